"""Snapshots persisted in the state database: the manifest (``mcp_server.core.manifest``)
of each, one row per file; their blobs live in the blob store (``mcp_server.fs.blobstore``)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

from mcp_server.core.canonical import canonical_json
from mcp_server.core.manifest import Entry, Snapshot, manifest_bytes, snapshot_id
from mcp_server.core.paths import path_key
from sandbox.errors import CcwError

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
                "INSERT OR IGNORE INTO snapshots (snapshot_id, fingerprint, files, bytes, created) "
                "VALUES (?, ?, ?, ?, ?)",
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
        rows = self.state.execute("SELECT snapshot_id, files, bytes, created FROM snapshots "
                                  "ORDER BY created, snapshot_id")
        return [dict(r) for r in rows]

    def live_blobs(self) -> set[str]:
        """Every blob some snapshot names (the live set for BlobStore.gc)."""
        return {r[0] for r in self.state.execute("SELECT DISTINCT blob FROM snapshot_entries")}
