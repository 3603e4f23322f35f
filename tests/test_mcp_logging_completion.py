"""MCP's logging/setLevel and completion/complete over stdio, driven by the SDK's own client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from mcp.shared.exceptions import MCPError
from mcp_types import PromptReference, ResourceTemplateReference

from tests.support.mcp_process import stdio_client

# The SDK marks logging deprecated (it leaves MCP in the 2026 era); 2025-era clients still use it.
pytestmark = pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")


def test_set_level_sends_records_at_that_level_and_not_below(tmp_path: Path) -> None:
    heard: list[Any] = []
    arrived = trio.Event()

    async def on_log(params: Any) -> None:
        heard.append(params)
        arrived.set()

    async def session() -> None:
        client = stdio_client(tmp_path, CCW_TOOLSETS="server,schema")
        client.logging_callback = on_log
        async with client:
            assert client.server_capabilities.logging is not None
            asset = {"asset": {"a": 1}}
            # A deprecated alias logs a warning: not sent at "error" ...
            await client.set_logging_level("error")
            await client.call_tool("validate", asset)
            # ... sent at "warning".  One queue sends in order, so a record of the first call
            # would arrive before the second's.
            await client.set_logging_level("warning")
            await client.call_tool("validate", asset)
            with trio.fail_after(10):
                await arrived.wait()

    trio.run(session)
    assert len(heard) == 1, heard
    assert heard[0].level == "warning" and heard[0].logger == "ccw.mcp"
    assert "'validate' is a deprecated alias of 'validate_asset'" in heard[0].data


def test_completion_of_paths_and_policy_names(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "src" / "main").mkdir(parents=True)
    (root / "src" / "macros").mkdir()
    (root / "src" / "manual.txt").write_text("a file, not a directory\n")
    (root / "docs").mkdir()

    async def session() -> tuple[Any, ...]:
        client = stdio_client(tmp_path, CCW_TOOLSETS="file,policy", CCW_WORKSPACE=str(root))
        async with client:
            assert client.server_capabilities.completions is not None
            template = ResourceTemplateReference(uri="list://{+path}")
            under = await client.complete(template, {"name": "path", "value": "src/ma"})
            top = await client.complete(template, {"name": "path", "value": ""})
            nowhere = await client.complete(template, {"name": "path", "value": "absent/x"})
            policies = await client.complete(PromptReference(name="policy_get"), {"name": "name", "value": ""})
            with pytest.raises(MCPError) as no_tool:
                await client.complete(PromptReference(name="no_such_tool"), {"name": "x", "value": ""})
            with pytest.raises(MCPError) as no_argument:
                await client.complete(PromptReference(name="policy_get"), {"name": "colour", "value": ""})
            return under, top, nowhere, policies, no_tool.value, no_argument.value

    under, top, nowhere, policies, no_tool, no_argument = trio.run(session)
    assert under.completion.values == ["src/macros/", "src/main/"]  # the file is no directory to list
    assert under.completion.total == 2 and under.completion.has_more is False
    assert top.completion.values == ["docs/", "src/"]
    assert nowhere.completion.values == []
    assert "baseline" in policies.completion.values
    assert policies.completion.values == sorted(policies.completion.values)
    assert no_tool.error.code == -32602 and "ccw serves no prompts" in no_tool.error.message
    assert no_argument.error.code == -32602 and "name" in no_argument.error.message

