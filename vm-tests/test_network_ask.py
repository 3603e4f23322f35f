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
