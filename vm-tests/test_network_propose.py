"""An agent's proposal approved by a person, the way a user would see it (issue 37, "Proposals").

A real ``ccw-mcp`` on Streamable HTTP with a tokens file: the agent is the official SDK
client holding a token without ``admin`` (read, write, exec, promote), as an agent's
token is.  Its capsule's rules leave out the port its package index answers on (the
servers of ``netfixtures``, in a network namespace of their own), so its ``pip install``
is denied.  The agent proposes that one rule with a reason; a person sees it in ``ccw net
pending`` and approves it with ``ccw net approve``; the agent, waiting on its proposal,
learns it was approved, and its next install in the same capsule completes.  ``ccw
capsule net`` and the journal's events say who approved it and whose proposal it was.

Nothing here sends a packet anywhere but loopback and the namespace the test makes.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from mcp_server.events import EventLog
from mcp_server.state import State
from tests.support import netfixtures as nf
from tests.support.cli_process import ccw
from tests.support.mcp_process import ServerProcess, server_env

SERVER = nf.SERVER_ADDRESS
HTTP = f"{SERVER}:{nf.HTTP_PORT}"
HTTPS = f"{SERVER}:{nf.HTTPS_PORT}"
PYTHON = "/usr/bin/python3"
AGENT_TOKEN, OPERATOR_TOKEN = "agent-token-0123456789abcdef", "operator-token-0123456789abcdef"
TOKENS = {"tokens": [{"name": "agent", "token": AGENT_TOKEN, "scopes": ["read", "write", "exec", "promote"]},
                     {"name": "operator", "token": OPERATOR_TOKEN, "scopes": ["admin"]}]}

# The SDK's HTTP client leaves the response streams of its calls to the garbage collector
# (httpx2 async generators, in this test process): its ResourceWarnings are the client's.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture
def servers(tmp_path: Path, root_required: None) -> Iterator[nf.Servers]:
    root = tmp_path / "srv"
    nf.build_wheel(root / "wheels")
    with nf.server_namespace(root, "http://denied.example/next") as running:
        yield running


@pytest.fixture
def front_end(tmp_path: Path, root_required: None) -> Iterator[ServerProcess]:
    """The state dir's front end, on HTTP with the agent's token in its tokens file."""
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps(TOKENS))
    tokens.chmod(0o600)
    server = ServerProcess(server_env(tmp_path, MCP_ENDPOINT="http", CCW_TOKENS_FILE=str(tokens),
                                      CCW_TOOLSETS="capsule,policy"))
    server.wait_ready()
    yield server
    server.stop()


@contextlib.asynccontextmanager
async def agent(server: ServerProcess, token: str = AGENT_TOKEN) -> AsyncIterator[Client]:
    """The official SDK client with the agent's token (or another)."""
    async with (
        httpx2.AsyncClient(headers={"authorization": f"Bearer {token}"},
                           timeout=httpx2.Timeout(30, read=300)) as http,
        Client(streamable_http_client(server.path, http_client=http), mode="legacy") as client,
    ):
        yield client


async def call(client: Client, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    """The structured result of ``tool``, which must not fail; an exec waits for its end (a busy
    machine's venv and install may take longer than a client's usual minute)."""
    if tool == "capsule_exec":
        args = {"wait_ms": 280_000, **args}
    result = await client.call_tool(tool, args, read_timeout_seconds=300)
    assert not result.is_error, result
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def _install(servers: nf.Servers) -> list[str]:
    return [".venv/bin/pip", "install", "--no-cache-dir", "--disable-pip-version-check", "--index-url",
            servers.index, "--trusted-host", SERVER, "--retries", "0", "--timeout", "20", "ccwtiny"]


def _person_approves(state: Path, seen: dict[str, Any]) -> None:
    """What a person does: look at what waits, then approve the proposal."""
    listed = json.loads(ccw(state, "net", "pending", "--json").stdout)["pending"]
    seen["pending"] = listed
    seen["pending_text"] = ccw(state, "net", "pending").stdout
    seen["approved"] = json.loads(ccw(state, "net", "approve", str(listed[0]["id"]), "--json").stdout)


def test_an_agents_proposal_approved_with_ccw_net_lets_its_install_through(
        tmp_path: Path, servers: nf.Servers, front_end: ServerProcess) -> None:
    ws = tmp_path / "project"
    ws.mkdir()
    state = tmp_path / "state"

    async def scenario() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with agent(front_end) as client:
            made = await call(client, "capsule_create", {"workspace": str(ws), "network": [HTTPS]})
            cap = seen["cap"] = made["capsule_id"]
            venv = await call(client, "capsule_exec", {"capsule_id": cap, "cmd": [PYTHON, "-m", "venv", ".venv"],
                                                       "timeout_ms": 120_000})
            assert venv["exit_code"] == 0, venv["stderr"]
            seen["denied"] = await call(client, "capsule_exec", {"capsule_id": cap, "cmd": _install(servers),
                                                                 "timeout_ms": 120_000})
            seen["proposed"] = await call(client, "capsule_network", {
                "capsule_id": cap, "propose": [HTTP], "reason": "the project's package index answers on 8080"})
            ident = seen["proposed"]["proposal"]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.to_thread.run_sync, _person_approves, state, seen)
                seen["outcome"] = await call(client, "capsule_network", {"capsule_id": cap, "proposal": ident,
                                                                         "wait_ms": 60_000})
            seen["installed"] = await call(client, "capsule_exec", {"capsule_id": cap, "cmd": _install(servers),
                                                                    "timeout_ms": 120_000})
        return seen

    seen = trio.run(scenario)
    cap = seen["cap"]
    denied = seen["denied"]
    assert denied["exit_code"] != 0
    assert any(r["port"] == nf.HTTP_PORT and not r["allowed"] for r in denied["touched"]["network"])
    ident, proposal = seen["proposed"]["proposal"], seen["proposed"]["outcome"]
    assert (proposal["state"], proposal["proposer"], proposal["rules"]) == ("pending", "token agent", [HTTP])
    assert seen["proposed"]["network"]["allow"] == [HTTPS]  # proposing changed nothing
    [listed] = seen["pending"]
    assert listed["id"] == ident and listed["kind"] == "proposal"
    assert f"{ident}: token agent proposes for {cap}: {HTTP}" in seen["pending_text"]
    assert "reason: the project's package index answers on 8080" in seen["pending_text"]
    approved = seen["approved"]
    assert approved["state"] == "capsule" and approved["who"].endswith("(ccw net)")
    assert approved["applied"] == "change 1", approved
    outcome = seen["outcome"]["outcome"]
    assert outcome["state"] == "approved" and outcome["applied"] == "change 1"
    assert HTTP in seen["outcome"]["network"]["allow"]
    installed = seen["installed"]
    assert installed["exit_code"] == 0, installed["stderr"]
    assert any(r["port"] == nf.HTTP_PORT and r["allowed"] and r["rule"] == HTTP
               for r in installed["touched"]["network"])
    # Who approved it, and whose proposal it was: in the rules' history and the journal's events.
    shown = ccw(state, "capsule", "net", cap).stdout
    assert f"by {approved['who']}, approving proposal {ident} of token agent: +{HTTP}" in shown, shown
    store = State(state)
    try:
        kinds = [(e.kind, e.data.get("who")) for e in EventLog(store).since(0) if e.kind.startswith("net.")]
    finally:
        store.close()
    assert ("net.answer", approved["who"]) in kinds
    assert ("net.rules", f"{approved['who']}, approving proposal {ident} of token agent") in kinds


def test_a_policy_that_lists_the_rule_approves_the_proposal_at_once(
        tmp_path: Path, servers: nf.Servers, front_end: ServerProcess) -> None:
    ws = tmp_path / "project"
    ws.mkdir()
    fetch = ["curl", "-sS", "--noproxy", "", "--max-time", "20", "-o", "/dev/null", "-w", "%{http_code}",
             f"{servers.http}/simple/"]

    async def scenario() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with agent(front_end, OPERATOR_TOKEN) as person:  # the person writes the policy
            await call(person, "policy_set", {"name": "team", "rules": {"network": {"approve": [HTTP]}}})
        async with agent(front_end) as client:
            made = await call(client, "capsule_create", {"workspace": str(ws),
                                                         "network": {"allow": [HTTPS], "policy": "team"}})
            cap = seen["cap"] = made["capsule_id"]
            seen["before"] = await call(client, "capsule_exec", {"capsule_id": cap, "cmd": fetch})
            seen["beyond"] = await call(client, "capsule_network", {
                "capsule_id": cap, "propose": [f"{SERVER}:{nf.REDIRECT_PORT}"], "reason": "not listed"})
            seen["proposed"] = await call(client, "capsule_network", {
                "capsule_id": cap, "propose": [HTTP], "reason": "the package index"})
            seen["after"] = await call(client, "capsule_exec", {"capsule_id": cap, "cmd": fetch})
        return seen

    seen = trio.run(scenario)
    assert seen["before"]["stdout"] == "403", seen["before"]
    assert seen["beyond"]["outcome"]["state"] == "pending"  # a rule the policy does not list waits for a person
    ident, proposal = seen["proposed"]["proposal"], seen["proposed"]["outcome"]
    assert (proposal["state"], proposal["who"], proposal["applied"]) == ("approved", "policy team", "change 1")
    assert seen["after"]["stdout"] == "200", seen["after"]
    shown = ccw(tmp_path / "state", "capsule", "net", seen["cap"]).stdout
    assert f"by policy team, approving proposal {ident} of token agent: +{HTTP}" in shown, shown
