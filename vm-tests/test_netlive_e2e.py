"""Live rules end to end (issue 37 "Shown by"): a rule removed while a download runs cuts
that download; a service started before a rule was added reaches the newly allowed host
without a restart; ``ccw capsule net`` shows and changes the rules, and says who did.

The download comes from ``netfixtures``' server namespace (its fixed addresses: this file
is in vm-tests/conftest.py's SHARED group); the service's host is a server on the host's
loopback, reached through the capsule's proxy by an exact-address rule.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from mcp_server.events import EventLog
from sandbox.errors import CcwError
from tests.support import netfixtures as nf
from tests.support.cli_process import ccw
from tests.support.netfixtures import HttpLoopback

HTTP = f"{nf.SERVER_ADDRESS}:{nf.HTTP_PORT}"
HTTPS = f"{nf.SERVER_ADDRESS}:{nf.HTTPS_PORT}"
SIZE = 32 << 20
# At 1 MiB/s the 32 MiB download runs for half a minute: far longer than the cut needs.
CURL = ["curl", "-sS", "--fail", "--limit-rate", "1M", "-o", "/dev/null", "-w", "%{size_download}",
        f"http://{HTTP}/files/big.bin"]
# Asks the host's server through the capsule's proxy every 0.2 s and prints the status line.
POLLER = r"""
import os, socket, sys, time
host, port = os.environ["HTTP_PROXY"].rsplit("/", 1)[-1].rsplit(":", 1)
while True:
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(f"GET http://127.0.0.1:{sys.argv[1]}/ HTTP/1.0\r\n\r\n".encode())
        print(s.recv(100).split(b"\r\n")[0].decode(), flush=True)
    time.sleep(0.2)
"""


@pytest.fixture
def servers(tmp_path: Path, root_required: None) -> Iterator[nf.Servers]:
    root = tmp_path / "srv"
    nf.big_file(root, "big.bin", SIZE)
    with nf.server_namespace(root, "http://denied.example/next") as running:
        yield running


async def _downloading(t: Any, cap: str) -> None:
    """Until the proxy has connected the capsule's download (its live event), and a second
    more, so that the cut comes in the middle of the file, not before its first byte."""
    log = EventLog(t.runtime.state)
    with trio.fail_after(30):
        while not any(e.kind == "net.connection" and e.data.get("allowed")  # noqa: ASYNC110 (the database's rows)
                      for e in log.since(0, cap)):
            await trio.sleep(0.05)
    await trio.sleep(1.0)


def test_removing_a_rule_cuts_the_download_it_allowed(tools: Any, tmp_path: Path, servers: nf.Servers) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws), "network": [HTTP, HTTPS]}))["capsule_id"]
        ran: dict[str, Any] = {}

        async def download() -> None:
            ran.update(await t.call("capsule_exec", {"capsule_id": cap, "cmd": CURL, "timeout_ms": 120_000}))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(download)
            await _downloading(t, cap)
            changed = await t.call("capsule_network", {"capsule_id": cap, "remove": [HTTP]})
        shown = await t.call("capsule_network", {"capsule_id": cap})
        events = [e.data for e in EventLog(t.runtime.state).since(0, cap) if e.kind == "net.rules"]
        await t.call("capsule_destroy", {"capsule_id": cap})
        return {"ran": ran, "changed": changed, "shown": shown, "events": events}

    out = tools.run(scenario)
    ran, changed = out["ran"], out["changed"]
    assert ran["exit_code"] != 0, ran  # curl saw the connection end before the file did
    [record] = [r for r in ran["touched"]["network"] if r["allowed"]]
    assert 0 < record["bytes_in"] < SIZE, record
    assert record["cut"].startswith(f"rules changed to {changed['rules']} by uid 0"), record
    assert record["rules"] == changed["changes"][0]["previous"] != changed["rules"]
    assert [c["port"] for c in changed["cut"]] == [nf.HTTP_PORT] and changed["network"]["allow"] == [HTTPS]
    assert any(note.startswith(f"ccw network: cut http {HTTP}") for note in ran["network_notes"]), ran["network_notes"]
    assert out["shown"]["changes"] == changed["changes"] and out["shown"]["changed"] is False
    [event] = out["events"]
    assert event["remove"] == [HTTP] and event["who"].startswith("uid 0") and event["rules"] == changed["rules"]


def test_a_running_service_reaches_a_host_allowed_after_it_started(tools: Any, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()

    async def scenario(t: Any, first: HttpLoopback, later: HttpLoopback) -> dict[str, Any]:
        cap = (await t.call("capsule_create",
                            {"workspace": str(ws), "network": [f"127.0.0.1:{first.port}"]}))["capsule_id"]
        await t.call("capsule_service_start", {"capsule_id": cap, "name": "poller", "cmd": [
            "python3", "-c", POLLER, str(later.port)], "ready": {"line": " 403 ", "timeout_ms": 30_000}})
        before = later.accepted
        changed = await t.call("capsule_network", {"capsule_id": cap, "allow": [f"127.0.0.1:{later.port}"]})
        with trio.fail_after(30):
            logs = {"text": ""}
            while " 200 " not in logs["text"]:
                await trio.sleep(0.2)
                logs = await t.call("capsule_service_logs", {"capsule_id": cap, "name": "poller"})
        services = await t.call("capsule_service_list", {"capsule_id": cap})
        await t.call("capsule_service_stop", {"capsule_id": cap, "name": "poller", "grace_ms": 1000})
        await t.call("capsule_destroy", {"capsule_id": cap})
        return {"before": before, "changed": changed, "logs": logs["text"], "services": services}

    with HttpLoopback() as first, HttpLoopback() as later:
        out = tools.run(lambda t: scenario(t, first, later))
        assert out["before"] == 0 and later.accepted >= 1  # denied at the gate until the rule came
    lines = [line for line in out["logs"].splitlines() if line.startswith("HTTP/")]
    assert " 403 " in lines[0] and " 200 " in lines[-1], lines
    [poller] = out["services"]["services"]
    assert poller["state"] in ("running", "ready") and poller.get("restarts", 0) == 0, poller  # never restarted
    assert out["changed"]["changed"] and out["changed"]["cut"] == []


def test_ccw_capsule_net_shows_and_changes_the_rules(cli_state: Path, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    cap = ccw(cli_state, "capsule", "create", str(ws), "--network", "pypi.org").stdout.strip()
    changed = json.loads(ccw(cli_state, "capsule", "net", cap, "allow", "GitHub.com:443", "remove", "pypi.org",
                             "allow", "files.pythonhosted.org", "--max-connections", "64", "--json").stdout)
    assert changed["network"] == {"allow": ["files.pythonhosted.org", "github.com:443"], "max_bytes": 1 << 30,
                                  "max_connections": 64}
    [change] = changed["changes"]
    assert change["who"] == f"uid {0} (ccw)" and change["remove"] == ["pypi.org"]
    shown = ccw(cli_state, "capsule", "net", cap).stdout
    assert f"{cap}: rules {changed['rules']}" in shown and "  allow github.com:443" in shown
    assert "by uid 0 (ccw): +GitHub.com:443 +files.pythonhosted.org -pypi.org max_connections=64" in shown, shown
    refused = ccw(cli_state, "capsule", "net", cap, "remove", "example.com", check=False)
    assert refused.returncode != 0 and "not in force" in refused.stderr, refused.stderr
    none = ccw(cli_state, "capsule", "create", str(ws)).stdout.strip()
    refused = ccw(cli_state, "capsule", "net", none, "allow", "pypi.org", check=False)
    assert refused.returncode != 0 and "no egress side" in refused.stderr, refused.stderr
    ccw(cli_state, "capsule", "destroy", cap)
    ccw(cli_state, "capsule", "destroy", none)


def _fetch(port: int) -> list[str]:
    # --noproxy '': through the proxy, although the jail's NO_PROXY names the capsule's own loopback.
    return ["curl", "-sS", "--noproxy", "", "-o", "/dev/null", "-w", "%{http_code}", f"http://127.0.0.1:{port}/"]


def test_a_replay_runs_each_exec_under_the_rules_its_witness_recorded(tools: Any, tmp_path: Path) -> None:
    """Exec 1 reached gate A; then A's rule was removed and exec 2 was denied it.  A replay
    allowed both gates still denies exec 2 (it runs under the rules recorded for it), so the
    replay matches; a replay allowed B only is refused, naming A's rule."""
    ws = tmp_path / "ws"
    ws.mkdir()

    async def scenario(t: Any, a: HttpLoopback, b: HttpLoopback) -> dict[str, Any]:
        rule_a, rule_b = f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"
        cap = (await t.call("capsule_create", {"workspace": str(ws), "network": [rule_a, rule_b]}))["capsule_id"]
        one = await t.call("capsule_exec", {"capsule_id": cap, "cmd": _fetch(a.port)})
        await t.call("capsule_network", {"capsule_id": cap, "remove": [rule_a]})
        two = await t.call("capsule_exec", {"capsule_id": cap, "cmd": _fetch(a.port)})
        witness = await t.call("capsule_witness", {"capsule_id": cap})
        replayed = await t.call("capsule_replay", {"witness_id": witness["witness_id"], "network": [rule_a, rule_b]})
        try:
            await t.call("capsule_replay", {"witness_id": witness["witness_id"], "network": [rule_b]})
            refused: Any = None
        except CcwError as exc:
            refused = exc
        await t.call("capsule_destroy", {"capsule_id": cap})
        return {"one": one, "two": two, "replayed": replayed, "refused": refused, "rule_a": rule_a}

    with HttpLoopback() as a, HttpLoopback() as b:
        out = tools.run(lambda t: scenario(t, a, b))
    assert out["one"]["stdout"] == "200" and out["two"]["stdout"] == "403", (out["one"], out["two"])
    replayed = out["replayed"]
    assert replayed["replay_ok"] and replayed["output_identical"], replayed["mismatches"]
    refused = out["refused"]
    assert refused is not None and refused.code == "PERMISSION_DENIED", refused
    assert refused.details["lacking"] == [out["rule_a"]] and refused.details["exec"] == 1
