"""Journal notes of changes seen in a capsule: file-tool writes, the base's state, and the
mtimes an exec left on what it wrote.

Replays redo file-tool writes between the execs (so a witness of a tool-edited capsule
still replays), and promotion's conflict check compares the base state recorded at each
changed path with the live workspace's.

Mtimes: a ``.pyc`` records its source's mtime, and make compares mtimes, so what a later
command makes from a file depends on when an earlier one wrote it.  An agent edits with
one command (``sed -i``) and tests with the next; replayed, the edit lands seconds later,
pytest compiles a different ``.pyc`` and the replay would report a changed file that no
one changed.  So each exec's written regular files have their mtimes journaled as the
exec left them, and a replay puts them back after redoing that exec (``restore_mtimes``),
as it does for file-tool writes.  The base cannot be read as it was before a
change, so its state is recorded when the change is first seen (after an exec, after a
file tool's write): the closest record there is.
"""

from __future__ import annotations

import os
from typing import Any

from mcp_server.fs import changeset
from mcp_server.fs.view import RootView, lstat
from mcp_server.journal import Journal
from mcp_server.journal_records import CapsuleRecord


def written_mtimes(root_fd: int, paths: list[str]) -> dict[str, int]:
    """The mtime (ns) of each of ``paths`` that is a regular file in the capsule now."""
    found = {}
    with RootView.from_fd(root_fd) as view:
        for path in paths:
            side = lstat(view, path)
            if side is not None and side.kind == "file":
                found[path] = view.stat(path).st_mtime_ns
    return found


def restore_mtimes(root_fd: int, mtimes: dict[str, int]) -> int:
    """Give the capsule's regular files the recorded mtimes (those still there); how many."""
    done = 0
    with RootView.from_fd(root_fd) as view:
        for path, mtime_ns in sorted(mtimes.items()):
            side = lstat(view, path)
            if side is None or side.kind != "file":
                continue
            fd = view.open_fd(path, os.O_RDONLY | os.O_NOFOLLOW, what="set the mtime of")
            try:
                os.utime(fd, ns=(mtime_ns, mtime_ns))
            finally:
                os.close(fd)
            done += 1
    return done


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
        states = {p: changeset.base_state(base_view, p) for p in fresh}
        # A directory the capsule deleted, replaced or emptied: its tree too (changeset.tree_key says why).
        trees = [changeset.tree_key(p) for p, state in states.items() if changeset.is_dir_state(state)]
        states.update({key: changeset.base_state(base_view, key) for key in trees if key not in known})
        journal.record_base(record.capsule_id, states)
