"""``ccw helper start|stop|status``: a detached helper that outlives each ``ccw`` command.

Why a detached helper.  ``ccw-mcp`` runs for a whole agent session, so its embedded
helper (a child that dies with it) lives as long as the capsules are used.  The ``ccw``
command is one process per command: an embedded helper would start, recover every
capsule from disk, mount what the command needs, and die again at the end of each
command, and an exec's jail would never outlive the command anyway.  Capsules would
survive (they are on disk and the next helper re-registers them), but every command
would pay for a helper start and a remount.  So the CLI uses, in this order:

1. ``CCW_HELPER_SOCKET`` (``--helper-socket``), when it answers: the system service.
2. The state dir's own helper socket, ``<state>/helper/helper.sock``, when a helper
   answers there: one started by an earlier ``ccw`` command, or the embedded helper of
   a ``ccw-mcp`` running on the same state dir (the same path ``mcp_server.helper``
   uses, so the CLI and a server share capsules).
3. Otherwise it starts a *detached* helper on that socket: double-forked, in a session
   of its own, stdin from /dev/null, its log appended to ``<state>/helper/helper.log``,
   without ``--die-with-parent``.  It runs until ``ccw helper stop`` (or a reboot);
   ``ccw helper status`` shows it.  A lock file (``start.lock``, flock) makes two
   commands that start at once share one helper, because ``recover()`` assumes it is
   the only helper on its state dir.

``ccw helper stop`` finds the pid from the listening socket itself (SO_PEERCRED names
the process that called ``listen()``), so a stale pid file can never make it signal
the wrong process, and refuses a socket that systemd listens on (pid 1: the service is
stopped with systemctl).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp_server.config import Config
from sandbox.client import BlockingClient
from sandbox.errors import CcwError

START_TIMEOUT_S = 60.0  # the helper recovers every capsule before it listens
STOP_TIMEOUT_S = 15.0  # SIGTERM lets in-flight execs finish; then SIGKILL
HELLO_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class HelperPaths:
    """Where the state dir's own helper keeps its socket, log and lock."""

    directory: Path
    socket: Path
    log: Path
    lock: Path

    @classmethod
    def of(cls, state_dir: str) -> HelperPaths:
        """The paths for ``state_dir`` (the same as mcp_server.helper's embedded helper)."""
        directory = Path(state_dir) / "helper"
        return cls(directory, directory / "helper.sock", directory / "helper.log", directory / "start.lock")


def answering(socket_path: str) -> dict[str, Any] | None:
    """``hello`` when a helper answers on ``socket_path``, else None."""
    try:
        with BlockingClient(socket_path, HELLO_TIMEOUT_S) as client:
            return client.hello()
    except (OSError, CcwError):
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


def _spawn_detached(argv: list[str], log_path: Path, ready_w: int) -> None:
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
            os.set_inheritable(ready_w, True)  # every other descriptor is close-on-exec
            os.chdir("/")
            os.execv(argv[0], argv)
        finally:
            os._exit(127)
    os.waitpid(pid, 0)


def _log_tail(log_path: Path, lines: int = 20) -> str:
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def start(state_dir: str, timeout_s: float = START_TIMEOUT_S) -> dict[str, Any]:
    """Start the state dir's detached helper unless one answers; its status."""
    paths = HelperPaths.of(state_dir)
    paths.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(paths.lock, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if answering(str(paths.socket)) is not None:
            return {**status_of(str(paths.socket)), "started": False}
        ready_r, ready_w = os.pipe()
        argv = [sys.executable, "-m", "sandbox", "--socket", str(paths.socket),
                "--state-dir", str(paths.directory), "--ready-fd", str(ready_w)]
        try:
            with open(paths.log, "ab") as log:
                log.write(f"--- ccw helper start {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n".encode())
            _spawn_detached(argv, paths.log, ready_w)
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
                           + _log_tail(paths.log), {"log": str(paths.log)})
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
    }


def stop(state_dir: str, timeout_s: float = STOP_TIMEOUT_S) -> dict[str, Any]:
    """Stop the state dir's helper (SIGTERM, then SIGKILL); what was stopped."""
    paths = HelperPaths.of(state_dir)
    socket_path = str(paths.socket)
    if answering(socket_path) is None:
        return {"socket": socket_path, "stopped": False, "pid": None, "reason": "no helper answers there"}
    pid = listener_pid(socket_path)
    if pid is None or pid == 1:
        raise CcwError("CONFLICT", f"{socket_path} is held by {'systemd' if pid == 1 else 'an unknown process'}; "
                       "stop the service with systemctl stop ccw-helper.service")
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return {"socket": socket_path, "stopped": True, "pid": pid}
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        exited, _, _ = select.select([pidfd], [], [], timeout_s)
        if not exited:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            select.select([pidfd], [], [], timeout_s)
    except ProcessLookupError:
        pass
    finally:
        os.close(pidfd)
    # A helper killed by SIGKILL leaves its socket file: the next start removes it as stale.
    return {"socket": socket_path, "stopped": True, "pid": pid, "forced": not exited}


def ensure(config: Config, autostart: bool = True) -> dict[str, Any]:
    """Make sure a helper answers for ``config``; which one (see the module docstring)."""
    if config.helper_socket:
        info = answering(config.helper_socket)
        if info is not None:
            return {"socket": config.helper_socket, "mode": info.get("mode"), "started": False}
        print(f"ccw: CCW_HELPER_SOCKET={config.helper_socket} does not answer; using the state dir's helper",
              file=sys.stderr)
    paths = HelperPaths.of(config.state_dir)
    info = answering(str(paths.socket))
    if info is not None:
        return {"socket": str(paths.socket), "mode": info.get("mode"), "started": False}
    if not autostart:
        raise CcwError("UNAVAILABLE", f"no helper answers for state dir {config.state_dir}; "
                       "run ccw helper start (or drop --no-autostart)")
    started = start(config.state_dir)
    with contextlib.suppress(OSError):
        print(f"ccw: started a helper for {config.state_dir} (pid {started.get('pid')}, "
              f"{started.get('mode')} mode); ccw helper stop ends it", file=sys.stderr)
    return started
