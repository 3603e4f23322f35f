"""An agent cannot widen its own allowlist (issue 37): over HTTP, capsule_network needs the
``admin`` scope, which an agent's token (read, write, exec, promote) does not have; the
tool is not in the ``agent`` profile; and a change names who made it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx2
import pytest
from jsonschema import Draft202012Validator

from mcp_server.config import Config
from mcp_server.server import CcwServer
from mcp_server.state import State
from mcp_server.tools.network import who
from mcp_server.tools.registry import Registry
from tests.support.mcp_process import ServerProcess, http_token_env

TOKENS = {"tokens": [
    {"name": "agent", "token": "agent-token-0123456789", "scopes": ["read", "write", "exec", "promote"]},
    {"name": "operator", "token": "admin-token-0123456789", "scopes": ["admin"]},
]}
CALL = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "capsule_network", "arguments": {"capsule_id": "cap_0123456789abcdef",
                                                           "allow": ["0.0.0.0/0:22"]}}}


@pytest.fixture
def server(tmp_path: Path):
    proc = ServerProcess(http_token_env(tmp_path, TOKENS, CCW_TOOLSETS="capsule", CCW_WORKSPACE=str(tmp_path)))
    proc.wait_ready()
    yield proc
    proc.stop()


def _post(http: httpx2.Client, url: str, token: str, message: dict[str, Any]) -> httpx2.Response:
    return http.post(url, json=message, headers={"authorization": f"Bearer {token}",
                                                 "accept": "application/json, text/event-stream"})


def test_an_agents_token_cannot_change_or_read_rules_over_http(server: ServerProcess) -> None:
    url = server.path
    with httpx2.Client(timeout=30) as http:
        for arguments in (CALL["params"]["arguments"], {"capsule_id": "cap_0123456789abcdef"}):
            message = {**CALL, "params": {"name": "capsule_network", "arguments": arguments}}
            denied = _post(http, url, "agent-token-0123456789", message)
            assert denied.status_code == 403, denied.text
            assert "lacks scope 'admin'" in denied.json()["error"]["message"], denied.text
        # The same request with the person's token passes the gate (and meets the handler's
        # NOT_FOUND for a capsule that does not exist, or the session's own rules: anything but 403).
        passed = _post(http, url, "admin-token-0123456789", CALL)
        assert passed.status_code != 403, passed.text


def test_the_agent_profile_has_no_way_to_change_rules() -> None:
    agent = Registry.load(["agent"])
    proposing = agent.lookup("capsule_network")  # proposals only: over stdio no token stops an allow
    assert proposing is not None
    assert set(proposing.input_schema["properties"]) == {"capsule_id", "propose", "reason", "proposal", "wait_ms"}
    validator = Draft202012Validator(proposing.input_schema)
    for change in ({"allow": ["example.org"]}, {"remove": ["example.org"]}, {"caps": {"max_bytes": 1}},
                   {"proposal": 1, "decide": "approve"}):
        assert not validator.is_valid({"capsule_id": "cap_a", **change}), change
    assert validator.is_valid({"capsule_id": "cap_a", "propose": ["example.org:443"], "reason": "docs"})
    whole = Registry.load(["agent", "capsule"]).lookup("capsule_network")  # its family named: whole
    assert whole is not None and "allow" in whole.input_schema["properties"]


def test_one_server_checks_each_connections_capsule_network_by_its_own_schema(tmp_path: Path) -> None:
    """Validators are kept per spec: an agent-profile connection beside a whole one is refused
    an allow, whichever list was made first."""
    state_dir = tmp_path / "state"
    server = CcwServer(Config.from_env({"CCW_STATE_DIR": str(state_dir), "CCW_TOOLSETS": "capsule"}), State(state_dir))
    whole = server.tools.registry.lookup("capsule_network")
    proposing = server.tool_list(["agent"]).registry.lookup("capsule_network")
    assert whole is not None and proposing is not None
    allow = {"capsule_id": "cap_a", "allow": ["example.org"]}
    assert server.argument_errors(whole, allow) == []
    assert [e["msg"] for e in server.argument_errors(proposing, allow)] == [
        "Additional properties are not allowed ('allow' was unexpected)"]
    every = Registry.load(Config().toolsets)
    spec = every.lookup("capsule_network")
    assert spec is not None and spec.scope == "admin" and spec.turn is None


def test_who_names_the_token_or_the_uid_and_the_client() -> None:
    assert who(SimpleNamespace(runs=SimpleNamespace(owner="operator"))) == "token operator"  # type: ignore[arg-type]
    ccw = SimpleNamespace(runs=SimpleNamespace(owner=None), caller_lent=True)  # the ccw command lent its environment
    assert who(ccw).endswith("(ccw)") and who(ccw).startswith("uid ")  # type: ignore[arg-type]
    client = SimpleNamespace(runs=SimpleNamespace(owner=None), caller_lent=False)
    assert who(client).endswith("(mcp client)")  # type: ignore[arg-type]
