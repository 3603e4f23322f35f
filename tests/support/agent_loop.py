"""The agent's loop on a real project, through ccw's MCP tools, asserting each step.

``agent_loop`` is written against a ``call(tool, args) -> structured result`` function, so
the same loop runs through a ``ToolRunner`` (handlers behind a real Runtime, schemas
checked), through a real MCP client talking to ``ccw-mcp`` over stdio, and as an
unprivileged user (a script run as that user imports this module).  A tool error
arrives as ``CcwError`` from every driver.

The loop (issue 13, "Shown by"): create; the project's tests pass; two harmless edits and
one breaking edit through ``read_text_file`` / ``edit_text_file``; the tests fail;
``capsule_deltamin`` with the same command gives exactly the breaking hunk; a
``require_tests`` policy blocks promotion; the breaking line is put back; the tests pass;
a witness; the workspace moved away and the witness replayed by a server on a fresh
state dir; the workspace moved back; promotion; the host's git shows exactly the
harmless edits.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from tests.support.mcp_process import CCW_MCP, ROOT, agent_server_env
from tests.support.realprojects import Edit, Project, git

Call = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]
# A server on a fresh state dir, for as long as the context lasts: its ``call``.
FreshServer = Callable[[Path], contextlib.AbstractAsyncContextManager[Call]]

# Lines a test runner prints that carry a duration ("in 0.31s", "Ran 21 tests in 0.004s").
DURATION = re.compile(r"\bin \d+(\.\d+)?m?s\b")


def changed_lines(diff: str) -> list[str]:
    """The ``-``/``+`` lines of a unified diff, without the file headers."""
    return [line for line in diff.splitlines()
            if line[:1] in "+-" and not line.startswith(("+++ ", "--- "))]


def edit_lines(edits: list[Edit]) -> list[str]:
    """The lines a diff of ``edits`` (one replaced line each) consists of, sorted."""
    return sorted([f"-{e.old}" for e in edits] + [f"+{e.new}" for e in edits])


async def edit(call: Call, capsule_id: str, ws: Path, path: str, old: str, new: str) -> None:
    """Read the file through the capsule, then replace its line ``old`` by its hashline tag."""
    read = await call("read_text_file", {"path": str(ws / path), "capsule_id": capsule_id})
    tags = [row.partition("|")[0] for row in read["content"].split("\n") if row.partition("|")[2] == old]
    assert len(tags) == 1, f"{old!r} is not one line of {path}"
    done = await call("edit_text_file", {
        "path": str(ws / path), "capsule_id": capsule_id, "file_hash": read["file_hash"],
        "ops": [{"op": "replace", "anchor": tags[0], "content": new}],
    })
    assert done["applied"] == 1


async def run_tests(call: Call, capsule_id: str, cmd: tuple[str, ...]) -> dict[str, Any]:
    """One exec of the project's test command in the capsule."""
    return await call("capsule_exec", {"capsule_id": capsule_id, "cmd": list(cmd), "timeout_ms": 300_000})


def check_output_verdict(replay: dict[str, Any], deterministic_output: bool) -> None:
    """``output_identical`` is reported apart from ``replay_ok``, and says what is true.

    A runner that prints no durations (tape) prints the same bytes again; one that does
    (pytest, unittest) may differ, and then only in lines that carry a duration.
    """
    assert isinstance(replay.get("output_identical"), bool), replay
    if deterministic_output:
        assert replay["output_identical"] is True, replay
        return
    if replay["output_identical"]:
        assert not replay.get("output_diffs"), replay
        return
    diffs = replay.get("output_diffs") or []
    assert diffs and all(d.get("lines") for d in diffs), f"output differs, but which lines is not shown: {diffs}"
    differing = [line[1:] for d in diffs for line in d["lines"]
                 if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert all(DURATION.search(line) for line in differing), differing


async def agent_loop(call: Call, fresh_server: FreshServer, project: Project, ws: Path, scratch: Path, *,
                     commit_in_capsule: bool = False, deterministic_output: bool = False) -> dict[str, Any]:
    """Run the loop on the workspace ``ws`` (a pristine copy of ``project``); assert every step.

    Returns what the caller checks beyond the loop: the first exec's ``touched`` and
    usage, the replay's result and the policy reports.
    """
    cap = (await call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
    first = await run_tests(call, cap, project.test_cmd)
    assert first["exit_code"] == 0, first["stdout"][-3000:] + first["stderr"][-3000:]

    for harmless in project.harmless:
        await edit(call, cap, ws, harmless.path, harmless.old, harmless.new)
    breaking = project.breaking
    await edit(call, cap, ws, breaking.path, breaking.old, breaking.new)
    failing = await run_tests(call, cap, project.test_cmd)
    assert failing["exit_code"] not in (0, None), failing

    # The natural loop: deltamin with the very command that just failed.
    minimal = await call("capsule_deltamin", {"capsule_id": cap, "target_cmd": list(project.test_cmd)})
    assert minimal["units"] == [breaking.path], minimal
    assert changed_lines(minimal["minimal_patch"]) == [f"-{breaking.old}", f"+{breaking.new}"], minimal["minimal_patch"]

    policy = f"tests-{project.name}"
    await call("policy_set", {"name": policy, "rules": {"require_tests": [list(project.test_cmd)]}})
    blocked = await call("capsule_promote", {"capsule_id": cap, "policies": [policy]})
    assert blocked["promoted"] is False and blocked["policy_report"]["tests_ok"] is False, blocked
    assert git(ws, "status", "--porcelain") == "", "a blocked promotion changed the workspace"

    await edit(call, cap, ws, breaking.path, breaking.new, breaking.old)
    fixed = await run_tests(call, cap, project.test_cmd)
    assert fixed["exit_code"] == 0, fixed["stdout"][-3000:] + fixed["stderr"][-3000:]

    # What promotion would write: the harmless edits, and no cache or bytecode of the runs.
    diff = await call("capsule_diff", {"capsule_id": cap, "format": "unified"})
    assert sorted(changed_lines(diff["diff"])) == edit_lines(list(project.harmless)), diff["diff"]
    assert diff["summary"] == {"added": 0, "deleted": 0, "modified": len({e.path for e in project.harmless})}, diff

    witness = await call("capsule_witness", {"capsule_id": cap})
    carried = scratch / Path(witness["path"]).name
    shutil.copyfile(witness["path"], carried)
    away = ws.with_name(ws.name + "-moved-away")
    os.rename(ws, away)
    try:
        async with fresh_server(scratch / "fresh-state") as fresh:
            replay = await fresh("capsule_replay", {"path": str(carried), "allow_untrusted": True})
    finally:
        os.rename(away, ws)
    assert replay["replay_ok"] is True, replay
    check_output_verdict(replay, deterministic_output)

    if commit_in_capsule:
        committed = await call("capsule_exec", {"capsule_id": cap, "cmd": [
            "env", "GIT_AUTHOR_DATE=2026-01-02T00:00:00Z", "GIT_COMMITTER_DATE=2026-01-02T00:00:00Z",
            "git", "-c", "user.name=agent", "-c", "user.email=agent@example.invalid",
            "commit", "-q", "-a", "-m", "Wording of the docs"]})
        assert committed["exit_code"] == 0, committed

    promoted = await call("capsule_promote", {"capsule_id": cap, "policies": [policy, "baseline"]})
    assert promoted["promoted"] is True, promoted
    await call("capsule_destroy", {"capsule_id": cap})

    harmless_paths = sorted({e.path for e in project.harmless})
    if commit_in_capsule:
        assert git(ws, "rev-list", "--count", "HEAD") == "2\n"
        assert sorted(changed_lines(git(ws, "show", "--format=", "HEAD"))) == edit_lines(list(project.harmless))
        assert git(ws, "show", "--name-only", "--format=", "HEAD").split() == harmless_paths
        git(ws, "fsck", "--strict", "--no-dangling")
        assert git(ws, "status", "--porcelain") == ""
    else:
        assert sorted(changed_lines(git(ws, "diff"))) == edit_lines(list(project.harmless))
        assert git(ws, "status", "--porcelain").splitlines() == [f" M {p}" for p in harmless_paths]
    return {"first": first, "replay": replay, "blocked": blocked, "promoted": promoted}


@contextlib.asynccontextmanager
async def mcp_stdio(env: dict[str, str]) -> AsyncIterator[Call]:
    """A real MCP client session with ``ccw-mcp`` on stdio; yields its ``call``."""
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    from sandbox.errors import CcwError

    params = StdioServerParameters(command=str(CCW_MCP), env=env)
    async with Client(params, mode="legacy") as client:
        async def call(tool: str, args: dict[str, Any]) -> dict[str, Any]:
            result = await client.call_tool(tool, args, read_timeout_seconds=600)
            content: dict[str, Any] = result.structured_content or {}
            if result.is_error:
                error = content.get("error") or {"code": "INTERNAL", "message": str(result.content)}
                raise CcwError(error["code"], error["message"], error.get("details") or {})
            return content

        yield call


def leaf(error: BaseException) -> BaseException:
    """The first exception inside (nested) exception groups: the failure itself."""
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error




# What ``scenario_command`` runs, as whichever user runs it: argv is the repository (for
# ccw and this package; its vm-tests/ for the scenario's module, a test module there), the
# scenario's module, the setup as JSON.
SCENARIO = r"""
import sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/vm-tests"]
from tests.support import agent_loop
agent_loop.scenario_main(sys.argv[2], sys.argv[3])
"""


def scenario_command(module: str, setup: dict[str, Any]) -> list[str]:
    """The command that runs ``module.scenario(call, setup)`` through a real ``ccw-mcp`` (see
    ``scenario_main``) and prints what it returned as JSON: run it as root, or as a test's
    user with ``test_ipc_users.run_script_as``."""
    return [sys.executable, "-c", SCENARIO, str(ROOT), module, json.dumps(setup)]


def scenario_main(module: str, setup_json: str) -> None:
    """In the process ``scenario_command`` starts: set ``setup["environ"]`` (if any) so the
    server inherits it, then ``module.scenario(call, setup)`` with a stdio ``ccw-mcp`` on a
    new state dir ``setup["scratch"]/state``; print its answer as JSON."""
    import importlib

    import trio

    setup = json.loads(setup_json)
    os.environ.update(setup.get("environ", {}))
    scenario = importlib.import_module(module).scenario
    scratch = Path(setup["scratch"])

    async def main() -> Any:
        (scratch / "state").mkdir()
        async with mcp_stdio(agent_server_env(scratch / "state", scratch)) as call:
            return await scenario(call, setup)

    try:
        print(json.dumps(trio.run(main)))
    except BaseExceptionGroup as group:  # the MCP client's task groups wrap the scenario's failure
        raise leaf(group) from None
