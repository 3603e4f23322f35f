"""Server start finishes a promotion that a crash interrupted (kill -9 of the front end), and journals
the exec it was running."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mcp_server.capsules.exec import FRONT_END_DIED
from mcp_server.config import Config
from mcp_server.fs.promote import CRASH_ENV
from mcp_server.journal import Journal
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


_EXEC_CHILD = """
import os, signal, trio
from mcp_server.capsules.exec import exec_request
from mcp_server.capsules.service import CapsuleService
from mcp_server.state import State
from sandbox.ops import CreateRequest
from sandbox.replies import CreateReply
from sandbox.spec import CapsuleSpec
from tests.support.call_hooks import Hooks

class Helper:
    async def call(self, request, on_progress=None):
        if isinstance(request, CreateRequest):
            return CreateReply("cap_1", "/m/1", {ws!r}, "", "", {{}})
        os.kill(os.getpid(), signal.SIGKILL)  # the front end dies as the command runs

async def main():
    async def helper():
        return Helper()
    service = CapsuleService(State({state!r}), helper, Hooks())
    await service.create(CapsuleSpec(workspace={ws!r}))
    await service.exec(exec_request("cap_1", ["sh", "-c", "echo partial > p.txt; sleep 100"]))

trio.run(main)
"""


def test_startup_journals_cut_short_the_exec_a_killed_front_end_was_running(tmp_path: Path) -> None:
    # Its row used to be lost: the capsule kept what it wrote, at a generation that said nothing changed.
    ws, state_dir = tmp_path / "ws", tmp_path / "state"
    ws.mkdir()
    killed = subprocess.run([sys.executable, "-c", _EXEC_CHILD.format(state=str(state_dir), ws=str(ws))],
                            cwd=Path(__file__).parent.parent, check=False)
    assert killed.returncode == -9
    assert Journal(State(state_dir)).execs("cap_1") == []

    app = CcwServer(Config.from_env({"CCW_STATE_DIR": str(state_dir), "CCW_TOOLSETS": "capsule"}), State(state_dir))
    app.startup()
    journal = Journal(State(state_dir))
    [row] = journal.execs("cap_1")
    assert (row["seq"], row["argv"], row["exit_code"]) == (1, ["sh", "-c", "echo partial > p.txt; sleep 100"], None)
    assert row["usage"]["cut_short"] == FRONT_END_DIED and row["generation"] is None
    assert journal.generation("cap_1") == 1  # what it wrote is not known
    app.startup()  # once: a second start finds nothing left to journal
    assert len(journal.execs("cap_1")) == 1
