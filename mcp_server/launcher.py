"""The one launcher of ccw-helper, in two modes: embedded and detached.

Both run the same command, ``python -m sandbox --socket <state>/helper/helper.sock
--state-dir <state>/helper --ready-fd N``, and wait for the ready byte on fd N (the
helper recovers existing capsules before it listens, so readiness is not instant).
Both use the same socket path, so a ``ccw`` command and a ``ccw-mcp`` on one state dir
share one helper and its capsules.

Embedded (``spawn_embedded``, ``connect_or_spawn``: ccw-mcp's default).  With
``CCW_HELPER_SOCKET`` set and answering, connect to it (the service).  Otherwise start
the helper as a child with ``--die-with-parent``, and stop it (SIGTERM, then SIGKILL)
on ``aclose``.  The child never gets the front end's stdout (which carries MCP frames
on stdio): its stdout and stderr go to a pipe whose lines are copied to our stderr,
and whose tail is quoted if the child dies before it is ready.  An embedded helper
already serving the same state dir (another ccw-mcp) is reused, not replaced.

Detached (``start_detached``: ``ccw helper start``, and the CLI's autostart).  The
helper is double-forked, in a session of its own, stdin from /dev/null, its log
appended to ``<state>/helper/helper.log``, without ``--die-with-parent``.  It runs until
``stop`` (``ccw helper stop``) or a reboot.  A lock file (``start.lock``, flock) makes
two commands that start at once share one helper, because ``recover()`` assumes it is
the only helper on its state dir.

``stop`` finds the pid from the listening socket itself (SO_PEERCRED names the process
that called ``listen()``), so a stale pid file can never make it signal the wrong
process, and refuses a socket that systemd listens on (pid 1: the service is stopped
with systemctl).
"""

from __future__ import annotations

import collections
import fcntl
import logging
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from mcp_server.config import Config
from mcp_server.statedir import make_state_dir
from sandbox.client import BlockingClient, HelperClient
from sandbox.errors import CcwError

log = logging.getLogger("ccw.helper_client")
HELPER_LOG = logging.getLogger("ccw.helper")  # the embedded helper's own lines

READY_TIMEOUT_S = 60.0  # the helper recovers existing capsules before it listens
STOP_TIMEOUT_S = 10.0  # SIGTERM lets in-flight execs finish; then SIGKILL
DETACHED_STOP_TIMEOUT_S = 15.0
HELLO_TIMEOUT_S = 10.0
STDERR_TAIL_LINES = 40
PF_EXITING = 0x4  # /proc/<pid>/stat flags: the task has begun to exit


@dataclass(frozen=True)
class HelperPaths:
    """Where the state dir's own helper keeps its socket, log and lock."""

    directory: Path
    socket: Path
    log: Path
    lock: Path

    @classmethod
    def of(cls, state_dir: str) -> HelperPaths:
        """The paths for ``state_dir``, the same in both modes."""
        directory = Path(state_dir) / "helper"
        return cls(directory, directory / "helper.sock", directory / "helper.log", directory / "start.lock")


def helper_command(paths: HelperPaths, ready_fd: int, embedded: bool) -> list[str]:
    """The helper's command line; an embedded helper dies with its parent."""
    command = [sys.executable, "-m", "sandbox", "--socket", str(paths.socket),
               "--state-dir", str(paths.directory), "--ready-fd", str(ready_fd)]
    return [*command, "--die-with-parent"] if embedded else command


# --- embedded ---------------------------------------------------------------------------


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
    paths = HelperPaths.of(state_dir)
    make_state_dir(state_dir)
    paths.directory.mkdir(exist_ok=True, mode=0o700)
    ready_r, ready_w = os.pipe()
    log_r, log_w = os.pipe()
    command = helper_command(paths, ready_w, embedded=True)
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
    return HelperClient(str(paths.socket), embedded)


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
    existing = HelperPaths.of(config.state_dir).socket
    if existing.is_socket():
        client = await _try_connect(str(existing))
        if client is not None:
            return client
    return await spawn_embedded(config.state_dir)


# --- detached ---------------------------------------------------------------------------


def answering(socket_path: str) -> dict[str, Any] | None:
    """``hello`` when a helper answers on ``socket_path``, else None.  A helper of another
    install answers too, as ``{"other_install": why}``: it is there to stop (``stop``), not
    to start another beside or to use (``HelperClient.hello`` refuses it)."""
    try:
        with BlockingClient(socket_path, HELLO_TIMEOUT_S) as client:
            return client.hello()
    except CcwError as exc:
        return {"other_install": exc.message} if exc.code == "UNSUPPORTED" else None
    except OSError:
        return None


def listener_pid(socket_path: str) -> int | None:
    """The pid that called listen() on ``socket_path`` (SO_PEERCRED), or None."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(HELLO_TIMEOUT_S)
        try:
            sock.connect(socket_path)
        except OSError:
            return None
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, _uid, _gid = struct.unpack("3i", raw)
    return pid or None


def spawn_detached(argv: list[str], log_path: Path, ready_w: int, env: Mapping[str, str] | None = None) -> None:
    """Start ``argv`` detached (its own session, stdin /dev/null, output appended to
    ``log_path``), keeping only ``ready_w`` of our descriptors; ``env``: its environment."""
    # Double fork: the helper is adopted by init (or the nearest subreaper) at once, so
    # this short-lived command never owns a child it would have to reap.
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            devnull = os.open(os.devnull, os.O_RDWR)
            log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.dup2(devnull, 0)
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            os.set_inheritable(ready_w, True)
            # Only the descriptors Python made are close-on-exec: one our caller handed us
            # (``flock LOCKFILE ccw ...``'s lock) would stay open in the helper for good.
            os.closerange(3, ready_w)
            os.closerange(ready_w + 1, os.sysconf("SC_OPEN_MAX"))
            os.chdir("/")
            if env is None:
                os.execv(argv[0], argv)
            os.execve(argv[0], argv, dict(env))
        finally:
            os._exit(127)
    os.waitpid(pid, 0)


def log_tail(log_path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a detached process's log."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def start_detached(state_dir: str, timeout_s: float = READY_TIMEOUT_S) -> dict[str, Any]:
    """Start the state dir's detached helper unless one answers; its status."""
    paths = HelperPaths.of(state_dir)
    make_state_dir(state_dir)
    paths.directory.mkdir(exist_ok=True, mode=0o700)
    with open(paths.lock, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if answering(str(paths.socket)) is not None:
            return {**status_of(str(paths.socket)), "started": False}
        ready_r, ready_w = os.pipe()
        argv = helper_command(paths, ready_w, embedded=False)
        try:
            with open(paths.log, "ab") as log:
                log.write(f"--- ccw helper start {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n".encode())
            spawn_detached(argv, paths.log, ready_w)
            os.close(ready_w)
            ready_w = -1
            readable, _, _ = select.select([ready_r], [], [], timeout_s)
            ready = os.read(ready_r, 1) if readable else b""
        finally:
            os.close(ready_r)
            if ready_w >= 0:
                os.close(ready_w)
        if ready != b"1":
            why = f"did not become ready within {timeout_s:g} s" if not readable else "failed to start"
            raise CcwError("UNAVAILABLE", f"the helper {why}; its log ({paths.log}) ends with:\n"
                           + log_tail(paths.log), {"log": str(paths.log)})
        return {**status_of(str(paths.socket)), "started": True}


def status_of(socket_path: str) -> dict[str, Any]:
    """Whether a helper answers on ``socket_path``: its pid, mode and protocol version."""
    info = answering(socket_path)
    if info is None:
        return {"socket": socket_path, "running": False, "pid": None, "mode": None}
    return {
        "socket": socket_path,
        "running": True,
        "pid": listener_pid(socket_path),
        "mode": info.get("mode"),
        "version": info.get("version"),
        **({"other_install": info["other_install"]} if "other_install" in info else {}),
    }


def stop(state_dir: str, timeout_s: float = DETACHED_STOP_TIMEOUT_S) -> dict[str, Any]:
    """Stop the state dir's helper (SIGTERM, then SIGKILL); what was stopped."""
    paths = HelperPaths.of(state_dir)
    socket_path = str(paths.socket)
    if answering(socket_path) is None:
        return {"socket": socket_path, "stopped": False, "pid": None, "reason": "no helper answers there"}
    pid = listener_pid(socket_path)
    if pid is None or pid == 1:
        raise CcwError("CONFLICT", f"{socket_path} is held by {'systemd' if pid == 1 else 'an unknown process'}; "
                       "stop the service with systemctl stop ccw-helper.service")
    ended = end_process(pid, timeout_s)
    if ended is None:
        return {"socket": socket_path, "stopped": True, "pid": pid}
    # A helper killed by SIGKILL leaves its socket file: the next start removes it as stale.
    return {"socket": socket_path, "stopped": True, "pid": pid, "forced": not ended}


def end_process(pid: int, timeout_s: float, terminate: bool = True, kill: bool = True) -> bool | None:
    """End process ``pid``: SIGTERM (unless not ``terminate``: it is ending on its own), wait up
    to ``timeout_s`` for its exit, then, with ``kill``, SIGKILL it if it is still there and wait
    as long again.  None when there is no such process; else whether it ended without SIGKILL.

    Through a pidfd, opened before the first signal: a SIGKILL after the wait cannot reach
    another process that took the pid meanwhile; and it turns readable at the exit, which
    ``select`` waits for where the process is no child of ours to ``waitpid``.
    """
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    try:
        if terminate:
            signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        exited, _, _ = select.select([pidfd], [], [], timeout_s)
        if not exited and kill:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            select.select([pidfd], [], [], timeout_s)
        return bool(exited)
    except ProcessLookupError:  # it exited before a signal reached it
        return True
    finally:
        os.close(pidfd)
