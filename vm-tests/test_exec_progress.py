"""A long capsule_exec streams progress notifications carrying the output's tail."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import trio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

ROOT = Path(__file__).resolve().parent.parent


def test_progress_notifications_carry_the_output_tail(tmp_path: Path, root_required: None) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CCW_", "MCP_"))}
    env.update(CCW_STATE_DIR=str(tmp_path / "state"), MCP_READY_FILE=str(tmp_path / "ready"), CCW_DEBUG="1")
    params = StdioServerParameters(command=str(ROOT / ".venv" / "bin" / "ccw-mcp"), env=env)
    reports: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        reports.append((progress, total, message))

    async def scenario() -> Any:
        async with Client(params, mode="legacy") as client:
            created = await client.call_tool("capsule_create", {"workspace": str(ws)})
            capsule_id = created.structured_content["capsule_id"]
            script = "for i in 1 2 3 4; do echo step$i; echo warn$i >&2; sleep 0.7; done"
            return await client.call_tool(
                "capsule_exec", {"capsule_id": capsule_id, "cmd": ["sh", "-c", script], "timeout_ms": 60_000},
                progress_callback=on_progress,
            )

    result = trio.run(scenario)
    assert result.structured_content["stdout"] == "step1\nstep2\nstep3\nstep4\n"
    assert len(reports) >= 2, reports
    elapsed = [p for p, _, _ in reports]
    assert elapsed == sorted(elapsed) and all(total == 60_000 for _, total, _ in reports)
    messages = [m or "" for _, _, m in reports]
    assert any("step1" in m for m in messages) and any("warn" in m for m in messages)
    assert "step4" not in messages[0]  # tails are live, not the final output replayed


def test_helper_progress_reports_reach_the_client(tmp_path: Path, root_required: None) -> None:
    from mcp_server.launcher import spawn_embedded

    ws = tmp_path / "ws"
    ws.mkdir()
    seen: list[dict[str, Any]] = []

    async def scenario() -> dict[str, Any]:
        helper = await spawn_embedded(str(tmp_path / "state"))
        try:
            capsule_id = (await helper.request("create", {"workspace": str(ws)}))["capsule_id"]

            async def sink(report: dict[str, Any]) -> None:
                seen.append(report)

            result = await helper.request(
                "exec",
                {"capsule_id": capsule_id, "argv": ["sh", "-c", "echo a; sleep 0.5; echo b; sleep 0.5"],
                 "cwd": str(ws), "env": {"PATH": "/usr/bin:/bin"}, "progress_ms": 200},
                on_progress=sink,
            )
            # Without progress_ms no report is sent.
            quiet: list[dict[str, Any]] = []

            async def quiet_sink(report: dict[str, Any]) -> None:
                quiet.append(report)

            await helper.request("exec", {"capsule_id": capsule_id, "argv": ["sleep", "0.5"], "cwd": str(ws),
                                          "env": {"PATH": "/usr/bin:/bin"}}, on_progress=quiet_sink)
            assert quiet == []
            await helper.request("destroy", {"capsule_id": capsule_id})
            return result
        finally:
            await helper.aclose()

    result = trio.run(scenario)
    assert result["exit_code"] == 0 and len(seen) >= 3
    # "written": the files closed after writing since the last report (traced here, as root)
    assert set(seen[0]) == {"elapsed_ms", "stdout_bytes", "stderr_bytes", "stdout_tail_b64", "stderr_tail_b64",
                            "written"}
    assert all(isinstance(report["written"], list) for report in seen)
    assert seen[-1]["stdout_bytes"] >= 2
