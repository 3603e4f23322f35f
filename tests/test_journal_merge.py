"""A merge's changes journaled as one batch (Journal.add_merge): given back row by row as file-tool writes are,
numbered in the capsule's one sequence, with their generations, base states and one event."""

from __future__ import annotations

from pathlib import Path

from mcp_server.events import EventLog
from mcp_server.journal import Journal
from mcp_server.state import State
from tests.support.journal_rows import capsule_record

ROWS = [("a.txt", "write", b"alpha\n", None, 0o644, 11), ("gone.txt", "delete", None, None, None, None),
        ("link", "symlink", None, "a.txt", None, None), ("run.sh", "chmod", None, None, 0o755, None),
        ("empty.txt", "write", b"", None, 0o600, 12), ("b.bin", "write", bytes(range(256)), None, 0o644, 13)]


def test_a_merge_batch_reads_back_as_the_same_rows_as_one_write_each(tmp_path: Path) -> None:
    journal = Journal(State(tmp_path / "state"))
    for capsule_id in ("cap_rows", "cap_batch"):
        journal.add_capsule(capsule_record(capsule_id=capsule_id))
        journal.add_write(capsule_id, "first.txt", "write", b"1", mode=0o644)
    journal.add_writes("cap_rows", ROWS)
    journal.add_merge("cap_batch", ROWS, {"a.txt": "file:old"}, ["cap_x", "cap_y"])
    after = journal.add_write("cap_batch", "last.txt", "delete")

    def shown(capsule_id: str) -> list[dict[str, object]]:
        return [{k: v for k, v in row.items() if k != "capsule_id"} for row in journal.writes(capsule_id)]

    assert shown("cap_batch")[:-1] == shown("cap_rows")
    assert [row["seq"] for row in shown("cap_batch")] == list(range(1, len(ROWS) + 3))
    assert after == len(ROWS) + 2
    assert journal.generation("cap_batch") == journal.generation("cap_rows") + 1 == len(ROWS) + 2
    assert journal.merged_from("cap_batch") == ["cap_x", "cap_y"]


def test_a_merge_batchs_base_states_win_over_later_records_and_it_is_one_event(tmp_path: Path) -> None:
    state = State(tmp_path / "state")
    journal = Journal(state)
    journal.add_capsule(capsule_record(capsule_id="cap_m"))
    journal.add_merge("cap_m", ROWS, {"a.txt": "file:merged-base", "d/": "tree:x"}, ["cap_x"])
    journal.record_base("cap_m", {"a.txt": "file:later", "new.txt": "absent"})
    assert journal.base_states("cap_m") == {"a.txt": "file:merged-base", "d/": "tree:x", "new.txt": "absent"}
    assert journal.known_paths("cap_m") == {"a.txt", "d/", "new.txt"}
    written = [event for event in EventLog(state).latest(limit=10) if event.kind == "files.written"]
    assert [(e.data["seq"], e.data["count"], e.data["merged"], e.data["paths"][:2]) for e in written] == [
        (1, len(ROWS), ["cap_x"], ["a.txt", "gone.txt"])]
