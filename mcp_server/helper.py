"""The front end's helper: the service's socket, or the embedded default it starts.

The client itself is ``sandbox.client.HelperClient``.  ``connect_or_spawn(config)``:
with ``CCW_HELPER_SOCKET`` set and answering, connect to it (the service).  Otherwise start the embedded helper as a child,
``python -m sandbox --socket <state>/helper/helper.sock --state-dir <state>/helper
--ready-fd N --die-with-parent``, wait for its ready byte, and stop it (SIGTERM, then
SIGKILL) on ``aclose``.  The child never gets the front end's stdout (which carries MCP
frames on stdio): its stdout and stderr go to a pipe whose lines are copied to our
stderr, and whose tail is quoted if the child dies before it is ready.  An embedded
helper already serving the same state dir (another ccw-mcp) is reused, not replaced.
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import trio

from mcp_server.config import Config
from sandbox.client import HelperClient
from sandbox.errors import CcwError

log = logging.getLogger("ccw.helper_client")
HELPER_LOG = logging.getLogger("ccw.helper")  # the embedded helper's own lines

READY_TIMEOUT_S = 60.0  # the helper recovers existing capsules before it listens
STOP_TIMEOUT_S = 10.0  # SIGTERM lets in-flight execs finish; then SIGKILL
STDERR_TAIL_LINES = 40
PF_EXITING = 0x4  # /proc/<pid>/stat flags: the task has begun to exit


class EmbeddedHelper:
    """The helper child process of the embedded default."""

    def __init__(self, process: subprocess.Popen[bytes], log_fd: int) -> None:
        self.process = process
        self._pidfd = os.pidfd_open(process.pid)
        # Kept open: ending() re-reads it on every call that needs the helper (~2 us with
        # pread, ~20 us opening the file each time).
        self._stat_fd = os.open(f"/proc/{process.pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        self.tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self._pump = threading.Thread(target=self._copy_log, args=(log_fd,), daemon=True)
        self._pump.start()

    def _copy_log(self, fd: int) -> None:
        # The child's stdout and stderr, line by line, into our log (stderr, never our
        # stdout), so a log level and JSON lines apply to the helper's lines too.
        with open(fd, "rb", closefd=True) as stream:
            for line in stream:
                text = line.decode("utf-8", "replace").rstrip("\n")
                self.tail.append(text)
                HELPER_LOG.info(text)

    def ending(self) -> bool:
        """Whether the child has exited or has begun to (PF_EXITING).

        A killed helper takes a while to become a zombie: its exit unmounts its mount
        namespace, capsule disks included, and ext4 writes their journals back first.
        Meanwhile its socket refuses connections, so "not yet reaped" is not "usable".
        """
        if self.process.poll() is not None or self._stat_fd < 0:
            return True
        try:
            fields = os.pread(self._stat_fd, 1024, 0).rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            return True
        return fields[0] in (b"Z", b"X") or int(fields[6]) & PF_EXITING != 0

    def describe_death(self) -> str:
        """A sentence on how the child ended, with its last log lines, or '' if it runs."""
        status = self.process.poll()
        if status is None:
            return ""
        self._pump.join(timeout=1.0)
        how = f"killed by {signal.Signals(-status).name}" if status < 0 else f"exit status {status}"
        tail = "\n".join(self.tail) or "(no output)"
        return f"; the embedded helper ended ({how}); its last output:\n{tail}"

    async def wait(self) -> int:
        """Wait for the child to exit (a pidfd turns readable), cancellably; its status."""
        while (status := self.process.poll()) is None:
            await trio.lowlevel.wait_readable(self._pidfd)
        return status

    async def stop(self) -> None:
        """SIGTERM (the helper finishes in-flight requests), then SIGKILL after a grace period."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with trio.move_on_after(STOP_TIMEOUT_S):
                await self.wait()
            if self.process.poll() is None:
                log.warning("embedded helper ignored SIGTERM; killing it")
                self.process.kill()
                await self.wait()
        await trio.to_thread.run_sync(self._pump.join, 1.0)
        for fd in (self._pidfd, self._stat_fd):
            if fd >= 0:
                os.close(fd)
        self._pidfd = self._stat_fd = -1


async def spawn_embedded(state_dir: str, timeout_s: float = READY_TIMEOUT_S) -> HelperClient:
    """Start ``python -m sandbox`` under ``state_dir``/helper and wait until it listens."""
    helper_dir = Path(state_dir) / "helper"
    helper_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    socket_path = str(helper_dir / "helper.sock")
    ready_r, ready_w = os.pipe()
    log_r, log_w = os.pipe()
    command = [
        sys.executable, "-m", "sandbox",
        "--socket", socket_path, "--state-dir", str(helper_dir),
        "--ready-fd", str(ready_w), "--die-with-parent",
    ]  # fmt: skip
    try:
        # Forked from this (trio's) thread on purpose: --die-with-parent uses PDEATHSIG,
        # which fires when the *thread* that forked exits, and trio's open_process forks
        # from a worker thread that exits when idle.
        process = subprocess.Popen(  # noqa: ASYNC220
            command,
            stdin=subprocess.DEVNULL,
            stdout=log_w,
            stderr=log_w,
            pass_fds=(ready_w,),
            start_new_session=True,  # a ^C meant for ccw-mcp reaches the helper via our aclose
        )
    except OSError as exc:
        for fd in (ready_r, ready_w, log_r, log_w):
            os.close(fd)
        raise CcwError("UNAVAILABLE", f"cannot start the embedded helper {command}: {exc}") from exc
    os.close(ready_w)
    os.close(log_w)
    embedded = EmbeddedHelper(process, log_r)
    try:
        try:
            with trio.move_on_after(timeout_s) as scope:
                await trio.lowlevel.wait_readable(ready_r)
            ready = b"" if scope.cancelled_caught else os.read(ready_r, 1)
        finally:
            os.close(ready_r)
        if ready != b"1":
            if not scope.cancelled_caught:  # it closed the pipe: give it a moment to exit
                with trio.move_on_after(5):
                    await embedded.wait()
            death = embedded.describe_death()
            why = f"did not become ready within {timeout_s:g} s" if scope.cancelled_caught else "failed to start"
            raise CcwError("UNAVAILABLE", f"the embedded helper {why}" + death)
    except BaseException:
        # Never leave a half-started helper behind, also when we are cancelled.
        with trio.CancelScope(shield=True):
            await embedded.stop()
        raise
    return HelperClient(socket_path, embedded)


async def _try_connect(socket_path: str) -> HelperClient | None:
    client = HelperClient(socket_path)
    try:
        await client.hello()
    except CcwError as exc:
        await client.aclose()
        if exc.code != "UNAVAILABLE":
            raise
        return None
    return client


async def connect_or_spawn(config: Config) -> HelperClient:
    """Connect to CCW_HELPER_SOCKET when it answers; else use or start the embedded helper."""
    if config.helper_socket:
        client = await _try_connect(config.helper_socket)
        if client is not None:
            return client
        log.warning("helper socket %s does not answer; starting an embedded helper", config.helper_socket)
    if not config.state_dir:
        raise CcwError("INVALID_ARGUMENT", "no state dir configured; set CCW_STATE_DIR")
    existing = Path(config.state_dir) / "helper" / "helper.sock"
    if existing.is_socket():
        client = await _try_connect(str(existing))
        if client is not None:
            return client
    return await spawn_embedded(config.state_dir)
