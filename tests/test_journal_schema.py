"""The journal's tables and their migration (mcp_server/journal_schema.py): a state dir made
by the first release ends with the tables a new one gets, its generations replayed."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from mcp_server import journal_schema
from mcp_server.state import State
from tests.support.journal_rows import FIRST_RELEASE_TABLES

TABLES = ("capsules", "execs", "writes", "exec_outputs", "capsule_base")
TRACED_NO_WRITE = {"read": ["t.py"], "written": []}
TRACED_WRITE = {"read": ["t.py"], "written": ["out.txt"]}
UNTRACED = {"read": None, "written": []}  # no fanotify trace: may have written


def _columns(state: State) -> dict[str, set[str]]:
    return {table: {row["name"] for row in state.execute(f"PRAGMA table_info({table})")} for table in TABLES}


def _first_release(path: Path, execs: list[tuple[str, int, dict[str, object]]], writes: list[tuple[str, int]]) -> None:
    db = sqlite3.connect(path / "ccw.sqlite3")
    db.executescript(FIRST_RELEASE_TABLES)
    for capsule_id in sorted({row[0] for row in execs + writes}):
        db.execute("INSERT INTO capsules VALUES (?, '/ws', '/ws', NULL, '', '', 0, '[]', '{}', 'none', '{}', '',"
                   " NULL, NULL)", (capsule_id,))
    for capsule_id, seq, touched in execs:
        db.execute("INSERT INTO execs VALUES (?, ?, '', '[\"make\"]', '/ws', '[]', NULL, NULL, 1000, 0, NULL, 0, 0,"
                   " 'b', 'b', 0, 0, 1, '{}', ?)", (capsule_id, seq, json.dumps(touched)))
    for capsule_id, seq in writes:
        db.execute("INSERT INTO writes VALUES (?, ?, 'a.py', 'write', 'eAo=', NULL, 420)", (capsule_id, seq))
    db.commit()
    db.close()


def test_a_first_release_state_dir_ends_with_the_columns_a_new_one_has(tmp_path: Path) -> None:
    fresh, old = tmp_path / "fresh", tmp_path / "old"
    fresh.mkdir()
    old.mkdir()
    _first_release(old, [], [])
    new_state, old_state = State(fresh), State(old)
    journal_schema.ensure(new_state)
    journal_schema.ensure(old_state)
    assert _columns(old_state) == _columns(new_state)
    assert "generation_out" in _columns(old_state)["execs"]


def test_each_capsule_gets_its_generations_replayed_in_its_own_order(state_dir: Path) -> None:
    _first_release(state_dir,
                   [("cap_1", 2, TRACED_NO_WRITE), ("cap_2", 1, UNTRACED), ("cap_2", 3, TRACED_WRITE)],
                   [("cap_1", 1), ("cap_2", 2)])
    state = State(state_dir)
    journal_schema.ensure(state)
    execs = {(row["capsule_id"], row["seq"]): (row["generation"], row["generation_out"])
             for row in state.execute("SELECT * FROM execs")}
    writes = {(row["capsule_id"], row["seq"]): row["generation"] for row in state.execute("SELECT * FROM writes")}
    capsules = {row["capsule_id"]: row["generation"] for row in state.execute("SELECT * FROM capsules")}
    assert execs == {("cap_1", 2): (1, None), ("cap_2", 1): (0, 1), ("cap_2", 3): (2, 3)}
    assert writes == {("cap_1", 1): 1, ("cap_2", 2): 2}
    assert capsules == {"cap_1": 1, "cap_2": 3}
