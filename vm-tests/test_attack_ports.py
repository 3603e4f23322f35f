"""Attacks on a forwarded port by another local user (issue 36: "a forwarded port refuses a
connection from another local uid"), through a real Runtime and an embedded helper.

Any local user can connect to the host's loopback as fast as the kernel accepts.  A
flood of such connections is refused one by one (ccw-forward's owner check, before a byte
is read), the port's ``refused`` count stays exact, the owner's own requests go on being
served meanwhile, and the capsule's events get at most one ``refused`` event a second
per peer uid (capsules/ports.py ``Refusals``), so the flood cannot push the capsule's
other events out of the bounded log.
"""

from __future__ import annotations

import errno
import subprocess
import time
from pathlib import Path
from typing import Any

import trio

from mcp_server.events import EventLog
from tests.support.pages import page
from tests.support.users import OTHER_UID

SERVER = ["python3", "-u", "-m", "http.server", "8765", "--bind", "127.0.0.1"]
FLOOD = 3000

# As the other user: FLOOD connections, each closed at once, as fast as they go; prints
# how many the port closed without an answer (all of them, if it refuses them).
_FLOOD = """
import socket, sys
port, count = int(sys.argv[1]), int(sys.argv[2])
closed = 0
for _ in range(count):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n")
    try:
        closed += s.recv(100) == b""
    except ConnectionResetError:
        closed += 1
    s.close()
print(closed)
"""


def test_another_users_flood_is_refused_counted_exactly_and_folded_in_events(tools: Any, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "index.txt").write_text("the owner's page\n")

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("capsule_service_start", {"capsule_id": cap, "name": "web", "cmd": SERVER,
                                               "ready": {"port": 8765, "timeout_ms": 20000}})
        url = (await t.call("capsule_port", {"capsule_id": cap, "port": 8765}))["url"]
        out: dict[str, Any] = {"cap": cap, "owner_pages": []}
        started = time.monotonic()
        async with trio.open_nursery() as nursery:
            async def flood() -> None:
                out["flood"] = await trio.run_process(
                    ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups",
                     "/usr/bin/python3", "-c", _FLOOD, url.rsplit(":", 1)[1].strip("/"), str(FLOOD)],
                    capture_stdout=True, capture_stderr=True, check=False)
                nursery.cancel_scope.cancel()

            nursery.start_soon(flood)
            while True:  # the owner's requests, all through the flood
                out["owner_pages"].append(await trio.to_thread.run_sync(page, url + "index.txt"))
                await trio.sleep(0.05)
        out["seconds"] = time.monotonic() - started
        out["list"] = await t.call("capsule_service_list", {"capsule_id": cap})
        out["events"] = [e for e in EventLog(t.runtime.state).since(0, cap, limit=100000)
                         if e.kind == "port" and e.data.get("state") == "refused"]
        await t.call("capsule_destroy", {"capsule_id": cap})
        return out

    out = tools.run(scenario)
    flood: subprocess.CompletedProcess[bytes] = out["flood"]
    assert flood.returncode == 0, flood.stderr
    assert int(flood.stdout) == FLOOD  # every one closed unanswered
    assert out["owner_pages"] and set(out["owner_pages"]) == {b"the owner's page\n"}
    [port] = out["list"]["ports"]
    assert port["refused"] == FLOOD and port["accepted"] == len(out["owner_pages"])
    events = out["events"]
    assert {e.data["peer_uid"] for e in events} == {OTHER_UID}
    assert 1 <= len(events) <= out["seconds"] + 2, (len(events), out["seconds"])
    assert len(events) + sum(e.data["more"] for e in events) <= FLOOD


# As the other user: listen on [::1] at the forwarded port, where a browser's localhost tries
# first; prints "listening", or the errno that refused it.
_SQUAT = """
import socket, sys
s = socket.socket(socket.AF_INET6)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
try:
    s.bind(("::1", int(sys.argv[1])))
    s.listen(1)
    print("listening")
except OSError as exc:
    print(exc.errno)
"""


def test_another_user_cannot_stand_in_for_the_port_at_ipv6_localhost(tools: Any, tmp_path: Path) -> None:
    """The forward listens on 127.0.0.1 alone; [::1] at its port was free for any user, and a
    browser sends http://localhost:PORT/ to ::1 first: the owner's requests, with their cookies
    and callback codes, went to the other user's program and never to the forward."""
    ws = tmp_path / "ws"
    ws.mkdir()

    async def scenario(t: Any) -> tuple[str, str]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("capsule_service_start", {"capsule_id": cap, "name": "web", "cmd": SERVER,
                                               "ready": {"port": 8765, "timeout_ms": 20000}})
        url = (await t.call("capsule_port", {"capsule_id": cap, "port": 8765}))["url"]
        squat = ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups",
                 "/usr/bin/python3", "-c", _SQUAT, url.rsplit(":", 1)[1].strip("/")]
        held = await trio.run_process(squat, capture_stdout=True, check=True)
        await t.call("capsule_destroy", {"capsule_id": cap})
        freed = await trio.run_process(squat, capture_stdout=True, check=True)
        return held.stdout.decode().strip(), freed.stdout.decode().strip()

    held, freed = tools.run(scenario)
    assert held == str(errno.EADDRINUSE)
    assert freed == "listening"  # given back with the port
