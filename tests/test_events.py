"""The state dir's event stream (mcp_server/events.py): the journal's rows as events in
their transactions, turn events, a reader in another connection following them, and the
events of a finished call as its tool's spec declares them (ToolSpec.outcome)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from mcp_server import events
from mcp_server.capsules.run import Run
from mcp_server.capsules.turns import CapsuleQueue, Ticket, exec_label
from mcp_server.config import TOOLSETS, Config
from mcp_server.events import EventLog
from mcp_server.journal import Journal
from mcp_server.state import State
from mcp_server.tools.registry import Outcome, Registry
from sandbox.errors import CcwError
from tests.support.journal_rows import capsule_record, exec_entry


@pytest.fixture
def state(tmp_path: Path) -> State:
    return State(tmp_path / "state")


def test_a_capsules_life_is_a_stream_of_events_in_journal_order(state: State) -> None:
    journal, log = Journal(state), EventLog(state)
    journal.add_capsule(capsule_record())
    network = [{"host": "pypi.org", "port": 443, "protocol": "https", "allowed": True, "rule": "pypi.org:443",
                "reason": None, "address": "1.2.3.4", "bytes_in": 10, "bytes_out": 5, "cut": False},
               {"host": "evil.example", "port": 80, "protocol": "http", "allowed": False, "rule": None,
                "reason": "not in the allowlist", "address": None, "bytes_in": 0, "bytes_out": 0, "cut": False}]
    journal.add_exec("cap_1", exec_entry({"read": ["src/a.py", "src/b.py", "setup.py"], "written": ["out.txt"],
                                      "network": network}, exit_code=1))
    journal.add_write("cap_1", "notes.md", "write", b"x")
    journal.mark_destroyed("cap_1", "2026-11-27T00:00:00Z")

    got = log.since(0)
    assert [e.kind for e in got] == ["capsule.created", "run.finished", "files.written", "files.read",
                                     "net.connection", "net.connection", "file.changed", "capsule.destroyed"]
    assert [e.id for e in got] == sorted(e.id for e in got) and all(e.capsule_id == "cap_1" for e in got)
    assert got[0].data["expose"] == ["/opt/py"] and got[0].data["workspace"] == "/ws"
    finished = got[1].data
    assert finished["seq"] == 1 and finished["exit_code"] == 1 and finished["argv"] == ["pytest", "-q"]
    assert (finished["reads"], finished["writes"], finished["connections"]) == (3, 1, 2)
    assert finished["generation"] == 0 and finished["generation_out"] == 1
    assert finished["usage"] == {"cpu_ms": 7, "rss_max_kb": 900}
    assert got[2].data == {"seq": 1, "count": 1, "paths": ["out.txt"]}
    assert got[3].data["dirs"] == [["src", 2], [".", 1]]
    denied = got[5].data
    assert denied["host"] == "evil.example" and denied["allowed"] is False and "address" not in denied
    assert got[6].data == {"seq": 2, "path": "notes.md", "action": "write"}
    assert log.since(got[3].id, capsule_id="cap_1")[0].id == got[4].id
    assert [e.kind for e in log.latest(limit=2)] == ["file.changed", "capsule.destroyed"]


def test_an_untraced_run_says_its_reads_are_unknown_and_lists_are_capped(state: State) -> None:
    journal, log = Journal(state), EventLog(state)
    journal.add_capsule(capsule_record())
    written = [f"f{i:04}" for i in range(events.MAX_PATHS + 50)]
    journal.add_exec("cap_1", exec_entry({"read": None, "written": written, "network": None}))
    finished, files = log.since(0)[1:]
    assert finished.data["reads"] is None and finished.data["writes"] == len(written)
    assert files.data["count"] == len(written) and len(files.data["paths"]) == events.MAX_PATHS


def test_a_failed_journal_write_leaves_no_event(state: State) -> None:
    journal, log = Journal(state), EventLog(state)
    journal.add_capsule(capsule_record())
    before = log.last_id()
    with pytest.raises(KeyError):
        journal.add_exec("cap_1", {"argv": ["x"]})  # no touched: the row and its events roll back
    assert log.last_id() == before


def test_a_file_changes_data_is_the_encoders_own_text(state: State) -> None:
    # Journal.add_writes writes file.changed data without the generic encoder: the stored text must
    # be what it writes, for paths with quotes, backslashes, control and non-ASCII characters and
    # a lone surrogate (a file name that is not UTF-8).
    paths = ["src/a.py", 'say "hi"\\x', "tab\there\nnl\x01\x7f", "naïve/€\u2028", "raw\udcff.bin"]
    for seq, path in enumerate(paths, start=1):
        for action in ("write", "delete", "symlink", "chmod"):
            assert events.file_changed(seq, path, action) == events._ENCODER.encode(
                {"seq": seq, "path": path, "action": action})
    journal, log = Journal(state), EventLog(state)
    journal.add_capsule(capsule_record())
    journal.add_writes("cap_1", [(path, "delete", None, None, None, None) for path in paths[:4]],
                       base={"src/a.py": "absent"})
    assert [e.data for e in log.since(0)[1:]] == [{"seq": seq, "path": path, "action": "delete"}
                                                  for seq, path in enumerate(paths[:4], start=1)]
    assert journal.base_states("cap_1") == {"src/a.py": "absent"}


def test_unknown_kinds_are_refused(state: State) -> None:
    with pytest.raises(ValueError, match="unknown event kind"):
        EventLog(state).add("run.exploded", None, {})


def test_commands_waiting_for_a_turn_are_queued_then_started_events() -> None:
    seen: list[tuple[str, str, str]] = []

    def observe(what: str, capsule_id: str, ticket: Ticket) -> None:
        seen.append((what, capsule_id, ticket.label))

    queue = CapsuleQueue(observer=observe)
    first, second = exec_label(["make"]), exec_label(["pytest", "-q"])

    async def call(label: str, hold: trio.Event | None = None) -> None:
        async with queue.turn("cap", label):
            if hold is not None:
                await hold.wait()

    async def main() -> None:
        release = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call, first, release)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(call, second)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(call, "destroy")  # not a command: no run events
            await trio.testing.wait_all_tasks_blocked()
            release.set()

    trio.run(main)
    assert seen == [("started", "cap", first), ("queued", "cap", second), ("started", "cap", second)]


def test_a_follower_in_another_connection_sees_events_as_they_are_committed(tmp_path: Path) -> None:
    writer, reader = State(tmp_path / "s"), State(tmp_path / "s")  # two processes' connections
    Journal(writer)
    log = EventLog(reader)
    got: list[str] = []

    async def main() -> None:
        async def follow() -> None:
            async with contextlib.aclosing(log.follow(0, poll_s=0.01)) as stream:
                async for event in stream:
                    got.append(event.kind)
                    if len(got) == 2:
                        return

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(follow)
                await trio.sleep(0.05)
                Journal(writer).add_capsule(capsule_record())
                await trio.sleep(0.05)
                Journal(writer).mark_destroyed("cap_1", "now")

    trio.run(main)
    assert got == ["capsule.created", "capsule.destroyed"]


def test_a_follower_that_caught_up_asks_again_only_after_a_commit(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    writer, reader = State(tmp_path / "s"), State(tmp_path / "s")
    Journal(writer).add_capsule(capsule_record())
    log = EventLog(reader)
    asked: list[int] = []
    since = log.since

    def counted(after: int = 0, capsule_id: str | None = None, limit: int = 500) -> list[events.Event]:
        asked.append(after)
        return since(after, capsule_id, limit)

    monkeypatch.setattr(log, "since", counted)
    monkeypatch.setattr(events, "LOOK_S", 3600.0)  # no look "just in case" within the test
    got: list[str] = []
    arrived = [trio.Event(), trio.Event()]

    async def follow() -> None:
        async with contextlib.aclosing(log.follow(0, poll_s=0.01)) as stream:
            async for event in stream:
                got.append(event.kind)
                arrived[len(got) - 1].set()

    async def main() -> None:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(follow)
                await arrived[0].wait()
                await trio.sleep(0.3)  # thirty polls with nothing committed
                assert asked == [0], asked  # one query: the stamps said nothing changed
                Journal(writer).mark_destroyed("cap_1", "now")
                await arrived[1].wait()
                nursery.cancel_scope.cancel()

    trio.run(main)
    assert got == ["capsule.created", "capsule.destroyed"] and len(asked) == 2


def _outcome(name: str) -> Outcome:
    spec = Registry.load(TOOLSETS).lookup(name)
    assert spec is not None and spec.outcome is not None, name
    return spec.outcome


def test_promotions_witnesses_replays_and_deltamin_results_become_events(state: State) -> None:
    promoted, witnessed, replayed = _outcome("capsule_promote"), _outcome("capsule_witness"), _outcome("capsule_replay")
    refused = {"promoted": False, "dry_run": False, "applied": [],
               "policy_report": {"passed": False, "tests_ok": True, "paths_ok": False, "replay_ok": None}}
    events.record_outcome(state, "cap_1", promoted(refused, None))
    events.record_outcome(state, "cap_1", promoted(None, CcwError("REPO_CHANGED", "the workspace moved")))
    events.record_outcome(state, "cap_1", promoted({"promoted": True, "dry_run": False, "applied": ["a.py"],
                                                    "policy_report": {"passed": True}}, None))
    events.record_outcome(state, "cap_1", promoted({"promoted": True, "dry_run": False, "applied": ["b.py"],
                                                    "policy_report": {"passed": True},
                                                    "branch": {"name": "ccw/fix", "ref": "refs/heads/ccw/fix",
                                                               "parent": "p0", "commit": "c1"}}, None))
    events.record_outcome(state, "cap_1", witnessed({"witness_id": "w1", "path": "/s/w1.tar.zst", "root_hash": "h",
                                                     "size_bytes": 10, "base": {"files": 3}}, None))
    events.record_outcome(state, None, replayed({"status": "running", "run_id": "r"}, None))
    events.record_outcome(state, None, replayed({"replay_ok": False, "root_hash": "h", "output_identical": False,
                                                 "output_diffs": [{}, {}]}, None))
    events.record_outcome(state, "cap_1", _outcome("capsule_deltamin")(
        {"minimal_patch": "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n", "units": ["x"], "replay_ok": True, "trials": 9,
         "cache_hits": 2, "elapsed_ms": 5, "one_minimal": True}, None))
    events.record_outcome(state, "cap_1", witnessed(None, CcwError("TOO_LARGE", "the base")))
    got = [(e.capsule_id, e.kind, e.data) for e in EventLog(state).since(0)]
    assert got == [
        ("cap_1", "policy.report", {"passed": False, "report": refused["policy_report"]}),
        ("cap_1", "promotion", {"applied": [], "dry_run": False,
                                "refused": {"code": "POLICY_FAILED", "message": "failed: paths"}}),
        ("cap_1", "promotion", {"applied": [], "dry_run": None,
                                "refused": {"code": "REPO_CHANGED", "message": "the workspace moved"}}),
        ("cap_1", "policy.report", {"passed": True, "report": {"passed": True}}),
        ("cap_1", "promotion", {"applied": ["a.py"], "dry_run": False, "refused": None}),
        ("cap_1", "policy.report", {"passed": True, "report": {"passed": True}}),
        ("cap_1", "promotion", {"applied": ["b.py"], "dry_run": False, "refused": None,  # a commit, not the workspace
                                "branch": {"name": "ccw/fix", "commit": "c1"}}),
        ("cap_1", "witness", {"witness_id": "w1", "path": "/s/w1.tar.zst", "root_hash": "h", "size_bytes": 10}),
        (None, "replay", {"replay_ok": False, "root_hash": "h", "output_identical": False, "differences": 2}),
        ("cap_1", "deltamin.done", {"minimal": 1, "files": 1, "replay_ok": True, "trials": 9, "cache_hits": 2,
                                    "elapsed_ms": 5, "one_minimal": True}),
    ]


def test_only_the_tools_that_declare_an_outcome_make_events_of_it() -> None:
    declared = sorted(spec.name for spec in Registry.load(TOOLSETS).tools if spec.outcome is not None)
    assert declared == ["capsule_deltamin", "capsule_promote", "capsule_replay", "capsule_witness"]


def test_a_run_that_ends_is_told_by_its_tools_spec(tmp_path: Path) -> None:
    """The server's runtime records an ended run's events as its tool's spec says: a replay
    finished (in the call's task or in the background) is one; a failed or cancelled one, or a
    run of a tool that declares none (capsule_exec), is none."""
    from mcp_server.server import CcwServer

    server = CcwServer(Config.from_env({"CCW_STATE_DIR": str(tmp_path / "state")}), State(tmp_path / "state"))
    verdict = {"replay_ok": True, "root_hash": "h", "output_identical": True, "output_diffs": []}

    async def progress(done: float, total: float | None, message: str | None, output: Any = None) -> None:
        pass

    async def main() -> None:
        async def replayed(run: Run) -> dict[str, Any]:
            return verdict

        async def failed(run: Run) -> dict[str, Any]:
            raise CcwError("NOT_FOUND", "no such witness")

        async def forever(run: Run) -> dict[str, Any]:
            await trio.sleep_forever()
            raise AssertionError("cancelled")

        runs = server.runtime.runs
        await runs.call("capsule_replay", None, replayed, None, progress)
        await runs.call("capsule_exec", "cap_1", replayed, None, progress)
        with pytest.raises(CcwError):
            await runs.call("capsule_replay", None, failed, None, progress)
        await runs.call("capsule_deltamin", "cap_1", replayed, 60_000, progress)
        running = await runs.call("capsule_deltamin", "cap_1", forever, 0, progress)
        assert running["status"] == "running"
        assert (await runs.cancel(runs.get(running["run_id"])))["status"] == "cancelled"

    trio.run(main)
    got = [(e.capsule_id, e.kind, e.data) for e in EventLog(server.state).since(0)]
    assert got == [(None, "replay", {"replay_ok": True, "root_hash": "h", "output_identical": True, "differences": 0}),
                   ("cap_1", "deltamin.done", {"minimal": 0, "files": 0, "replay_ok": True, "trials": None,
                                               "cache_hits": None, "elapsed_ms": None, "one_minimal": None})]
    server.state.close()
