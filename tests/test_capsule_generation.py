"""A capsule's change generation: which writes advance it, which journaled runs observe the
current contents, deltamin's use of them, and the migration of journals made before it."""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from mcp_server.capsules.deltamin import _evidence, _journal_outcomes
from mcp_server.capsules.exec import CANCELLED, cut_entry
from mcp_server.cli import runlog
from mcp_server.core.generations import exec_advances, observes
from mcp_server.journal import Journal
from mcp_server.journal_records import CapsuleRecord
from mcp_server.journal_view import exec_summary
from mcp_server.state import State
from sandbox.ops import ExecRequest
from sandbox.spec import CapsuleSpec
from tests.support.journal_rows import FIRST_RELEASE_TABLES

TRACED_NO_WRITE = {"read": ["t.py"], "written": []}
TRACED_WRITE = {"read": ["t.py"], "written": [".pytest_cache/v/cache/lastfailed"]}
UNTRACED_NO_WRITE = {"read": None, "written": []}  # rootless: no fanotify


def _record(capsule_id: str = "cap_1") -> CapsuleRecord:
    return CapsuleRecord(
        capsule_id=capsule_id, spec=CapsuleSpec(workspace="/ws"), parent=None, created_at="", clock="",
        isolation={}, mount="",
        base_fingerprint=None, destroyed_at=None,
    )


def _exec(journal: Journal, capsule_id: str, exit_code: int, touched: dict[str, Any],
          argv: list[str] | None = None) -> dict[str, Any]:
    started = journal.generation(capsule_id)
    journal.add_exec(capsule_id, {
        "started_at": "", "argv": argv or ["pytest", "-q"], "cwd": "/ws", "env_keys": [], "stdin_blake3": None,
        "stdin_b64": None, "timeout_ms": 1000, "exit_code": exit_code, "signal": None, "timed_out": 0,
        "oom_killed": 0, "stdout_blake3": "b", "stderr_blake3": "b", "stdout_bytes": 0, "stderr_bytes": 0,
        "duration_ms": 1, "usage": {}, "touched": touched, "generation": started,
    })
    return journal.execs(capsule_id)[-1]


@pytest.fixture
def journal(state_dir: Path) -> Journal:
    state = State(state_dir)
    journal = Journal(state)
    journal.add_capsule(_record())
    return journal


def test_writes_advance_the_generation_and_reads_do_not(journal: Journal) -> None:
    assert journal.capsule("cap_1").generation == 0  # type: ignore[union-attr]
    ran = _exec(journal, "cap_1", 0, TRACED_NO_WRITE)
    assert (ran["generation"], ran["generation_out"], journal.generation("cap_1")) == (0, None, 0)
    ran = _exec(journal, "cap_1", 0, TRACED_WRITE)
    assert (ran["generation"], ran["generation_out"], journal.generation("cap_1")) == (0, 1, 1)
    journal.add_write("cap_1", "src/a.py", "write", b"x = 2\n", mode=0o644)
    assert journal.writes("cap_1")[-1]["generation"] == 2 and journal.generation("cap_1") == 2
    # Without a fanotify trace the write set may be incomplete: the exec advances anyway.
    ran = _exec(journal, "cap_1", 0, UNTRACED_NO_WRITE)
    assert (ran["generation"], ran["generation_out"], journal.generation("cap_1")) == (2, 3, 3)
    assert journal.advance("cap_1") == 4
    assert journal.capsule("cap_1").generation == 4  # type: ignore[union-attr]


def test_exec_advances() -> None:
    assert not exec_advances(TRACED_NO_WRITE)
    assert exec_advances(TRACED_WRITE)
    assert exec_advances(UNTRACED_NO_WRITE)
    assert exec_advances({"read": None, "written": ["a"]})


@pytest.mark.parametrize(
    ("started", "out", "current", "expected"),
    [
        (3, None, 3, True),  # ran on the current contents and wrote nothing
        (2, 3, 3, True),  # its own writes made the current generation
        (1, None, 3, False),  # ran on older contents
        (1, 2, 3, False),  # wrote, then something else changed the capsule
        (1, 3, 3, False),  # a file tool wrote while it ran: its contents changed under it
        (3, 4, 3, False),  # impossible (out ahead of current), never counted
        (None, None, 0, False),  # no generation recorded
    ],
)
def test_observes(started: int | None, out: int | None, current: int, expected: bool) -> None:
    assert observes({"generation": started, "generation_out": out}, current) is expected


def test_the_agent_loop_counts_only_the_run_after_the_edit(journal: Journal) -> None:
    # pytest passes and writes caches, an edit, pytest fails and writes caches: the run
    # before the edit is not an observation of the change deltamin minimises.
    record = _record()
    _exec(journal, "cap_1", 0, {"read": ["t.py", "a.py"], "written": [".pytest_cache/x"]})
    journal.add_write("cap_1", "a.py", "write", b"broken\n", mode=0o644)
    _exec(journal, "cap_1", 1, {"read": ["t.py", "a.py", "b.py"], "written": [".pytest_cache/x"]})
    current = journal.generation("cap_1")
    assert current == 3
    assert _journal_outcomes(journal, record, ["pytest", "-q"], "exit_code", current) == ["fail"]
    assert _evidence(journal, record, ["pytest", "-q"], current) == {"t.py", "a.py", "b.py"}
    # Another failing run on the same contents agrees; another command is ignored.
    _exec(journal, "cap_1", 1, TRACED_NO_WRITE)
    _exec(journal, "cap_1", 0, TRACED_NO_WRITE, argv=["true"])
    assert _journal_outcomes(journal, record, ["pytest", "-q"], "exit_code", current) == ["fail", "fail"]


def test_a_flaky_command_on_the_current_generation_still_disagrees(journal: Journal) -> None:
    record = _record()
    journal.add_write("cap_1", "a.py", "write", b"x\n", mode=0o644)
    _exec(journal, "cap_1", 1, TRACED_NO_WRITE)
    _exec(journal, "cap_1", 0, TRACED_NO_WRITE)
    outcomes = _journal_outcomes(journal, record, ["pytest", "-q"], "exit_code", journal.generation("cap_1"))
    assert outcomes == ["fail", "pass"]


def test_rootless_runs_count_only_the_last_one(journal: Journal) -> None:
    # Untraced runs always advance: only the latest run observed the current contents.
    record = _record()
    _exec(journal, "cap_1", 0, UNTRACED_NO_WRITE)
    journal.add_write("cap_1", "a.py", "write", b"x\n", mode=0o644)
    _exec(journal, "cap_1", 1, UNTRACED_NO_WRITE)
    current = journal.generation("cap_1")
    assert _journal_outcomes(journal, record, ["pytest", "-q"], "exit_code", current) == ["fail"]
    assert _evidence(journal, record, ["pytest", "-q"], current) is None  # reads unknown


def test_a_run_cut_short_advances_the_generation_and_observes_nothing(journal: Journal) -> None:
    # Cancelled while it ran (its front end ended when its client closed): journaled with what
    # is known, listed as cut, and no outcome of any contents (it may have written anything).
    record = _record()
    request = ExecRequest("cap_1", ("pytest", "-q"), "/ws", timeout_ms=1000)
    started = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=2)
    journal.append_exec("cap_1", cut_entry(request, started, CANCELLED))
    [cut] = journal.execs("cap_1")
    assert (cut["argv"], cut["exit_code"], cut["generation"], cut["generation_out"]) == (
        ["pytest", "-q"], None, None, 1)
    assert cut["duration_ms"] >= 2000 and cut["usage"]["cut_short"] == CANCELLED
    assert journal.generation("cap_1") == 1
    assert _journal_outcomes(journal, record, ["pytest", "-q"], "exit_code", 1) == []
    summary = exec_summary(cut)
    assert (summary["cut_short"], summary["writes"]) == (CANCELLED, None)
    assert runlog.render_log([summary], color=False).splitlines()[1].split()[2:6] == ["-", "cut", "2.0", "s"]


def test_a_journal_made_before_generations_gets_them_from_its_own_order(state_dir: Path) -> None:
    db = sqlite3.connect(state_dir / "ccw.sqlite3")
    db.executescript(FIRST_RELEASE_TABLES)
    db.execute("INSERT INTO capsules VALUES ('cap_1', '/ws', '/ws', NULL, '', '', 0, '[]', '{}', 'none', '{}', '',"
               " NULL, NULL)")
    for seq, exit_code, touched in ((1, 0, TRACED_WRITE), (3, 1, TRACED_WRITE), (4, 1, TRACED_NO_WRITE)):
        db.execute("INSERT INTO execs VALUES ('cap_1', ?, '', '[\"pytest\",\"-q\"]', '/ws', '[]', NULL, NULL, 1000,"
                   " ?, NULL, 0, 0, 'b', 'b', 0, 0, 1, '{}', ?)", (seq, exit_code, json.dumps(touched)))
    db.execute("INSERT INTO writes VALUES ('cap_1', 2, 'a.py', 'write', 'eAo=', NULL, 420)")
    db.commit()
    db.close()
    journal = Journal(State(state_dir))
    execs = journal.execs("cap_1")
    assert [(e["generation"], e["generation_out"]) for e in execs] == [(0, 1), (2, 3), (3, None)]
    assert journal.writes("cap_1")[0]["generation"] == 2
    assert journal.capsule("cap_1").generation == 3  # type: ignore[union-attr]
    assert _journal_outcomes(journal, _record(), ["pytest", "-q"], "exit_code", 3) == ["fail", "fail"]
    # A later exec goes on from there; opening the journal again changes nothing.
    _exec(journal, "cap_1", 1, TRACED_WRITE)
    assert Journal(State(state_dir)).generation("cap_1") == 4
