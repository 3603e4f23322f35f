"""Snapshot tools (seed 000 §3.1): create, list, file, grep, diff, info, changes, export.

Adapters over the substrate service (``mcp_server/substrate/snapshots.py`` and
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
from mcp_server.substrate import snapshots as S
from mcp_server.substrate.search import GrepQuery, grep_live, grep_snapshot
from mcp_server.substrate.views import LiveTarget, norm_paths
from mcp_server.tools import targets as T
from mcp_server.tools.snapshot_schemas import TOOL_SCHEMAS
from mcp_server.tools.targets import run_live, run_sync, shaped, stores
from sandbox.errors import CcwError


async def snapshot_create(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Capture files into an immutable, content-addressed snapshot."""

    def body(target: LiveTarget) -> dict[str, Any]:
        return S.create(stores(ctx), target, args.get("lease_id"), args.get("paths"))

    return await T.on_live(ctx, args, body)


async def snapshot_info(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    """A snapshot's fingerprint and manifest stats (no lease context)."""
    return await run_sync(lambda: S.info(stores(ctx), args["snapshot_id"]))


async def snapshot_list(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Entries directly under a directory (or all beneath it with ``recursive``)."""
    base = P.normalize(args.get("path", P.ROOT))
    recursive = bool(args.get("recursive", False))
    limit = int(args.get("max_entries", 10000))
    if T.resolve_mode(args) == "snapshot":
        return shaped(await run_sync(lambda: S.list_snapshot(stores(ctx), args["snapshot_id"], base, recursive, limit)))
    return await run_live(ctx, args, lambda target: S.list_live(stores(ctx), target, args.get("lease_id"), base, recursive, limit))


async def snapshot_file(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Read one file from the worktree or a snapshot."""
    path = P.normalize(args["path"])
    if T.resolve_mode(args) == "snapshot":
        return shaped(await run_sync(lambda: S.file_snapshot(stores(ctx), args["snapshot_id"], path)))
    return await run_live(ctx, args, lambda target: S.file_live(stores(ctx), target, args.get("lease_id"), path))


async def snapshot_grep(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Search text files for a literal (or regex) in deterministic candidate order."""
    try:
        matcher = Matcher.build(args["pattern"], regex=bool(args.get("regex")), ignore_case=bool(args.get("ignore_case")))
    except re.error as exc:
        raise CcwError("INVALID_ARGUMENT", f"pattern is not a valid regular expression: {exc}") from exc
    query = GrepQuery(matcher, norm_paths(args.get("paths")), int(args.get("max_files", 10000)), int(args.get("max_matches", 1000)))
    if T.resolve_mode(args) == "snapshot":
        return shaped(await run_sync(lambda: grep_snapshot(stores(ctx), args["snapshot_id"], query)))
    return await run_live(ctx, args, lambda target: grep_live(stores(ctx), target, args.get("lease_id"), query))


async def snapshot_diff(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Unified diff from ``base_snapshot_id`` to ``snapshot_id`` or the live tree."""
    scopes = norm_paths(args.get("paths"))
    if T.resolve_mode(args) == "snapshot":
        return shaped(await run_sync(lambda: S.diff_snapshots(stores(ctx), args["base_snapshot_id"], args["snapshot_id"], scopes)))
    return await run_live(ctx, args, lambda target: S.diff_live(stores(ctx), target, args.get("lease_id"), args["base_snapshot_id"], scopes))


async def snapshot_changes(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Changed files: the worktree against HEAD, or a snapshot against a base snapshot."""
    if T.resolve_mode(args) == "snapshot":
        return shaped(await run_sync(lambda: S.changes_snapshots(stores(ctx), args.get("base_snapshot_id"), args["snapshot_id"])))
    if args.get("capsule_id"):
        raise CcwError(
            "UNSUPPORTED",
            "snapshot_changes reads git status, which cannot run inside a capsule's view; "
            "call capsule_diff for the capsule's changes against its base",
        )
    return await run_live(ctx, args, lambda target: S.changes_live(stores(ctx), target, args.get("lease_id")))


async def snapshot_export(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    """A deterministic tar of a snapshot (or of live files, touching them)."""
    scopes = norm_paths(args.get("paths"))
    if T.resolve_mode(args) == "snapshot":
        return shaped(await run_sync(lambda: S.export_snapshot(stores(ctx), args["snapshot_id"], scopes)))
    return await run_live(ctx, args, lambda target: S.export_live(stores(ctx), target, args.get("lease_id"), scopes))


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
