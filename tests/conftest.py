"""Shared fixtures for tests that run anywhere, without root."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from sandbox.client import HelperClient

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    """A fresh CCW_STATE_DIR."""
    path = tmp_path / "state"
    path.mkdir()
    return path


@pytest.fixture(autouse=True)
def _no_user_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests must not pick up a developer's own ccw settings.
    for name in list(os.environ):
        if name.startswith(("CCW_", "MCP_", "SYN_")) and name != "CCW_MUST_WORK":
            monkeypatch.delenv(name, raising=False)


class DirectContext:
    """A ToolContext for calling handlers directly: real config and state, no helper."""

    def __init__(self, state_dir: Path, workspace: Path | None = None, roots: list[str] | None = None) -> None:
        from mcp_server.config import Config
        from mcp_server.state import State

        env = {"CCW_STATE_DIR": str(state_dir)}
        if workspace is not None:
            env["CCW_WORKSPACE"] = str(workspace)
        self.config = Config.from_env(env)
        self.state = State(state_dir)
        self._roots = roots
        self.logs: list[str] = []
        self.progress_calls: list[tuple[float, float | None, str | None]] = []

    async def helper(self) -> HelperClient:  # the ToolContext's type: these tests never get one
        raise AssertionError("this test's tools must not need the helper")

    async def roots(self) -> list[str] | None:
        return self._roots

    @property
    def workspace(self) -> str:
        return str(self.config.workspace)

    async def progress(self, progress: float, total: float | None = None, message: str | None = None,
                       output: Any = None) -> None:
        self.progress_calls.append((progress, total, message))

    def log(self, message: str) -> None:
        self.logs.append(message)


@pytest.fixture
def direct_ctx(state_dir: Path, tmp_path: Path) -> DirectContext:
    """A DirectContext over a fresh state dir, with tmp_path/ws as the workspace."""
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    return DirectContext(state_dir, workspace)


def call_tool(ctx: object, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """Validate args against the tool's input schema, run it, validate the result."""
    import jsonschema
    import trio

    from mcp_server.config import TOOLSETS
    from mcp_server.tools.registry import Registry
    from mcp_server.tools.surface import advertised_output_schema

    spec = Registry.load(TOOLSETS).lookup(name)
    assert spec is not None, f"no tool {name}"
    jsonschema.Draft202012Validator(spec.input_schema).validate(args)
    result: dict[str, Any] = trio.run(spec.handler, ctx, args)
    jsonschema.Draft202012Validator(spec.output_schema).validate(result)
    # What tools/list advertises must be true of every result too (clients validate against it).
    jsonschema.Draft202012Validator(advertised_output_schema(spec)).validate(result)
    return result


@pytest.fixture(name="call_tool")
def call_tool_fixture() -> object:
    """``call_tool(ctx, name, args)``: a schema-checked direct call of a tool handler."""
    return call_tool
