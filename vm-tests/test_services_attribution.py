"""Whose is what: a run's journal row names only what that run did, when a service runs
beside execs and file-tool edits (issue 36: "an exec must still end as it does now ...
its own touched files"; "a service is a run ... whose writes and reads are traced as an
exec's are"; "every connection ... journaled").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mcp_server.journal import Journal
from tests.support.agent_loop import edit
from tests.support.netfixtures import HttpLoopback

SERVER = ["python3", "-m", "http.server", "8765", "--bind", "127.0.0.1"]

# Fetches the host's gate through the capsule's proxy every 0.2 s, as a service that calls
# an allowed API would.
POLLER = r"""
import os, socket, sys, time
host, port = os.environ["HTTP_PROXY"].rsplit("/", 1)[-1].rsplit(":", 1)
while True:
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(f"GET http://127.0.0.1:{sys.argv[1]}/ HTTP/1.0\r\n\r\n".encode())
        print(s.recv(100).split(b"\r\n")[0].decode(), flush=True)
    time.sleep(0.2)
"""


def _service_row(t: Any, cap: str, name: str) -> dict[str, Any]:
    [row] = [row for row in Journal(t.runtime.state).execs(cap) if row.get("service") == name]
    return row


def test_a_services_written_set_holds_neither_an_execs_writes_nor_a_file_tools(tools: Any, tmp_path: Path) -> None:
    """The service's row lists neither ``exec.txt``, which an exec wrote while the service
    ran, nor ``app.txt``, which the agent wrote through ``edit_text_file``: each recording
    notes what other processes closed after writing (sandbox/fanotify_record.py
    ``_written_outside``), and the upper dir's changes are a run's own only if it wrote
    them or no one else did (sandbox/execution.py ``_touched``)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "app.txt").write_text("version 1\n")

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("capsule_service_start", {"capsule_id": cap, "name": "web", "cmd": SERVER,
                                               "ready": {"port": 8765}})
        wrote = await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", "echo x > exec.txt"]})
        await edit(t.call, cap, ws, "app.txt", "version 1", "version 2")
        await t.call("capsule_service_stop", {"capsule_id": cap, "name": "web", "grace_ms": 1000})
        row = _service_row(t, cap, "web")
        await t.call("capsule_destroy", {"capsule_id": cap})
        return {"exec": wrote["touched"]["written"], "service": row["touched"]["written"]}

    out = tools.run(scenario)
    assert out["exec"] == ["exec.txt"], out
    assert "exec.txt" not in out["service"] and "app.txt" not in out["service"], out


def test_an_execs_connections_are_its_own_and_a_services_are_journaled(tools: Any, tmp_path: Path) -> None:
    """In an allowlist capsule, ``sleep 1``'s row lists none of the connections the
    capsule's service made while it ran, and the service's row lists them.  All the
    capsule's runs share one network namespace, so the proxy tells them apart by the
    cgroup v2 id the kernel keeps on each connecting socket (egress/runs.py), which names
    the service: each service of an allowlist capsule has a v2 cgroup of its own
    (sandbox/run_sockets.py)."""
    ws = tmp_path / "ws"
    ws.mkdir()

    async def scenario(t: Any, gate: HttpLoopback) -> dict[str, Any]:
        network = {"allow": [f"127.0.0.1:{gate.port}"]}
        cap = (await t.call("capsule_create", {"workspace": str(ws), "network": network}))["capsule_id"]
        await t.call("capsule_service_start", {"capsule_id": cap, "name": "poller", "cmd": [
            "python3", "-c", POLLER, str(gate.port)], "ready": {"line": " 200 ", "timeout_ms": 30_000}})
        quiet = await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sleep", "1"]})
        await t.call("capsule_service_stop", {"capsule_id": cap, "name": "poller", "grace_ms": 1000})
        row = _service_row(t, cap, "poller")
        await t.call("capsule_destroy", {"capsule_id": cap})
        return {"exec": quiet["touched"]["network"], "service": row["touched"]["network"]}

    with HttpLoopback() as gate:
        out = tools.run(lambda t: scenario(t, gate))
    assert gate.accepted >= 2  # the service did talk to the host, through the proxy
    assert out["exec"] == [], f"`sleep 1` is journaled with {len(out['exec'] or [])} connections, its service's"
    assert out["service"] and all(r["host"] == "127.0.0.1" and r["allowed"] for r in out["service"]), out["service"]
