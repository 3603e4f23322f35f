"""An interactive exec's two ends as the front end holds them: the command's stdin and its output.

``capsule_exec`` with ``interactive`` starts a command that an agent then drives with
``capsule_run``: each call may type into its stdin and reads what it wrote since the
last read (mcp_server/core/transcript.py).  The command runs as every exec does (its
jail, limits, tracer, turn and journal row); only its stdin and the way its output
comes back differ.  Some facts about the two ways it is wired, which the design follows
from:

- **Pipes** (the default).  The request's stdio is ``"stdin"``: the read end of a pipe
  made here travels with it (SCM_RIGHTS, as a shell's terminal does) and becomes the
  jail's stdin; we keep the write end.  Closing it is the command's end of file, as no
  one else holds a write end (descriptors are made close-on-exec).  stdout and stderr
  are captured by the helper as usual, and the request asks for ``stream``: each
  progress report (every ``PROGRESS_MS``, the helper's shortest) carries every byte
  since the last one (at most 256 KiB a stream; the running totals tell what was
  dropped), and the reply what came after the last report (within the capture cap).
- **A terminal** (``tty``).  A pseudo-terminal made here, whose slave goes as the
  command's stdio and controlling terminal (stdio ``"tty"``, as for ``ccw capsule
  shell``); we read its output from the master and type into it.  Its window is
  ``WINDOW`` (rows, columns), its TERM ``TERM`` unless the capsule whitelists one: a
  dumb terminal asks programs for the fewest control sequences, and what they still
  write is stripped from what the agent is shown (core/terminal_text.py).  The line
  discipline echoes what is typed, as a terminal shows it.  End of file is the
  terminal's end-of-file character (^D), which ends a line's read only at its start.
  We hold our copy of the slave until the reply has come (the helper has closed its
  copy by then and the jail's processes are gone), then read the master until EIO:
  the last of the output.
- **Input** is queued (at most ``INPUT_MAX`` bytes a call, ``MAX_STDIN`` in all) and a
  task writes it while the command runs, as fast as it reads: a pipe holds 64 KiB and a
  terminal's line 4 KiB, and a call must not wait on a command that is not reading.
  What was written is kept, in order, as ``typed``: the journal's record of the run's
  stdin (capsules/exec.py ``journal_entry``), so a witness carries it and a replay feeds
  it.  Beside it the journal keeps the run's ``record``: whether it was on a terminal,
  and each write as ``[output so far, bytes written]`` (a terminal's pending output is
  read first, so the count holds everything the command had printed by then), and the
  output count when end of file was sent.
- **A replay** of a terminal run (replay_steps.py) makes a terminal again and types the
  same bytes in the same steps, each once the replayed output has come as far as it had
  when the step was written (``replay``): a REPL gets each line after its prompt, echoed
  where it was, and a program that reads /dev/tty itself (``git rebase -i``'s editor)
  finds a terminal and its answers.  A command whose output differs would never reach
  the count: once its output pauses ``REPLAY_PAUSE_S`` short of it, the step is typed
  anyway (the comparison then says how the output differs).  Its ^D for ``eof`` is
  typed the same way.  A piped run's replay feeds ``typed`` at once as its stdin, its end
  the stdin's end: its output came in the helper's reports (stdout and stderr apart,
  every ``PROGRESS_MS``), too coarse to place a step by, and what a command reads from
  a pipe does not depend on when the bytes came.
- **Reading** waits (at most its ``wait_ms``) for output after the reader's cursor, then
  until the output pauses for ``QUIET_S``, so a REPL's answer and its next prompt come
  back in one read; or for the run's end.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import os
import struct
import termios
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any

import trio

from mcp_server.core.transcript import Reading, Transcript
from sandbox.checks import MAX_STDIN
from sandbox.errors import CcwError
from sandbox.ops import ExecRequest
from sandbox.replies import ExecProgress, ExecReply
from sandbox.spec import DEFAULT_OUTPUT_CAP

INPUT_MAX = 64 * 1024  # bytes of input one call may give
PROGRESS_MS = 100  # how often the helper delivers a piped run's output (its shortest interval)
QUIET_S = 0.2  # a read ends once output has come and then paused this long
WINDOW = (50, 200)  # rows, columns of a run's terminal
TERM = "dumb"  # asks programs for the fewest control sequences (see above)
EOF_CHAR = b"\x04"  # the terminal's VEOF (^D), as a fresh pty has it
REPLAY_PAUSE_S = 3.0  # a replay types a step anyway once output pauses this long short of its count
_CHUNK = 1 << 16


def input_bytes(name: str, text: str) -> bytes:
    """The bytes ``text`` (an exec's ``stdin``, capsule_run's ``input``) gives the command: its UTF-8, a
    ``\\udcXX`` as byte XX (a file's content is carried so too); another lone surrogate is refused."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise CcwError("INVALID_ARGUMENT", f"{name} holds a lone surrogate, which is not UTF-8; send valid text",
                       {"argument": name}) from None


class Console:
    """One interactive exec's stdin and output: ``with`` holds its descriptors."""

    def __init__(self, terminal: bool) -> None:
        self.terminal = terminal
        # A terminal's output comes from us, not the helper: its head is the journal's stdout.
        self.transcript = Transcript(terminal, head_cap=DEFAULT_OUTPUT_CAP if terminal else 0)
        self.typed = bytearray()  # what the command was given on its stdin, in order
        self.read_cursor = 0  # where the last read ended
        self._pending = bytearray()  # given, not yet written
        self._steps: list[list[int]] = []  # each write: [output bytes before it, bytes written]
        self._eof_at: int | None = None  # output bytes before end of file was sent
        self._given = 0
        self._eof = False  # asked for
        self._input_closed: str | None = None  # why no more input can be written
        self._ended = False  # no more output will come
        self._seen = {"stdout": 0, "stderr": 0}  # the helper's running totals, as last reported
        self._changed = trio.Event()  # set when output arrives or ends (then replaced)
        self._input = trio.Event()  # set when input is given (then replaced)
        self._ours: int | None = None  # the pipe's write end, or the pty's master
        self._theirs: int | None = None  # what the helper gets: the pipe's read end, or the slave

    def __enter__(self) -> Console:
        if self.terminal:
            self._ours, self._theirs = os.openpty()  # both close-on-exec (PEP 446)
            fcntl.ioctl(self._ours, termios.TIOCSWINSZ, struct.pack("HHHH", *WINDOW, 0, 0))
        else:
            self._theirs, self._ours = os.pipe()
        os.set_blocking(self._ours, False)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._end()
        self._close_ours()
        self._close_theirs()

    # --- the service's side: the exec ------------------------------------------------

    def prepare(self, request: ExecRequest) -> ExecRequest:
        """``request`` wired to this console: its stdio, the descriptor that goes with it, and (pipes)
        reports that carry the output.  It sends no stdin of its own: input is given (``give``)."""
        if self.terminal:
            env = {"TERM": TERM, **(request.env or {})}  # a TERM the capsule whitelists wins
            return dataclasses.replace(request, stdio="tty", tty_fd=self._theirs, env=env, stdin=None)
        return dataclasses.replace(request, stdio="stdin", tty_fd=self._theirs, stream=True,
                                   progress_ms=PROGRESS_MS, stdin=None)

    @contextlib.asynccontextmanager
    async def attached(self) -> AsyncIterator[None]:
        """For the block (the helper's call): input written as the command reads it, and a
        terminal's output read; after it, the rest of a terminal's output."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._write)
                if self.terminal:
                    nursery.start_soon(self._read)
                try:
                    yield
                finally:
                    nursery.cancel_scope.cancel()
            if self.terminal:  # the jail has ended: with our slave closed, the master reads to EIO
                self._close_theirs()
                while self._read_some():
                    pass
        finally:
            self._input_closed = self._input_closed or "the run has ended"

    def stream(self, report: ExecProgress) -> None:
        """A progress report of a piped run: the output it carries (what it could not, noted)."""
        if not self.terminal:
            before = self.transcript.total
            for name, total, chunk in (("stdout", report.stdout_bytes, report.stdout_tail),
                                       ("stderr", report.stderr_bytes, report.stderr_tail)):
                self.transcript.note_lost(total - self._seen[name] - len(chunk), name)  # the oldest went
                self.transcript.append(chunk)
                self._seen[name] = total
            if self.transcript.total != before:  # most reports of a command that waits carry nothing
                self._notify()

    def finished(self, reply: ExecReply) -> ExecReply:
        """The reply of the ended run: a piped run's last output taken from it; a terminal's
        output put in it as its stdout (the first ``output_cap`` bytes, as the helper captures)."""
        if self.terminal:
            head, total = self.transcript.release_head(), self.transcript.total
            reply = dataclasses.replace(reply, stdout=head, stdout_bytes=total,
                                        truncated=dataclasses.replace(reply.truncated, stdout=total > len(head)))
        else:
            for name, data, total in (("stdout", reply.stdout, reply.stdout_bytes),
                                      ("stderr", reply.stderr, reply.stderr_bytes)):
                rest = data[self._seen[name]:]
                self.transcript.append(rest)
                self.transcript.note_lost(total - self._seen[name] - len(rest), name)  # past the cap
                self._seen[name] = total
        self._end()
        return reply

    # --- the caller's side: input and reads -------------------------------------------

    def give(self, data: bytes, eof: bool = False) -> None:
        """Queue ``data`` for the command's stdin (then its end of file, if ``eof``)."""
        if self._input_closed is not None or self._eof:
            raise CcwError("CONFLICT", f"the run's stdin is closed ({self._input_closed or 'eof was sent'}): "
                           "nothing more can be typed; start a new interactive exec", {"given": len(data)})
        if len(data) > INPUT_MAX:
            raise CcwError("TOO_LARGE", f"input of {len(data)} bytes: at most {INPUT_MAX} a call; "
                           "give it in parts", {"limit": INPUT_MAX})
        if self._given + len(data) > MAX_STDIN:
            raise CcwError("TOO_LARGE", f"a run's input is kept for its replay, at most {MAX_STDIN} bytes in all "
                           f"({self._given} given); pass large data as a file instead", {"limit": MAX_STDIN})
        self._given += len(data)
        self._pending += data
        self._eof = eof
        self._input.set()

    async def read(self, done: trio.Event, cursor: int | None, wait_s: float) -> Reading:
        """The output from ``cursor`` (None: where the last read ended), once some has come and
        paused, or the run is ``done``, or ``wait_s`` has passed; the next read goes on from it."""
        start = self.read_cursor if cursor is None else cursor
        self.transcript.check(start)  # a bad cursor fails now, not after the wait
        with trio.move_on_after(wait_s):
            while self.transcript.total <= start and not self._ended:
                await self._changed.wait()
            while not self._ended:  # then until it pauses
                seen = self.transcript.total
                with trio.move_on_after(QUIET_S) as quiet:
                    while self.transcript.total == seen and not self._ended:
                        await self._changed.wait()
                if quiet.cancelled_caught:
                    break
            if self._ended:  # its result is journaled by now or very soon
                await done.wait()
        return self.read_now(start)

    def read_now(self, cursor: int | None = None) -> Reading:
        """The output from ``cursor`` (None: where the last read ended) as it is now."""
        reading = self.transcript.read(self.read_cursor if cursor is None else cursor, final=self._ended)
        self.read_cursor = reading.cursor
        return reading

    def record(self) -> dict[str, Any]:
        """How the input went in, for the journal and a replay: ``tty``, the ``steps`` of ``typed``
        (each ``[output bytes before it, its bytes]``) and the output count at ``eof`` (None: none sent)."""
        return {"tty": self.terminal, "steps": [list(step) for step in self._steps], "eof": self._eof_at}

    # --- a replay's side ---------------------------------------------------------------

    async def replay(self, typed: bytes, record: dict[str, Any]) -> None:
        """Type ``typed`` in the steps of ``record`` (``record()``'s form), each once the output has
        come as far as it had (or paused short of it), then end of file if it was sent; stop if
        the command's stdin closes first."""
        position = 0
        try:
            for after, length in record.get("steps") or [[0, len(typed)]]:
                await self._output_reaches(after)
                self.give(typed[position : position + length])
                position += length
            if position < len(typed):  # a record that covers less than typed: the rest at its end
                self.give(typed[position:])
            if record.get("eof") is not None:
                await self._output_reaches(record["eof"])
                self.give(b"", eof=True)
        except CcwError as exc:
            if exc.code != "CONFLICT":  # the run ended (or closed its stdin): the rest is never read
                raise

    async def _output_reaches(self, count: int) -> None:
        """Wait until ``count`` bytes of output have come, the run ends, or output pauses
        ``REPLAY_PAUSE_S`` short of it."""
        while self.transcript.total < count and not self._ended:
            with trio.move_on_after(REPLAY_PAUSE_S) as paused:
                await self._changed.wait()
            if paused.cancelled_caught:
                return

    # --- inside ------------------------------------------------------------------------

    async def _write(self) -> None:
        """Write what is given while the command runs; then its end of file, if asked."""
        while self._input_closed is None:
            if self._pending:
                after, written = await self._write_some(self._pending)
                if written:
                    self._steps.append([after, written])
                    self.typed += self._pending[:written]
                    del self._pending[:written]
            elif self._eof:
                if self.terminal:
                    while self._input_closed is None:
                        after, written = await self._write_some(EOF_CHAR)
                        if written:
                            self._eof_at = after
                            break  # else a full input queue: wait until the line discipline takes it
                else:
                    self._eof_at = self.transcript.total
                    self._close_ours()
                self._input_closed = self._input_closed or "eof was sent"
            else:
                await self._input.wait()
                self._input = trio.Event()

    async def _write_some(self, data: bytes | bytearray) -> tuple[int, int]:
        """(output bytes so far, bytes written) of one write: a terminal's pending output is read
        first, so the count holds all the command had printed before it."""
        assert self._ours is not None
        await trio.lowlevel.wait_writable(self._ours)
        if self.terminal:
            while self._read_some():
                pass
        after = self.transcript.total
        try:
            return after, os.write(self._ours, data[:_CHUNK])
        except BlockingIOError:
            return after, 0
        except OSError as exc:  # EPIPE: the command closed its stdin; what is pending is never read
            self._input_closed = f"the command closed its stdin: {os.strerror(exc.errno or 0)}"
            return after, 0

    async def _read(self) -> None:
        """A terminal's output as it comes, until no slave is open."""
        assert self._ours is not None
        while True:
            await trio.lowlevel.wait_readable(self._ours)
            if self._read_some() is False:
                return

    def _read_some(self) -> bool | None:
        """One read of the master: True (output), None (nothing yet), False (no slave is open)."""
        if self._ours is None:
            return False
        try:
            chunk = os.read(self._ours, _CHUNK)
        except BlockingIOError:
            return None
        except OSError as exc:
            if exc.errno == errno.EIO:
                return False
            raise
        self.transcript.append(chunk)
        self._notify()
        return bool(chunk)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _end(self) -> None:
        if not self._ended:
            self._ended = True
            self._input_closed = self._input_closed or "the run has ended"
            self._notify()

    def _close_ours(self) -> None:
        if self._ours is not None:
            trio.lowlevel.notify_closing(self._ours)
            os.close(self._ours)
            self._ours = None

    def _close_theirs(self) -> None:
        if self._theirs is not None:
            os.close(self._theirs)
            self._theirs = None
