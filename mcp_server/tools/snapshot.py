"""Snapshot tools (seed 000 §3.1): create, list, file, grep, diff, info, changes, export.

Adapters over the substrate service (``mcp_server/substrate/snapshot.py`` and
``search.py``): each handler parses its arguments, opens the live target or names the
snapshot, calls the service in a worker thread and shapes its answer (``targets.shaped``).

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

import re
from typing import Any

from mcp_server.core import paths as P
from mcp_server.core.grep import Matcher
from mcp_server.substrate import snapshot as S
from mcp_server.substrate.search import GrepQuery, grep_live, grep_snapshot
from mcp_server.substrate.views import LiveTarget, norm_paths
from mcp_server.tools import targets as T
from mcp_server.tools.registry import ToolContext
from mcp_server.tools.targets import run_live, run_sync, shaped, stores
from sandbox.errors import CcwError


async def snapshot_create(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Capture files into an immutable, content-addressed snapshot."""

    def body(target: LiveTarget) -> dict[str, Any]:
        return S.create(stores(ctx), target, args.get("lease_id"), args.get("paths"))

    return await T.on_live(ctx, args, body)


async def snapshot_info(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """A snapshot's fingerprint and manifest stats (no lease context)."""
    return await run_sync(lambda: S.info(stores(ctx), args["snapshot_id"]))


async def snapshot_list(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Entries directly under a directory (or all beneath it with ``recursive``)."""
    base = P.normalize(args.get("path", P.ROOT))
    recursive = bool(args.get("recursive", False))
    limit = int(args.get("max_entries", 10000))
    if T.resolve_mode(args) == "snapshot":
        return shaped(await run_sync(lambda: S.list_snapshot(stores(ctx), args["snapshot_id"], base, recursive, limit)))
    return await run_live(
        ctx, args, lambda target: S.list_live(stores(ctx), target, args.get("lease_id"), base, recursive, limit)
    )


async def snapshot_file(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Read one file from the worktree or a snapshot."""
    path = P.normalize(args["path"])
    if T.resolve_mode(args) == "snapshot":
        return shaped(await run_sync(lambda: S.file_snapshot(stores(ctx), args["snapshot_id"], path)))
    return await run_live(ctx, args, lambda target: S.file_live(stores(ctx), target, args.get("lease_id"), path))


async def snapshot_grep(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Search text files for a literal (or regex) in deterministic candidate order."""
    try:
        matcher = Matcher.build(
            args["pattern"], regex=bool(args.get("regex")), ignore_case=bool(args.get("ignore_case"))
        )
    except re.error as exc:
        raise CcwError("INVALID_ARGUMENT", f"pattern is not a valid regular expression: {exc}") from exc
    query = GrepQuery(
        matcher, norm_paths(args.get("paths")), int(args.get("max_files", 10000)), int(args.get("max_matches", 1000))
    )
    if T.resolve_mode(args) == "snapshot":
        return shaped(await run_sync(lambda: grep_snapshot(stores(ctx), args["snapshot_id"], query)))
    return await run_live(ctx, args, lambda target: grep_live(stores(ctx), target, args.get("lease_id"), query))


async def snapshot_diff(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Unified diff from ``base_snapshot_id`` to ``snapshot_id`` or the live tree."""
    scopes = norm_paths(args.get("paths"))
    if T.resolve_mode(args) == "snapshot":
        return shaped(
            await run_sync(lambda: S.diff_snapshots(stores(ctx), args["base_snapshot_id"], args["snapshot_id"], scopes))
        )
    return await run_live(
        ctx,
        args,
        lambda target: S.diff_live(stores(ctx), target, args.get("lease_id"), args["base_snapshot_id"], scopes),
    )


async def snapshot_changes(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Changed files: the worktree against HEAD, or a snapshot against a base snapshot."""
    if T.resolve_mode(args) == "snapshot":
        return shaped(
            await run_sync(lambda: S.changes_snapshots(stores(ctx), args.get("base_snapshot_id"), args["snapshot_id"]))
        )
    if args.get("capsule_id"):
        raise CcwError(
            "UNSUPPORTED",
            "snapshot_changes reads git status, which cannot run inside a capsule's view; "
            "call capsule_diff for the capsule's changes against its base",
        )
    return await run_live(ctx, args, lambda target: S.changes_live(stores(ctx), target, args.get("lease_id")))


async def snapshot_export(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """A deterministic tar of a snapshot (or of live files, touching them)."""
    scopes = norm_paths(args.get("paths"))
    if T.resolve_mode(args) == "snapshot":
        return shaped(await run_sync(lambda: S.export_snapshot(stores(ctx), args["snapshot_id"], scopes)))
    return await run_live(ctx, args, lambda target: S.export_live(stores(ctx), target, args.get("lease_id"), scopes))


# --- schemas (seed 000 §5) ------------------------------------------------------------
# Hybrid tools answer oneOf [Immutable, Worktree] (targets.hybrid_output); snapshot-only
# tools answer the immutable shape alone.

_LIMIT = {"type": "integer", "minimum": 1, "maximum": 1_000_000}
_CHANGES = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "status": {"enum": ["added", "deleted", "modified", "type_changed", "untracked", "conflicted"]},
        },
        "required": ["path", "status"],
        "additionalProperties": False,
    },
}
_STATS = {
    "type": "object",
    "properties": {"files": T.COUNT, "bytes": T.COUNT},
    "required": ["files", "bytes"],
    "additionalProperties": False,
}
_SNAPSHOT_OUT = {
    "type": "object",
    "properties": {
        "snapshot_id": T.SNAPSHOT_ID,
        "fingerprint": T.FINGERPRINT,
        "manifest_stats": _STATS,
        "cache_hint": {"const": "immutable"},
    },
    "required": ["snapshot_id", "fingerprint", "manifest_stats", "cache_hint"],
    "additionalProperties": False,
}
TOOL_SCHEMAS: dict[str, dict[str, Any]] = {
    "snapshot_create": {
        "description": (
            "Capture files into an immutable content-addressed snapshot: the given paths, "
            "else the lease's touched files, else every file git does not ignore."
        ),
        "input": T.input_schema(
            {"lease_id": T.LEASE_ID, "paths": T.PATHS, "capsule_id": T.CAPSULE_ID, "workspace": T.WORKSPACE}
        ),
        "output": _SNAPSHOT_OUT,
    },
    "snapshot_info": {
        "description": "A snapshot's fingerprint and manifest stats (file count, total bytes).",
        "input": T.input_schema({"snapshot_id": T.SNAPSHOT_ID}, ["snapshot_id"]),
        "output": _SNAPSHOT_OUT,
    },
    "snapshot_list": {
        "description": (
            "List a directory of the worktree (issues/uses a lease, touches entries and parents) "
            "or of a snapshot (captured entries only)."
        ),
        "input": T.input_schema(
            {**T.HYBRID, "path": T.PATH, "recursive": {"type": "boolean", "default": False}, "max_entries": _LIMIT}
        ),
        "output": T.hybrid_output(
            {
                "path": {"type": "string"},
                "entries": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "path": {"type": "string"},
                            "kind": {"enum": ["file", "dir", "symlink"]},
                            "size": T.COUNT,
                        },
                        "required": ["path", "kind"],
                        "additionalProperties": False,
                    },
                },
                "truncated": {"type": "boolean"},
            },
            ["path", "entries", "truncated"],
        ),
    },
    "snapshot_file": {
        "description": (
            "Read one file from the worktree (touches it) or a snapshot; binary content comes as 'base64:…'."
        ),
        "input": T.input_schema({**T.HYBRID, "path": T.PATH}, ["path"]),
        "output": T.hybrid_output(
            {
                "path": {"type": "string"},
                "content": {"type": "string"},
                "encoding": {"enum": ["utf-8", "base64"]},
                "size": T.COUNT,
                "mode": {"type": "string", "pattern": "^[0-7]{6}$"},
                "blob": T.BLOB_ID,
            },
            ["path", "content", "encoding", "size", "mode", "blob"],
        ),
    },
    "snapshot_grep": {
        "description": (
            "Search text files (binaries excluded, git ignore rules applied) in byte order of path; "
            "matches ordered by line and column."
        ),
        "input": T.input_schema(
            {
                **T.HYBRID,
                "pattern": {"type": "string", "minLength": 1},
                "paths": T.PATHS,
                "regex": {"type": "boolean", "default": False},
                "ignore_case": {"type": "boolean", "default": False},
                "max_files": _LIMIT,
                "max_matches": _LIMIT,
            },
            ["pattern"],
        ),
        "output": T.hybrid_output(
            {
                "matches": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "path": {"type": "string"},
                            "line": T.COUNT,
                            "col": T.COUNT,
                            "text": {"type": "string"},
                        },
                        "required": ["path", "line", "col", "text"],
                        "additionalProperties": False,
                    },
                },
                "files_searched": T.COUNT,
                "truncated": {"type": "boolean"},
                "matches_truncated": {"type": "boolean"},
            },
            ["matches", "files_searched", "truncated", "matches_truncated"],
        ),
    },
    "snapshot_diff": {
        "description": (
            "Unified diff from base_snapshot_id to snapshot_id, or to the live worktree (touches the target paths)."
        ),
        "input": T.input_schema(
            {**T.HYBRID, "base_snapshot_id": T.SNAPSHOT_ID, "paths": T.PATHS}, ["base_snapshot_id"]
        ),
        "output": T.hybrid_output({"changes": _CHANGES, "diff": {"type": "string"}}, ["changes", "diff"]),
    },
    "snapshot_changes": {
        "description": (
            "Changed files: the worktree against HEAD (git status, no rename detection), "
            "or snapshot_id against base_snapshot_id."
        ),
        "input": T.input_schema({**T.HYBRID, "base_snapshot_id": T.SNAPSHOT_ID}),
        "output": T.hybrid_output({"changes": _CHANGES}, ["changes"]),
    },
    "snapshot_export": {
        "description": (
            "A deterministic tar bundle (sorted entries, fixed metadata) of a snapshot or of live files, "
            "as 'base64:…'."
        ),
        "input": T.input_schema({**T.HYBRID, "paths": T.PATHS}),
        "output": T.hybrid_output(
            {
                "format": {"const": "tar"},
                "bundle": {"type": "string", "pattern": "^base64:"},
                "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                "size": T.COUNT,
                "files": T.COUNT,
            },
            ["format", "bundle", "sha256", "size", "files"],
        ),
    },
}


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
