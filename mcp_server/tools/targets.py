"""Which view a file tool acts on, the JSON-Schema fragments every file tool shares, and
the adapter plumbing the snapshot and workspace tools share: opening the live target,
running the substrate service (``mcp_server/substrate/``) in a worker thread, and shaping
its answers as seed 000 §5's responses.

Every file tool (snapshot, workspace, text, hashline) reads or edits one of three views:

- the live **worktree**: the workspace root is the tool's ``workspace`` argument when
  given (an absolute directory), else ``ctx.workspace`` (``CCW_WORKSPACE`` of the
  ``ccw-mcp`` the client started, default its cwd).  Symlinks in the root path itself are resolved once, when
  the root is opened; everything beneath it is reached through the root descriptor.
  The service is given the root; only the adapter knows the caller's workspace.
- a **capsule**'s copy-on-write merged view, when ``capsule_id`` is given: the helper
  passes an O_PATH descriptor of it (``open_root``), so no file content crosses the IPC.
- a **snapshot** (immutable, content-addressed), handled by the snapshot tools
  themselves from the blob store; it needs no view.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar

import anyio

from mcp_server.fs.view import RootView
from mcp_server.substrate.views import Immutable, Leased, LiveTarget, Stores
from mcp_server.tools.registry import Handler, ToolContext, ToolSpec
from sandbox.errors import CcwError

R = TypeVar("R")


def workspace_root(ctx: ToolContext, workspace: str | None = None) -> str:
    """The worktree root directory: the ``workspace`` argument, else the configured one."""
    root = workspace or ctx.workspace
    if not os.path.isabs(root):
        raise CcwError(
            "INVALID_ARGUMENT",
            f"workspace {root!r} must be an absolute directory path",
            {"workspace": root},
        )
    return root


async def open_view(ctx: ToolContext, *, capsule_id: str | None, workspace: str | None = None) -> RootView:
    """The view a file tool acts on: a capsule's merged view, or the worktree root."""
    if capsule_id:
        helper = await ctx.helper()
        fd = await helper.open_root(capsule_id)
        return RootView.from_fd(fd)
    return RootView.open(workspace_root(ctx, workspace))


# --- shared schema fragments ---------------------------------------------------------

CAPSULE_ID: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "maxLength": 128,
    "description": "This capsule's view instead of the live tree.",
}

WORKSPACE: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "description": "Absolute path (default: CCW_WORKSPACE).",
}

PATH: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "maxLength": 4096,
    "description": "Repo-relative path ('.' is the root).",
}

PATHS: dict[str, Any] = {"type": "array", "items": PATH, "maxItems": 10000}

LEASE_ID: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "maxLength": 128,
    "description": "From an earlier live-tree read; refused once the tree changed.",
}

SNAPSHOT_ID: dict[str, Any] = {
    "type": "string",
    "pattern": "^sha256:[0-9a-f]{64}$",
}

BLOB_ID: dict[str, Any] = {"type": "string", "pattern": "^sha256:[0-9a-f]{64}$"}

MODE: dict[str, Any] = {
    "type": "string",
    "enum": ["worktree", "snapshot"],
    "default": "worktree",
}

FINGERPRINT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "head_oid": {"type": "string", "pattern": "^([0-9a-f]{40}|[0-9a-f]{64})?$"},
        "index_oid": {"type": "string", "pattern": "^([0-9a-f]{40}|[0-9a-f]{64})?$"},
        "status_hash": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
    },
    "required": ["head_oid", "index_oid", "status_hash"],
    "additionalProperties": False,
}

ERROR: dict[str, Any] = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "details": {"type": "object"},
            },
            "required": ["code", "message", "details"],
        }
    },
    "required": ["error"],
}


COUNT: dict[str, Any] = {"type": "integer", "minimum": 0}
LIVE: dict[str, Any] = {"lease_id": LEASE_ID, "capsule_id": CAPSULE_ID,
                        "workspace": WORKSPACE}  # a live target's arguments
HYBRID: dict[str, Any] = {"mode": MODE, "snapshot_id": SNAPSHOT_ID, **LIVE}  # ... or a snapshot's


def input_schema(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    """A tool's input schema: these properties, nothing else."""
    return {"type": "object", "properties": properties, "required": required or [], "additionalProperties": False}


def hybrid_output(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """Seed 000 §5: ``oneOf`` [Immutable (cache_hint "immutable"), Worktree (cache_hint
    "until_dirty" with ``lease_id`` and ``fingerprint``)] over the same payload."""
    immutable = {
        "type": "object",
        "properties": {
            **properties,
            "cache_hint": {"const": "immutable"},
            "snapshot_id": SNAPSHOT_ID,
        },
        "required": [*required, "cache_hint", "snapshot_id"],
        "not": {"required": ["lease_id"]},
    }
    worktree = {
        "type": "object",
        "properties": {
            **properties,
            "cache_hint": {"const": "until_dirty"},
            "lease_id": {"type": "string"},
            "fingerprint": FINGERPRINT,
            "capsule_id": {"type": "string"},
        },
        "required": [*required, "cache_hint", "lease_id", "fingerprint"],
    }
    return {"type": "object", "oneOf": [immutable, worktree]}


def family_tools(
    family: str,
    schemas: dict[str, dict[str, Any]],
    handlers: Mapping[str, Handler],
    *,
    scope: str,
    read_only: Collection[str] = (),
    idempotent: bool = False,
    destructive: bool = False,
) -> list[ToolSpec]:
    """The ToolSpecs of a substrate family (snapshot, workspace) from its ``TOOL_SCHEMAS``
    table (description, input, output by tool name) and its handlers; each tool also
    answers to the seed's dotted alias (``snapshot_list`` → ``snapshot.list``) and is
    read-only when named in ``read_only``."""
    return [
        ToolSpec(
            name=name,
            family=family,
            description=schemas[name]["description"],
            input_schema=schemas[name]["input"],
            output_schema=schemas[name]["output"],
            handler=handler,
            scope=scope,
            aliases=(f"{family}." + name.split("_", 1)[1],),
            read_only=name in read_only,
            destructive=destructive,
            idempotent=idempotent,
            title=name.replace("_", " "),
        )
        for name, handler in handlers.items()
    ]


# --- live targets (worktree or capsule), and their answers --------------------------


async def open_live(ctx: ToolContext, args: dict[str, Any]) -> LiveTarget:
    """Open the worktree (or ``capsule_id``'s view) a worktree-mode call acts on."""
    capsule_id = args.get("capsule_id")
    if capsule_id:
        view = await open_view(ctx, capsule_id=capsule_id)
        return LiveTarget.capsule(view, capsule_id, ctx.state)
    return LiveTarget.worktree(workspace_root(ctx, args.get("workspace")))


def stores(ctx: ToolContext) -> Stores:
    """The stores of the server's state dir."""
    return Stores(ctx.state)


def shaped(answer: Leased | Immutable) -> dict[str, Any]:
    """Seed 000 §5: a live target's answer as a WorktreeResponse (the payload plus
    cache_hint "until_dirty", lease_id, fingerprint, and capsule_id in a capsule), a
    snapshot's as an ImmutableResponse (the payload plus cache_hint and snapshot_id)."""
    out = dict(answer.payload)
    if isinstance(answer, Immutable):
        out["cache_hint"] = "immutable"
        out["snapshot_id"] = answer.snapshot_id
        return out
    out["cache_hint"] = "until_dirty"
    out["lease_id"] = answer.lease_id
    out["fingerprint"] = answer.fingerprint.to_dict()
    if answer.capsule_id:
        out["capsule_id"] = answer.capsule_id
    return out


def resolve_mode(args: dict[str, Any]) -> str:
    """``snapshot`` when asked for (or when a snapshot_id is given), else ``worktree``."""
    mode = args.get("mode") or ("snapshot" if args.get("snapshot_id") else "worktree")
    if mode == "snapshot":
        if not args.get("snapshot_id"):
            raise CcwError("INVALID_ARGUMENT", "mode 'snapshot' needs snapshot_id; create one with snapshot_create")
        if args.get("capsule_id") or args.get("lease_id"):
            raise CcwError("INVALID_ARGUMENT",
                           "capsule_id and lease_id apply to worktree mode only; drop them for mode 'snapshot'")
    return str(mode)


async def on_live(ctx: ToolContext, args: dict[str, Any], body: Callable[[LiveTarget], R]) -> R:
    """Open the live target, run ``body`` in a worker thread, close the target."""
    target = await open_live(ctx, args)
    try:
        return await anyio.to_thread.run_sync(body, target)
    finally:
        target.close()


async def run_live(ctx: ToolContext, args: dict[str, Any], body: Callable[[LiveTarget], Leased]) -> dict[str, Any]:
    """``on_live``, the answer shaped (``shaped``)."""
    return shaped(await on_live(ctx, args, body))


async def run_sync(fn: Callable[[], R]) -> R:
    """Run blocking work in a worker thread."""
    return await anyio.to_thread.run_sync(fn)
