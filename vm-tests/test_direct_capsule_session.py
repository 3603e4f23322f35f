"""Seed 001 style: NDJSON requests naming tools, piped into ccw-mcp, with no handshake."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_piped_capsule_session(tmp_path: Path, root_required: None) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "x.txt").write_text("x\n")
    create = {"jsonrpc": "2.0", "id": 1, "method": "capsule/create", "params": {"workspace": str(ws)}}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CCW_", "MCP_"))}
    env.update(CCW_STATE_DIR=str(tmp_path / "state"), MCP_READY_FILE=str(tmp_path / "ready"))
    proc = subprocess.Popen([str(ROOT / ".venv" / "bin" / "ccw-mcp")], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(create).encode() + b"\n")
    proc.stdin.flush()
    first = json.loads(proc.stdout.readline())
    assert first["id"] == 1 and first["result"]["capsule_id"].startswith("cap_")
    capsule_id = first["result"]["capsule_id"]
    followups = [
        {"jsonrpc": "2.0", "id": "two", "method": "capsule/exec",
         "params": {"capsule_id": capsule_id, "cmd": ["sh", "-c", "echo y >> x.txt; cat x.txt"]}},
        {"jsonrpc": "2.0", "id": 3, "method": "capsule/diff", "params": {"capsule_id": capsule_id, "format": "stat"}},
        {"jsonrpc": "2.0", "id": 4, "method": "capsule_destroy", "params": {"capsule_id": capsule_id}},
    ]
    out, err = proc.communicate(b"".join(json.dumps(r).encode() + b"\n" for r in followups), timeout=120)
    replies = [json.loads(line) for line in out.splitlines()]
    assert all("result" in r for r in replies), replies
    assert [r["id"] for r in replies] == ["two", 3, 4]  # in request order, ids echoed unchanged
    assert replies[0]["result"]["stdout"] == "x\ny\n" and replies[0]["result"]["exit_code"] == 0
    assert replies[1]["result"]["summary"] == {"added": 0, "deleted": 0, "modified": 1}
    assert replies[2]["result"] == {"capsule_id": capsule_id, "destroyed": True}
    assert proc.returncode == 0 and b"mcp:shutdown mode=stdio" in err
    assert (ws / "x.txt").read_text() == "x\n"
