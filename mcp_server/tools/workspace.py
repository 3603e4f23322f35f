"""Workspace tools (seed 000 §3.2): apply_patch, write_file, delete.

- Writes go through ``RootView``: the parent directory is resolved with
  ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`` and the file
  is replaced by ``renameat`` of a fsynced temp file, so there is no window between the
  check and the write, no path through a symlink, and no escape (PERMISSION_DENIED).
- ``workspace_apply_patch`` is all or nothing: the whole patch is applied in memory
  first; with any reject nothing is written and the result says ``applied: false``
  with the rejects (a result, not an error, so the agent sees every failed hunk).
  ``mode``: ``worktree`` (default), ``capsule`` (needs ``capsule_id``) or ``snapshot``
  (needs ``snapshot_id``; the result is a new snapshot carrying the base snapshot's
  fingerprint).  Empty directories left by deletions are removed, as git does.
- A mutator validates its lease (STALE_LEASE if the tree moved) or issues one, then
  moves the lease onto the fingerprint its own write produced, and touches the paths
  it changed.
- ``content`` is UTF-8 text, or bytes as ``base64:…``.
"""

from __future__ import annotations

import base64
import binascii
import stat as stat_mod
from typing import Any

from mcp_server.core import paths as P
from mcp_server.core.blobid import blob_id_of
from mcp_server.core.manifest import Entry
from mcp_server.core.patch import parse_patch
from mcp_server.core.patch_apply import ApplyResult, apply
from mcp_server.fs.view import RootView
from mcp_server.tools import targets as T
from sandbox.errors import CcwError


def decode_content(content: str) -> bytes:
    """Text as UTF-8, or the bytes of a ``base64:`` string."""
    if content.startswith("base64:"):
        try:
            return base64.b64decode(content[7:], validate=True)
        except binascii.Error as exc:
            raise CcwError("INVALID_ARGUMENT", f"content is not valid base64 after 'base64:': {exc}") from exc
    try:
        return content.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        # "\ud800" in JSON: a lone surrogate that surrogateescape cannot map to a byte.
        raise CcwError(
            "INVALID_ARGUMENT", "content holds a lone surrogate, which is not UTF-8; send valid text "
            "or the bytes as 'base64:...'",
        ) from None


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
                raise CcwError("CONFLICT", f"{path!r} needs {parent!r} to be a directory, but it is a file", {"path": path})


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


async def workspace_apply_patch(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Apply a unified diff strictly to the worktree, a capsule or a snapshot."""
    mode = args.get("mode") or ("capsule" if args.get("capsule_id") else "snapshot" if args.get("snapshot_id") else "worktree")
    if mode == "capsule" and not args.get("capsule_id"):
        raise CcwError("INVALID_ARGUMENT", "mode 'capsule' needs capsule_id")
    if mode == "worktree" and args.get("capsule_id"):
        raise CcwError("INVALID_ARGUMENT", "capsule_id needs mode 'capsule' (or no mode)")
    patches = parse_patch(decode_content(args["patch"]))
    if not patches:
        raise CcwError("INVALID_ARGUMENT", "the patch contains no file diffs; send `git diff` output")
    if mode == "snapshot":
        T.resolve_mode({**args, "mode": "snapshot"})

        def on_snapshot() -> dict[str, Any]:
            snap = T.snapshots(ctx).load(args["snapshot_id"])
            index = snap.by_path()
            store = T.blobs(ctx)

            def read(path: str) -> tuple[bytes, int] | None:
                entry = index.get(path)
                return (store.get(entry.blob), entry.mode) if entry else None

            result = apply(patches, read)
            if result.rejects:
                return T.immutable_response({"applied": False, "files": [], "rejects": result.rejects}, snap.snapshot_id)
            entries = dict(index)
            for path, item in result.files.items():
                if item is None:
                    entries.pop(path, None)
                else:
                    entries[path] = Entry(path, store.put(item[0]), len(item[0]), item[1])
            new = T.snapshots(ctx).save(snap.fingerprint, entries.values())
            files = P.sort_paths(result.files)
            return T.immutable_response({"applied": True, "files": files, "rejects": []}, new.snapshot_id)

        return await T.run_sync(on_snapshot)

    def body(target: T.LiveTarget) -> dict[str, Any]:
        lease_id, live = T.begin_live(ctx, target, args.get("lease_id"))
        result = apply(patches, lambda path: T.read_entry(target.view, path))
        if result.rejects:
            return T.worktree_response({"applied": False, "files": [], "rejects": result.rejects}, target, lease_id, live)
        files = write_result(target.view, result)
        return _after_write(ctx, target, lease_id, {"applied": True, "files": files, "rejects": []}, files)

    return await T.run_live(ctx, args, body)


def _after_write(ctx: Any, target: T.LiveTarget, lease_id: str, payload: dict[str, Any], touched: list[str]) -> dict[str, Any]:
    if target.capsule_id:
        from mcp_server.capsules.notes import note_tool_changes

        note_tool_changes(ctx.state, target.capsule_id, target.view, touched)
    new = target.fingerprint()
    leases = T.lease_store(ctx)
    leases.rebase(lease_id, new)
    leases.touch(lease_id, touched)
    return T.worktree_response(payload, target, lease_id, new)


async def workspace_write_file(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Write one file atomically beneath the root."""
    path = P.normalize(args["path"])
    if path == P.ROOT:
        raise CcwError("INVALID_ARGUMENT", "name a file to write, not the root")
    data = decode_content(args["content"])
    executable = args.get("executable")

    def body(target: T.LiveTarget) -> dict[str, Any]:
        lease_id, _ = T.begin_live(ctx, target, args.get("lease_id"))
        parents = P.parents(path)
        if parents and args.get("create_dirs", True):
            target.view.makedirs(parents[-1])
        mode = None if executable is None else (0o755 if executable else 0o644)
        target.view.write_bytes(path, data, mode)
        payload = {"path": path, "size": len(data), "blob": blob_id_of(data)}
        return _after_write(ctx, target, lease_id, payload, [path])

    return await T.run_live(ctx, args, body)


async def workspace_delete(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Delete a file or symlink, or a directory tree with ``recursive``."""
    path = P.normalize(args["path"])
    if path == P.ROOT:
        raise CcwError("PERMISSION_DENIED", "the workspace root itself cannot be deleted; name a path inside it")

    def body(target: T.LiveTarget) -> dict[str, Any]:
        lease_id, _ = T.begin_live(ctx, target, args.get("lease_id"))
        view = target.view
        st = view.stat(path)
        deleted: list[str] = []
        if stat_mod.S_ISDIR(st.st_mode):
            if not args.get("recursive"):
                raise CcwError("INVALID_ARGUMENT", f"{path!r} is a directory; pass recursive: true to delete it and everything in it", {"path": path})
            deleted = _rmtree(view, path)
        else:
            view.unlink(path)
            deleted = [path]
        deleted = P.sort_paths(deleted)
        return _after_write(ctx, target, lease_id, {"path": path, "deleted": deleted}, deleted)

    return await T.run_live(ctx, args, body)


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


# --- schemas (seed 000 §5) ------------------------------------------------------------

_REJECTS = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "hunks": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"index": T.COUNT, "reason": {"type": "string"}},
                    "required": ["index", "reason"],
                    "additionalProperties": False,
                },
            },
        },
        "required": ["path", "hunks"],
        "additionalProperties": False,
    },
}

TOOL_SCHEMAS: dict[str, dict[str, Any]] = {
    "workspace_apply_patch": {
        "description": "Apply a unified diff strictly (byte-exact context, no fuzz, all or nothing) to the worktree, a capsule or a snapshot (which yields a new snapshot).",
        "input": T.input_schema(
            {
                **T.HYBRID,
                "mode": {"enum": ["worktree", "snapshot", "capsule"], "default": "worktree"},
                "patch": {"type": "string", "minLength": 1, "maxLength": 32 * 1024 * 1024},
            },
            ["patch"],
        ),
        "output": T.hybrid_output(
            {"applied": {"type": "boolean"}, "files": {"type": "array", "items": {"type": "string"}}, "rejects": _REJECTS},
            ["applied", "files", "rejects"],
        ),
    },
    "workspace_write_file": {
        "description": "Write a file atomically beneath the root (never through a symlink); content is text or 'base64:…'.",
        "input": T.input_schema(
            {
                **T.LIVE,
                "path": T.PATH,
                "content": {"type": "string", "maxLength": 64 * 1024 * 1024},
                "executable": {"type": "boolean"},
                "create_dirs": {"type": "boolean", "default": True},
            },
            ["path", "content"],
        ),
        "output": T.hybrid_output({"path": {"type": "string"}, "size": T.COUNT, "blob": T.BLOB_ID}, ["path", "size", "blob"]),
    },
    "workspace_delete": {
        "description": "Delete a file or symlink (or, with recursive, a directory) beneath the root.",
        "input": T.input_schema({**T.LIVE, "path": T.PATH, "recursive": {"type": "boolean", "default": False}}, ["path"]),
        "output": T.hybrid_output({"path": {"type": "string"}, "deleted": {"type": "array", "items": {"type": "string"}}}, ["path", "deleted"]),
    },
}

_HANDLERS = {
    "workspace_apply_patch": workspace_apply_patch,
    "workspace_write_file": workspace_write_file,
    "workspace_delete": workspace_delete,
}

TOOLS = T.family_tools("workspace", TOOL_SCHEMAS, _HANDLERS, scope="write", destructive=True)
