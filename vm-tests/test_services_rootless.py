"""Services as an unprivileged user, through the rootless helper (issue 36).

A user made for the test runs an agent's session: its own ``ccw-mcp`` on stdio, whose
embedded helper is rootless (a user namespace of its own).  It starts a web server as a
service, reaches it from an exec on the capsule's loopback, forwards its port and fetches
the page from the host as itself.  While the port is open the test (root) connects to it
as another uid and as root: both are closed before a byte is read, counted as refused,
and the server never sees them.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from tests.support.users import OTHER_UID, UserScript

HERE = Path(__file__).resolve().parent

SCRIPT = r"""
import json, sys, urllib.request
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import trio
from tests.support import agent_loop
from tests.support.mcp_process import agent_server_env
from tests.support.users import step
from sandbox.errors import CcwError

ws, state = Path(sys.argv[2]), Path(sys.argv[3])
SERVER = ["python3", "-m", "http.server", "8765", "--bind", "127.0.0.1"]
FAST = ["sh", "-c", "echo fast-out-1; echo fast-err-1 >&2; exit 3"]
FETCH = ["python3", "-c", "import urllib.request as u; print(u.urlopen('http://127.0.0.1:8765/index.txt').read().decode())"]

def get(url):
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.read().decode()

async def main():
    out = {}
    async with agent_loop.mcp_stdio(agent_server_env(state, ws)) as call:
        cap = (await call("capsule_create", {"workspace": str(ws), "auto_expose": False}))["capsule_id"]
        out["start"] = await call("capsule_service_start", {"capsule_id": cap, "name": "web", "cmd": SERVER,
                                                            "ready": {"port": 8765, "timeout_ms": 30000}})
        out["fetch"] = await call("capsule_exec", {"capsule_id": cap, "cmd": FETCH})
        out["port"] = await call("capsule_port", {"capsule_id": cap, "port": 8765})
        out["host_fetch"] = await trio.to_thread.run_sync(get, out["port"]["url"] + "index.txt")
        await trio.to_thread.run_sync(step, {"step": "forwarded", "host_port": out["port"]["host_port"]})
        out["list"] = await call("capsule_service_list", {"capsule_id": cap})
        for tool in ("capsule_pause", "capsule_fork"):  # nothing to freeze the server with: both refused
            try:
                out[tool] = await call(tool, {"capsule_id": cap})
            except CcwError as exc:
                out[tool] = {"code": exc.code, "message": exc.message}
        out["after_refusals"] = await call("capsule_exec", {"capsule_id": cap, "cmd": FETCH})
        await call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", "echo made > made.txt"]})
        out["promote"] = await call("capsule_promote", {"capsule_id": cap})
        with trio.move_on_after(15):  # its output comes in a few times a second
            while (await call("capsule_service_logs", {"capsule_id": cap, "name": "web"}))["text"].count("GET") < 3:
                await trio.sleep(0.1)
        out["logs"] = await call("capsule_service_logs", {"capsule_id": cap, "name": "web"})
        out["stop"] = await call("capsule_service_stop", {"capsule_id": cap, "name": "web"})
        out["stopped_logs"] = await call("capsule_service_logs", {"capsule_id": cap, "name": "web"})
        out["fast"] = await call("capsule_service_start", {"capsule_id": cap, "name": "fast1", "cmd": FAST,
                                                           "ready": {"port": 8005, "timeout_ms": 10000}})
        await call("capsule_destroy", {"capsule_id": cap})
    step({"step": "done", **out}, wait=False)

try:
    trio.run(main)
except BaseExceptionGroup as group:  # the MCP client's task groups wrap the scenario's failure
    raise agent_loop.leaf(group) from None
"""

# A client of the forwarded port: what it got back ("closed": nothing, the connection ended).
STRANGER = r"""
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
try:
    s.sendall(b"GET /index.txt HTTP/1.0\r\n\r\n")
    print("closed" if s.recv(100) == b"" else "answered")
except (BrokenPipeError, ConnectionResetError):
    print("closed")
"""


def test_a_user_serves_reaches_and_forwards_through_the_rootless_helper(user_dir: tuple[int, int, Path]) -> None:
    uid, gid, home = user_dir
    ws, state = home / "ws", home / "state"
    ws.mkdir()
    state.mkdir()
    (ws / "index.txt").write_text("served from a user's capsule\n")
    subprocess.run(["chown", "-R", f"{uid}:{gid}", str(ws), str(state)], check=True)
    argv = [sys.executable, "-c", SCRIPT, str(HERE.parent), str(ws), str(state)]
    with UserScript(uid, gid, argv, home) as script:
        port = script.receive()["host_port"]
        stranger = subprocess.run(["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups",
                                   "/usr/bin/python3", "-c", STRANGER, str(port)], capture_output=True, text=True)
        root = subprocess.run(["/usr/bin/python3", "-c", STRANGER, str(port)], capture_output=True, text=True)
        script.send("go on")
        out = script.receive()
        script.finish()
    assert out["start"]["ready"] is True, out["start"]
    assert out["fetch"]["exit_code"] == 0 and out["fetch"]["stdout"] == "served from a user's capsule\n\n"
    # A rootless helper: no fanotify in a user namespace, so no read set, and the reason instead.
    assert out["fetch"]["touched"]["read"] is None and out["fetch"]["touched_unavailable"]["read"], out["fetch"]
    assert out["host_fetch"] == "served from a user's capsule\n"
    # Another uid, and root too: not the capsule's owner, so closed, and counted.
    assert (stranger.stdout, root.stdout) == ("closed\n", "closed\n"), (stranger, root)
    assert [p["refused"] for p in out["list"]["ports"]] == [2], out["list"]["ports"]
    # No rule on the host's network from a rootless helper: the owner's page came by the relay.
    assert [(p["path"], p["accepted"]) for p in out["list"]["ports"]] == [("relay", 1)], out["list"]["ports"]
    # No freezer for a rootless helper's runs: a pause that froze nothing, or a fork under a
    # server still writing through its open files, would be a lie; both refused, nothing changed.
    for tool, doing in (("capsule_pause", "paused"), ("capsule_fork", "forked")):
        assert out[tool]["code"] == "UNSUPPORTED" and f"cannot be {doing}" in out[tool]["message"], out[tool]
        assert "['web']" in out[tool]["message"], out[tool]
    assert out["after_refusals"]["exit_code"] == 0, out["after_refusals"]
    # Promotion goes on beside the running server, and says it was not frozen.
    assert out["promote"]["promoted"] is True and (ws / "made.txt").read_text() == "made\n", out["promote"]
    ran_on = out["promote"]["policy_report"]["services"]
    assert [(s["name"], s["frozen"]) for s in ran_on] == [("web", False)] and "rootless" in ran_on[0]["unfrozen"]
    # The server saw the two execs' requests and the user's, nothing of the refused two.
    assert out["logs"]["text"].count('"GET /index.txt HTTP/1.1" 200') == 3, out["logs"]["text"]
    assert "HTTP/1.0" not in out["logs"]["text"]
    assert out["stop"]["state"] == "stopped", out["stop"]
    # A stopped service's logs stay readable; one that ended at once logged its last words.
    assert out["stopped_logs"]["state"] == "stopped" and out["stopped_logs"]["text"].startswith(out["logs"]["text"])
    assert out["fast"]["ready"] is False and out["fast"]["log_tail"].splitlines()[1:] == [
        "fast-out-1", "fast-err-1", "[ccw: fast1 ended: exit 3]"], out["fast"]
    with socket.socket() as probe:  # the forward ended with its capsule
        assert probe.connect_ex(("127.0.0.1", port)) != 0
