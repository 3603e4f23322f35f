"""Ask on a miss end to end (issue 37 "Shown by"), through a real ccw-mcp, helper and proxy.

The servers of ``netfixtures`` run in a network namespace of their own (10.98.0.2).  A
capsule's rules leave out the host:port an install needs, and its network says
``on_miss: ask``:

- an agent's ``pip install`` through the official SDK client, which declares
  elicitation: the install is held, the client is asked (the form names the host and the
  command) and answers "allow for this capsule", and the same install completes in the
  same capsule; the rule is now the capsule's (a second install asks nothing), and the
  journal, ``ccw capsule log`` and ``capsule_network`` say who answered;
- a client that cannot elicit: ``ccw net pending`` shows the question and ``ccw net
  approve`` lets the held connection through; a second question left unanswered is
  denied at its time with the message that names the command to allow it.

Nothing here sends a packet anywhere but loopback and the namespaces the tests make.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
import trio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.support import netfixtures as nf
from tests.support.cli_process import ccw
from tests.support.interactive import call
from tests.support.mcp_process import CCW_MCP, server_env

SERVER = nf.SERVER_ADDRESS
HTTP = f"{SERVER}:{nf.HTTP_PORT}"
HTTPS = f"{SERVER}:{nf.HTTPS_PORT}"
REDIRECT = f"{SERVER}:{nf.REDIRECT_PORT}"
PYTHON = "/usr/bin/python3"


@pytest.fixture
def servers(tmp_path: Path, root_required: None) -> Iterator[nf.Servers]:
    root = tmp_path / "srv"
    nf.build_wheel(root / "wheels")
    with nf.server_namespace(root, "http://denied.example/next") as running:
        yield running


def _install(servers: nf.Servers, *more: str) -> list[str]:
    return [".venv/bin/pip", "install", "--no-cache-dir", "--disable-pip-version-check", "--index-url",
            servers.index, "--trusted-host", SERVER, *more, "ccwtiny"]


def test_an_install_held_on_a_miss_goes_on_once_the_agents_client_allows_it(tmp_path: Path,
                                                                            servers: nf.Servers) -> None:
    ws = tmp_path / "project"
    ws.mkdir()
    asked: list[str] = []

    async def answer(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"answer": "allow for this capsule"})

    params = StdioServerParameters(command=str(CCW_MCP), env=server_env(tmp_path, CCW_TOOLSETS="capsule"))

    async def scenario() -> dict[str, Any]:
        async with Client(params, mode="legacy", elicitation_callback=answer) as client:
            network = {"allow": [HTTPS], "on_miss": "ask", "ask_timeout_ms": 60_000}  # the index's port left out
            cap = (await call(client, "capsule_create", {"workspace": str(ws), "network": network}))["capsule_id"]
            venv = await call(client, "capsule_exec", {"capsule_id": cap, "cmd": [PYTHON, "-m", "venv", ".venv"],
                                                       "timeout_ms": 120_000})
            pip = await call(client, "capsule_exec", {"capsule_id": cap, "cmd": _install(servers),
                                                      "timeout_ms": 120_000})
            again = await call(client, "capsule_exec", {"capsule_id": cap, "timeout_ms": 120_000,
                                                        "cmd": _install(servers, "--force-reinstall")})
            rules = await call(client, "capsule_network", {"capsule_id": cap})
            return {"cap": cap, "venv": venv, "pip": pip, "again": again, "rules": rules}

    out = trio.run(scenario)
    assert out["venv"]["exit_code"] == 0, out["venv"]["stderr"]
    assert out["pip"]["exit_code"] == 0, out["pip"]["stderr"]
    assert len(asked) == 1 and f"{HTTP} (http)" in asked[0] and "pip install" in asked[0]
    held = [r for r in out["pip"]["touched"]["network"] if r.get("asked")]
    assert held and {r["port"] for r in held} == {nf.HTTP_PORT}
    [first] = held[:1]
    assert first["allowed"] is True and first["rule"] == HTTP
    assert first["asked"]["answer"] == "capsule" and "elicitation" in first["asked"]["who"]
    assert out["again"]["exit_code"] == 0 and len(asked) == 1  # the rule is the capsule's now: nothing asked
    assert not [r for r in out["again"]["touched"]["network"] if r.get("asked")]
    assert HTTP in out["rules"]["network"]["allow"]
    [change] = out["rules"]["changes"]
    assert change["allow"] == [HTTP] and "elicitation" in change["who"]
    log = ccw(tmp_path / "state", "capsule", "show", out["cap"], "2").stdout
    assert f"asked (question {first['asked']['question']}): capsule by uid" in log, log


def test_without_elicitation_a_person_answers_with_ccw_net_and_silence_is_a_denial(
        tools: Any, tmp_path: Path, servers: nf.Servers) -> None:
    ws = tmp_path / "project"
    ws.mkdir()
    state = tmp_path / "state"  # the tools fixture's state dir
    curl = ["curl", "-sS", "-o", "/dev/stderr", "-w", "%{http_code}", f"http://{REDIRECT}/"]

    def person(seen: dict[str, Any]) -> None:
        for _ in range(200):  # until the question is there, as a person running ccw net pending would
            listed = json.loads(ccw(state, "net", "pending", "--json").stdout)["pending"]
            if listed:
                seen["pending"] = listed
                seen["approved"] = json.loads(ccw(state, "net", "approve", str(listed[0]["id"]), "--json").stdout)
                return
            subprocess.run(["sleep", "0.1"], check=True)

    async def scenario(t: Any) -> dict[str, Any]:
        network = {"allow": [HTTPS], "on_miss": "ask", "ask_timeout_ms": 20_000}
        cap = (await t.call("capsule_create", {"workspace": str(ws), "network": network}))["capsule_id"]
        seen: dict[str, Any] = {"cap": cap}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, person, seen)
            seen["fetch"] = await t.call("capsule_exec", {"capsule_id": cap, "timeout_ms": 60_000, "cmd": [
                "curl", "-sS", "--fail", "-o", "/dev/null", "-w", "%{http_code}", f"{servers.http}/simple/"]})
        seen["silence"] = await t.call("capsule_exec", {"capsule_id": cap, "cmd": curl, "timeout_ms": 60_000})
        return seen

    seen = tools.run(scenario)
    [question] = seen["pending"]
    assert (question["host"], question["port"], question["protocol"]) == (SERVER, nf.HTTP_PORT, "http")
    assert question["command"].startswith("curl ") and question["waiters"] == 1
    assert seen["approved"]["state"] == "once" and seen["approved"]["who"].endswith("(ccw net)")
    assert seen["fetch"]["exit_code"] == 0 and seen["fetch"]["stdout"] == "200", seen["fetch"]["stderr"]
    # Nobody answers the second: denied at its time, saying how to allow it.
    silence = seen["silence"]
    assert silence["stdout"] == "403", silence
    assert f"ccw capsule net {seen['cap']} allow {REDIRECT}" in silence["stderr"]
    [record] = [r for r in silence["touched"]["network"] if r["port"] == nf.REDIRECT_PORT]
    assert record["allowed"] is False and record["asked"]["answer"] == "expired"


# In the jail: ATTEMPTS CONNECTs through the proxy to names no rule allows, 400 at a time;
# prints how each ended: a 403, the connection closed or reset (the proxy's accept queue
# overflowing), or still waiting after a minute (none may).
FLOOD = r"""
import asyncio, collections, json, os
host, port = os.environ["HTTP_PROXY"].rsplit("/", 1)[-1].rsplit(":", 1)
async def one(i, gate):
    async with gate:
        try:
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(f"CONNECT h{i}.example:443 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            line = await asyncio.wait_for(reader.readline(), 60)
            writer.close()
            return "403" if line.startswith(b"HTTP/1.1 403") else "closed"
        except asyncio.TimeoutError:
            return "waiting"
        except OSError:
            return "closed"
async def main():
    gate = asyncio.Semaphore(400)
    print(json.dumps(collections.Counter(await asyncio.gather(*(one(i, gate) for i in range(ATTEMPTS))))))
asyncio.run(main())
"""


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_jail_flooding_unlisted_hosts_gets_a_bounded_pending_list(tools: Any, tmp_path: Path,
                                                                   root_required: None) -> None:
    ws = tmp_path / "project"
    ws.mkdir()
    attempts = 10_000
    from mcp_server.capsules import asks

    async def scenario(t: Any) -> dict[str, Any]:
        network = {"allow": ["192.0.2.1:443"], "on_miss": "ask", "ask_timeout_ms": 2000}
        cap = (await t.call("capsule_create", {"workspace": str(ws), "network": network}))["capsule_id"]
        seen: dict[str, Any] = {"most_pending": 0, "rss_before": _rss_kb()}

        async def watch() -> None:
            while True:
                seen["most_pending"] = max(seen["most_pending"], len(asks.pending(t.runtime.state)))
                await trio.sleep(0.05)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            seen["flood"] = await t.call("capsule_exec", {"capsule_id": cap, "timeout_ms": 300_000, "cmd": [
                PYTHON, "-c", FLOOD.replace("ATTEMPTS", str(attempts))]})
            nursery.cancel_scope.cancel()
        seen["rss_after"] = _rss_kb()
        seen["questions"] = t.runtime.state.execute("SELECT COUNT(*) AS n FROM net_questions")[0]["n"]
        return seen

    seen = tools.run(scenario)
    flood = seen["flood"]
    assert flood["exit_code"] == 0, flood["stderr"]
    ended = json.loads(flood["stdout"])
    assert ended.get("waiting", 0) == 0 and ended["403"] >= attempts * 0.9, ended  # every one refused, none hanging
    assert 1 <= seen["most_pending"] <= asks.MAX_PENDING_PER_CAPSULE
    # The exec's connection cap (512) bounds what is even considered; the questions are fewer.
    assert seen["questions"] <= 512
    assert seen["rss_after"] - seen["rss_before"] < 64 * 1024, seen
    reasons = {str(r["reason"]) for r in flood["touched"]["network"]}
    assert any("questions about the network pending" in why for why in reasons), sorted(reasons)[:5]
