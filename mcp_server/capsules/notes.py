"""Journal notes of changes seen in a capsule: file-tool writes and the base's state.

Replays redo file-tool writes between the execs (so a witness of a tool-edited capsule
still replays), and promotion's conflict check compares the base state recorded at each
changed path with the live workspace's.  The base cannot be read as it was before a
change, so its state is recorded when the change is first seen (after an exec, after a
file tool's write): the closest record there is.
"""

from __future__ import annotations

from typing import Any

from mcp_server.fs import changeset
from mcp_server.fs.view import RootView, lstat
from mcp_server.journal import CapsuleRecord, Journal


def note_tool_changes(state: Any, capsule_id: str, view: RootView, paths: list[str]) -> None:
    """Journal what a file tool just did to a capsule, path by path, as the view now shows it."""
    journal = Journal(state)
    record = journal.capsule(capsule_id)
    if record is None:
        return
    for path in paths:
        side = lstat(view, path)
        if side is None:
            journal.add_write(capsule_id, path, "delete")
        elif side.kind == "symlink":
            journal.add_write(capsule_id, path, "symlink", target=side.target)
        elif side.kind == "file":
            journal.add_write(capsule_id, path, "write", view.read_bytes(path), mode=side.mode,
                              mtime_ns=view.stat(path).st_mtime_ns)
    record_base_states(journal, record, paths)


def record_base_states(journal: Journal, record: CapsuleRecord, paths: list[str]) -> None:
    """Note the base's state at newly changed paths, for promotion's conflict check."""
    known = journal.known_paths(record.capsule_id)
    fresh = [p for p in paths if p not in known]
    if not fresh:
        return
    with RootView.open(record.base) as base_view:
        journal.record_base(record.capsule_id, {p: changeset.base_state(base_view, p) for p in fresh})
