"""The tool pipeline of CcwServer, in process: tool errors, output-schema checks, deprecated
aliases, resources, roots (with refresh on list_changed), direct methods and scopes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
import trio
from mcp import Client
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError

from mcp_server.config import Config
from mcp_server.server import CcwServer
from mcp_server.state import State
from mcp_server.tools import server_info
from mcp_server.tools.registry import Registry, ResourceSpec, ToolSpec
from sandbox.errors import CcwError

OBJECT = {"type": "object", "properties": {}, "additionalProperties": False}
SHAPE = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}


async def fails(ctx, args: dict[str, Any]) -> dict[str, Any]:
    raise CcwError("NOT_FOUND", "capsule cap_1 does not exist; call capsule_list to see yours", {"capsule_id": "cap_1"})


async def wrong_shape(ctx, args: dict[str, Any]) -> dict[str, Any]:
    return {"n": "not a number"}


async def counts(ctx, args: dict[str, Any]) -> dict[str, Any]:
    return {"n": 1}


async def listing(ctx, uri: str) -> tuple[str, str]:
    path = uri.removeprefix("list://")
    if path == "missing":
        raise CcwError("NOT_FOUND", f"{path} does not exist")
    return "application/json", json.dumps({"path": path})


def make_server(tmp_path: Path, debug: bool = True) -> CcwServer:
    config = dataclasses.replace(
        Config.from_env({"CCW_STATE_DIR": str(tmp_path / "state"), "CCW_TOOLSETS": "server"}), debug=debug
    )
    registry = Registry()
    for spec in server_info.TOOLS:
        registry.add(spec)
    registry.add(ToolSpec("fails", "server", "always fails", OBJECT, SHAPE, fails, scope="exec"))
    registry.add(ToolSpec("wrong_shape", "server", "breaks its schema", OBJECT, SHAPE, wrong_shape))
    registry.add(ToolSpec("counts", "server", "fine", OBJECT, SHAPE, counts, scope="write",
                          aliases=("count/it",), deprecated_aliases=("count",)))
    registry.resources.append(ResourceSpec("list://{+path}", "listing", "a directory listing", "server", listing))
    return CcwServer(config, State(config.state_dir), registry)


def run_client(server: CcwServer, body, **client_options):
    async def main():
        async with Client(server.sdk, mode="legacy", **client_options) as client:
            return await body(client)

    return trio.run(main)


def test_tool_error_is_structured(tmp_path: Path):
    server = make_server(tmp_path)

    async def body(client):
        return await client.call_tool("fails", {})

    result = run_client(server, body)
    assert result.is_error is True
    error = {"code": "NOT_FOUND", "message": "capsule cap_1 does not exist; call capsule_list to see yours",
             "details": {"capsule_id": "cap_1"}}
    assert result.structured_content == {"error": error}
    assert json.loads(result.content[0].text) == {"error": error}


@pytest.mark.parametrize("debug", [True, False])
def test_output_schema_checked_in_debug(tmp_path: Path, debug: bool):
    server = make_server(tmp_path, debug=debug)

    async def body(client):
        await client.list_tools()
        try:
            return await client.session.call_tool("wrong_shape", {})
        except MCPError as exc:
            return exc

    if debug:
        outcome = run_client(server, body)
        assert isinstance(outcome, MCPError) and outcome.error.code == -32603
        assert "output schema" in outcome.error.message
    else:
        # Unchecked, the result goes out as it is (the SDK client would then refuse it).
        answer = trio.run(server.run_direct, 1, "wrong_shape", {})
        assert answer["result"] == {"n": "not a number"}


def test_deprecated_alias_logs_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    server = make_server(tmp_path)

    async def body(client):
        await client.list_tools()
        first = await client.call_tool("count/it", {})
        second = await client.call_tool("count", {})
        return first, second

    first, second = run_client(server, body)
    assert first.structured_content == second.structured_content == {"n": 1}
    warned = [r.getMessage() for r in caplog.records if r.name == "ccw.mcp" and r.levelname == "WARNING"]
    assert len(warned) == 1 and "'count' is a deprecated alias of 'counts'" in warned[0]


def test_resources(tmp_path: Path):
    server = make_server(tmp_path)

    async def body(client):
        templates = await client.list_resource_templates()
        resources = await client.list_resources()
        read = await client.read_resource("list://src/app")
        with pytest.raises(MCPError) as missing:
            await client.read_resource("list://missing")
        with pytest.raises(MCPError) as unmatched:
            await client.read_resource("other://x")
        return templates, resources, read, missing.value, unmatched.value

    templates, resources, read, missing, unmatched = run_client(server, body)
    assert [t.uri_template for t in templates.resource_templates] == ["list://{+path}"]
    assert resources.resources == []
    assert json.loads(read.contents[0].text) == {"path": "src/app"}
    assert missing.error.code == -32002 and unmatched.error.code == -32002


def test_roots_asked_once_and_refreshed_on_list_changed(tmp_path: Path):
    server = make_server(tmp_path)
    roots = ["/work/a"]
    asked: list[int] = []

    async def list_roots(context):
        asked.append(1)
        return types.ListRootsResult(roots=[types.Root(uri=f"file://{r}") for r in roots])

    async def body(client):
        await client.list_tools()
        first = (await client.call_tool("ccw_info", {})).structured_content["roots"]
        roots[:] = ["/work/b", "/work/a b"]
        cached = (await client.call_tool("ccw_info", {})).structured_content["roots"]
        with pytest.warns(MCPDeprecationWarning):
            await client.send_roots_list_changed()
        await trio.sleep(0.05)  # the notification is handled concurrently
        fresh = (await client.call_tool("ccw_info", {})).structured_content["roots"]
        return first, cached, fresh

    first, cached, fresh = run_client(server, body, list_roots_callback=list_roots)
    assert first == ["/work/a"]
    assert cached == ["/work/a"]
    assert fresh == ["/work/a b", "/work/b"]
    assert len(asked) == 2


def test_roots_none_without_capability(tmp_path: Path):
    server = make_server(tmp_path)

    async def body(client):
        return (await client.call_tool("ccw_info", {})).structured_content["roots"]

    assert run_client(server, body) is None


def test_direct_methods(tmp_path: Path):
    server = make_server(tmp_path)
    assert server.is_direct_method("ccw_info") and server.is_direct_method("count/it")
    assert not server.is_direct_method("tools/call") and not server.is_direct_method("nope")

    async def main():
        return (
            await server.run_direct(1, "counts", None),
            await server.run_direct(2, "fails", {}),
            await server.run_direct(3, "counts", [1]),
            await server.run_direct(4, "counts", {"extra": True}),
            await server.run_direct(5, "wrong_shape", {}),
        )

    ok, failed, not_object, bad_args, broken = trio.run(main)
    assert ok == {"jsonrpc": "2.0", "id": 1, "result": {"n": 1}}
    assert failed["error"]["code"] == -32000
    assert failed["error"]["data"]["error"]["code"] == "NOT_FOUND"
    assert not_object["error"]["code"] == -32602
    assert bad_args["error"]["code"] == -32602
    assert bad_args["error"]["data"]["errors"] == [
        {"path": "", "msg": "Additional properties are not allowed ('extra' was unexpected)"}
    ]
    assert broken["error"]["code"] == -32603


def test_scopes(tmp_path: Path):
    server = make_server(tmp_path)
    assert server.scope_for("tools/call", {"name": "fails"}) == "exec"
    assert server.scope_for("tools/call", {"name": "count"}) == "write"
    assert server.scope_for("counts", {}) == "write"
    assert server.scope_for("resources/read", {"uri": "list://x"}) == "read"
    assert server.scope_for("tools/list", None) is None
    assert server.scope_for("initialize", {}) is None
