"""The ``ccw`` command's front-end daemon, controlled from outside it: asked to yield, asked what
it holds, shown, stopped.

The daemon is a front end like any (frontdoor.py says why there is one per state dir);
what sets it apart is that nobody's session owns it, so others may end it.  Three rules
keep that from losing anybody's work:

* **It yields only when nothing would be lost.**  A ``ccw-mcp`` that starts on the state
  dir asks it to yield (``ask_to_yield``).  It answers "now" only when that asker is its
  one client and it keeps no service and no forwarded port (``Services.holding``:
  capsules/services.py).  Services and forwards live in the front end's process (a
  service is a helper exec held open by it, a forward a listener it holds), so a daemon
  that yielded would end them: the new server would bring back only the services whose
  restart policy says so (the others listed ``lost``), and its forwards perhaps on other
  host ports (capsules/ports.py).  Otherwise it answers "busy"
  and the asker attaches to it (transports/relay.py), as it does while a person's long
  exec runs.  "busy" is the answer an older ``ccw-mcp`` knows; a new word would make it
  stop the daemon instead.
* **``ccw helper stop`` says what it would end.**  It asks the owner which services it
  runs (``ask_what_it_holds``), whose processes the stop ends, and refuses (CONFLICT,
  naming each and how to stop it) unless given ``--force``, as the CLI refuses what
  would lose work elsewhere; an owner that does not know the question (an older ccw) is
  stopped as before.  Forwarded ports do not hold it: they are kept in the state dir and
  the next front end opens them again.
* **A stop waits.**  SIGTERM lets the daemon drain (it finishes the calls it runs);
  ``stop_daemon`` waits for its exit on a pidfd, so the helper is stopped after it.
"""

from __future__ import annotations

import json
import socket
from typing import Any

from mcp_server.caller import CALLER_META
from mcp_server.frontdoor import OPENING_HOLDS, OPENING_YIELD, FrontendPaths, owner_of
from sandbox.errors import CcwError

YIELD_ANSWER_S = 10.0  # a front end that does not answer a question in this long is asked to stop
STOP_TIMEOUT_S = 30.0  # SIGTERM lets the front end finish the calls it is running


def _ask(state_dir: str, key: str) -> Any:
    """The owner's answer to the opening question ``key`` (frontdoor.Opening), or None when it
    does not answer (not listening, or a ccw that does not know the question)."""
    line = json.dumps({CALLER_META: {}, key: True}).encode() + b"\n"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
        sock.settimeout(YIELD_ANSWER_S)
        try:
            sock.connect(str(FrontendPaths.of(state_dir).socket))
            sock.sendall(line)
            answer = sock.makefile("rb").readline(1 << 20)
        except OSError:
            return None
    try:
        return json.loads(answer.partition(b"\n")[0]).get(key)
    except (ValueError, AttributeError):
        return None


def ask_to_yield(state_dir: str) -> str | None:
    """Ask the state dir's daemon to yield: "now" (it drains and exits), "busy" (a client is
    connected to it, or it keeps a service or a forwarded port: it stays), or None when it
    does not answer."""
    said = _ask(state_dir, OPENING_YIELD)
    return said if said in ("now", "busy") else None


def ask_what_it_holds(state_dir: str) -> list[str] | None:
    """What the state dir's front end runs that its end would end (its running services, each
    said in a few words: ``Services.held``); None when it does not answer."""
    said = _ask(state_dir, OPENING_HOLDS)
    return [str(one) for one in said] if isinstance(said, list) else None


def refuse_to_end_held(state_dir: str) -> None:
    """CONFLICT if the state dir's front end runs services that stopping the helper would end
    (``ccw helper stop`` without ``--force``)."""
    owner = owner_of(state_dir)
    if owner is None:
        return
    held = ask_what_it_holds(state_dir)
    if not held:
        return
    raise CcwError("CONFLICT", (
        f"the front end of {state_dir} (pid {owner.get('pid', '?')}) runs {'; '.join(held)}; stopping the helper "
        "ends them (a service comes back at the next start only if its restart policy says so, else it is listed "
        "lost). Stop them first (ccw capsule service stop CAP NAME), or run ccw helper stop --force"),
        {"held": held})


def status(state_dir: str) -> dict[str, Any]:
    """Who serves the state dir: the owner's pid, endpoint, and whether it is the CLI's daemon."""
    from mcp_server.launcher import listener_pid

    path = str(FrontendPaths.of(state_dir).socket)
    owner = owner_of(state_dir)
    if owner is None:
        return {"frontend_socket": path, "frontend_running": False}
    return {"frontend_socket": path, "frontend_running": True, "frontend_pid": listener_pid(path) or owner.get("pid"),
            "frontend_endpoint": owner.get("endpoint"), "frontend_daemon": bool(owner.get("daemon"))}


def stop_daemon(state_dir: str, send_signal: bool = True) -> dict[str, Any]:
    """Stop the CLI's front-end daemon of ``state_dir`` (SIGTERM: it drains, then exits); an
    owner serving an agent (stdio, socket, http) is left alone.  What was done.  Without
    ``send_signal``: only wait for it to exit (it yields on its own: ``ask_to_yield``)."""
    from mcp_server.launcher import end_process

    found = status(state_dir)
    if not found["frontend_running"] or not found.get("frontend_daemon"):
        return {**found, "frontend_stopped": False}
    pid = found.get("frontend_pid")
    if not pid:
        return {**found, "frontend_stopped": False}
    # SIGTERM only, never SIGKILL: the daemon drains, finishing the calls it runs (module
    # docstring, A stop waits); this waits for that, at most STOP_TIMEOUT_S.
    end_process(int(pid), STOP_TIMEOUT_S, terminate=send_signal, kill=False)
    return {**found, "frontend_stopped": True}
