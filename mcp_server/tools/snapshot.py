"""Snapshot tools (seed 000 §3.1): create, list, file, grep, diff, info, changes, export.

Choices this module makes where the seed is silent:

- **Mode**: ``worktree`` (default) reads the live tree and answers with a lease;
  ``snapshot`` (implied by ``snapshot_id``) reads an immutable snapshot.  ``capsule_id``
  reads a capsule's view in worktree mode.  The worktree root is the ``workspace``
  argument, else ``CCW_WORKSPACE`` (see tools/targets.py).
- **Which files exist** in a worktree: git's view, tracked plus untracked-but-not-
  ignored (``git ls-files -co --exclude-standard``); ``.git`` is never listed.
- **snapshot_create** without ``paths`` captures the lease's touched files; with
  neither ``paths`` nor a lease it captures every file git's ignore rules leave.
  The fingerprint is taken before and after reading; if they differ the tree moved
  while it was read and the call fails with REPO_CHANGED.  Symlinks are captured as
  their target text with mode 120000, as git stores them.
- **snapshot_grep** searches a literal by default (``regex: true`` for a Python
  regular expression over bytes); columns are 1-based code points.
- **snapshot_diff** diffs ``base_snapshot_id`` against ``snapshot_id`` or the live tree.
- **snapshot_changes** does no rename detection: a rename is a deletion plus an
  addition (deterministic, and what ``--no-renames`` shows).
- **snapshot_export** returns a pax tar (entries in byte order, mtime 0, uid/gid 0) as
  ``base64:``; the same snapshot always gives the same bytes.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import stat as stat_mod
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from mcp_server.core import paths as P
from mcp_server.core.blobid import blob_id_of
from mcp_server.core.grep import Matcher, is_binary
from mcp_server.core.manifest import Entry, Snapshot, compare_entries, tree_entries
from mcp_server.core.unidiff import FileChange, render_all
from mcp_server.fs import fingerprint as fp_mod
from mcp_server.fs import gitgrep
from mcp_server.fs.export import tar_bundle
from mcp_server.tools import targets as T
from mcp_server.tools.snapshot_schemas import TOOL_SCHEMAS
from mcp_server.tools.targets import (
    begin_live,
    blobs,
    capture,
    encode_content,
    git_mode,
    live_files,
    norm_paths,
    read_entry,
    run_live,
    run_sync,
    scoped,
    snapshots,
)
from sandbox.errors import CcwError

MAX_FILE_BYTES = 16 * 1024 * 1024
MAX_EXPORT_BYTES = 64 * 1024 * 1024


# --- snapshot_create -----------------------------------------------------------------


async def snapshot_create(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Capture files into an immutable, content-addressed snapshot."""

    def body(target: T.LiveTarget) -> dict[str, Any]:
        lease_id = args.get("lease_id")
        before = target.fingerprint()
        leases = T.lease_store(ctx)
        if lease_id:
            leases.validate(lease_id, target.key, before)
        if args.get("paths") is not None:
            scopes = norm_paths(args["paths"])
            for scope in scopes:
                if scope != P.ROOT and not target.view.exists(scope):
                    raise CcwError("NOT_FOUND", f"path {scope!r} does not exist in the worktree", {"path": scope})
            files = live_files(target, scopes)
            files = P.sort_paths([*files, *(s for s in scopes if s != P.ROOT and s not in files and read_entry(target.view, s))])
        elif lease_id:
            files = leases.touched(lease_id)
        else:
            files = live_files(target, [P.ROOT])
        entries = capture(target.view, blobs(ctx), files)
        after = target.fingerprint()
        if after != before:
            raise CcwError(
                "REPO_CHANGED",
                "the worktree changed while the snapshot was being taken; retry when it is quiet",
                {"fingerprint": after.to_dict()},
            )
        snap = snapshots(ctx).save(before.to_dict(), entries)
        return _info_payload(snap)

    return await run_live(ctx, args, body)


def _info_payload(snap: Snapshot) -> dict[str, Any]:
    return {
        "snapshot_id": snap.snapshot_id,
        "fingerprint": snap.fingerprint,
        "manifest_stats": {"files": len(snap.entries), "bytes": snap.total_bytes},
        "cache_hint": "immutable",
    }


async def snapshot_info(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    """A snapshot's fingerprint and manifest stats (no lease context)."""
    return await run_sync(lambda: _info_payload(snapshots(ctx).load(args["snapshot_id"])))


# --- snapshot_list -------------------------------------------------------------------


def _limit(items: list[dict[str, Any]], limit: int) -> tuple[list[dict[str, Any]], bool]:
    return items[:limit], len(items) > limit


async def snapshot_list(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Entries directly under a directory (or all beneath it with ``recursive``)."""
    base = P.normalize(args.get("path", P.ROOT))
    recursive = bool(args.get("recursive", False))
    limit = int(args.get("max_entries", 10000))
    if T.resolve_mode(args) == "snapshot":

        def from_snapshot() -> dict[str, Any]:
            snap = snapshots(ctx).load(args["snapshot_id"])
            entries = tree_entries([(e.path, e.size, e.mode) for e in snap.entries], base, recursive)
            items, truncated = _limit(entries, limit)
            return T.immutable_response({"path": base, "entries": items, "truncated": truncated}, snap.snapshot_id)

        return await run_sync(from_snapshot)

    def body(target: T.LiveTarget) -> dict[str, Any]:
        lease_id, live = begin_live(ctx, target, args.get("lease_id"))
        if base != P.ROOT:
            st = target.view.stat(base)
            if not stat_mod.S_ISDIR(st.st_mode):
                raise CcwError("INVALID_ARGUMENT", f"{base!r} is not a directory; use snapshot_file to read a file", {"path": base})
        files = live_files(target, [base])
        sized = []
        for path in files:
            try:
                st = target.view.stat(path)
            except CcwError:
                continue
            sized.append((path, st.st_size, git_mode(st)))
        entries = tree_entries(sized, base, recursive)
        items, truncated = _limit(entries, limit)
        touched = {e["path"] for e in items}
        for path in list(touched):
            touched.update(P.parents(path))
        T.lease_store(ctx).touch(lease_id, touched)
        return T.worktree_response({"path": base, "entries": items, "truncated": truncated}, target, lease_id, live)

    return await run_live(ctx, args, body)


# --- snapshot_file -------------------------------------------------------------------


def _file_payload(path: str, data: bytes, mode: int) -> dict[str, Any]:
    if len(data) > MAX_FILE_BYTES:
        raise CcwError("TOO_LARGE", f"{path!r} is {len(data)} bytes, over {MAX_FILE_BYTES}; use snapshot_export", {"path": path, "size": len(data)})
    content, encoding = encode_content(data)
    return {"path": path, "content": content, "encoding": encoding, "size": len(data), "mode": f"{mode:06o}", "blob": blob_id_of(data)}


async def snapshot_file(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Read one file from the worktree or a snapshot."""
    path = P.normalize(args["path"])
    if T.resolve_mode(args) == "snapshot":

        def from_snapshot() -> dict[str, Any]:
            snap = snapshots(ctx).load(args["snapshot_id"])
            entry = snap.by_path().get(path)
            if entry is None:
                raise CcwError("NOT_FOUND", f"{path!r} was not captured in snapshot {snap.snapshot_id}", {"path": path})
            return T.immutable_response(_file_payload(path, blobs(ctx).get(entry.blob), entry.mode), snap.snapshot_id)

        return await run_sync(from_snapshot)

    def body(target: T.LiveTarget) -> dict[str, Any]:
        lease_id, live = begin_live(ctx, target, args.get("lease_id"))
        item = read_entry(target.view, path)
        if item is None:
            raise CcwError("NOT_FOUND", f"{path!r} is not a file in the worktree; list its directory to see what exists", {"path": path})
        T.lease_store(ctx).touch(lease_id, [path])
        return T.worktree_response(_file_payload(path, *item), target, lease_id, live)

    return await run_live(ctx, args, body)


# --- snapshot_grep -------------------------------------------------------------------


_GREP_CHUNK = 256  # files read ahead in parallel; bounds the work wasted past max_files
_GREP_WORKERS = min(4, os.cpu_count() or 1)


def _grep(
    read: Callable[[str], bytes | None], candidates: list[str], matcher: Matcher, max_files: int, max_matches: int
) -> tuple[dict[str, Any], list[str]]:
    """Search candidates in order; reading and searching run in worker threads a chunk
    at a time, and the results are consumed in candidate order, so the outcome (and
    which files count as searched) is the same as a sequential walk."""

    def one(path: str) -> list[dict[str, Any]] | None:
        data = read(path)
        if data is None or is_binary(data):
            return None
        return [{"path": path, **m} for m in matcher.search(data, max_matches)]

    matches: list[dict[str, Any]] = []
    searched: list[str] = []
    truncated = False
    with ThreadPoolExecutor(_GREP_WORKERS) as pool:
        for start in range(0, len(candidates), _GREP_CHUNK):
            chunk = candidates[start:start + _GREP_CHUNK]
            for path, found in zip(chunk, pool.map(one, chunk), strict=True):
                if found is None:
                    continue
                if len(searched) >= max_files:
                    truncated = True
                    break
                searched.append(path)
                matches.extend(found[: max(0, max_matches - len(matches))])
            if truncated:
                break
    payload = {
        "matches": matches,
        "files_searched": len(searched),
        "truncated": truncated,
        "matches_truncated": len(matches) >= max_matches,
    }
    return payload, searched


@dataclass(frozen=True)
class _GrepQuery:
    """What snapshot_grep looks for, and where it stops."""

    matcher: Matcher
    scopes: list[str]
    max_files: int
    max_matches: int


async def snapshot_grep(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Search text files for a literal (or regex) in deterministic candidate order."""
    try:
        matcher = Matcher.build(args["pattern"], regex=bool(args.get("regex")), ignore_case=bool(args.get("ignore_case")))
    except re.error as exc:
        raise CcwError("INVALID_ARGUMENT", f"pattern is not a valid regular expression: {exc}") from exc
    query = _GrepQuery(matcher, norm_paths(args.get("paths")), int(args.get("max_files", 10000)), int(args.get("max_matches", 1000)))
    if T.resolve_mode(args) == "snapshot":
        return await run_sync(lambda: _grep_snapshot(ctx, args["snapshot_id"], query))

    def body(target: T.LiveTarget) -> dict[str, Any]:
        if target.capsule_id is None and gitgrep.usable(matcher):
            return _git_grep(ctx, target, args.get("lease_id"), query)
        # git's candidate list does not depend on the fingerprint: list while it runs.
        with ThreadPoolExecutor(1) as pool:
            listing = pool.submit(live_files, target, query.scopes)
            lease_id, live = begin_live(ctx, target, args.get("lease_id"))
            candidates = listing.result()
        payload, searched = _grep(target.view.read_regular, candidates, matcher, query.max_files, query.max_matches)
        T.lease_store(ctx).touch(lease_id, searched)
        return T.worktree_response(payload, target, lease_id, live)

    return await run_live(ctx, args, body)


def _grep_snapshot(ctx: Any, snapshot_id: str, query: _GrepQuery) -> dict[str, Any]:
    snap = snapshots(ctx).load(snapshot_id)
    index = snap.by_path()
    store = blobs(ctx)
    candidates = scoped([e.path for e in snap.entries if e.mode != 0o120000], query.scopes)
    payload, _ = _grep(lambda p: store.get(index[p].blob), candidates, query.matcher, query.max_files, query.max_matches)
    return T.immutable_response(payload, snap.snapshot_id)


def _git_grep(ctx: Any, target: T.LiveTarget, lease_id: str | None, query: _GrepQuery) -> dict[str, Any]:
    # The git greps run while the fingerprint is taken.  Between them they name every
    # text candidate (git walks what ls-files lists), so no separate listing is needed.
    assert query.matcher.literal is not None
    specs = [] if P.ROOT in query.scopes else [f":(literal){s}" for s in query.scopes]
    procs = gitgrep.start(target.git_root, query.matcher.literal, specs)
    try:
        lease_id, live = begin_live(ctx, target, lease_id)
    finally:
        text, found = gitgrep.finish(procs, query.matcher, query.max_matches)
    ordered = P.sort_paths(text)
    searched = ordered[:query.max_files]
    matches: list[dict[str, Any]] = []
    for path in searched:
        for hit in found.get(path, ()):
            if len(matches) >= query.max_matches:
                break
            matches.append({"path": path, **hit})
    payload = {
        "matches": matches,
        "files_searched": len(searched),
        "truncated": len(ordered) > query.max_files,
        "matches_truncated": len(matches) >= query.max_matches,
    }
    T.lease_store(ctx).touch(lease_id, searched)
    return T.worktree_response(payload, target, lease_id, live)


# --- snapshot_diff / snapshot_changes -------------------------------------------------


def _diff_text(ctx: Any, old: dict[str, Entry], new: dict[str, Entry], changes: list[dict[str, str]]) -> str:
    store = blobs(ctx)
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


async def snapshot_diff(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Unified diff from ``base_snapshot_id`` to ``snapshot_id`` or the live tree."""
    scopes = norm_paths(args.get("paths"))

    def within(entries: dict[str, Entry]) -> dict[str, Entry]:
        return {p: e for p, e in entries.items() if any(P.is_within(p, s) for s in scopes)}

    if T.resolve_mode(args) == "snapshot":

        def from_snapshot() -> dict[str, Any]:
            base = within(snapshots(ctx).load(args["base_snapshot_id"]).by_path())
            snap = snapshots(ctx).load(args["snapshot_id"])
            new = within(snap.by_path())
            changes = compare_entries(base, new)
            return T.immutable_response({"changes": changes, "diff": _diff_text(ctx, base, new, changes)}, snap.snapshot_id)

        return await run_sync(from_snapshot)

    def body(target: T.LiveTarget) -> dict[str, Any]:
        lease_id, live = begin_live(ctx, target, args.get("lease_id"))
        base = within(snapshots(ctx).load(args["base_snapshot_id"]).by_path())
        files = P.sort_paths([*live_files(target, scopes), *base])
        new = {e.path: e for e in capture(target.view, blobs(ctx), files)}
        changes = compare_entries(base, new)
        T.lease_store(ctx).touch(lease_id, scopes)
        return T.worktree_response({"changes": changes, "diff": _diff_text(ctx, base, new, changes)}, target, lease_id, live)

    return await run_live(ctx, args, body)


async def snapshot_changes(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Changed files: the worktree against HEAD, or a snapshot against a base snapshot."""
    if T.resolve_mode(args) == "snapshot":

        def from_snapshot() -> dict[str, Any]:
            if not args.get("base_snapshot_id"):
                raise CcwError("INVALID_ARGUMENT", "mode 'snapshot' compares two snapshots: give base_snapshot_id too")
            base = snapshots(ctx).load(args["base_snapshot_id"]).by_path()
            snap = snapshots(ctx).load(args["snapshot_id"])
            return T.immutable_response({"changes": compare_entries(base, snap.by_path())}, snap.snapshot_id)

        return await run_sync(from_snapshot)

    if args.get("capsule_id"):
        raise CcwError(
            "UNSUPPORTED",
            "snapshot_changes reads git status, which cannot run inside a capsule's view; "
            "call capsule_diff for the capsule's changes against its base",
        )

    def body(target: T.LiveTarget) -> dict[str, Any]:
        lease_id, live = begin_live(ctx, target, args.get("lease_id"))
        proc = fp_mod.run_git(target.git_root, "status", "--porcelain=v1", "-z", "--no-renames", "--untracked-files=all")
        return T.worktree_response({"changes": fp_mod.parse_porcelain(proc.stdout)}, target, lease_id, live)

    return await run_live(ctx, args, body)


# --- snapshot_export -----------------------------------------------------------------


def _bundle(files: list[tuple[str, bytes, int]]) -> dict[str, Any]:
    data = tar_bundle(files)
    if len(data) > MAX_EXPORT_BYTES:
        raise CcwError("TOO_LARGE", f"bundle is {len(data)} bytes, over {MAX_EXPORT_BYTES}; export fewer paths", {"size": len(data)})
    return {
        "format": "tar",
        "bundle": "base64:" + base64.b64encode(data).decode("ascii"),
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "files": len(files),
    }


async def snapshot_export(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    """A deterministic tar of a snapshot (or of live files, touching them)."""
    scopes = norm_paths(args.get("paths"))
    if T.resolve_mode(args) == "snapshot":

        def from_snapshot() -> dict[str, Any]:
            snap = snapshots(ctx).load(args["snapshot_id"])
            store = blobs(ctx)
            chosen = set(scoped([e.path for e in snap.entries], scopes))
            files = [(e.path, store.get(e.blob), e.mode) for e in snap.entries if e.path in chosen]
            return T.immutable_response(_bundle(files), snap.snapshot_id)

        return await run_sync(from_snapshot)

    def body(target: T.LiveTarget) -> dict[str, Any]:
        lease_id, live = begin_live(ctx, target, args.get("lease_id"))
        files = []
        for path in live_files(target, scopes):
            item = read_entry(target.view, path)
            if item is not None:
                files.append((path, item[0], item[1]))
        T.lease_store(ctx).touch(lease_id, [f[0] for f in files])
        return T.worktree_response(_bundle(files), target, lease_id, live)

    return await run_live(ctx, args, body)


_HANDLERS = {
    "snapshot_create": snapshot_create,
    "snapshot_list": snapshot_list,
    "snapshot_file": snapshot_file,
    "snapshot_grep": snapshot_grep,
    "snapshot_diff": snapshot_diff,
    "snapshot_info": snapshot_info,
    "snapshot_changes": snapshot_changes,
    "snapshot_export": snapshot_export,
}

TOOLS = T.family_tools(
    "snapshot",
    TOOL_SCHEMAS,
    _HANDLERS,
    scope="read",
    read_only=[name for name in _HANDLERS if name != "snapshot_create"],
    idempotent=True,
)
