"""The MCP Inspector's CLI (npm @modelcontextprotocol/inspector) drives ccw-mcp over stdio and HTTP.

A client ccw did not write lists the tools and calls capsule_create and capsule_exec.
Over HTTP it sends the server's bearer token (``--header``), and without it is refused.
Over stdio each inspector call starts its own ccw-mcp (and embedded helper): the
capsule made by one call is used by the next, as it would be across an agent's restarts.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcp_server.config import TOOLSETS
from tests.support.mcp_process import ServerProcess, server_env

ROOT = Path(__file__).resolve().parent.parent
INSPECTOR = ROOT / ".cache" / "npm" / "node_modules" / ".bin" / "mcp-inspector"
CCW_MCP = ROOT / ".venv" / "bin" / "ccw-mcp"


@pytest.fixture
def inspector(require: Any, root_required: None) -> Path:
    require(INSPECTOR.exists(), "the MCP Inspector is not installed (./dev setup installs it with npm)")
    return INSPECTOR


def _inspect(target: list[str], *args: str) -> dict[str, Any]:
    done = subprocess.run([str(INSPECTOR), "--cli", *target, *args], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "hello.txt").write_text("hello from the workspace\n")
    return ws


def _capsule_round(target: list[str], ws: Path) -> None:
    listed = _inspect(target, "--method", "tools/list")
    names = {tool["name"] for tool in listed["tools"]}
    assert {"capsule_create", "capsule_exec", "capsule_diff", "capsule_promote"} <= names
    created = _inspect(target, "--method", "tools/call", "--tool-name", "capsule_create",
                       "--tool-arg", f"workspace={ws}")
    assert created.get("isError") is not True, created
    capsule_id = created["structuredContent"]["capsule_id"]
    ran = _inspect(
        target, "--method", "tools/call", "--tool-name", "capsule_exec",
        "--tool-arg", f"capsule_id={capsule_id}", "--tool-arg", 'cmd=["sh","-c","cat hello.txt; echo made > new.txt"]',
    )
    assert ran.get("isError") is not True, ran
    assert ran["structuredContent"]["exit_code"] == 0
    assert ran["structuredContent"]["stdout"] == "hello from the workspace\n"
    assert json.loads(ran["content"][0]["text"]) == ran["structuredContent"]
    assert not (ws / "new.txt").exists()


def test_inspector_over_stdio(inspector: Path, tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    _capsule_round(["-e", f"CCW_STATE_DIR={tmp_path / 'state'}", str(CCW_MCP)], ws)


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(server_env(tmp_path, MCP_ENDPOINT="http", CCW_TOOLSETS=",".join(TOOLSETS)))
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def test_inspector_over_http(inspector: Path, tmp_path: Path, http_server: ServerProcess) -> None:
    # HTTP authenticates every caller, loopback included: the inspector sends the token
    # the server generated in its state dir.
    authorization = http_server.bearer()["authorization"]
    target = [http_server.path, "--transport", "http", "--header", f"Authorization: {authorization}"]
    _capsule_round(target, _workspace(tmp_path))
    refused = subprocess.run([str(INSPECTOR), "--cli", http_server.path, "--transport", "http", "--method",
                              "tools/list"], capture_output=True, text=True, timeout=120, check=False)
    assert refused.returncode != 0 and "missing or unknown bearer token" in refused.stdout + refused.stderr
