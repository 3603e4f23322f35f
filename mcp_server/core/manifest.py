"""Snapshot manifests and ids (seed 000 §2.4).

A manifest is ``{"entries": [{"path", "blob"}, …]}`` in canonical JSON with entries in
byte order of path; ``snapshot_id = "sha256:" + sha256(canonical_fingerprint_json + "\\n"
+ manifest_bytes)``.  The manifest names content only: file modes and kinds are kept
beside it (the snapshot tables) and do not change the id, just as seed 000 defines it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mcp_server.core.canonical import canonical_json
from mcp_server.core.paths import path_key
from sandbox.errors import CcwError


def manifest_entries(files: Mapping[str, str] | Iterable[tuple[str, str]]) -> list[dict[str, str]]:
    """``[{"path", "blob"}]`` sorted by path bytes; duplicate paths are an error."""
    pairs = list(files.items()) if isinstance(files, Mapping) else list(files)
    pairs.sort(key=lambda item: path_key(item[0]))
    for before, after in itertools.pairwise(pairs):
        if before[0] == after[0]:
            raise ValueError(f"manifest names {before[0]!r} twice")
    return [{"path": path, "blob": blob} for path, blob in pairs]


def manifest_bytes(files: Mapping[str, str] | Iterable[tuple[str, str]]) -> bytes:
    """The canonical manifest bytes."""
    return canonical_json({"entries": manifest_entries(files)})


def snapshot_id(fingerprint: Mapping[str, Any], manifest: bytes) -> str:
    """``sha256:<hex>`` of the canonical fingerprint, a newline and the manifest bytes."""
    digest = hashlib.sha256(canonical_json(dict(fingerprint)) + b"\n" + manifest)
    return "sha256:" + digest.hexdigest()


@dataclass(frozen=True)
class Entry:
    """One captured file: content blob, size in bytes, git-style mode."""

    path: str
    blob: str
    size: int
    mode: int = 0o100644


@dataclass(frozen=True)
class Snapshot:
    """A stored snapshot: id, the fingerprint it was taken at, entries in path order."""

    snapshot_id: str
    fingerprint: dict[str, str]
    entries: tuple[Entry, ...]
    created: float

    def by_path(self) -> dict[str, Entry]:
        """Entries keyed by path."""
        return {e.path: e for e in self.entries}

    @property
    def total_bytes(self) -> int:
        """Sum of the entries' sizes."""
        return sum(e.size for e in self.entries)


_DDL = """
CREATE TABLE IF NOT EXISTS snapshots (
    snapshot_id TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    files INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS snapshot_entries (
    snapshot_id TEXT NOT NULL REFERENCES snapshots(snapshot_id) ON DELETE CASCADE,
    path TEXT NOT NULL,
    blob TEXT NOT NULL,
    size INTEGER NOT NULL,
    mode INTEGER NOT NULL,
    PRIMARY KEY (snapshot_id, path)
);
"""


class SnapshotStore:
    """Snapshots persisted in the state database (their blobs live in the BlobStore)."""

    def __init__(self, state: Any) -> None:
        self.state = state
        state.ensure_schema("snapshots", _DDL)

    def save(self, fingerprint: Mapping[str, str], entries: Iterable[Entry]) -> Snapshot:
        """Record a snapshot (idempotent: the same content gives the same id)."""
        ordered = sorted(entries, key=lambda e: path_key(e.path))
        manifest = manifest_bytes((e.path, e.blob) for e in ordered)
        sid = snapshot_id(fingerprint, manifest)
        now = time.time()
        with self.state.transaction() as db:
            cur = db.execute(
                "INSERT OR IGNORE INTO snapshots (snapshot_id, fingerprint, files, bytes, created) VALUES (?, ?, ?, ?, ?)",
                (sid, canonical_json(dict(fingerprint)).decode(), len(ordered), sum(e.size for e in ordered), now),
            )
            if cur.rowcount:
                db.executemany(
                    "INSERT INTO snapshot_entries (snapshot_id, path, blob, size, mode) VALUES (?, ?, ?, ?, ?)",
                    [(sid, e.path, e.blob, e.size, e.mode) for e in ordered],
                )
        return self.load(sid)

    def load(self, sid: str) -> Snapshot:
        """A stored snapshot, or NOT_FOUND."""
        rows = self.state.execute("SELECT fingerprint, created FROM snapshots WHERE snapshot_id = ?", (sid,))
        if not rows:
            raise CcwError(
                "NOT_FOUND",
                f"snapshot {sid} is unknown; create one with snapshot_create",
                {"snapshot_id": sid},
            )
        entries = self.state.execute(
            "SELECT path, blob, size, mode FROM snapshot_entries WHERE snapshot_id = ?", (sid,)
        )
        ordered = sorted(
            (Entry(r["path"], r["blob"], r["size"], r["mode"]) for r in entries), key=lambda e: path_key(e.path)
        )
        return Snapshot(sid, json.loads(rows[0]["fingerprint"]), tuple(ordered), rows[0]["created"])

    def list(self) -> list[dict[str, Any]]:
        """Every snapshot's id, file count, bytes and creation time, oldest first."""
        rows = self.state.execute("SELECT snapshot_id, files, bytes, created FROM snapshots ORDER BY created, snapshot_id")
        return [dict(r) for r in rows]

    def live_blobs(self) -> set[str]:
        """Every blob some snapshot names (the live set for BlobStore.gc)."""
        return {r[0] for r in self.state.execute("SELECT DISTINCT blob FROM snapshot_entries")}
