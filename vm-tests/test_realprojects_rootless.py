"""The Python project's agent loop as an unprivileged user, through a rootless helper.

The test creates a system user, gives it a copy of the prepared more-itertools
workspace (its own ``.venv/`` inside) and runs a script as that user which starts
``ccw-mcp`` on stdio through a real MCP client; ``ccw-mcp`` starts its embedded helper
rootless (user namespace).  The script runs the same loop as the root tests
(``agent_loop.agent_loop``), so every step is asserted there; here: no fanotify as a user,
so ``touched.read`` is null with a reason, and the default ``baseline`` policy still
lets the change be promoted (issue 13 item 4).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

from tests.support import realprojects  # noqa: E402
from tests.support.users import run_script_as  # noqa: E402

SCRIPT = r"""
import contextlib, json, os, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import trio
from tests.support import agent_loop, realprojects
from tests.support.mcp_process import agent_server_env

ws, scratch = Path(sys.argv[2]), Path(sys.argv[3])
project = realprojects.PROJECTS["more-itertools"]

@contextlib.asynccontextmanager
async def fresh(state):
    os.mkdir(state)
    async with agent_loop.mcp_stdio(agent_server_env(state, scratch)) as call:
        yield call

async def main():
    os.mkdir(scratch / "state")
    async with agent_loop.mcp_stdio(agent_server_env(scratch / "state", scratch)) as call:
        out = await agent_loop.agent_loop(call, fresh, project, ws, scratch)
        out["info"] = await call("ccw_info", {})
    return out

try:
    print(json.dumps(trio.run(main)))
except BaseExceptionGroup as group:  # the MCP client's task groups wrap the loop's failure
    raise agent_loop.leaf(group) from None
"""


def test_agent_loop_on_the_python_project_as_an_unprivileged_user(user_dir: tuple[int, int, Path]) -> None:

    uid, gid, home = user_dir
    project = realprojects.PROJECTS["more-itertools"]
    ws = realprojects.pristine(project, home / "ws")
    scratch = home / "scratch"
    scratch.mkdir()
    subprocess.run(["chown", "-R", f"{uid}:{gid}", str(ws), str(scratch)], check=True)
    out = run_script_as(uid, gid, [sys.executable, "-c", SCRIPT, str(HERE.parent), str(ws), str(scratch)], home)
    # fanotify does not work from a user namespace: no read set, and the reason instead.
    first = out["first"]
    assert first["touched"]["read"] is None and first.get("touched_unavailable", {}).get("read"), first["touched"]
    # The baseline policy passed without cgroups (promotion is asserted in the loop).
    assert out["promoted"]["policy_report"]["passed"] is True, out["promoted"]
    # Everything promoted belongs to the user.
    for rel in (e.path for e in project.harmless):
        assert (ws / rel).stat().st_uid == uid
