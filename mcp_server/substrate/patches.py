"""Writes to a live target or a snapshot (seed 000 §3.2): strict patches, files, deletions.

- Writes go through ``RootView``: the parent directory is resolved with
  ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`` and the file
  is replaced by ``renameat`` of a fsynced temp file, so there is no window between the
  check and the write, no path through a symlink, and no escape (PERMISSION_DENIED).
- A patch is all or nothing: it is applied in memory first; with any reject nothing is
  written and the answer says ``applied: false`` with the rejects.  On a snapshot the
  result is a new snapshot carrying the base snapshot's fingerprint.  Empty directories
  left by deletions are removed, as git does.
- A write validates its lease (STALE_LEASE if the tree moved) or issues one, then moves
  the lease onto the fingerprint its own write produced, and touches the paths it
  changed; in a capsule it notes the change in the journal (``ChangeNote``).
"""

from __future__ import annotations

import stat as stat_mod
from typing import Any

from mcp_server.core import paths as P
from mcp_server.core.blobid import blob_id_of
from mcp_server.core.manifest import Entry
from mcp_server.core.patch import FilePatch
from mcp_server.core.patch_apply import ApplyResult, apply
from mcp_server.fs.view import RootView
from mcp_server.substrate.views import (
    ChangeNote,
    Immutable,
    Leased,
    LiveTarget,
    Stores,
    begin_live,
    leased,
    read_entry,
)
from sandbox.errors import CcwError


def _remove_empty_parents(view: RootView, path: str) -> None:
    for parent in reversed(P.parents(path)):
        if view.listdir(parent):
            return
        view.rmdir(parent)


def _preflight(view: RootView, paths: list[str], deleted: set[str]) -> None:
    """Refuse before writing anything when a parent is a symlink or a file: the writes
    would fail part way (writes never pass through symlinks) and leave half a patch."""
    seen: set[str] = set()
    for path in paths:
        for parent in P.parents(path):
            if parent in seen or parent in deleted:
                continue
            seen.add(parent)
            try:
                st = view.stat(parent)
            except CcwError as exc:
                if exc.code == "NOT_FOUND":
                    break
                raise
            if stat_mod.S_ISLNK(st.st_mode):
                raise CcwError(
                    "PERMISSION_DENIED",
                    f"{path!r} lies under the symlink {parent!r}; patches never write through symlinks",
                    {"path": path},
                )
            if not stat_mod.S_ISDIR(st.st_mode):
                raise CcwError("CONFLICT", f"{path!r} needs {parent!r} to be a directory, but it is a file",
                               {"path": path})


def write_result(view: RootView, result: ApplyResult) -> list[str]:
    """Write an accepted patch's files (deletions first, so renames onto them work)."""
    changed = P.sort_paths(result.files)
    _preflight(view, changed, {p for p, item in result.files.items() if item is None})
    for path in changed:
        if result.files[path] is None and view.exists(path):
            view.unlink(path)
            _remove_empty_parents(view, path)
    for path in changed:
        item = result.files[path]
        if item is None:
            continue
        content, mode = item
        parent = P.parents(path)
        if parent:
            view.makedirs(parent[-1])
        view.write_bytes(path, content, 0o755 if mode & 0o100 else 0o644)
    return changed


def patch_snapshot(stores: Stores, snapshot_id: str, patches: list[FilePatch]) -> Immutable:
    """Apply a patch to a snapshot: the new snapshot, or the rejects and nothing made."""
    snap = stores.snapshots.load(snapshot_id)
    index = snap.by_path()
    store = stores.blobs

    def read(path: str) -> tuple[bytes, int] | None:
        entry = index.get(path)
        return (store.get(entry.blob), entry.mode) if entry else None

    result = apply(patches, read)
    if result.rejects:
        return Immutable({"applied": False, "files": [], "rejects": result.rejects}, snap.snapshot_id)
    entries = dict(index)
    for path, item in result.files.items():
        if item is None:
            entries.pop(path, None)
        else:
            entries[path] = Entry(path, store.put(item[0]), len(item[0]), item[1])
    new = stores.snapshots.save(snap.fingerprint, entries.values())
    files = P.sort_paths(result.files)
    return Immutable({"applied": True, "files": files, "rejects": []}, new.snapshot_id)


def patch_live(stores: Stores, target: LiveTarget, lease_id: str | None, patches: list[FilePatch],
               note: ChangeNote) -> Leased:
    """Apply a patch to a live target, all or nothing."""
    lease_id, live = begin_live(stores, target, lease_id)
    result = apply(patches, lambda path: read_entry(target.view, path))
    if result.rejects:
        return leased({"applied": False, "files": [], "rejects": result.rejects}, target, lease_id, live)
    files = write_result(target.view, result)
    return _after_write(stores, target, lease_id, {"applied": True, "files": files, "rejects": []}, files, note)


def _after_write(
    stores: Stores, target: LiveTarget, lease_id: str, payload: dict[str, Any], touched: list[str], note: ChangeNote
) -> Leased:
    if target.capsule_id:
        note(target.state, target.capsule_id, target.view, touched)
    new = target.fingerprint()
    leases = stores.leases
    leases.rebase(lease_id, new)
    leases.touch(lease_id, touched)
    return leased(payload, target, lease_id, new)


def write_file(
    stores: Stores,
    target: LiveTarget,
    lease_id: str | None,
    path: str,
    data: bytes,
    *,
    executable: bool | None,
    create_dirs: bool,
    note: ChangeNote,
) -> Leased:
    """Write one file atomically beneath the root (``executable`` None keeps the mode)."""
    lease_id, _ = begin_live(stores, target, lease_id)
    parents = P.parents(path)
    if parents and create_dirs:
        target.view.makedirs(parents[-1])
    mode = None if executable is None else (0o755 if executable else 0o644)
    target.view.write_bytes(path, data, mode)
    payload = {"path": path, "size": len(data), "blob": blob_id_of(data)}
    return _after_write(stores, target, lease_id, payload, [path], note)


def delete(stores: Stores, target: LiveTarget, lease_id: str | None, path: str, *, recursive: bool,
           note: ChangeNote) -> Leased:
    """Delete a file or symlink, or a directory tree with ``recursive``."""
    lease_id, _ = begin_live(stores, target, lease_id)
    view = target.view
    st = view.stat(path)
    deleted: list[str] = []
    if stat_mod.S_ISDIR(st.st_mode):
        if not recursive:
            raise CcwError("INVALID_ARGUMENT",
                           f"{path!r} is a directory; pass recursive: true to delete it and everything in it",
                           {"path": path})
        deleted = _rmtree(view, path)
    else:
        view.unlink(path)
        deleted = [path]
    deleted = P.sort_paths(deleted)
    return _after_write(stores, target, lease_id, {"path": path, "deleted": deleted}, deleted, note)


def _rmtree(view: RootView, path: str) -> list[str]:
    """Delete a directory tree beneath the root (links are removed, never followed)."""
    removed = []
    for name, kind in view.listdir(path):
        child = P.join(path, name)
        if kind == "dir":
            removed.extend(_rmtree(view, child))
        else:
            view.unlink(child)
            removed.append(child)
    view.rmdir(path)
    return removed
