"""capsule_merge into a new capsule as an unprivileged user, through the rootless helper (issue 39).

A user made for the test runs its own ``ccw-mcp`` on stdio (its embedded helper rootless:
overlayfs with ``userxattr``, whiteouts and opaque directories of a user namespace).  Two
attempts forked from one capsule are merged into a new capsule that stacks the second's
layer over a fork of the first: the cases where the second's layer holds or hides what its
change list does not name (a file rewritten unchanged, a directory replaced) show as the
merge has them, both inputs are frozen until the merged capsule is destroyed, its witness
replays, and its promotion writes exactly both changes into the user's workspace.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.users import UserScript

HERE = Path(__file__).resolve().parent

SCRIPT = r"""
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import trio
from tests.support import agent_loop
from tests.support.mcp_process import agent_server_env
from tests.support.users import step
from sandbox.errors import CcwError

ws, state = Path(sys.argv[2]), Path(sys.argv[3])
FIRST = "echo first > a.txt; echo from-first > d/first.txt"
SECOND = "sed -i 's/nothing-matches/x/' a.txt; echo second > b.txt; rm -rf d; mkdir d; echo from-second > d/second.txt"

async def main():
    out = {}
    async with agent_loop.mcp_stdio(agent_server_env(state, ws)) as call:
        async def refused(capsule_id):
            try:
                await call("capsule_exec", {"capsule_id": capsule_id, "cmd": ["true"]})
            except CcwError as exc:
                return exc.code
            return None

        parent = (await call("capsule_create", {"workspace": str(ws), "auto_expose": False}))["capsule_id"]
        first, second = (await call("capsule_fork", {"capsule_id": parent, "count": 2}))["capsule_ids"]
        for capsule_id, script in ((first, FIRST), (second, SECOND)):
            done = await call("capsule_exec", {"capsule_id": capsule_id, "cmd": ["sh", "-c", script]})
            assert done["exit_code"] == 0, done
        made = (await call("capsule_merge", {"capsule_ids": [first, second], "into": "new"}))["capsule_id"]
        look = await call("capsule_exec", {"capsule_id": made, "cmd": ["sh", "-c", "cat a.txt b.txt; ls d"]})
        out["look"] = look["stdout"]
        out["frozen"] = [await refused(first), await refused(second)]
        witness = await call("capsule_witness", {"capsule_id": made})
        out["replay"] = await call("capsule_replay", {"witness_id": witness["witness_id"]})
        out["promote"] = await call("capsule_promote", {"capsule_id": made})
        await call("capsule_destroy", {"capsule_id": made})
        out["thawed"] = [await refused(first), await refused(second)]
        for capsule_id in (first, second, parent):
            await call("capsule_destroy", {"capsule_id": capsule_id})
    step({"step": "done", **out}, wait=False)

try:
    trio.run(main)
except BaseExceptionGroup as group:  # the MCP client's task groups wrap the scenario's failure
    raise agent_loop.leaf(group) from None
"""


def test_a_user_merges_two_attempts_through_the_rootless_helper(user_dir: tuple[int, int, Path]) -> None:
    uid, gid, home = user_dir
    ws, state = home / "ws", home / "state"
    (ws / "d").mkdir(parents=True)
    state.mkdir()
    for name in ("a.txt", "b.txt", "d/old.txt"):
        (ws / name).write_text(f"{name} base\n")
    subprocess.run(["chown", "-R", f"{uid}:{gid}", str(ws), str(state)], check=True)
    argv = [sys.executable, "-c", SCRIPT, str(HERE.parent), str(ws), str(state)]
    with UserScript(uid, gid, argv, home) as script:
        out = script.receive()
        script.finish()
    assert out["look"].splitlines() == ["first", "second", "first.txt", "second.txt"], out["look"]
    assert out["frozen"] == ["CONFLICT", "CONFLICT"]
    assert out["replay"]["replay_ok"] is True, {k: v for k, v in out["replay"].items() if k not in ("root_hash",)}
    assert out["promote"]["promoted"] is True, out["promote"]
    assert (ws / "a.txt").read_text() == "first\n" and (ws / "b.txt").read_text() == "second\n"
    assert sorted(p.name for p in (ws / "d").iterdir()) == ["first.txt", "second.txt"]
    assert out["thawed"] == [None, None]
