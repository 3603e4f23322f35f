"""``ccw helper start|stop|status``, and which helper the ``ccw`` command uses.

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
   a ``ccw-mcp`` running on the same state dir (the same path, so the CLI and a server
   share capsules).
3. Otherwise it starts a *detached* helper on that socket (``mcp_server/launcher.py``
   says how); it runs until ``ccw helper stop`` (or a reboot), and ``ccw helper status``
   shows it.

The same two commands show and stop the state dir's front end (``frontend_*`` keys):
``status`` names whoever serves ``frontend.sock`` (an agent's ``ccw-mcp`` or the daemon
the ``ccw`` command started, ``mcp_server/frontdoor.py``); ``stop`` stops that daemon
before the helper, and leaves an agent's ``ccw-mcp`` alone.  While that front end runs
services, which the stop would end, ``stop`` refuses and names them unless given
``force`` (``frontdaemon.refuse_to_end_held``).
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from mcp_server import launcher
from mcp_server.config import Config
from mcp_server.launcher import HelperPaths, answering
from sandbox.errors import CcwError


def run(action: str, state_dir: str, force: bool = False, helper_socket: str = "") -> dict[str, Any]:
    """``ccw helper <action>`` for ``state_dir``: start, stop or status; what it did or found.
    ``status`` names the helper the commands use (``ensure``): ``helper_socket``'s
    (CCW_HELPER_SOCKET) when it answers, else the state dir's."""
    from mcp_server import frontdaemon

    if action == "start":
        return launcher.start_detached(state_dir)
    if action == "stop":
        if not force:
            frontdaemon.refuse_to_end_held(state_dir)
        # The front end the ccw command started uses this helper: it goes first (an agent's
        # ccw-mcp serving the state dir is left alone; it would start a helper again).
        stopped = {**frontdaemon.stop_daemon(state_dir), **launcher.stop(state_dir)}
        if not stopped["stopped"] and helper_socket and answering(helper_socket) is not None:
            # The commands use CCW_HELPER_SOCKET's helper (a system service's, say): "none was
            # running" would send a person who was told to stop it (an older install's) nowhere.
            stopped |= {"given": True, "left_running": helper_socket,
                        "reason": f"the helper the commands use is CCW_HELPER_SOCKET's, {helper_socket} (pid "
                                  f"{launcher.listener_pid(helper_socket)}), and ccw helper stop stops only the "
                                  "state dir's own: restart that one as it was started (systemctl restart "
                                  "ccw-helper.service for the system service), or unset CCW_HELPER_SOCKET"}
        return stopped
    if helper_socket and answering(helper_socket) is not None:
        return {**frontdaemon.status(state_dir), **launcher.status_of(helper_socket), "given": True}
    return {**frontdaemon.status(state_dir), **launcher.status_of(str(HelperPaths.of(state_dir).socket))}


def ensure(config: Config, autostart: bool = True) -> dict[str, Any]:
    """Make sure a helper answers for ``config``; which one (see the module docstring)."""
    if config.helper_socket:
        info = _usable(config.helper_socket)
        if info is not None:
            return {"socket": config.helper_socket, "mode": info.get("mode"), "started": False}
        print(f"ccw: CCW_HELPER_SOCKET={config.helper_socket} does not answer; using the state dir's helper",
              file=sys.stderr)
    paths = HelperPaths.of(config.state_dir)
    info = _usable(str(paths.socket))
    if info is not None:
        return {"socket": str(paths.socket), "mode": info.get("mode"), "started": False}
    if not autostart:
        raise CcwError("UNAVAILABLE", f"no helper answers for state dir {config.state_dir}; "
                       "run ccw helper start (or drop --no-autostart)")
    started = launcher.start_detached(config.state_dir)
    if not started.get("started"):  # another command started it while this one waited for the lock
        return started
    with contextlib.suppress(OSError):
        print(f"ccw: started a helper for {config.state_dir} (pid {started.get('pid')}, "
              f"{started.get('mode')} mode); ccw helper stop ends it", file=sys.stderr)
    return started


def _usable(socket_path: str) -> dict[str, Any] | None:
    """``hello`` of the helper on ``socket_path``, None if none answers; UNSUPPORTED for one of
    another install (left running by an earlier one): starting another beside it would fail."""
    info = answering(socket_path)
    if info is not None and "other_install" in info:
        raise CcwError("UNSUPPORTED", info["other_install"], {"socket": socket_path})
    return info


def describe(action: str, result: dict[str, Any]) -> list[str]:
    """``run``'s result as the lines a person reads (``--json`` gives every field)."""
    lines = []
    given = ", CCW_HELPER_SOCKET" if result.get("given") else ""
    where = f"{result.get('mode')} mode, pid {result.get('pid')} ({result.get('socket')}{given})"
    if action == "start":
        lines.append(f"helper {'started' if result.get('started') else 'already running'}: {where}")
    elif action == "stop":
        forced = ", killed: it did not end in time" if result.get("forced") else ""
        lines.append(f"helper stopped (pid {result.get('pid')}{forced})" if result.get("stopped") else
                     f"helper left running: {result['reason']}" if result.get("left_running") else
                     f"no helper was running ({result.get('reason', 'none answered')})")
    elif result.get("other_install"):
        lines.append(f"helper: running, pid {result.get('pid')}, and not usable: {result['other_install']}")
    else:
        lines.append(f"helper: running, {where}" if result.get("running") else
                     f"helper: not running ({result.get('reason', 'none answers')})")
    if action == "start":
        return lines
    front = f"pid {result.get('frontend_pid')}, " + ("the ccw command's daemon" if result.get("frontend_daemon")
                                                      else "an agent's ccw-mcp")
    if result.get("frontend_stopped"):
        lines.append(f"front end stopped ({front})")
    elif result.get("frontend_running"):
        left = "; left running: it starts a helper again when it needs one" if action == "stop" else ""
        lines.append(f"front end: running ({front}){left}")
    elif action == "status":
        lines.append("front end: not running")
    return lines
