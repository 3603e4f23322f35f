"""``ccw capsule exec --interactive [--tty] CAP -- CMD...``: our stdin and stdout joined to an interactive exec.

The run is capsule_exec's ``interactive`` one (``tty``: on a pseudo-terminal in the jail,
capsules/console.py), driven as an agent drives it, through ``capsule_run`` calls on the
state dir's front end; so what is typed is journaled as the run's stdin, in its steps,
and a witness of the capsule replays it (``ccw capsule shell`` lends the front end our
own terminal instead, and its input is not kept).  Some facts the design follows from:

- **One call, one session.**  Each tool call here is an MCP session of its own
  (cli/frontclient.py), and a run outlives them (capsules/run.py), so two tasks call at
  once: one follows the output (``capsule_run`` with the cursor its last answer gave,
  waiting up to ``FOLLOW_WAIT_MS`` for output to come and pause) and prints it; the other
  types what our stdin gives (``capsule_run`` with ``input``, waiting for nothing).  The
  follower names its cursor on every read, so the typist's answers, which carry output
  too, take nothing from it: they are dropped.
- **Input is text.**  ``capsule_run`` takes a string: our stdin's bytes are decoded as
  UTF-8 as they come (a character split between two reads is held until it is whole),
  and a byte that is no UTF-8 goes in as U+FFFD.  The end of our stdin is ``eof``.
- **Our terminal, with --tty.**  The jail's terminal echoes and edits the line, so ours
  passes each key at once and echoes nothing (no ICANON, ECHO, ISIG: ^C, ^D and ^Z go
  as bytes, which the jail's terminal makes a signal or end of file).  Output processing
  stays on, so the text printed ends its lines as it should.  It is restored on the
  way out.
- **What is printed** is what ``capsule_run`` answers: on a terminal its text form
  (core/terminal_text.py: escape sequences dropped, carriage returns and backspaces
  applied within each answer), so a full-screen program does not draw and an erased
  character's echo may stay on the screen; ``ccw capsule shell`` is for those.  A piped
  run's stdout and stderr come as one stream, onto our stdout.
- **Without --tty**, a terminal we read stays as it is: a line goes when it is ended,
  ^D is end of file, and ^C (SIGINT) cancels the run (``capsule_run`` with ``cancel``).
- **Exit status**: the run's (``output.exec_status``: 128+N if signal N ended it, 124 on
  timeout), 130 when it was cancelled.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import os
import signal
import sys
import termios
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any

from mcp_server.capsules.console import INPUT_MAX
from mcp_server.cli import frontclient, helperctl
from mcp_server.cli.output import beside, exec_status, print_error
from mcp_server.config import Config
from sandbox.errors import CcwError

FIRST_WAIT_MS = 2000  # the starting call answers once output has come and paused, or after this
FOLLOW_WAIT_MS = 5000  # each read of the output waits at most this long
READ_MAX = INPUT_MAX // 4  # bytes of our stdin a call types at most (a byte may decode to 3)
STOP_WAIT_S = 45.0  # how long cancelling waits for the run's end (the front end's own wait is 40 s)
EXIT_CANCELLED = 130  # as a shell reports a command ended by ^C


def refusal(args: argparse.Namespace) -> str | None:
    """Why these ``exec`` options cannot go with --interactive, if they cannot."""
    if args.stdin_file:
        return "ccw: --stdin-file and --interactive: an interactive exec's stdin is ours"
    if args.json:
        return "ccw: --json gives a whole result; an interactive exec prints its output as it comes"
    return None


def run(args: argparse.Namespace, config: Config) -> int:
    """Run the command interactively; its exit status."""
    import trio

    refused = refusal(args)
    if refused is not None:
        raise SystemExit(refused)
    call: dict[str, Any] = {"capsule_id": args.capsule_id, "cmd": args.cmd, "interactive": True,
                            "tty": bool(args.tty), "wait_ms": FIRST_WAIT_MS}
    if args.cwd:
        call["cwd"] = args.cwd
    if args.timeout_ms is not None:
        call["timeout_ms"] = args.timeout_ms
    helperctl.ensure(config, autostart=not args.no_autostart)
    with Keys(sys.stdin.fileno(), raw=bool(args.tty)) as keys:
        return int(trio.run(_drive, config, call, keys.fd))


class Keys:
    """Our stdin; ``with`` and ``raw`` on a terminal: each key passed at once, unechoed (restored after)."""

    def __init__(self, fd: int, raw: bool) -> None:
        self.fd = fd
        self._saved: list[Any] | None = None
        self._raw = raw and os.isatty(fd)

    def __enter__(self) -> Keys:
        if self._raw:
            self._saved = termios.tcgetattr(self.fd)
            mode = termios.tcgetattr(self.fd)
            mode[0] &= ~(termios.BRKINT | termios.ICRNL | termios.INPCK | termios.ISTRIP | termios.IXON)
            mode[3] &= ~(termios.ECHO | termios.ICANON | termios.IEXTEN | termios.ISIG)
            mode[6][termios.VMIN], mode[6][termios.VTIME] = 1, 0
            termios.tcsetattr(self.fd, termios.TCSADRAIN, mode)  # output processing (OPOST) stays
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._saved is not None:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)


async def _drive(config: Config, call: dict[str, Any], in_fd: int) -> int:
    """Start the run, then follow its output while our stdin is typed into it; its exit status."""
    import trio

    # Open from the start: a SIGINT while the run starts waits here, for the run to be cancelled.
    with trio.open_signal_receiver(signal.SIGINT) as interrupts:
        first = await frontclient.call_tool(config, "capsule_exec", call)
        _show(first["output"])
        if first["status"] == "running":
            run_id = first["run_id"]
            try:
                first = await beside(lambda: _type_and_interrupt(config, run_id, in_fd, interrupts),
                                     lambda: _follow(config, run_id, first["cursor"]))
            except BaseException:  # we are going: the run must not go on without anyone
                await _cancel(config, run_id)
                raise
    if first["status"] == "cancelled":
        print("ccw: the run was cancelled", file=sys.stderr)
        return EXIT_CANCELLED
    return exec_status(first)


async def _follow(config: Config, run_id: str, cursor: int) -> dict[str, Any]:
    """Print the run's output as it comes, until it ends; its last answer."""
    while True:
        answer = await frontclient.call_tool(config, "capsule_run", {"run_id": run_id, "cursor": cursor,
                                                                      "wait_ms": FOLLOW_WAIT_MS})
        _show(answer["output"])
        cursor = answer["cursor"]
        if answer["status"] != "running":
            return answer


async def _type_and_interrupt(config: Config, run_id: str, in_fd: int, interrupts: AsyncIterator[int]) -> None:
    """Type our stdin into the run, and cancel it at SIGINT (ours, or from a terminal not raw)."""
    import trio

    async def interrupt() -> None:
        async for _ in interrupts:
            await _cancel(config, run_id)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(interrupt)
        await _type(config, run_id, in_fd)


async def _type(config: Config, run_id: str, in_fd: int) -> None:
    """Our stdin as input, as it comes; its end as eof.  Stops once the run takes no more."""
    import trio

    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    while True:
        chunk = await trio.to_thread.run_sync(os.read, in_fd, READ_MAX, abandon_on_cancel=True)
        text = decoder.decode(chunk, final=not chunk)
        args: dict[str, Any] = {"run_id": run_id, "wait_ms": 0, "input": text}
        if not chunk:
            args["eof"] = True
        if text or not chunk:
            try:
                await frontclient.call_tool(config, "capsule_run", args)
            except CcwError as exc:
                if exc.code != "CONFLICT":  # CONFLICT: its stdin is closed, or it has ended
                    print_error(exc)
                    await _cancel(config, run_id)
                return
        if not chunk:
            return


async def _cancel(config: Config, run_id: str) -> None:
    """Cancel the run (bounded, shielded: also on our way out); nothing if it has ended or is gone."""
    import trio

    with trio.CancelScope(shield=True), trio.move_on_after(STOP_WAIT_S), contextlib.suppress(CcwError, OSError):
        await frontclient.call_tool(config, "capsule_run", {"run_id": run_id, "cancel": True})


def _show(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
