"""The ``ccw`` command's daemon (mcp_server/frontdaemon.py) keeps what it runs: a ``ccw-mcp``
that starts while it runs a service and forwards a port attaches to it instead of taking the
state dir over (the service and the forward go on), and ``ccw helper stop`` refuses to end
the service unless forced."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.cli_process import ccw  # noqa: E402
from tests.support.pages import page  # noqa: E402
from tests.support.raw_mcp import RawStdio, structured  # noqa: E402

PORT = 8783
SERVER = ["python3", "-u", "-m", "http.server", str(PORT), "--bind", "127.0.0.1"]


def test_a_new_server_attaches_to_the_daemon_that_runs_a_service(cli_state: Path, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "index.txt").write_text("served from the capsule\n")
    cap = ccw(cli_state, "capsule", "create", "--no-auto-expose", str(ws)).stdout.strip()
    started = ccw(cli_state, "capsule", "service", "start", cap, "web", "--ready-port", str(PORT), "--", *SERVER)
    assert started.stdout == "web: ready\n", started.stdout
    url = json.loads(ccw(cli_state, "capsule", "port", cap, str(PORT), "--json").stdout)["url"]
    daemon = json.loads(ccw(cli_state, "helper", "status", "--json").stdout)["frontend_pid"]

    # An agent's session comes and goes (the trial's repro: the daemon yielded, and its service was lost).
    with RawStdio(cli_state, "capsule", tasks=None) as agent:
        assert [c["capsule_id"] for c in structured(agent.call("capsule_list", {}))["capsules"]] == [cap]
        assert any("tools=relayed" in line for line in agent.stderr), agent.stderr
    assert page(url + "index.txt") == b"served from the capsule\n"
    listed = json.loads(ccw(cli_state, "capsule", "service", "list", cap, "--json").stdout)
    assert [(one["name"], one["state"]) for one in listed["services"]] == [("web", "ready")]
    assert json.loads(ccw(cli_state, "helper", "status", "--json").stdout)["frontend_pid"] == daemon

    # Stopping the helper would end the service: refused, with what and how.
    refused = ccw(cli_state, "helper", "stop", check=False)
    assert refused.returncode == 1, refused.stdout
    assert f"CONFLICT: the front end of {cli_state} (pid {daemon}) runs service {cap}/web (ready)" in refused.stderr
    assert "ccw capsule service stop CAP NAME" in refused.stderr and "--force" in refused.stderr, refused.stderr
    assert page(url + "index.txt") == b"served from the capsule\n"
    ccw(cli_state, "capsule", "service", "stop", cap, "web")
    stopped = json.loads(ccw(cli_state, "helper", "stop", "--json").stdout)  # nothing runs: no refusal
    assert stopped["frontend_stopped"] is True
