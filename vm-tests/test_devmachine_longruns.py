"""Runs longer than a client's timeout (issue 25, item 6), through a real ccw-mcp.

Codex cuts a tool call at 60 s (``tool_timeout_sec``), other clients at similar limits,
while the capsule goes on running.  Here every call is made by an SDK client whose
request timeout is 2 s, standing in for the 60 s: a longer exec or deltamin answers
``status: running`` with a run id within its ``wait_ms`` and is fetched with
``capsule_run``; the client's own timeout never hits.  The run keeps the capsule's turn
(an exec sent after it runs after it), a cancel ends its jail at once, and a client that
left comes back for the result on a new connection.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.support.mcp_process import ServerProcess, server_env
from tests.support.processes import running_pids
from tests.support.users import run_script_as
from tests.support.workspaces import make_workspace

HERE = Path(__file__).resolve().parent

ROOT = HERE.parent
CLIENT_TIMEOUT_S = 2.0  # the client's limit for one call, as Codex's 60 s
SLOW = ["sh", "-c", "sleep 3; echo first >> order.txt; echo done"]


def _workspace(tmp_path: Path) -> Path:
    return make_workspace(tmp_path / "ws", {"a.txt": "good\n", "b.txt": "one\n"})


def _stdio_client(tmp_path: Path) -> Client:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CCW_", "MCP_"))}
    env.update(CCW_STATE_DIR=str(tmp_path / "state"), MCP_READY_FILE=str(tmp_path / "ready"), CCW_DEBUG="1",
               CCW_TOOLSETS="capsule")
    return Client(StdioServerParameters(command=str(ROOT / ".venv" / "bin" / "ccw-mcp"), env=env), mode="legacy")


async def _call(client: Client, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    """One call under the client's short timeout (the SDK raises if it hits)."""
    result = await client.call_tool(tool, args, read_timeout_seconds=CLIENT_TIMEOUT_S)
    assert not result.is_error, result
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def _fetch(client: Client, run_id: str, limit_s: float = 60) -> tuple[dict[str, Any], int]:
    """Wait for a run by id, one short call after another; (its result, calls made)."""
    with trio.fail_after(limit_s):
        calls = 0
        while True:
            calls += 1
            answer = await _call(client, "capsule_run", {"run_id": run_id, "wait_ms": 1000})
            if answer.get("status") != "running":
                return answer, calls


def test_a_long_exec_answers_running_and_keeps_its_turn(tmp_path: Path, root_required: None) -> None:
    ws = _workspace(tmp_path)

    async def scenario() -> tuple[dict[str, Any], ...]:
        async with _stdio_client(tmp_path) as client:
            cap = (await _call(client, "capsule_create", {"workspace": str(ws)}))["capsule_id"]
            first = await _call(client, "capsule_exec", {"capsule_id": cap, "cmd": SLOW, "wait_ms": 1000})
            # Sent while the first still runs in the background: it waits its turn.
            second = await _call(client, "capsule_exec", {"capsule_id": cap, "cmd": ["cat", "order.txt"],
                                                          "wait_ms": 1000})
            done, calls = await _fetch(client, first["run_id"])
            after, _ = await _fetch(client, second["run_id"]) if second.get("status") == "running" else (second, 0)
            quick = await _call(client, "capsule_exec", {"capsule_id": cap, "cmd": ["echo", "quick"]})
            listed = await _call(client, "capsule_list", {})
            return first, second, done, after, quick, listed, {"calls": calls}

    first, second, done, after, quick, listed, counts = trio.run(scenario)
    assert first["status"] == "running" and first["run_id"].startswith("run_")
    assert 1000 <= first["elapsed_ms"] < 2000
    assert second["status"] == "running"  # queued behind the run, past its own budget
    assert done["exit_code"] == 0 and done["stdout"] == "done\n" and counts["calls"] >= 1
    assert "status" not in done  # exactly what capsule_exec answers for a finished exec
    assert after["exit_code"] == 0 and after["stdout"] == "first\n"  # it ran after the first
    assert after["queued_ms"] > 0
    assert quick["stdout"] == "quick\n" and "status" not in quick  # within the budget: the plain result
    assert listed["capsules"][0]["execs"] == 3


def test_cancel_kills_the_run_and_frees_the_capsule(tmp_path: Path, root_required: None) -> None:
    ws = _workspace(tmp_path)

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], float, dict[str, Any]]:
        async with _stdio_client(tmp_path) as client:
            cap = (await _call(client, "capsule_create", {"workspace": str(ws)}))["capsule_id"]
            started = await _call(client, "capsule_exec", {
                "capsule_id": cap, "cmd": ["sh", "-c", "echo started; sleep 60"], "wait_ms": 1500})
            began = trio.current_time()
            cancelled = await _call(client, "capsule_run", {"run_id": started["run_id"], "cancel": True})
            took = trio.current_time() - began
            after = await _call(client, "capsule_exec", {"capsule_id": cap, "cmd": ["echo", "after"]})
            again = await _call(client, "capsule_run", {"run_id": started["run_id"], "wait_ms": 0})
            return started, cancelled, took, {"after": after, "again": again}

    started, cancelled, took, later = trio.run(scenario)
    assert started["status"] == "running" and "started" in (started["progress"] or "")
    assert cancelled["status"] == "cancelled" and cancelled["run_id"] == started["run_id"]
    assert took < CLIENT_TIMEOUT_S and cancelled["elapsed_ms"] < 10_000  # killed, not left to sleep 60
    assert later["after"]["exit_code"] == 0 and later["after"]["stdout"] == "after\n"
    assert later["again"] == cancelled | {"elapsed_ms": later["again"]["elapsed_ms"]}


def test_an_unknown_run_id_is_not_found_with_how_to_recover(tmp_path: Path, root_required: None) -> None:
    async def scenario() -> Any:
        async with _stdio_client(tmp_path) as client:
            return await client.call_tool("capsule_run", {"run_id": "run_9_deadbeef"})

    result = trio.run(scenario)
    assert result.is_error
    error = result.structured_content["error"]
    assert error["code"] == "NOT_FOUND" and "restart" in error["message"]


def test_a_deltamin_past_the_budget_is_collected_by_run_id(tmp_path: Path, root_required: None) -> None:
    ws = _workspace(tmp_path)
    # Each trial takes a second: more than the 1 s budget in all.
    target = ["sh", "-c", "sleep 1; ! grep -q bad a.txt"]

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        async with _stdio_client(tmp_path) as client:
            cap = (await _call(client, "capsule_create", {"workspace": str(ws)}))["capsule_id"]
            await _call(client, "capsule_exec", {"capsule_id": cap, "cmd": [
                "sh", "-c", "echo bad > a.txt; echo two > b.txt"]})
            started = await _call(client, "capsule_deltamin", {"capsule_id": cap, "target_cmd": target,
                                                               "wait_ms": 1000})
            found, _ = await _fetch(client, started["run_id"], limit_s=120)
            return started, found

    started, found = trio.run(scenario)
    assert started["status"] == "running"
    assert found["units"] == ["a.txt"] and found["replay_ok"] is True
    assert "bad" in found["minimal_patch"] and "b.txt" not in found["minimal_patch"]


# The SDK's HTTP client leaves the response streams of a closed session to the garbage
# collector (httpx2 async generators, in this test process): its warnings are the client's.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_run_outlives_the_client_that_started_it(tmp_path: Path, root_required: None) -> None:
    ws = _workspace(tmp_path)
    server = ServerProcess(server_env(tmp_path, MCP_ENDPOINT="http", CCW_TOOLSETS="capsule"))
    server.wait_ready()

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        async with server.client() as first_client:
            cap = (await _call(first_client, "capsule_create", {"workspace": str(ws)}))["capsule_id"]
            started = await _call(first_client, "capsule_exec", {"capsule_id": cap, "cmd": SLOW, "wait_ms": 500})
        # That client is gone; another comes back for the result.
        async with server.client() as second_client:
            found, _ = await _fetch(second_client, started["run_id"])
        return started, found

    try:
        started, found = trio.run(scenario)
    finally:
        assert server.stop() == 0
    assert started["status"] == "running"
    assert found["exit_code"] == 0 and found["stdout"] == "done\n"


def test_the_server_end_ends_its_runs(tmp_path: Path, root_required: None) -> None:
    ws = _workspace(tmp_path)
    marker = ["sleep", f"{4000 + os.getpid() % 1000}.25"]  # a command line no one else runs

    async def scenario() -> dict[str, Any]:
        async with _stdio_client(tmp_path) as client:
            cap = (await _call(client, "capsule_create", {"workspace": str(ws)}))["capsule_id"]
            started = await _call(client, "capsule_exec", {"capsule_id": cap, "cmd": marker, "wait_ms": 500})
            assert running_pids(marker), "the run's command should be running"
        return started  # the client closed the server's stdin: the server ended

    started = trio.run(scenario)
    assert started["status"] == "running"
    # The run did not outlive its server: its jail was ended before the helper went away.
    assert running_pids(marker) == []


ROOTLESS_SCRIPT = r"""
import json, os, sys
import trio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

ccw_mcp, ws, state = sys.argv[1:4]

async def main():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CCW_", "MCP_"))}
    # Its own ready file: the default /tmp/mcp.ready may be root's, from a test beside this one.
    env.update(CCW_STATE_DIR=state, CCW_TOOLSETS="capsule", MCP_READY_FILE=os.path.join(state, "ready"))
    async with Client(StdioServerParameters(command=ccw_mcp, env=env), mode="legacy") as client:
        async def call(tool, args):
            result = await client.call_tool(tool, args, read_timeout_seconds=2.0)
            assert not result.is_error, result
            return result.structured_content
        cap = (await call("capsule_create", {"workspace": ws}))["capsule_id"]
        started = await call("capsule_exec", {"capsule_id": cap, "wait_ms": 1000,
                                              "cmd": ["sh", "-c", "sleep 3; echo done"]})
        found = started
        while found.get("status") == "running":
            found = await call("capsule_run", {"run_id": started["run_id"], "wait_ms": 1000})
        sleeper = await call("capsule_exec", {"capsule_id": cap, "cmd": ["sleep", "60"], "wait_ms": 500})
        cancelled = await call("capsule_run", {"run_id": sleeper["run_id"], "cancel": True})
        after = await call("capsule_exec", {"capsule_id": cap, "cmd": ["echo", "after"]})
        return {"started": started, "found": found, "cancelled": cancelled, "after": after}

print(json.dumps(trio.run(main)))
"""


def test_long_runs_as_an_unprivileged_user(user_dir: tuple[int, int, Path]) -> None:
    uid, gid, home = user_dir
    ws = make_workspace(home / "ws", {"a.txt": "good\n"}, owner=(uid, gid))
    out = run_script_as(uid, gid, [sys.executable, "-c", ROOTLESS_SCRIPT, str(ROOT / ".venv" / "bin" / "ccw-mcp"),
                                   str(ws), str(home / "state")], home)
    assert out["started"]["status"] == "running", json.dumps(out)
    assert out["found"]["exit_code"] == 0 and out["found"]["stdout"] == "done\n"
    assert out["cancelled"]["status"] == "cancelled" and out["cancelled"]["elapsed_ms"] < 10_000
    assert out["after"]["stdout"] == "after\n"
