"""Scopes over Streamable HTTP, as a client meets them: ``tools/list`` shows a token only the
tools its scopes reach (ToolSpec.scopes, a tool whose scope depends on its arguments under
each it may need), and a call it may not make is a 403 with the MCP authorization spec's
``insufficient_scope`` challenge and a JSON-RPC error with the request's id, which an SDK
client hands its session as the call's error (transports/http.py, step 5)."""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest
import trio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from mcp_server.tools.registry import Registry
from tests.support.mcp_process import ServerProcess, http_token_env

TOOLSETS = ("server", "file", "capsule")
TOKENS = {"tokens": [
    {"name": "reader", "token": "read-token-0123456789", "scopes": ["read"]},
    {"name": "runner", "token": "exec-token-0123456789", "scopes": ["exec"]},
    {"name": "boss", "token": "admin-token-0123456789", "scopes": ["admin"]},
]}
EXEC = {"capsule_id": "cap_0123456789abcdef", "cmd": ["true"]}

# The SDK's HTTP client leaves SSE async generators for trio to finalise (test_server_http.py says more).
SDK_CLIENT_GC = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <async_generator object:pytest.PytestUnraisableExceptionWarning"
)


def bearer(name: str) -> dict[str, str]:
    token = next(t["token"] for t in TOKENS["tokens"] if t["name"] == name)
    return {"authorization": f"Bearer {token}"}


@pytest.fixture
def server(tmp_path: Path):
    proc = ServerProcess(http_token_env(tmp_path, TOKENS, CCW_TOOLSETS=",".join(TOOLSETS),
                                        CCW_WORKSPACE=str(tmp_path)))
    proc.wait_ready()
    yield proc
    proc.stop()


@SDK_CLIENT_GC
@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_tools_list_shows_a_token_only_what_it_may_call(server: ServerProcess, mode: str) -> None:
    async def listed(who: str) -> set[str]:
        async with (
            httpx2.AsyncClient(headers=bearer(who), timeout=30) as http,
            Client(streamable_http_client(server.path, http_client=http), mode=mode) as client,
        ):
            return {tool.name for tool in (await client.list_tools()).tools}

    tools = Registry.load(TOOLSETS).tools
    reader, runner, boss = (trio.run(listed, who) for who in ("reader", "runner", "boss"))
    assert boss == {spec.name for spec in tools}
    assert reader == {spec.name for spec in tools if spec.scope == "read"}
    assert "ccw_info" in reader and "capsule_exec" not in reader and "capsule_network" not in reader
    # exec proposes network rules and merges into a new capsule: those tools are its too.
    assert {"capsule_exec", "capsule_network", "capsule_merge"} <= runner and "ccw_info" not in runner
    assert runner == {spec.name for spec in tools if "exec" in spec.scopes}


@SDK_CLIENT_GC
def test_resource_lists_show_a_token_only_what_it_may_read(server: ServerProcess) -> None:
    async def listed(who: str) -> set[str]:
        async with (
            httpx2.AsyncClient(headers=bearer(who), timeout=30) as http,
            Client(streamable_http_client(server.path, http_client=http)) as client,
        ):
            templates = (await client.list_resource_templates()).resource_templates
            return {one.uri_template for one in templates} | {str(one.uri) for one in
                                                             (await client.list_resources()).resources}

    readable = {one.uri_template for one in Registry.load(TOOLSETS).resources}
    assert "list://{+path}" in readable
    reader, runner, boss = (trio.run(listed, who) for who in ("reader", "runner", "boss"))
    assert reader == boss == readable and runner == set()


@SDK_CLIENT_GC
def test_a_call_the_token_may_not_make_is_an_error_its_session_reads(server: ServerProcess) -> None:
    with httpx2.Client(timeout=30) as http:
        call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                "params": {"name": "capsule_exec", "arguments": EXEC}}
        denied = http.post(server.path, json=call, headers={**bearer("reader"),
                                                            "accept": "application/json, text/event-stream"})
    why = "token 'reader' lacks scope 'exec', which tool 'capsule_exec' needs"
    assert denied.status_code == 403
    assert denied.headers["www-authenticate"] == 'Bearer realm="ccw", error="insufficient_scope", scope="exec"'
    assert denied.json() == {"jsonrpc": "2.0", "id": 7, "error": {"code": -32000, "message": why, "data": {
        "error": {"code": "PERMISSION_DENIED", "message": why, "details": {"scope": "exec"}}}}}

    async def call_it() -> MCPError:
        async with (
            httpx2.AsyncClient(headers=bearer("reader"), timeout=30) as client_http,
            Client(streamable_http_client(server.path, http_client=client_http), mode="legacy") as client,
        ):
            with pytest.raises(MCPError) as raised:
                await client.call_tool("capsule_exec", EXEC)
            assert (await client.call_tool("ccw_info", {})).structured_content is not None  # the session goes on
            return raised.value

    refused = trio.run(call_it)
    assert (refused.code, refused.message) == (-32000, why)
