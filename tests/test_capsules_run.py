"""Background runs (mcp_server/capsules/run.py): answers within the budget, "running"
past it, fetches, cancels, the capsule's turn held by the run, and results that expire."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from mcp_server.capsules import run
from mcp_server.capsules.run import Run, Runs
from mcp_server.capsules.turns import CapsuleQueue
from sandbox.errors import CcwError

RESULT = {"exit_code": 0, "stdout": "done\n"}


async def _no_progress(progress: float, total: float | None = None, message: str | None = None,
                       output: Any = None) -> None:
    pass


def _sleeper(seconds: float, log: list[str] | None = None) -> Any:
    async def body(run: Run) -> dict[str, Any]:
        try:
            await run.progress(1.0, None, "running 0 s\nhalf")
            await trio.sleep(seconds)
            return dict(RESULT)
        finally:
            if log is not None:
                log.append("ended")
    return body


def _run(main: Any) -> Any:
    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_run_that_ends_within_the_budget_answers_its_result() -> None:
    async def main() -> Any:
        return await Runs().call("capsule_exec", "cap", _sleeper(1), 5000, _no_progress)

    assert _run(main) == RESULT


def test_a_run_past_the_budget_answers_running_and_is_fetched_by_id() -> None:
    async def main() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        runs = Runs()
        first = await runs.call("capsule_exec", "cap", _sleeper(3), 1000, _no_progress)
        again = await runs.wait(runs.get(first["run_id"]), 1000, _no_progress)
        done = await runs.wait(runs.get(first["run_id"]), 5000, None)
        return first, again, done

    first, again, done = _run(main)
    assert first["status"] == "running" and first["run_id"].startswith("run_")
    assert 1000 <= first["elapsed_ms"] < 2000 and first["progress"] == "running 0 s\nhalf"
    assert again["status"] == "running" and again["run_id"] == first["run_id"] and again["elapsed_ms"] >= 2000
    assert done == RESULT


def test_progress_goes_to_the_waiting_call_only() -> None:
    heard: list[str | None] = []

    async def listener(progress: float, total: float | None = None, message: str | None = None,
                       output: Any = None) -> None:
        heard.append(message)

    async def body(run: Run) -> dict[str, Any]:
        await run.progress(1.0, None, "one")
        await trio.sleep(2)
        await run.progress(2.0, None, "two")  # nobody waits now
        await trio.sleep(2)
        await run.progress(3.0, None, "three")
        return dict(RESULT)

    async def main() -> None:
        runs = Runs()
        first = await runs.call("capsule_exec", "cap", body, 1000, listener)
        await trio.sleep(2)
        assert await runs.wait(runs.get(first["run_id"]), 5000, listener) == RESULT

    _run(main)
    assert heard == ["one", "three"]


def test_cancel_ends_the_run_and_frees_the_turn() -> None:
    queue = CapsuleQueue()
    log: list[str] = []

    async def body(run: Run) -> dict[str, Any]:
        async with queue.turn("cap", "exec `sleep 60`"):
            return await _sleeper(60, log)(run)

    async def main() -> tuple[dict[str, Any], dict[str, Any], float]:
        runs = Runs()
        first = await runs.call("capsule_exec", "cap", body, 1000, _no_progress)
        assert [t.label for t in queue.line("cap")] == ["exec `sleep 60`"]
        began = trio.current_time()
        cancelled = await runs.cancel(runs.get(first["run_id"]))
        took = trio.current_time() - began
        assert queue.line("cap") == []
        return cancelled, await runs.wait(runs.get(first["run_id"]), 0, None), took

    cancelled, later, took = _run(main)
    assert log == ["ended"] and took < 1
    assert cancelled["status"] == "cancelled" and later == cancelled


def test_a_call_on_the_same_capsule_waits_behind_a_background_run() -> None:
    queue = CapsuleQueue()
    order: list[str] = []

    def holding(name: str, seconds: float) -> Any:
        async def body(run: Run) -> dict[str, Any]:
            async with queue.turn("cap", name):
                order.append(f"{name} starts")
                await trio.sleep(seconds)
                order.append(f"{name} ends")
                return {"name": name}
        return body

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        runs = Runs()
        first = await runs.call("capsule_exec", "cap", holding("long", 3), 1000, _no_progress)
        # The call that started the run has answered; its run still holds the turn.
        second = await runs.call("capsule_exec", "cap", holding("next", 0), 10_000, _no_progress)
        return first, second

    first, second = _run(main)
    assert first["status"] == "running" and second == {"name": "next"}
    assert order == ["long starts", "long ends", "next starts", "next ends"]


def test_cancelling_the_call_before_it_answers_cancels_the_run() -> None:
    log: list[str] = []

    async def main() -> Runs:
        runs = Runs()
        with trio.move_on_after(0.5):
            await runs.call("capsule_exec", "cap", _sleeper(60, log), 10_000, _no_progress)
        await trio.testing.wait_all_tasks_blocked()
        return runs

    _run(main)
    assert log == ["ended"]


def test_an_error_of_the_run_is_raised_at_the_fetch() -> None:
    async def body(run: Run) -> dict[str, Any]:
        await trio.sleep(2)
        raise CcwError("NOT_FOUND", "capsule cap not found", {})

    async def main() -> None:
        runs = Runs()
        first = await runs.call("capsule_exec", "cap", body, 1000, _no_progress)
        with pytest.raises(CcwError) as caught:
            await runs.wait(runs.get(first["run_id"]), 5000, None)
        assert caught.value.code == "NOT_FOUND"

    _run(main)


def test_wait_none_runs_in_the_calling_task() -> None:
    async def main() -> Any:
        runs = Runs()
        result = await runs.call("capsule_exec", "cap", _sleeper(120), None, _no_progress)
        assert runs._runs == {}
        return result

    assert _run(main) == RESULT


def test_a_run_waited_for_in_the_calling_task_tells_its_end_too() -> None:
    """The event stream learns of a run the ccw command waited for (wait_ms null), as of others."""
    ended: list[tuple[str, Any, Any]] = []

    async def failing(run: Run) -> dict[str, Any]:
        raise CcwError("CONFLICT", "the command is flaky", {})

    async def main() -> None:
        runs = Runs(on_end=lambda run: ended.append((run.tool, run.result, run.error and run.error.code)))
        assert await runs.call("capsule_deltamin", "cap", _sleeper(1), None, _no_progress) == RESULT
        with pytest.raises(CcwError):
            await runs.call("capsule_replay", None, failing, None, _no_progress)

    _run(main)
    assert ended == [("capsule_deltamin", RESULT, None), ("capsule_replay", None, "CONFLICT")]


def test_finished_runs_expire_by_age_and_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run, "KEEP_FINISHED", 2)

    async def main() -> None:
        runs = Runs()
        ids = [(await runs.call("capsule_exec", "cap", _sleeper(2), 100, _no_progress))["run_id"] for _ in range(3)]
        await trio.sleep(3)
        assert await runs.wait(runs.get(ids[2]), 0, None) == RESULT  # the newest ones stay
        runs.get(ids[1])
        with pytest.raises(CcwError) as caught:
            runs.get(ids[0])
        assert caught.value.code == "NOT_FOUND" and "restart" in caught.value.message
        await trio.sleep(run.KEEP_S + 1)
        with pytest.raises(CcwError):
            runs.get(ids[2])

    _run(main)


def test_the_server_end_cancels_every_run() -> None:
    log: list[str] = []

    async def main() -> None:
        runs = Runs()
        await runs.call("capsule_exec", "cap", _sleeper(600, log), 100, _no_progress)
        await runs.call("capsule_exec", "other", _sleeper(600, log), 100, _no_progress)
        await runs.aclose()
        assert log == ["ended", "ended"]

    _run(main)


@pytest.mark.parametrize("tool", ["capsule_exec", "capsule_race", "capsule_deltamin", "capsule_replay"])
def test_a_running_answer_says_what_to_do_next_in_every_tool_that_runs(tool: str) -> None:
    from jsonschema import Draft202012Validator

    from mcp_server.config import TOOLSETS
    from mcp_server.tools.registry import Registry

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        runs = Runs()
        first = await runs.call(tool, "cap", _sleeper(3), 1000, _no_progress)
        return first, await runs.cancel(runs.get(first["run_id"]))

    first, cancelled = _run(main)
    assert first["status"] == "running"
    assert first["next"].startswith(f'capsule_run {{"run_id": "{first["run_id"]}"}} waits for the rest')
    assert '"cancel": true' in first["next"]
    assert "next" not in cancelled  # nothing is left to do with a cancelled run
    spec = Registry.load(TOOLSETS).lookup(tool)
    assert spec is not None
    Draft202012Validator(spec.output_schema).validate(first)
