"""Snapshot capture and the snapshot reads (seed 000 §3.1), of a snapshot or a live target.

Each read has two forms: of an immutable snapshot (answering ``Immutable``) and of a
live target under a lease (answering ``Leased``, the files it read touched on the
lease).  What the reads mean where the seed is silent is told in
``mcp_server/tools/snapshot.py``.
"""

from __future__ import annotations

import base64
import hashlib
import stat as stat_mod
from typing import Any

from mcp_server.core import paths as P
from mcp_server.core.blobid import blob_id_of
from mcp_server.core.manifest import Entry, Snapshot, compare_entries, tree_entries
from mcp_server.core.unidiff import FileChange, render_all
from mcp_server.fs import fingerprint as fp_mod
from mcp_server.fs.export import tar_bundle
from mcp_server.substrate.views import (
    Immutable,
    Leased,
    LiveTarget,
    Stores,
    begin_live,
    capture,
    encode_content,
    git_mode,
    leased,
    live_files,
    norm_paths,
    read_entry,
    scoped,
)
from sandbox.errors import CcwError

MAX_FILE_BYTES = 16 * 1024 * 1024
MAX_EXPORT_BYTES = 64 * 1024 * 1024


# --- capture and info ---------------------------------------------------------------


def create(stores: Stores, target: LiveTarget, lease_id: str | None, paths: list[str] | None) -> dict[str, Any]:
    """Capture files into an immutable, content-addressed snapshot: ``paths`` (repo-relative
    scopes, normalised once the lease is validated) when given, else the lease's touched
    files, else every file git's ignore rules leave.  REPO_CHANGED when the tree moved while it was read."""
    before = target.fingerprint()
    leases = stores.leases
    if lease_id:
        leases.validate(lease_id, target.key, before)
    if paths is not None:
        paths = norm_paths(paths)
        for scope in paths:
            if scope != P.ROOT and not target.view.exists(scope):
                raise CcwError("NOT_FOUND", f"path {scope!r} does not exist in the worktree", {"path": scope})
        files = live_files(target, paths)
        files = P.sort_paths([*files, *(s for s in paths
                                        if s != P.ROOT and s not in files and read_entry(target.view, s))])
    elif lease_id:
        files = leases.touched(lease_id)
    else:
        files = live_files(target, [P.ROOT])
    entries = capture(target.view, stores.blobs, files)
    after = target.fingerprint()
    if after != before:
        raise CcwError(
            "REPO_CHANGED",
            "the worktree changed while the snapshot was being taken; retry when it is quiet",
            {"fingerprint": after.to_dict()},
        )
    return info_payload(stores.snapshots.save(before.to_dict(), entries))


def info_payload(snap: Snapshot) -> dict[str, Any]:
    """A snapshot's id, fingerprint and manifest stats."""
    return {
        "snapshot_id": snap.snapshot_id,
        "fingerprint": snap.fingerprint,
        "manifest_stats": {"files": len(snap.entries), "bytes": snap.total_bytes},
        "cache_hint": "immutable",
    }


def info(stores: Stores, snapshot_id: str) -> dict[str, Any]:
    """A snapshot's fingerprint and manifest stats (no lease context)."""
    return info_payload(stores.snapshots.load(snapshot_id))


# --- list ---------------------------------------------------------------------------


def _limit(items: list[dict[str, Any]], limit: int) -> tuple[list[dict[str, Any]], bool]:
    return items[:limit], len(items) > limit


def list_snapshot(stores: Stores, snapshot_id: str, base: str, recursive: bool, limit: int) -> Immutable:
    """Entries of a snapshot directly under ``base`` (or all beneath it)."""
    snap = stores.snapshots.load(snapshot_id)
    entries = tree_entries([(e.path, e.size, e.mode) for e in snap.entries], base, recursive)
    items, truncated = _limit(entries, limit)
    return Immutable({"path": base, "entries": items, "truncated": truncated}, snap.snapshot_id)


def list_live(stores: Stores, target: LiveTarget, lease_id: str | None, base: str, recursive: bool,
              limit: int) -> Leased:
    """Entries of a live target directly under ``base`` (or all beneath it), touched
    with their parents."""
    lease_id, live = begin_live(stores, target, lease_id)
    if base != P.ROOT:
        st = target.view.stat(base)
        if not stat_mod.S_ISDIR(st.st_mode):
            raise CcwError("INVALID_ARGUMENT", f"{base!r} is not a directory; use snapshot_file to read a file",
                           {"path": base})
    sized = []
    for path in live_files(target, [base]):
        try:
            st = target.view.stat(path)
        except CcwError:
            continue
        sized.append((path, st.st_size, git_mode(st)))
    items, truncated = _limit(tree_entries(sized, base, recursive), limit)
    touched = {e["path"] for e in items}
    for path in list(touched):
        touched.update(P.parents(path))
    stores.leases.touch(lease_id, touched)
    return leased({"path": base, "entries": items, "truncated": truncated}, target, lease_id, live)


# --- file ---------------------------------------------------------------------------


def _file_payload(path: str, data: bytes, mode: int) -> dict[str, Any]:
    if len(data) > MAX_FILE_BYTES:
        raise CcwError("TOO_LARGE", f"{path!r} is {len(data)} bytes, over {MAX_FILE_BYTES}; use snapshot_export",
                       {"path": path, "size": len(data)})
    content, encoding = encode_content(data)
    return {"path": path, "content": content, "encoding": encoding, "size": len(data), "mode": f"{mode:06o}",
            "blob": blob_id_of(data)}


def file_snapshot(stores: Stores, snapshot_id: str, path: str) -> Immutable:
    """One file of a snapshot."""
    snap = stores.snapshots.load(snapshot_id)
    entry = snap.by_path().get(path)
    if entry is None:
        raise CcwError("NOT_FOUND", f"{path!r} was not captured in snapshot {snap.snapshot_id}", {"path": path})
    return Immutable(_file_payload(path, stores.blobs.get(entry.blob), entry.mode), snap.snapshot_id)


def file_live(stores: Stores, target: LiveTarget, lease_id: str | None, path: str) -> Leased:
    """One file of a live target, touched."""
    lease_id, live = begin_live(stores, target, lease_id)
    item = read_entry(target.view, path)
    if item is None:
        raise CcwError("NOT_FOUND", f"{path!r} is not a file in the worktree; list its directory to see what exists",
                       {"path": path})
    stores.leases.touch(lease_id, [path])
    return leased(_file_payload(path, *item), target, lease_id, live)


# --- diff and changes -----------------------------------------------------------------


def _diff_text(stores: Stores, old: dict[str, Entry], new: dict[str, Entry], changes: list[dict[str, str]]) -> str:
    store = stores.blobs
    rendered = []
    for change in changes:
        a, b = old.get(change["path"]), new.get(change["path"])
        rendered.append(
            FileChange(
                change["path"],
                store.get(a.blob) if a else None,
                store.get(b.blob) if b else None,
                a.mode if a else None,
                b.mode if b else None,
            )
        )
    return render_all(rendered).decode("utf-8", "replace")


def _within(entries: dict[str, Entry], scopes: list[str]) -> dict[str, Entry]:
    return {p: e for p, e in entries.items() if any(P.is_within(p, s) for s in scopes)}


def diff_snapshots(stores: Stores, base_snapshot_id: str, snapshot_id: str, scopes: list[str]) -> Immutable:
    """Changes and unified diff from one snapshot to another, within the scopes."""
    base = _within(stores.snapshots.load(base_snapshot_id).by_path(), scopes)
    snap = stores.snapshots.load(snapshot_id)
    new = _within(snap.by_path(), scopes)
    changes = compare_entries(base, new)
    return Immutable({"changes": changes, "diff": _diff_text(stores, base, new, changes)}, snap.snapshot_id)


def diff_live(stores: Stores, target: LiveTarget, lease_id: str | None, base_snapshot_id: str,
              scopes: list[str]) -> Leased:
    """Changes and unified diff from a snapshot to the live target, within the scopes."""
    lease_id, live = begin_live(stores, target, lease_id)
    base = _within(stores.snapshots.load(base_snapshot_id).by_path(), scopes)
    files = P.sort_paths([*live_files(target, scopes), *base])
    new = {e.path: e for e in capture(target.view, stores.blobs, files)}
    changes = compare_entries(base, new)
    stores.leases.touch(lease_id, scopes)
    return leased({"changes": changes, "diff": _diff_text(stores, base, new, changes)}, target, lease_id, live)


def changes_snapshots(stores: Stores, base_snapshot_id: str | None, snapshot_id: str) -> Immutable:
    """Changed files of a snapshot against a base snapshot."""
    if not base_snapshot_id:
        raise CcwError("INVALID_ARGUMENT", "mode 'snapshot' compares two snapshots: give base_snapshot_id too")
    base = stores.snapshots.load(base_snapshot_id).by_path()
    snap = stores.snapshots.load(snapshot_id)
    return Immutable({"changes": compare_entries(base, snap.by_path())}, snap.snapshot_id)


def changes_live(stores: Stores, target: LiveTarget, lease_id: str | None) -> Leased:
    """Changed files of the worktree against HEAD (git status; not in a capsule)."""
    lease_id, live = begin_live(stores, target, lease_id)
    proc = fp_mod.run_git(target.git_root, "status", "--porcelain=v1", "-z", "--no-renames", "--untracked-files=all")
    return leased({"changes": fp_mod.parse_porcelain(proc.stdout)}, target, lease_id, live)


# --- export -------------------------------------------------------------------------


def _bundle(files: list[tuple[str, bytes, int]]) -> dict[str, Any]:
    data = tar_bundle(files)
    if len(data) > MAX_EXPORT_BYTES:
        raise CcwError("TOO_LARGE", f"bundle is {len(data)} bytes, over {MAX_EXPORT_BYTES}; export fewer paths",
                       {"size": len(data)})
    return {
        "format": "tar",
        "bundle": "base64:" + base64.b64encode(data).decode("ascii"),
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "files": len(files),
    }


def export_snapshot(stores: Stores, snapshot_id: str, scopes: list[str]) -> Immutable:
    """A deterministic tar of a snapshot's files within the scopes."""
    snap = stores.snapshots.load(snapshot_id)
    store = stores.blobs
    chosen = set(scoped([e.path for e in snap.entries], scopes))
    files = [(e.path, store.get(e.blob), e.mode) for e in snap.entries if e.path in chosen]
    return Immutable(_bundle(files), snap.snapshot_id)


def export_live(stores: Stores, target: LiveTarget, lease_id: str | None, scopes: list[str]) -> Leased:
    """A deterministic tar of a live target's files within the scopes, touched."""
    lease_id, live = begin_live(stores, target, lease_id)
    files = []
    for path in live_files(target, scopes):
        item = read_entry(target.view, path)
        if item is not None:
            files.append((path, item[0], item[1]))
    stores.leases.touch(lease_id, [f[0] for f in files])
    return leased(_bundle(files), target, lease_id, live)
