"""Writing a merge into the capsule made to hold it (capsule_merge ``into: "new"``), and journaling it.

The capsule is fresh (a fork of the inputs' common ancestor, or a new capsule over their
base), so its view is the merge base: the ops are promotion's (``changeset.promote_ops``
of each path's base state against its merged one), written through the capsule's root
with parents reached without links (``DirFds``, ``RootView``) and each file renamed into
place, in the order that keeps every step well formed (fs/promote.py's: deletions
deepest first, then directories, then files and symlinks, then modes).  Nothing is
fsynced, as nothing a command writes in a capsule is: the capsule's upper layer is as
durable as an exec's writes (an fsync a file cost a merge of 2,000 files 20 s on this
VM's disk, a ``syncfs`` after them a third of the merge).  Set-id bits are written as the inputs had them: the capsule is no host
tree, and promoting it refuses them as any promotion does (core/hazards.py).

Each written path is then journaled as a file tool's change (as capsules/notes.py's
``note_tool_changes`` does, in one transaction for all), so a
witness of the merged capsule replays, and the base states the inputs recorded are
recorded for it first (the first record wins): promotion's conflict check then asks the
live tree for the states the attempts were made on, not the ones seen at merge time.
"""

from __future__ import annotations

import os
import secrets
from typing import Any

from mcp_server.capsules.merge3 import State
from mcp_server.capsules.merge_plan import Plan
from mcp_server.capsules.notes import record_base_states
from mcp_server.fs import changeset
from mcp_server.fs.promote import Op, make_symlink
from mcp_server.fs.view import DirFds, RootView, Side, open_name
from mcp_server.journal import Journal
from sandbox.errors import wrap_oserror


def _side(state: State) -> Side | None:
    return None if state.kind is None else Side(state.kind, state.mode, state.target)


def ops_of(plan: Plan) -> list[Op]:
    """The ops that make a view of the merge base hold the merge, in the order they are written."""
    entries = []
    for one in plan.changed:
        assert one.state is not None
        base = plan.base[one.path]
        modified = one.state.kind == "file" and (base.kind != "file" or base.data != one.state.data)
        entries.append(changeset.Entry(one.path, _side(base), _side(one.state), modified))
    ops = changeset.promote_ops(entries)
    depth = {op.path: op.path.count("/") for op in ops}
    order = {"delete": 0, "mkdir": 1, "write": 2, "symlink": 2, "chmod": 3}
    return sorted(ops, key=lambda op: (order[op.action], -depth[op.path] if op.action == "delete" else depth[op.path]))


def _put(dirs: DirFds, path: str, data: bytes, mode: int) -> None:
    """A file's bytes under a temporary name beside it, then renamed over it (never through a link)."""
    head, _, name = path.rpartition("/")
    parent = dirs.get(head, "write")
    temp = f".{name}.ccw-{secrets.token_hex(6)}.tmp"
    fd = open_name(parent, temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    os.rename(temp, name, src_dir_fd=parent, dst_dir_fd=parent)


def _apply(view: RootView, ops: list[Op], contents: dict[str, State]) -> None:
    """The ops, in order, none fsynced (see the module's docstring)."""
    with DirFds(view) as dirs:
        for op in ops:
            merged = contents[op.path]
            if op.action == "delete":
                dirs.forget()  # a directory removed must not be reached through a kept descriptor
                if view.stat(op.path).st_mode & 0o170000 == 0o040000:
                    view.rmdir(op.path)
                else:
                    view.unlink(op.path)
            elif op.action == "mkdir":
                dirs.forget()
                view.makedirs(op.path)
                view.chmod(op.path, merged.mode)
            elif op.action == "write":
                assert merged.data is not None
                with wrap_oserror("merge: write", op.path):
                    _put(dirs, op.path, merged.data, merged.mode)
            elif op.action == "symlink":
                make_symlink(view, merged.target or "", op.path)
            else:
                view.chmod(op.path, merged.mode)


def _journal(state: Any, capsule_id: str, view: RootView, paths: list[str], contents: dict[str, State]) -> None:
    """Journal the written paths as file tools' changes (capsules/notes.py's ``note_tool_changes``, in one
    transaction), with each file's mtime as written, and the base's state where none is recorded yet."""
    journal = Journal(state)
    rows: list[tuple[str, str, bytes | None, str | None, int | None, int | None]] = []
    with DirFds(view) as dirs:
        for path in paths:
            merged = contents[path]
            if merged.kind is None:
                rows.append((path, "delete", None, None, None, None))
            elif merged.kind == "symlink":
                rows.append((path, "symlink", None, merged.target, None, None))
            elif merged.kind == "file":
                head, _, name = path.rpartition("/")
                mtime = os.stat(name, dir_fd=dirs.get(head, "stat"), follow_symlinks=False).st_mtime_ns
                rows.append((path, "write", merged.data, None, merged.mode, mtime))
    journal.add_writes(capsule_id, rows)
    record = journal.capsule(capsule_id)
    if record is not None:
        record_base_states(journal, record, paths)


def write(state: Any, capsule_id: str, root_fd: int, plan: Plan, recorded: dict[str, str]) -> list[str]:
    """Write the merge into the capsule (its root is closed after) and journal it; the paths written."""
    contents = {one.path: one.state for one in plan.changed if one.state is not None}
    Journal(state).record_base(capsule_id, {path: recorded[path] for path in contents if path in recorded})
    ops = ops_of(plan)
    with RootView.from_fd(root_fd) as view:
        _apply(view, ops, contents)
        _journal(state, capsule_id, view, sorted({op.path for op in ops if contents[op.path].kind != "dir"}), contents)
    return sorted({op.path for op in ops})
