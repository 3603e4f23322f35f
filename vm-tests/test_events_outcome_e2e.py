"""The events of finished calls through the server's own pipeline, on the real kernel (issue 40):
each tool's spec declares them (ToolSpec.outcome) and events.py appends them.  A witness, a
replay answered at once and one that outlived its call (told when its run ended), a deltamin
search, and promotions: a dry run, one refused before any check, one applied."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio

from mcp_server.config import Config
from mcp_server.context import CallContext
from mcp_server.events import EventLog
from mcp_server.server import CcwServer
from mcp_server.state import State
from sandbox.errors import CcwError

OUTCOMES = ("witness", "replay", "deltamin.done", "policy.report", "promotion")


def test_finished_calls_write_the_events_their_specs_declare(tmp_path: Path, root_required: None) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    (ws / "b.txt").write_text("b\n")
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    server = CcwServer(Config.from_env({"CCW_STATE_DIR": str(tmp_path / "state")}), State(tmp_path / "state"))
    ctx = CallContext(server.runtime)

    async def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
        spec = server.tools.registry.lookup(name)
        assert spec is not None, name
        return await server.call_tool(spec, args, ctx)

    async def main() -> dict[str, Any]:
        try:
            cap = (await call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
            ran = await call("capsule_exec",
                             {"capsule_id": cap, "cmd": ["sh", "-c", "echo x >> a.txt; echo y >> b.txt"]})
            assert ran["exit_code"] == 0, ran
            made = await call("capsule_witness", {"capsule_id": cap})
            replayed = await call("capsule_replay", {"witness_id": made["witness_id"], "wait_ms": None})
            running = await call("capsule_replay", {"witness_id": made["witness_id"], "wait_ms": 0})
            assert running["status"] == "running", running  # its event comes when its run ends
            later = await call("capsule_run", {"run_id": running["run_id"], "wait_ms": 600_000})
            found = await call("capsule_deltamin", {"capsule_id": cap, "target_cmd": ["sh", "-c", "! grep -q x a.txt"],
                                                    "wait_ms": None})
            dry = await call("capsule_promote", {"capsule_id": cap, "dry_run": True})
            with pytest.raises(CcwError) as refused:
                await call("capsule_promote", {"capsule_id": cap, "policies": ["no_such_policy"]})
            done = await call("capsule_promote", {"capsule_id": cap})
            return {"cap": cap, "made": made, "replayed": replayed, "later": later, "found": found, "dry": dry,
                    "refused": refused.value, "done": done}
        finally:
            await server.runtime.aclose()

    out = trio.run(main)
    cap = out["cap"]
    got = [(e.kind, e.capsule_id, e.data) for e in EventLog(server.state).since(0, limit=10_000) if e.kind in OUTCOMES]
    server.state.close()
    made, found = out["made"], out["found"]
    verdict = {"replay_ok": True, "root_hash": out["replayed"]["root_hash"], "output_identical": True, "differences": 0}
    assert out["replayed"]["replay_ok"] is True and out["later"]["replay_ok"] is True, out
    assert [kind for kind, _, _ in got] == ["witness", "replay", "replay", "deltamin.done", "policy.report",
                                            "promotion", "promotion", "policy.report", "promotion"], got
    assert got[0] == ("witness", cap, {key: made[key] for key in ("witness_id", "path", "root_hash", "size_bytes")})
    assert got[1] == got[2] == ("replay", None, verdict)
    assert got[3] == ("deltamin.done", cap, {"minimal": 1, "files": 1, "replay_ok": found["replay_ok"],
                                             "trials": found["trials"], "cache_hits": found["cache_hits"],
                                             "elapsed_ms": found["elapsed_ms"], "one_minimal": found["one_minimal"]})
    assert got[4] == ("policy.report", cap, {"passed": True, "report": out["dry"]["policy_report"]})
    assert got[5] == ("promotion", cap, {"applied": ["a.txt", "b.txt"], "dry_run": True, "refused": None})
    refused = out["refused"]
    assert refused.code == "NOT_FOUND", refused
    assert got[6] == ("promotion", cap, {"applied": [], "dry_run": None,
                                         "refused": {"code": "NOT_FOUND", "message": refused.message}})
    assert got[8] == ("promotion", cap, {"applied": ["a.txt", "b.txt"], "dry_run": False, "refused": None})
    assert out["done"]["promoted"] is True and (ws / "a.txt").read_text() == "a\nx\n"
