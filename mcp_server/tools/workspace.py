"""Workspace tools (seed 000 §3.2): apply_patch, write_file, delete.

Adapters over the substrate service (``mcp_server/substrate/patches.py``, which tells how
the writes are made): each handler parses its arguments (``content`` and ``patch`` are
UTF-8 text, or bytes as ``base64:…``), opens the target, calls the service in a worker
thread and shapes its answer.  In short:

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
from typing import Any

from mcp_server.capsules.notes import note_tool_changes
from mcp_server.core import paths as P
from mcp_server.core.patch import parse_patch
from mcp_server.substrate import patches
from mcp_server.tools import targets as T
from mcp_server.tools.registry import ToolContext
from mcp_server.tools.targets import run_live, run_sync, shaped, stores
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


async def workspace_apply_patch(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Apply a unified diff strictly to the worktree, a capsule or a snapshot."""
    mode = args.get("mode") or (
        "capsule" if args.get("capsule_id") else "snapshot" if args.get("snapshot_id") else "worktree"
    )
    if mode == "capsule" and not args.get("capsule_id"):
        raise CcwError("INVALID_ARGUMENT", "mode 'capsule' needs capsule_id")
    if mode == "worktree" and args.get("capsule_id"):
        raise CcwError("INVALID_ARGUMENT", "capsule_id needs mode 'capsule' (or no mode)")
    parsed = parse_patch(decode_content(args["patch"]))
    if not parsed:
        raise CcwError("INVALID_ARGUMENT", "the patch contains no file diffs; send `git diff` output")
    if mode == "snapshot":
        T.resolve_mode({**args, "mode": "snapshot"})
        return shaped(await run_sync(lambda: patches.patch_snapshot(stores(ctx), args["snapshot_id"], parsed)))
    return await run_live(
        ctx,
        args,
        lambda target: patches.patch_live(stores(ctx), target, args.get("lease_id"), parsed, note_tool_changes),
    )


async def workspace_write_file(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Write one file atomically beneath the root."""
    path = P.normalize(args["path"])
    if path == P.ROOT:
        raise CcwError("INVALID_ARGUMENT", "name a file to write, not the root")
    data = decode_content(args["content"])
    return await run_live(
        ctx,
        args,
        lambda target: patches.write_file(
            stores(ctx),
            target,
            args.get("lease_id"),
            path,
            data,
            executable=args.get("executable"),
            create_dirs=bool(args.get("create_dirs", True)),
            note=note_tool_changes,
        ),
    )


async def workspace_delete(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Delete a file or symlink, or a directory tree with ``recursive``."""
    path = P.normalize(args["path"])
    if path == P.ROOT:
        raise CcwError("PERMISSION_DENIED", "the workspace root itself cannot be deleted; name a path inside it")
    return await run_live(
        ctx,
        args,
        lambda target: patches.delete(
            stores(ctx),
            target,
            args.get("lease_id"),
            path,
            recursive=bool(args.get("recursive")),
            note=note_tool_changes,
        ),
    )


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
        "description": (
            "Apply a unified diff strictly (byte-exact context, no fuzz, all or nothing) to the worktree, "
            "a capsule or a snapshot (which yields a new snapshot)."
        ),
        "input": T.input_schema(
            {
                **T.HYBRID,
                "mode": {"enum": ["worktree", "snapshot", "capsule"], "default": "worktree"},
                "patch": {"type": "string", "minLength": 1, "maxLength": 32 * 1024 * 1024},
            },
            ["patch"],
        ),
        "output": T.hybrid_output(
            {
                "applied": {"type": "boolean"},
                "files": {"type": "array", "items": {"type": "string"}},
                "rejects": _REJECTS,
            },
            ["applied", "files", "rejects"],
        ),
    },
    "workspace_write_file": {
        "description": (
            "Write a file atomically beneath the root (never through a symlink); content is text or 'base64:…'."
        ),
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
        "output": T.hybrid_output(
            {"path": {"type": "string"}, "size": T.COUNT, "blob": T.BLOB_ID}, ["path", "size", "blob"]
        ),
    },
    "workspace_delete": {
        "description": "Delete a file or symlink (or, with recursive, a directory) beneath the root.",
        "input": T.input_schema(
            {**T.LIVE, "path": T.PATH, "recursive": {"type": "boolean", "default": False}}, ["path"]
        ),
        "output": T.hybrid_output(
            {"path": {"type": "string"}, "deleted": {"type": "array", "items": {"type": "string"}}},
            ["path", "deleted"],
        ),
    },
}

_HANDLERS = {
    "workspace_apply_patch": workspace_apply_patch,
    "workspace_write_file": workspace_write_file,
    "workspace_delete": workspace_delete,
}

TOOLS = T.family_tools("workspace", TOOL_SCHEMAS, _HANDLERS, scope="write", destructive=True)
