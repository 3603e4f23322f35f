"""Fork N and race (issue 39) without a helper: forks made all or none, the race's order,
its bounds, its table, and a race through a fake helper whose capsules exit differently."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel

from mcp_server.capsules import race as race_module
from mcp_server.capsules import races
from mcp_server.capsules.race import MAX_RACERS, ORDER, Question, check, race, ranked
from mcp_server.capsules.remote import RemoteRun
from mcp_server.capsules.service import MAX_FORKS, CapsuleService
from mcp_server.cli import parse_args
from mcp_server.cli import race as cli_race
from mcp_server.cli.capsule import tool_call
from mcp_server.journal import Journal
from mcp_server.state import State
from sandbox.errors import CcwError
from sandbox.ops import (
    ChangesRequest,
    CreateRequest,
    DestroyRequest,
    ExecRequest,
    ForkRequest,
    OpRequest,
)
from sandbox.replies import (
    ChangesReply,
    CreateReply,
    DestroyReply,
    ExecReply,
    ForkReply,
    OpReply,
    Touched,
    Truncated,
    Usage,
)
from sandbox.spec import CapsuleSpec
from tests.support.call_hooks import Hooks


class FakeHelper:
    """Makes capsules and forks (the ``fail_at``-th fork refused), runs execs exiting as
    ``exits`` says per capsule, and shows no changes."""

    def __init__(self, scratch: Path) -> None:
        self.requests: list[OpRequest] = []
        self.made = 0
        self.forks = 0
        self.fail_at: int | None = None
        self.exits: dict[str, int] = {}
        self.root = tempfile.mkdtemp(prefix="fake-race-", dir=scratch)  # the test's tmp_path, removed with it

    async def call(self, request: OpRequest, on_progress: Any = None) -> OpReply:
        self.requests.append(request)
        if isinstance(request, CreateRequest | ForkRequest):
            if isinstance(request, ForkRequest):
                self.forks += 1
                if self.forks == self.fail_at:
                    raise CcwError("UNAVAILABLE", "no room for another overlay")
            self.made += 1
            made = {"capsule_id": f"cap_{self.made}", "mount": f"/m/{self.made}", "workspace": "/w",
                    "created_at": "", "clock": "", "isolation": {}}
            if isinstance(request, ForkRequest):
                return ForkReply(**made, parent=request.capsule_id)
            return CreateReply(**made)
        if isinstance(request, ExecRequest):
            await trio.lowlevel.checkpoint()
            return ExecReply(
                exit_code=self.exits.get(request.capsule_id, 0), signal=None, timed_out=False, oom_killed=False,
                duration_ms=int(request.capsule_id.removeprefix("cap_")) * 10, stdout=b"", stderr=b"",
                stdout_bytes=0, stderr_bytes=0, truncated=Truncated(False, False),
                usage=Usage(cpu_ms=1, rss_max_kb=2, rss_max_process_kb=2, io_read_kb=0, io_write_kb=0),
                usage_unavailable={}, usage_sources={}, disk=None, touched=Touched((), (), (), ()),
                touched_unavailable={})
        if isinstance(request, ChangesRequest):
            return ChangesReply(())
        if isinstance(request, DestroyRequest):
            return DestroyReply(request.capsule_id, True)
        raise AssertionError(request)

    async def open_root(self, capsule_id: str) -> int:
        return os.open(self.root, os.O_PATH | os.O_DIRECTORY)


@pytest.fixture
def world(tmp_path: Path) -> tuple[CapsuleService, FakeHelper, Hooks, Path]:
    helper, hooks = FakeHelper(tmp_path), Hooks()

    async def get_helper() -> FakeHelper:
        return helper

    workspace = tmp_path / "ws"
    workspace.mkdir()
    return CapsuleService(State(tmp_path / "state"), get_helper, hooks), helper, hooks, workspace  # type: ignore[arg-type]


def test_forks_are_made_in_one_turn_and_journaled(world: Any) -> None:
    service, _, _, workspace = world

    async def main() -> list[str]:
        parent = await service.create(CapsuleSpec(workspace=str(workspace)))
        return [record.capsule_id for record in await service.forks(parent.capsule_id, 3)]

    assert trio.run(main) == ["cap_2", "cap_3", "cap_4"]
    journal = Journal(service.state)
    assert [journal.live_capsule(c, "gone").parent for c in ("cap_2", "cap_3", "cap_4")] == ["cap_1"] * 3


def test_a_fork_that_fails_halfway_leaves_none(world: Any) -> None:
    service, helper, _, workspace = world
    helper.fail_at = 3

    async def main() -> None:
        parent = await service.create(CapsuleSpec(workspace=str(workspace)))
        await service.forks(parent.capsule_id, 5)

    with pytest.raises(CcwError) as caught:
        trio.run(main)
    assert caught.value.code == "UNAVAILABLE"
    assert "fork 3 of 5 failed" in caught.value.message and "the 2 made were destroyed" in caught.value.message
    assert caught.value.details["destroyed"] == 2 and caught.value.details["not_destroyed"] == []
    assert [r.capsule_id for r in helper.requests if isinstance(r, DestroyRequest)] == ["cap_2", "cap_3"]
    for gone in ("cap_2", "cap_3"):
        with pytest.raises(CcwError, match="not found"):
            service.live_record(gone)


@pytest.mark.parametrize(("count", "code"), [(0, "INVALID_ARGUMENT"), (MAX_FORKS + 1, "TOO_LARGE")])
def test_a_fork_count_out_of_bounds_names_the_bound(world: Any, count: int, code: str) -> None:
    service, helper, _, _ = world
    with pytest.raises(CcwError) as caught:
        trio.run(service.forks, "cap_1", count)
    assert caught.value.code == code and f"1..{MAX_FORKS}" in caught.value.message
    assert "call capsule_fork again" in caught.value.message and helper.requests == []


def test_a_race_is_bounded_and_names_each_capsule_once() -> None:
    with pytest.raises(CcwError) as caught:
        check(Question(tuple(f"cap_{i}" for i in range(MAX_RACERS + 1)), ("true",)))
    assert caught.value.code == "TOO_LARGE" and str(MAX_RACERS) in caught.value.message
    with pytest.raises(CcwError, match="cap_2 named twice"):
        check(Question(("cap_1", "cap_2", "cap_2"), ("true",)))


def _row(capsule_id: str, exit_code: int = 0, verdict: str = "passed", lines: int = 1, files: int = 1,
         duration_ms: int = 100) -> dict[str, Any]:
    return {"capsule_id": capsule_id, "exit_code": exit_code, "timed_out": False, "duration_ms": duration_ms,
            "usage": {}, "diff": {"files": files, "lines": lines}, "verdict": verdict, "verdict_details": ""}


def test_rows_rank_passes_first_then_smallest_diff_then_fastest() -> None:
    rows = [
        _row("cap_fast_fail", exit_code=1, lines=0, duration_ms=1),
        _row("cap_big", lines=50),
        _row("cap_slow", lines=3, duration_ms=900),
        _row("cap_quick", lines=3, duration_ms=20),
        _row("cap_policy", lines=0, verdict="failed"),
        {"capsule_id": "cap_gone", "error": {"code": "NOT_FOUND", "message": "destroyed"}},
        {**_row("cap_timeout", exit_code=0, lines=0), "timed_out": True},
        _row("cap_fewer_files", lines=3, files=0, duration_ms=5000),
    ]
    order = [row["capsule_id"] for row in ranked(rows)]
    assert order == ["cap_fewer_files", "cap_quick", "cap_slow", "cap_big", "cap_policy", "cap_fast_fail",
                     "cap_timeout", "cap_gone"]
    assert [row["rank"] for row in ranked(rows)] == list(range(1, 9))


def test_a_race_through_the_service_ranks_and_reports_each_end(world: Any) -> None:
    service, helper, hooks, workspace = world

    async def main() -> dict[str, Any]:
        parent = await service.create(CapsuleSpec(workspace=str(workspace)))
        forks = [record.capsule_id for record in await service.forks(parent.capsule_id, 3)]
        helper.exits = {forks[0]: 1}
        return await race(service, Question(tuple(forks), ("pytest", "-q")))

    result = trio.run(main)
    assert [(row["capsule_id"], row["exit_code"], row["verdict"]) for row in result["rows"]] == [
        ("cap_3", 0, "passed"), ("cap_4", 0, "passed"), ("cap_2", 1, "passed")]
    assert result["order"] == ORDER and result["executor"] == "local" and result["policy"] == "baseline"
    assert result["rows"][0]["diff"] == {"files": 0, "lines": 0} and result["rows"][0]["usage"]["cpu_ms"] == 1
    assert [(done, total) for done, total, _ in hooks.reports] == [(1.0, 3.0), (2.0, 3.0), (3.0, 3.0)]
    assert [len(Journal(service.state).execs(c)) for c in ("cap_2", "cap_3", "cap_4")] == [1, 1, 1]
    # The table names the race as ccw ui lists it, its rows the same.
    kept = races.get(service.state, result["race_id"])
    assert result["race_id"].startswith("race_") and kept["state"] == "finished", kept
    assert [row["capsule_id"] for row in kept["rows"]] == ["cap_3", "cap_4", "cap_2"]


def test_a_row_whose_change_cannot_be_read_keeps_its_run(world: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # Root racing forks over another uid's checkout: its git refuses the repository, so what
    # promotion would carry is unknown; the command ran all the same, and the row once lost it.
    service, helper, _, workspace = world
    real = race_module.carried

    async def carried(service: CapsuleService, capsule_id: str) -> Any:
        if capsule_id == "cap_2":
            raise CcwError("PERMISSION_DENIED", "git check-ignore failed: detected dubious ownership")
        return await real(service, capsule_id)

    monkeypatch.setattr(race_module, "carried", carried)

    async def main() -> dict[str, Any]:
        parent = await service.create(CapsuleSpec(workspace=str(workspace)))
        forks = [record.capsule_id for record in await service.forks(parent.capsule_id, 2)]
        helper.exits = {forks[1]: 1}
        return await race(service, Question(tuple(forks), ("pytest", "-q")))

    result = trio.run(main)
    unread, failed = result["rows"]
    assert (unread["capsule_id"], unread["exit_code"], unread["duration_ms"]) == ("cap_2", 0, 20)
    assert "error" not in unread and "diff" not in unread and unread["verdict"] == "refused"
    assert unread["verdict_details"].startswith("PERMISSION_DENIED: git check-ignore failed")
    assert (failed["capsule_id"], failed["exit_code"], failed["verdict"]) == ("cap_3", 1, "passed")
    first = cli_race.table(result).splitlines()[1]
    assert first.split()[:6] == ["1", "cap_2", "0", "0.0s", "0.0s", "0M"] and first.split()[6:8] == ["-", "-"]
    assert first.endswith("refused: PERMISSION_DENIED: git check-ignore failed: detected dubious ownership")


def test_a_race_kept_under_its_run_id_answers_with_it(world: Any) -> None:
    service, _, _, workspace = world

    async def main() -> dict[str, Any]:
        parent = await service.create(CapsuleSpec(workspace=str(workspace)))
        return await race(service, Question((parent.capsule_id,), ("true",)), race_id="run_0123abcd")

    result = trio.run(main)
    assert result["race_id"] == "run_0123abcd"
    assert races.get(service.state, "run_0123abcd")["state"] == "finished"


def test_a_race_with_an_unknown_policy_runs_nothing(world: Any) -> None:
    service, helper, _, workspace = world

    async def main() -> None:
        parent = await service.create(CapsuleSpec(workspace=str(workspace)))
        await race(service, Question((parent.capsule_id,), ("true",), policy="no-such"))

    with pytest.raises(CcwError, match="no policy named 'no-such'"):
        trio.run(main)
    assert not any(isinstance(r, ExecRequest) for r in helper.requests)


def test_the_command_line_forks_n_and_races() -> None:
    assert tool_call(parse_args(["capsule", "fork", "cap_1", "-n", "3"]))[:2] == (
        "capsule_fork", {"capsule_id": "cap_1", "count": 3})
    args = parse_args(["capsule", "race", "cap_1", "cap_2", "--timeout-ms", "900", "--", "pytest", "-q"])
    assert cli_race.tool_call(args) == {"capsule_ids": ["cap_1", "cap_2"], "cmd": ["pytest", "-q"],
                                        "wait_ms": None, "timeout_ms": 900}
    with pytest.raises(SystemExit, match="give the command after --"):
        cli_race.tool_call(parse_args(["capsule", "race", "cap_1"]))


def test_the_table_shows_each_row_best_first() -> None:
    result = {"race_id": "race_0a1b", "order": ORDER, "policy": "baseline", "parallel": 2, "executor": "local",
              "elapsed_ms": 1500,
              "rows": ranked([_row("cap_b", exit_code=1), {**_row("cap_a", lines=7), "usage": {"cpu_ms": 2500}},
                              {"capsule_id": "cap_c", "error": {"code": "CONFLICT", "message": "it has forks"}}])}
    lines = cli_race.table(result).splitlines()
    assert lines[0].split() == ["rank", "capsule", "exit", "time", "cpu", "rss", "files", "lines", "policy"]
    assert lines[1].split() == ["1", "cap_a", "0", "0.1s", "2.5s", "-", "1", "7", "passed"]
    assert lines[2].split()[:3] == ["2", "cap_b", "1"] and lines[3].endswith("CONFLICT: it has forks")
    assert lines[4].startswith("ranked: passed first") and "2 at once, local, 1.5s" in lines[4]
    assert lines[4].endswith("; race_0a1b in ccw ui")
    assert cli_race.best_passed(result) and not cli_race.best_passed({**result, "rows": result["rows"][1:]})


def test_a_rootless_row_shows_its_largest_process_and_says_so() -> None:
    # Without a memory cgroup no total is measured, and "-" hid the figure the run did have.
    rows = ranked([{**_row("cap_a"), "usage": {"rss_max_kb": None, "rss_max_process_kb": 98_304}},
                   {**_row("cap_b"), "usage": {"rss_max_kb": 51_200}}])
    lines = cli_race.table({"order": ORDER, "policy": "baseline", "parallel": 2, "executor": "local",
                            "elapsed_ms": 1500, "rows": rows}).splitlines()
    assert [line.split()[5] for line in lines[1:3]] == ["96M*", "50M"]
    assert lines[3] == "* the largest process's peak: no memory cgroup measured the run's total"


class FakeCluster:
    """A cluster's executor as a race sees it: each trial's exit by capsule (``exits``), the trials kept;
    ``refuse``: capsules whose trials it cannot run (as an allowlist network's)."""

    name = "reapi"
    parallelism = 3

    def __init__(self, exits: dict[str, int], refuse: frozenset[str] = frozenset()) -> None:
        self.exits, self.refuse, self.trials = exits, refuse, []  # type: ignore[var-annotated]

    async def run_trial(self, service: CapsuleService, trial: Any) -> Any:
        self.trials.append(trial)
        await trio.lowlevel.checkpoint()
        return RemoteRun(self.exits.get(trial.record.capsule_id, 0), False, b"", b"")

    def check_trials(self, service: CapsuleService, record: Any, services: Any) -> None:
        if record.capsule_id in self.refuse:
            raise CcwError("UNSUPPORTED", "trials of a capsule with an allowlist network run locally only")


def test_a_race_on_a_cluster_runs_each_tree_there_and_says_where(world: Any) -> None:
    service, helper, _, workspace = world
    cluster = FakeCluster({"cap_3": 2}, refuse=frozenset({"cap_4"}))

    async def main() -> dict[str, Any]:
        parent = await service.create(CapsuleSpec(workspace=str(workspace)))
        forks = [record.capsule_id for record in await service.forks(parent.capsule_id, 3)]
        return await race(service, Question(tuple(forks), ("pytest", "-q"), timeout_ms=5000), runner=cluster)

    result = trio.run(main)
    assert result["executor"] == "reapi" and result["parallel"] == 3
    assert [(row["capsule_id"], row["where"], row["exit_code"]) for row in result["rows"]] == [
        ("cap_2", "reapi", 0), ("cap_4", "local", 0), ("cap_3", "reapi", 2)]
    # The cluster got its capsules' trees with the race's command; nothing ran in them here.
    assert sorted(t.record.capsule_id for t in cluster.trials) == ["cap_2", "cap_3"]  # cap_4 it refused
    assert ({t.request.argv for t in cluster.trials} == {("pytest", "-q")}
            and cluster.trials[0].request.timeout_ms == 5000)
    assert [r.capsule_id for r in helper.requests if isinstance(r, ExecRequest)] == ["cap_4"]
    assert [len(Journal(service.state).execs(c)) for c in ("cap_2", "cap_3", "cap_4")] == [0, 0, 1]
    assert result["rows"][0]["usage"] == {} and result["rows"][0]["verdict"] == "passed"
