"""The MCP Tasks extension (mcp_server/tasks.py): advertised and served in the 2026-07-28
era only, unknown ids are JSON-RPC errors, and a task's final state is what tools/call of
its tool would have answered.  Real execs as tasks: vm-tests/test_devmachine_tasks.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import mcp_types as types
import pytest
import trio
import trio.testing
from mcp.shared.exceptions import MCPError

from mcp_server.capsules.run import OwnedRuns, Run
from mcp_server.config import Config
from mcp_server.server import CcwServer
from mcp_server.state import State
from mcp_server.tasks import EXTENSION, TaskParams, declared
from sandbox.errors import CcwError
from tests.support.raw_mcp import LEGACY, MODERN, TASKS, RawStdio


def test_the_extension_is_advertised_to_2026_clients_and_not_in_2025(tmp_path: Path) -> None:
    with RawStdio(tmp_path / "state", "server", tasks=True) as modern:
        discovered = modern.request("server/discover")["result"]
    with RawStdio(tmp_path / "state", "server", tasks=None) as legacy:
        initialized = legacy.initialized["result"]
    assert discovered["capabilities"]["extensions"] == {TASKS: {}}
    assert initialized["protocolVersion"] == LEGACY
    assert "extensions" not in initialized["capabilities"]  # the 2025-11-25 schema has none


def test_an_unknown_task_is_a_jsonrpc_error(tmp_path: Path) -> None:
    with RawStdio(tmp_path / "state", "server", tasks=True) as client:
        answers = {method: client.request(method, {"taskId": "run_1_0123456789ab"})
                   for method in ("tasks/get", "tasks/cancel")}
        answers["tasks/update"] = client.request("tasks/update", {"taskId": "nope", "inputResponses": {}})
        missing_id = client.request("tasks/get", {})
    for method, answer in answers.items():
        assert "result" not in answer, method
        assert answer["error"]["code"] == types.INVALID_PARAMS and "no task" in answer["error"]["message"]
    assert missing_id["error"]["code"] == types.INVALID_PARAMS


def test_a_task_augmented_call_with_bad_arguments_is_a_tool_error_not_a_task(tmp_path: Path) -> None:
    with RawStdio(tmp_path / "state", "server", tasks=True) as client:
        answer = client.request("tools/call", {"name": "ccw_info", "arguments": {"delay_ms": "soon"}})
    result = answer["result"]
    assert result.get("resultType") != "task" and "taskId" not in result, result
    assert result["isError"] is True
    error = result["structuredContent"]["error"]
    assert error["code"] == "INVALID_ARGUMENT"
    assert error["details"]["errors"] == [{"path": "/delay_ms", "msg": "'soon' is not of type 'integer'"}]


def test_a_2025_client_has_no_tasks_methods(tmp_path: Path) -> None:
    with RawStdio(tmp_path / "state", "server", tasks=None) as client:
        answer = client.request("tasks/get", {"taskId": "run_1_0123456789ab"})
    assert answer["error"]["code"] == types.METHOD_NOT_FOUND and "capsule_run" in answer["error"]["message"]


def _ctx(version: str, extensions: dict[str, Any] | None) -> Any:
    capabilities = types.ClientCapabilities(extensions=extensions)
    return SimpleNamespace(protocol_version=version, session=SimpleNamespace(client_capabilities=capabilities))


def test_only_a_2026_request_that_declares_the_extension_may_get_a_task() -> None:
    assert declared(_ctx(MODERN, {EXTENSION: {}}))
    assert not declared(_ctx(MODERN, None))
    assert not declared(_ctx(MODERN, {"io.example/other": {}}))
    assert not declared(_ctx(LEGACY, {EXTENSION: {}}))  # the extension is not of that era


def _server(tmp_path: Path) -> CcwServer:
    state_dir = tmp_path / "state"
    state_dir.mkdir(exist_ok=True)
    return CcwServer(Config.from_env({"CCW_STATE_DIR": str(state_dir), "CCW_TOOLSETS": "capsule"}),
                     State(state_dir))


def _task_states(server: CcwServer, body: Any) -> tuple[dict[str, Any] | None, dict[str, Any], dict[str, Any]]:
    """Start ``body`` as a capsule_exec run past its budget; (CreateTaskResult, tasks/get while it
    works, tasks/get once it ended), on a mock clock."""

    async def main() -> tuple[dict[str, Any] | None, dict[str, Any], dict[str, Any]]:
        runs = server.runtime.runs

        async def no_progress(*_: Any) -> None:
            pass

        running = await runs.call("capsule_exec", "cap", body, 1000, no_progress)
        created = server.tasks.adopt("capsule_exec", running, None)
        working = await server.tasks.get(running["run_id"], None, server._task_result)
        await trio.sleep(10)
        ended = await server.tasks.get(running["run_id"], None, server._task_result)
        return created, working, ended

    result: tuple[dict[str, Any] | None, dict[str, Any], dict[str, Any]] = trio.run(
        main, clock=trio.testing.MockClock(autojump_threshold=0))
    return result


def test_a_ccw_error_completes_the_task_with_the_tool_error_tools_call_gives(tmp_path: Path) -> None:
    async def body(run: Run) -> dict[str, Any]:
        await run.progress(1.0, None, "running 1 s")
        await trio.sleep(3)
        raise CcwError("NOT_FOUND", "capsule cap not found: capsule_list shows the capsules", {"capsule_id": "cap"})

    created, working, ended = _task_states(_server(tmp_path), body)
    assert created is not None and created["resultType"] == "task" and created["status"] == "working"
    assert created["taskId"].startswith("run_") and created["ttlMs"] is None and created["pollIntervalMs"] > 0
    # A call that fails at once may have ended by the time its task is answered: updated then.
    assert created["createdAt"].endswith("Z") and created["lastUpdatedAt"] >= created["createdAt"]
    assert working["status"] == "working" and working["statusMessage"] == "running 1 s"
    assert ended["status"] == "completed" and ended["taskId"] == created["taskId"]
    assert ended["ttlMs"] > 3_600_000 and ended["lastUpdatedAt"] > ended["createdAt"]
    result = ended["result"]
    assert result["isError"] is True
    assert result["structuredContent"]["error"]["code"] == "NOT_FOUND"
    assert '"code":"NOT_FOUND"' in result["content"][0]["text"]


def test_an_unexpected_failure_fails_the_task_with_a_jsonrpc_error(tmp_path: Path) -> None:
    async def body(run: Run) -> dict[str, Any]:
        await trio.sleep(3)
        raise RuntimeError("boom")

    _, _, ended = _task_states(_server(tmp_path), body)
    assert ended["status"] == "failed" and "result" not in ended
    assert ended["error"]["code"] == types.INTERNAL_ERROR and "boom" in ended["error"]["message"]


def test_only_a_live_runs_running_summary_becomes_a_task(tmp_path: Path) -> None:
    server = _server(tmp_path)
    summary = {"status": "running", "run_id": "run_1_0123456789ab", "elapsed_ms": 1, "progress": None}

    async def main() -> list[Any]:
        return [server.tasks.adopt("capsule_exec", summary, None),  # no such run
                server.tasks.adopt("capsule_exec", {"exit_code": 0, "stdout": "x"}, None),
                server.tasks.adopt("capsule_exec", [summary], None)]

    assert trio.run(main) == [None, None, None]


@pytest.mark.parametrize("method", ["tasks/get", "tasks/update", "tasks/cancel"])
def test_the_tasks_methods_need_the_exec_scope(tmp_path: Path, method: str) -> None:
    assert _server(tmp_path).scope_for(method, {"taskId": "run_1_0123456789ab"}) == "exec"


def test_a_running_summary_is_recognised_by_run_statuss_fields() -> None:
    from mcp_server.capsules.run import RUN_STATUS
    from mcp_server.tasks import _SUMMARY_KEYS

    assert set(RUN_STATUS["properties"]) == _SUMMARY_KEYS  # type: ignore[call-overload]


def test_a_task_and_its_run_are_the_starting_tokens_only(tmp_path: Path) -> None:
    server = _server(tmp_path)
    unknown = "run_9_0123456789ab"

    async def body(run: Run) -> dict[str, Any]:
        await trio.sleep(5)
        return {"done": True}

    async def main() -> dict[str, Any]:
        runs = server.runtime.runs
        alice = OwnedRuns(runs, "alice")
        running = await alice.call("capsule_exec", "cap", body, 1000, _no_progress)
        run_id = running["run_id"]
        assert server.tasks.adopt("capsule_exec", running, "bob") is None  # bob's call cannot claim it
        assert server.tasks.adopt("capsule_exec", running, "alice") is not None
        # Another token's run reads exactly as an unknown one: its existence is not told.
        refused = {
            "capsule_run": _refusal(lambda: OwnedRuns(runs, "bob").get(run_id)).replace(run_id, unknown),
            "stdio capsule_run": _refusal(lambda: OwnedRuns(runs, None).get(run_id)).replace(run_id, unknown),
            "unknown run": _refusal(lambda: OwnedRuns(runs, "bob").get(unknown)),
            "tasks/get": _refusal(lambda: server.tasks.find(run_id, "bob")).replace(run_id, unknown),
            "tasks/update": _refusal(lambda: server.tasks.update(run_id, "bob")).replace(run_id, unknown),
            "unknown task": _refusal(lambda: server.tasks.find(unknown, "bob")),
        }
        try:
            await server.tasks.cancel(run_id, "bob")
            raise AssertionError("bob cancelled alice's task")
        except MCPError as exc:
            refused["tasks/cancel"] = str(exc).replace(run_id, unknown)
        alive = not alice.get(run_id).done.is_set()  # bob's cancel did not touch it
        return {"refused": refused, "alive": alive, "ended": await server.tasks.get(run_id, "alice", _never_answer)}

    outcome = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    refused = outcome["refused"]
    assert refused["capsule_run"] == refused["stdio capsule_run"] == refused["unknown run"]
    assert refused["tasks/get"] == refused["tasks/update"] == refused["tasks/cancel"] == refused["unknown task"]
    assert outcome["alive"] and outcome["ended"]["status"] == "working"


def _refusal(attempt: Any) -> str:
    """The message of the error ``attempt()`` raises (it must raise one)."""
    try:
        attempt()
    except (CcwError, MCPError) as exc:
        return str(exc)
    raise AssertionError("not refused")


async def _no_progress(*_: Any) -> None:
    pass


async def _never_answer(tool: str, outcome: Any) -> dict[str, Any]:
    raise AssertionError("the task has not ended")


def test_a_task_is_no_task_to_a_connection_not_served_its_tool(tmp_path: Path) -> None:
    """A client attached with other tool families (mcp_server/frontdoor.py) shares the
    owner's runs: one made by a tool it is not served is no task to it, as to a server
    of its own, which would never have made it."""
    server = _server(tmp_path)
    unknown = "run_9_0123456789ab"

    async def body(run: Run) -> dict[str, Any]:
        await trio.sleep(5)
        return {"done": True}

    def ctx(toolsets: str) -> Any:
        return SimpleNamespace(protocol_version=MODERN, lifespan_context=server.tool_list(toolsets.split(",")))

    async def main() -> dict[str, Any]:
        running = await server.runtime.runs.call("capsule_exec", "cap", body, 1000, _no_progress)
        run_id = running["run_id"]
        assert server.tasks.adopt("capsule_exec", running, None) is not None
        params = TaskParams(taskId=run_id)
        refused = {"unknown task": _refusal(lambda: server.tasks.find(unknown, None))}
        for method, handler in (("tasks/get", server._on_task_get), ("tasks/cancel", server._on_task_cancel),
                                ("tasks/update", server._on_task_update)):
            try:
                await handler(ctx("server,text"), params)
                raise AssertionError(f"{method} of a task of capsule_exec on a connection without it")
            except MCPError as exc:
                refused[method] = str(exc).replace(run_id, unknown)
        alive = not server.runtime.runs.get(run_id, None).done.is_set()  # the refused cancel did not touch it
        return {"refused": refused, "alive": alive, "served": await server._on_task_get(ctx("agent"), params)}

    outcome = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    refused = outcome["refused"]
    assert refused["tasks/get"] == refused["tasks/cancel"] == refused["tasks/update"] == refused["unknown task"]
    assert outcome["alive"] and outcome["served"]["status"] == "working"  # the agent profile has capsule_exec
