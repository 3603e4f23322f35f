"""SIGTERM while a capsule_exec runs: the exec's result is delivered, then ccw-mcp exits."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import trio
from mcp import Client

from mcp_server.transports.unix import connect
from tests.support.mcp_process import ServerProcess, server_env


def test_sigterm_delivers_the_running_exec_then_exits(tmp_path: Path, root_required: None) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    server = ServerProcess(server_env(tmp_path, MCP_ENDPOINT="socket", CCW_TOOLSETS="capsule"))
    path = server.wait_ready()

    async def main() -> Any:
        async with Client(connect(path), mode="legacy") as client:
            await client.list_tools()
            created = await client.call_tool("capsule_create", {"workspace": str(ws)})
            signalled: list[float] = []

            async def on_progress(value: float, total: float | None, message: str | None) -> None:
                if not signalled:  # the command is running in its jail now
                    server.signal(signal.SIGTERM)
                    signalled.append(value)

            result = await client.call_tool(
                "capsule_exec",
                {"capsule_id": created.structured_content["capsule_id"],
                 "cmd": ["sh", "-c", "echo started; sleep 2.5; echo finished > done.txt; echo done"]},
                progress_callback=on_progress,
            )
            assert signalled
            return result

    result = trio.run(main)
    assert result.is_error is not True
    assert result.structured_content["exit_code"] == 0
    assert result.structured_content["stdout"] == "started\ndone\n"
    assert server.wait() == 0
    assert not os.path.exists(path)
    assert "mcp:draining mode=socket signal=SIGTERM" in server.log and "mcp:shutdown mode=socket" in server.log
    assert not (ws / "done.txt").exists()  # the capsule wrote it, the workspace did not change
