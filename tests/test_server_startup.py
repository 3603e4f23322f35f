"""Server start finishes a promotion that a crash interrupted (kill -9 of the front end)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mcp_server.config import Config
from mcp_server.fs.promote import CRASH_ENV
from mcp_server.server import CcwServer
from mcp_server.state import State

_CHILD = ("""
from pathlib import Path
from mcp_server.fs.promote import Op, Promoter
Promoter(Path({state!r})).promote({ws!r}, [Op("write", "a.txt", 0o644), Op("write", "b/c.txt", 0o644), """
          """Op("delete", "old")],
                                  lambda op: ("new " + op.path).encode())
""")


@pytest.mark.parametrize(("step", "expect_new"), [("prepared", False), ("first_commit_op", True)])
def test_startup_recovers_interrupted_promotion(tmp_path: Path, step: str, expect_new: bool) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("old a")
    (ws / "old").write_text("x")
    state_dir = tmp_path / "state"
    code = _CHILD.format(state=str(state_dir), ws=str(ws))
    killed = subprocess.run([sys.executable, "-c", code], env={**os.environ, CRASH_ENV: step}, check=False)
    assert killed.returncode == -9
    assert list((state_dir / "promotions").glob("*.json"))  # the journal survived the crash

    app = CcwServer(Config.from_env({"CCW_STATE_DIR": str(state_dir), "CCW_TOOLSETS": "capsule"}), State(state_dir))
    app.startup()

    names = sorted(str(p.relative_to(ws)) for p in ws.rglob("*"))
    if expect_new:
        assert names == ["a.txt", "b", "b/c.txt"]
        assert (ws / "a.txt").read_text() == "new a.txt" and (ws / "b" / "c.txt").read_text() == "new b/c.txt"
    else:
        assert names == ["a.txt", "old"] and (ws / "a.txt").read_text() == "old a"
    assert not list((state_dir / "promotions").glob("*.json"))
