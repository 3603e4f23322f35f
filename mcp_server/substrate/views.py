"""The views the file tools act on, the stores they keep, and the answers they give.

A **live target** is the worktree (a directory the caller names, opened once, symlinks
in its path resolved; everything beneath it reached through its descriptor) or a
capsule's copy-on-write merged view (an O_PATH descriptor the helper passed, so no file
content crosses the IPC).  A **snapshot** (immutable, content-addressed) needs no view:
its files are read from the blob store.  Reads of a live target answer under a lease
(``Leased``), reads of a snapshot name it (``Immutable``).
"""

from __future__ import annotations

import base64
import hashlib
import os
import stat as stat_mod
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from mcp_server.core import paths as P
from mcp_server.core.blobid import blob_id_of
from mcp_server.core.canonical import canonical_json
from mcp_server.core.fingerprint import Fingerprint
from mcp_server.core.grep import is_binary
from mcp_server.core.manifest import Entry
from mcp_server.fs import fingerprint as fp_mod
from mcp_server.fs.blobstore import BlobStore
from mcp_server.fs.leases import LeaseStore
from mcp_server.fs.snapshot import SnapshotStore
from mcp_server.fs.view import RootView
from mcp_server.journal import Journal
from sandbox.errors import CcwError

_WORKERS = 4  # threads reading, hashing and compressing files during capture


@dataclass(frozen=True)
class Stores:
    """The state dir's stores; each is opened afresh when asked for."""

    state: Any  # mcp_server.state.State

    @property
    def blobs(self) -> BlobStore:
        """The state dir's blob store."""
        return BlobStore(self.state.objects_dir)

    @property
    def snapshots(self) -> SnapshotStore:
        """The state dir's snapshot store."""
        return SnapshotStore(self.state)

    @property
    def leases(self) -> LeaseStore:
        """The state dir's lease store."""
        return LeaseStore(self.state)


class LiveTarget:
    """An open worktree or capsule view, with the key its leases are issued under."""

    def __init__(self, view: RootView, key: str, git_root: str, capsule_id: str | None, state: Any = None) -> None:
        self.view = view
        self.key = key
        self.git_root = git_root
        self.capsule_id = capsule_id
        self.state = state

    @classmethod
    def worktree(cls, root: str) -> LiveTarget:
        """Open the worktree at ``root``, keyed by the canonical path of the directory
        actually opened (symlinks in ``root`` resolved)."""
        view = RootView.open(root)
        canonical = os.readlink(f"/proc/self/fd/{view.fd}")
        return cls(view, f"worktree:{canonical}", canonical, None)

    @classmethod
    def capsule(cls, view: RootView, capsule_id: str, state: Any) -> LiveTarget:
        """A capsule's view.  It lives in the helper's mount namespace: reachable through
        the descriptor, but not by any path git could resolve, so capsules get
        ``capsule_fingerprint`` instead of git's."""
        return cls(view, f"capsule:{capsule_id}", "", capsule_id, state)

    def fingerprint(self) -> Fingerprint:
        """The live fingerprint of this target (blocking: call from a worker thread)."""
        if self.capsule_id:
            return capsule_fingerprint(self.view, self.state, self.capsule_id)
        return fp_mod.compute(self.git_root)

    def close(self) -> None:
        """Close the view."""
        self.view.close()


@dataclass(frozen=True)
class Leased:
    """A live target's answer: the payload, under ``lease_id`` at ``fingerprint``."""

    payload: dict[str, Any]
    lease_id: str
    fingerprint: Fingerprint
    capsule_id: str | None


@dataclass(frozen=True)
class Immutable:
    """A snapshot's answer: the payload, of snapshot ``snapshot_id``."""

    payload: dict[str, Any]
    snapshot_id: str


def leased(payload: dict[str, Any], target: LiveTarget, lease_id: str, fp: Fingerprint) -> Leased:
    """The payload as ``target``'s answer under ``lease_id``."""
    return Leased(payload, lease_id, fp, target.capsule_id)


def begin_live(stores: Stores, target: LiveTarget, lease_id: str | None) -> tuple[str, Fingerprint]:
    """Fingerprint the target and validate (or issue) the lease."""
    live = target.fingerprint()
    lease = stores.leases.acquire(lease_id, target.key, live)
    return lease.lease_id, live


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
    """Normalise a list of repo-relative paths (default: the root)."""
    return P.sort_paths(P.normalize(p) for p in (raw or [P.ROOT]))


def live_files(target: LiveTarget, scopes: list[str]) -> list[str]:
    """Files git's ignore rules leave, within the scopes, in byte order.

    In a capsule git cannot run (see ``LiveTarget.capsule``): every file but ``.git`` counts.
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


def encode_content(data: bytes) -> tuple[str, str]:
    """(content, encoding): UTF-8 text as is; binary (a NUL near the start) or other bytes as ``base64:…``."""
    if is_binary(data):
        return "base64:" + base64.b64encode(data).decode("ascii"), "base64"
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode("ascii"), "base64"


# A capsule's change, noted in its journal so its witness replays it:
# ``note(state, capsule_id, view, paths)`` (mcp_server/capsules/notes.py's
# note_tool_changes, which the tools pass in: the capsule service is not beneath this one).
ChangeNote = Callable[[Any, str, RootView, list[str]], None]
