"""Writing a merge into the capsule made to hold it (capsule_merge ``into: "new"``), and journaling it.

The capsule is fresh (a fork of the inputs' common ancestor, or a new capsule over their
base), so its view is the merge base: the ops are promotion's (``changeset.promote_ops``
of each path's base state against its merged one), written through the capsule's root
with ``RootView``'s confined calls, in the order that keeps every step well formed
(fs/promote.py's: deletions deepest first, then directories, then files and symlinks,
then modes).  Set-id bits are written as the inputs had them: the capsule is no host
tree, and promoting it refuses them as any promotion does (core/hazards.py).

Each written path is then journaled as a file tool's change (capsules/notes.py), so a
witness of the merged capsule replays, and the base states the inputs recorded are
recorded for it first (the first record wins): promotion's conflict check then asks the
live tree for the states the attempts were made on, not the ones seen at merge time.
"""

from __future__ import annotations

from typing import Any

from mcp_server.capsules.merge3 import State
from mcp_server.capsules.merge_plan import Plan
from mcp_server.capsules.notes import note_tool_changes
from mcp_server.fs import changeset
from mcp_server.fs.promote import Op, make_symlink
from mcp_server.fs.view import RootView, Side
from mcp_server.journal import Journal


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


def write(state: Any, capsule_id: str, root_fd: int, plan: Plan, recorded: dict[str, str]) -> list[str]:
    """Write the merge into the capsule (its root is closed after) and journal it; the paths written."""
    contents = {one.path: one.state for one in plan.changed if one.state is not None}
    Journal(state).record_base(capsule_id, {path: recorded[path] for path in contents if path in recorded})
    ops = ops_of(plan)
    with RootView.from_fd(root_fd) as view:
        for op in ops:
            merged = contents[op.path]
            if op.action == "delete":
                if view.stat(op.path).st_mode & 0o170000 == 0o040000:
                    view.rmdir(op.path)
                else:
                    view.unlink(op.path)
            elif op.action == "mkdir":
                view.makedirs(op.path)
                view.chmod(op.path, merged.mode)
            elif op.action == "write":
                assert merged.data is not None
                view.write_bytes(op.path, merged.data, merged.mode)
            elif op.action == "symlink":
                make_symlink(view, merged.target or "", op.path)
            else:
                view.chmod(op.path, merged.mode)
        written = sorted({op.path for op in ops if contents[op.path].kind != "dir"})
        note_tool_changes(state, capsule_id, view, written)
    return sorted({op.path for op in ops})
