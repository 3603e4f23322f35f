"""``ccw capsule shell CAP [-- CMD]``: an interactive terminal in a capsule's jail.

The command runs as any exec does (same jail, limits, tracer, journal row), except that
its stdin, stdout and stderr are a terminal: a pseudo-terminal this process opens, whose
slave it sends to the helper with the exec request and whose master it relays to the
person's own terminal.  Some facts about terminals that the design follows from:

- A pty's *slave* is what a program sees as its terminal; whoever holds the *master*
  reads what the program writes and types what it reads.  Keeping the master here means
  the helper never handles a byte of the session, and the jail gets one character
  device and nothing else: the helper refuses any other descriptor
  (``sandbox.access.check_terminal``), since a directory or a socket would reach past
  the jail.  A fresh pty's only reader of input is the jail itself, so a process there
  pushing input into it (TIOCSTI, which the jail's seccomp filter denies anyway) types
  into nothing but its own session.
- Job control needs a session whose controlling terminal is the slave: the helper's
  init spawns the command with ``setsid`` and reopens the slave without O_NOCTTY
  (sandbox/contain.py).  Ctrl-C is then a byte like any other here: our terminal is in
  raw mode (no ISIG), the byte crosses the master, and the *pty's* line discipline
  sends SIGINT to the jail's foreground job: ``sleep`` dies, the shell lives on.
- The window size belongs to the pty: copied from our terminal at start and at every
  SIGWINCH (TIOCSWINSZ on the master, which signals the jail's foreground job).  Our
  terminal's settings (erase character, ...) are copied to the slave before ours goes
  raw; ours are restored on every way out (``Terminal``'s ``with``).
- Reading the master fails with EIO once no slave is open anywhere.  We keep our own
  copy of the slave until the exec's reply has come (the helper closes its copy before
  replying and the jail's processes are gone by then), so after closing it, reading to
  EIO yields the last of the output and then ends the relay.

What is recorded: the journal's exec row, as for ``capsule exec`` (argv, cwd, env keys,
exit status, signal, duration, timeout, usage, the touched sets read/written/listed/
executed), except the output: it went to the terminal, so the row's stdout/stderr are
those of no bytes and no output is kept for witnesses.  A shell has no timeout of its own
unless ``--timeout-ms`` is given: it gets the helper's longest (24 hours).  If the
person's terminal goes away, the pty hangs up (the shell gets SIGHUP); if this process
dies, its session ends (below).

Where it runs: like every ``ccw capsule`` command, through the state dir's front end
(``mcp_server/frontdoor.py``), as a ``capsule_exec`` call that carries the slave with it
(SCM_RIGHTS on frontend.sock; ``_meta["ccw/terminal"]``).  So the session takes its turn
in the capsule's one queue with the agent's calls (saying once on stderr that it waits),
and an "egress" capsule's connections are recorded by the one process that holds its
proxy listeners.  If this process dies, the front end sees its connection hung up (or
reset) and cancels the call at once, which ends the jail with it, even when the command
ignores the pty's SIGHUP.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import functools
import os
import select
import signal
import sys
import termios
import threading
import tty
from types import TracebackType
from typing import Any

from mcp_server.config import Config
from sandbox.checks import MAX_TIMEOUT_MS

VERBS = ("shell",)
_CHUNK = 1 << 16


def add_parser(verbs: Any, common: argparse.ArgumentParser) -> None:
    """Register ``ccw capsule shell``."""
    shell = verbs.add_parser("shell", parents=[common],
                             help="an interactive terminal in a capsule: ccw capsule shell CAP [-- CMD...]")
    shell.add_argument("capsule_id")
    shell.add_argument("cmd", nargs="*", default=[], help="the program to run (default: the capsule's shell)")
    shell.add_argument("--cwd", help="working directory inside the capsule")
    shell.add_argument("--timeout-ms", type=int, help="end the session after this long (default: no timeout)")


def default_command() -> list[str]:
    """``/bin/bash -i``, else ``/bin/sh -i``: the jail shows the host's system dirs, so the
    host's answer is the jail's."""
    return ["/bin/bash", "-i"] if os.access("/bin/bash", os.X_OK) else ["/bin/sh", "-i"]


def run(args: argparse.Namespace, config: Config) -> int:
    """Run the terminal; the command's exit status (128+N if signal N ended it, 124 on timeout)."""
    import trio

    from mcp_server.cli import helperctl
    from mcp_server.cli.output import exec_status

    helperctl.ensure(config, autostart=not args.no_autostart)
    with Terminal(sys.stdin.fileno(), sys.stdout.fileno()) as terminal:
        result = trio.run(_session, config, args, terminal)
    return exec_status(result)


async def _session(config: Config, args: argparse.Namespace, terminal: Terminal) -> dict[str, Any]:
    """capsule_exec on the terminal's slave, through the state dir's front end, in the capsule's turn."""
    from mcp_server.cli import frontclient
    from mcp_server.cli.output import beside

    call = {"capsule_id": args.capsule_id, "cmd": args.cmd or default_command(), "cwd": args.cwd,
            "timeout_ms": args.timeout_ms or MAX_TIMEOUT_MS, "wait_ms": None}
    terminal.start_relay()
    return await beside(functools.partial(_follow_window_size, terminal),
                        lambda: frontclient.call_tool(config, "capsule_exec", call,
                                                      _Queued(terminal, args.capsule_id), terminal.slave))


class _Queued:
    """The call's progress reports: said once on stderr if it waits for another command."""

    def __init__(self, terminal: Terminal, capsule_id: str) -> None:
        self.terminal = terminal
        self.capsule_id = capsule_id
        self.told = False

    def update(self, _progress: float, _total: float | None = None, message: str | None = None,
               _output: object = None) -> None:
        """A progress report: the first "queued" one is told (the session's output comes through its
        terminal, not the reports: ``_output`` is what frontclient passes every progress)."""
        if not self.told and (message or "").startswith("queued:"):
            self.terminal.say(f"ccw: capsule {self.capsule_id} is running another command; waiting for its turn")
            self.told = True


async def _follow_window_size(terminal: Terminal) -> None:
    """Copy our window size to the pty now and at every SIGWINCH."""
    import trio

    with trio.open_signal_receiver(signal.SIGWINCH) as changes:
        terminal.copy_window_size()
        async for _ in changes:
            terminal.copy_window_size()


class Terminal:
    """Our terminal and the pty relayed to it; ``with``: our terminal raw, restored on the way out."""

    def __init__(self, in_fd: int, out_fd: int) -> None:
        self.in_fd = in_fd
        self.out_fd = out_fd
        self.interactive = os.isatty(in_fd)
        self.master, self.slave = os.openpty()  # glibc opens the slave O_NOCTTY: it stays nobody's terminal
        for fd in (self.master, self.slave):
            os.set_inheritable(fd, False)
        self._saved: list[Any] | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC)
        self._relay: threading.Thread | None = None

    def __enter__(self) -> Terminal:
        if self.interactive:
            self._saved = termios.tcgetattr(self.in_fd)
            termios.tcsetattr(self.slave, termios.TCSANOW, self._saved)
            self.copy_window_size()
            tty.setraw(self.in_fd, termios.TCSADRAIN)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            self.finish()
        finally:
            if self._saved is not None:
                termios.tcsetattr(self.in_fd, termios.TCSADRAIN, self._saved)
            for fd in (self.master, self._wake_r, self._wake_w):
                os.close(fd)

    def say(self, message: str) -> None:
        """A line on stderr (raw mode wants its own carriage return)."""
        with contextlib.suppress(OSError):
            os.write(sys.stderr.fileno(), (message + ("\r\n" if self._saved is not None else "\n")).encode())

    def copy_window_size(self) -> None:
        """Our terminal's size onto the pty (the jail's foreground job gets SIGWINCH)."""
        if self.interactive:
            size = fcntl.ioctl(self.in_fd, termios.TIOCGWINSZ, b"\0" * 8)
            fcntl.ioctl(self.master, termios.TIOCSWINSZ, size)

    def start_relay(self) -> None:
        """Copy bytes both ways (our stdin to the master, the master to our stdout) on a thread."""
        self._relay = threading.Thread(target=self._copy, name="ccw-shell-relay", daemon=True)
        self._relay.start()

    def finish(self) -> None:
        """Close our slave, let the relay print what is left (until EIO), and wait for it."""
        if self.slave >= 0:
            os.close(self.slave)
            self.slave = -1
        if self._relay is not None:
            self._relay.join(timeout=5.0)
            if self._relay.is_alive():  # something outside still holds the slave: stop anyway
                os.write(self._wake_w, b"x")
                self._relay.join()

    def _copy(self) -> None:
        os.set_blocking(self.master, False)
        poller = select.poll()
        poller.register(self.master, select.POLLIN)
        poller.register(self.in_fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        typed = bytearray()  # read from our stdin, not yet taken by the pty (its input queue is small)
        while True:
            for fd, _events in poller.poll():
                if fd == self._wake_r:
                    return
                if fd == self.master and not self._print():
                    return
                if fd == self.in_fd:
                    try:
                        chunk = os.read(self.in_fd, _CHUNK)
                    except OSError:  # our terminal hung up: as its end
                        chunk = b""
                    if not chunk:  # end of a piped stdin: the terminal's end-of-file character
                        poller.unregister(self.in_fd)
                        chunk = b"" if self.interactive else b"\x04"
                    typed += chunk
            if typed:
                with contextlib.suppress(BlockingIOError):
                    del typed[: os.write(self.master, typed)]
            poller.modify(self.master, select.POLLIN | (select.POLLOUT if typed else 0))

    def _print(self) -> bool:
        """What the jail wrote, onto our stdout; False once no slave is open (EIO)."""
        try:
            chunk = os.read(self.master, _CHUNK)
        except BlockingIOError:
            return True
        except OSError as exc:
            if exc.errno == errno.EIO:
                return False
            raise
        view = memoryview(chunk)
        while view:
            view = view[os.write(self.out_fd, view):]
        return bool(chunk)
