"""The agent loop on real projects from PyPI and npm, as root (issue 13, "Shown by").

The projects (``realprojects.py``) are pinned releases prepared once and cached under
``.cache/realprojects/``; each test works on its own copy.  The loop itself, with its
assertions, is ``agent_loop.agent_loop``: here it runs through a ``ToolRunner`` for each
project, once through a real MCP client over stdio, and (in
``test_realprojects_rootless.py``) as an unprivileged user.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import agent_loop, realprojects
from tests.support.mcp_process import agent_server_env


def _fresh_runner(runner_type: type) -> agent_loop.FreshServer:
    @contextlib.asynccontextmanager
    async def fresh(state: Path) -> AsyncIterator[agent_loop.Call]:
        os.mkdir(state)
        runner = runner_type(state)
        try:
            yield runner.call
        finally:
            await runner.runtime.aclose()

    return fresh


@pytest.mark.parametrize(("name", "options"), [
    ("more-itertools", {}),
    ("idna", {"commit_in_capsule": True}),
])
def test_agent_loop_on_a_python_project(tools: Any, require: Any, tmp_path: Path, name: str,
                                        options: dict[str, Any]) -> None:
    require(os.path.exists(realprojects.SYSTEM_PYTHON) and shutil.which("git") is not None,
            f"needs {realprojects.SYSTEM_PYTHON} and git")
    project = realprojects.PROJECTS[name]
    ws = realprojects.pristine(project, tmp_path / "ws")

    async def scenario(t: Any) -> dict[str, Any]:
        return await agent_loop.agent_loop(t.call, _fresh_runner(type(t)), project, ws, tmp_path, **options)

    out = tools.run(scenario)
    # As root the tracer sees what the tests read: the module under test among them.
    read = out["first"]["touched"]["read"]
    assert read is not None and project.breaking.path in read, read


def test_agent_loop_on_a_node_project_over_stdio(root_required: None, require: Any, tmp_path: Path) -> None:
    """The npm package through a real MCP client and ``ccw-mcp`` on stdio, as an agent would."""
    import trio

    require(all(shutil.which(tool) for tool in ("node", "npm", "git")), "needs node, npm and git")

    project = realprojects.PROJECTS["json-stable-stringify-without-jsonify"]
    ws = realprojects.pristine(project, tmp_path / "ws")

    @contextlib.asynccontextmanager
    async def fresh(state: Path) -> AsyncIterator[agent_loop.Call]:
        os.mkdir(state)
        async with agent_loop.mcp_stdio(agent_server_env(state, tmp_path)) as call:
            yield call

    async def scenario() -> dict[str, Any]:
        (tmp_path / "state").mkdir()
        async with agent_loop.mcp_stdio(agent_server_env(tmp_path / "state", tmp_path)) as call:
            return await agent_loop.agent_loop(call, fresh, project, ws, tmp_path, deterministic_output=True)

    out = trio.run(scenario)
    read = out["first"]["touched"]["read"]
    # npm test started tape through node_modules/.bin and read the package's own index.js.
    assert read is not None and "index.js" in read and "node_modules/tape/bin/tape" in read, read


def test_full_suite_of_the_python_project_passes_in_a_capsule(tools: Any, tmp_path: Path) -> None:
    project = realprojects.PROJECTS["more-itertools"]
    ws = realprojects.pristine(project, tmp_path / "ws")

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        ran = await agent_loop.run_tests(t.call, cap, project.full_cmd)
        diff = await t.call("capsule_diff", {"capsule_id": cap, "format": "stat"})
        await t.call("capsule_destroy", {"capsule_id": cap})
        return {"ran": ran, "diff": diff}

    out = tools.run(scenario)
    assert out["ran"]["exit_code"] == 0, out["ran"]["stdout"][-3000:]
    assert " passed" in out["ran"]["stdout"].splitlines()[-1]
    # The whole suite leaves nothing behind in the workspace: no caches, no bytecode.
    assert out["diff"]["summary"] == {"added": 0, "deleted": 0, "modified": 0}, out["diff"]["diff"]
