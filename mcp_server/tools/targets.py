"""Which view a file tool acts on, the JSON-Schema fragments every file tool shares, and
the plumbing the snapshot and workspace tools share (stores, leases, capture).

Every file tool (snapshot, workspace, text, hashline) reads or edits one of three views:

- the live **worktree**: the workspace root is the tool's ``workspace`` argument when
  given (an absolute directory), else ``ctx.workspace`` (``CCW_WORKSPACE`` of the
  ``ccw-mcp`` the client started, default its cwd).  Symlinks in the root path itself are resolved once, when
  the root is opened; everything beneath it is reached through the root descriptor.
- a **capsule**'s copy-on-write merged view, when ``capsule_id`` is given: the helper
  passes an O_PATH descriptor of it (``open_root``), so no file content crosses the IPC.
- a **snapshot** (immutable, content-addressed), handled by the snapshot tools
  themselves from the blob store; it needs no view.
"""

from __future__ import annotations

import base64
import os
import stat as stat_mod
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio

from mcp_server.core import paths as P
from mcp_server.core.blobid import blob_id_of
from mcp_server.core.fingerprint import Fingerprint
from mcp_server.core.grep import is_binary
from mcp_server.core.manifest import Entry
from mcp_server.fs import fingerprint as fp_mod
from mcp_server.fs.blobstore import BlobStore
from mcp_server.fs.leases import LeaseStore
from mcp_server.fs.snapshots import SnapshotStore
from mcp_server.fs.view import RootView
from mcp_server.tools.registry import Handler, ToolSpec
from sandbox.errors import CcwError


def workspace_root(ctx: Any, workspace: str | None = None) -> str:
    """The worktree root directory: the ``workspace`` argument, else the configured one."""
    root = workspace or ctx.workspace
    if not os.path.isabs(root):
        raise CcwError(
            "INVALID_ARGUMENT",
            f"workspace {root!r} must be an absolute directory path",
            {"workspace": root},
        )
    return root


async def open_view(ctx: Any, *, capsule_id: str | None, workspace: str | None = None) -> RootView:
    """The view a file tool acts on: a capsule's merged view, or the worktree root."""
    if capsule_id:
        helper = await ctx.helper()
        fd = await helper.open_root(capsule_id)
        return RootView.from_fd(fd)
    return RootView.open(workspace_root(ctx, workspace))


_WORKERS = 4  # threads reading, hashing and compressing files during capture


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
LIVE: dict[str, Any] = {"lease_id": LEASE_ID, "capsule_id": CAPSULE_ID, "workspace": WORKSPACE}  # a live target's arguments
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


# --- live targets (worktree or capsule) and their leases -----------------------------


class LiveTarget:
    """An open worktree or capsule view, with the key its leases are issued under."""

    def __init__(self, view: RootView, key: str, git_root: str, capsule_id: str | None, state: Any = None) -> None:
        self.view = view
        self.key = key
        self.git_root = git_root
        self.capsule_id = capsule_id
        self.state = state

    def fingerprint(self) -> Fingerprint:
        """The live fingerprint of this target (blocking: call from a worker thread)."""
        if self.capsule_id:
            return capsule_fingerprint(self.view, self.state, self.capsule_id)
        return fp_mod.compute(self.git_root)

    def close(self) -> None:
        """Close the view."""
        self.view.close()


async def open_live(ctx: Any, args: dict[str, Any]) -> LiveTarget:
    """Open the worktree (or ``capsule_id``'s view) a worktree-mode call acts on.

    A capsule's view lives in the helper's mount namespace: reachable through the
    descriptor, but not by any path git could resolve, so capsules get
    ``capsule_fingerprint`` instead of git's.
    """
    capsule_id = args.get("capsule_id")
    if capsule_id:
        view = await open_view(ctx, capsule_id=capsule_id)
        return LiveTarget(view, f"capsule:{capsule_id}", "", capsule_id, ctx.state)
    root = workspace_root(ctx, args.get("workspace"))
    view = RootView.open(root)
    # The canonical path of the directory actually opened (symlinks in root resolved).
    canonical = os.readlink(f"/proc/self/fd/{view.fd}")
    return LiveTarget(view, f"worktree:{canonical}", canonical, None)


def lease_store(ctx: Any) -> LeaseStore:
    """The lease store of the server's state dir."""
    return LeaseStore(ctx.state)


def worktree_response(payload: dict[str, Any], target: LiveTarget, lease_id: str, fp: Fingerprint) -> dict[str, Any]:
    """Seed 000 §5 WorktreeResponse: the payload plus cache_hint, lease_id, fingerprint."""
    out = dict(payload)
    out["cache_hint"] = "until_dirty"
    out["lease_id"] = lease_id
    out["fingerprint"] = fp.to_dict()
    if target.capsule_id:
        out["capsule_id"] = target.capsule_id
    return out


def immutable_response(payload: dict[str, Any], snapshot_id: str) -> dict[str, Any]:
    """Seed 000 §5 ImmutableResponse: the payload plus cache_hint and snapshot_id."""
    out = dict(payload)
    out["cache_hint"] = "immutable"
    out["snapshot_id"] = snapshot_id
    return out


def resolve_mode(args: dict[str, Any]) -> str:
    """``snapshot`` when asked for (or when a snapshot_id is given), else ``worktree``."""
    mode = args.get("mode") or ("snapshot" if args.get("snapshot_id") else "worktree")
    if mode == "snapshot":
        if not args.get("snapshot_id"):
            raise CcwError("INVALID_ARGUMENT", "mode 'snapshot' needs snapshot_id; create one with snapshot_create")
        if args.get("capsule_id") or args.get("lease_id"):
            raise CcwError("INVALID_ARGUMENT", "capsule_id and lease_id apply to worktree mode only; drop them for mode 'snapshot'")
    return str(mode)


# --- shared plumbing of the snapshot and workspace tools ----------------------------


def blobs(ctx: Any) -> BlobStore:
    """The state dir's blob store."""
    return BlobStore(ctx.state.objects_dir)


def snapshots(ctx: Any) -> SnapshotStore:
    """The state dir's snapshot store."""
    return SnapshotStore(ctx.state)


def git_mode(st: os.stat_result) -> int:
    """git's mode for a stat: 120000, 100755 or 100644."""
    if stat_mod.S_ISLNK(st.st_mode):
        return 0o120000
    return 0o100755 if st.st_mode & 0o111 else 0o100644


def read_entry(view: RootView, path: str) -> tuple[bytes, int] | None:
    """Content and git mode of a file or symlink; None when absent, a directory or special."""
    try:
        st = view.stat(path)
    except CcwError as exc:
        if exc.code == "NOT_FOUND":
            return None
        raise
    if stat_mod.S_ISLNK(st.st_mode):
        return os.fsencode(view.readlink(path)), 0o120000
    if not stat_mod.S_ISREG(st.st_mode):
        return None
    return view.read_bytes(path), git_mode(st)


def scoped(candidates: list[str], scopes: list[str]) -> list[str]:
    """The candidates within any of the normalised scopes."""
    if P.ROOT in scopes:
        return candidates
    return [c for c in candidates if any(P.is_within(c, s) for s in scopes)]


def norm_paths(raw: list[str] | None) -> list[str]:
    """Normalise a ``paths`` argument (default: the root)."""
    return P.sort_paths(P.normalize(p) for p in (raw or [P.ROOT]))


def live_files(target: LiveTarget, scopes: list[str]) -> list[str]:
    """Files git's ignore rules leave, within the scopes, in byte order.

    In a capsule git cannot run (see ``open_live``): every file but ``.git`` counts.
    """
    if target.capsule_id:
        files = [path for path, kind in target.view.walk("") if kind in ("file", "symlink")]
        return scoped(P.sort_paths(files), scopes)
    specs = [] if P.ROOT in scopes else [f":(literal){s}" for s in scopes]
    return fp_mod.candidate_files(target.git_root, specs)


def _read_ref(view: RootView, ref: str, depth: int = 0) -> str:
    """A ref's object id read from .git's files (loose ref, then packed-refs); "" if unborn."""
    try:
        value = view.read_bytes(f".git/{ref}").decode("ascii", "replace").strip()
    except CcwError:
        value = ""
    if value.startswith("ref: ") and depth < 5:
        return _read_ref(view, value[5:], depth + 1)
    if value:
        return value
    try:
        packed = view.read_bytes(".git/packed-refs").decode("ascii", "replace")
    except CcwError:
        return ""
    for line in packed.splitlines():
        oid, _, name = line.partition(" ")
        if name == ref:
            return oid
    return ""


def capsule_fingerprint(view: RootView, state: Any, capsule_id: str) -> Fingerprint:
    """The fingerprint of a capsule's view, computed without git.

    ``head_oid`` is read from the capsule's ``.git`` files; ``index_oid`` is "" (writing a
    tree needs git, which cannot reach the view); ``status_hash`` is sha256 over the
    capsule's change sequence: every change to a capsule is an exec or a tool write,
    both journaled, so the last sequence number names its state exactly, and a lease
    goes stale on any change to the capsule.
    """
    import hashlib

    from mcp_server.core.canonical import canonical_json
    from mcp_server.journal import Journal

    journal = Journal(state)
    seq = max([0] + [e["seq"] for e in journal.execs(capsule_id)] + [w["seq"] for w in journal.writes(capsule_id)])
    status = hashlib.sha256(canonical_json({"capsule_id": capsule_id, "seq": seq})).hexdigest()
    return Fingerprint(head_oid=_read_ref(view, "HEAD"), index_oid="", status_hash=status)


def capture(view: RootView, store: BlobStore, files: list[str]) -> list[Entry]:
    """Read, hash and store files in parallel; absent files are skipped."""

    def one(path: str) -> Entry | None:
        item = read_entry(view, path)
        if item is None:
            return None
        data, mode = item
        return Entry(path, store.put(data, blob_id_of(data)), len(data), mode)

    with ThreadPoolExecutor(_WORKERS) as pool:
        return [e for e in pool.map(one, files) if e is not None]


def begin_live(ctx: Any, target: LiveTarget, lease_id: str | None) -> tuple[str, Fingerprint]:
    """Fingerprint the target and validate (or issue) the lease."""
    live = target.fingerprint()
    lease = lease_store(ctx).acquire(lease_id, target.key, live)
    return lease.lease_id, live


async def run_live(ctx: Any, args: dict[str, Any], body: Callable[[LiveTarget], dict[str, Any]]) -> dict[str, Any]:
    """Open the live target, run ``body`` in a worker thread, close the target."""
    target = await open_live(ctx, args)
    try:
        return await anyio.to_thread.run_sync(body, target)
    finally:
        target.close()


async def run_sync(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run blocking work in a worker thread."""
    return await anyio.to_thread.run_sync(fn)


def encode_content(data: bytes) -> tuple[str, str]:
    """(content, encoding): UTF-8 text as is; binary (a NUL near the start) or other bytes as ``base64:…``."""
    if is_binary(data):
        return "base64:" + base64.b64encode(data).decode("ascii"), "base64"
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode("ascii"), "base64"
