"""Leases (seed 000 §2.3): a worktree read's promise, checked against the live fingerprint.

- A lease records the target it was issued for (a worktree root, or ``capsule:<id>``),
  the fingerprint at issue, and the set of paths the holder has touched.
- Every worktree request that names a lease validates it: a different live fingerprint
  is STALE_LEASE carrying the live fingerprint in ``details`` (and the lease's own, as
  ``lease_fingerprint``).  Nothing is refreshed automatically; the client reads again.
- A mutator that the lease holder itself performs (apply_patch, write_file, delete)
  moves the lease onto the fingerprint that results, so the holder may keep going;
  anyone else's change still makes the lease stale.
- Leases live in the state dir's SQLite database and expire after ``ttl`` seconds
  without use (idle TTL); an expired or unknown lease is NOT_FOUND.
- Touched paths are stored one row per call (a JSON list: a grep over ten thousand
  files is one insert, not ten thousand); ``touched()`` returns their union in byte order.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from mcp_server.core.canonical import canonical_text
from mcp_server.core.fingerprint import Fingerprint
from mcp_server.core.paths import path_key
from sandbox.errors import CcwError

DEFAULT_TTL = 3600.0

_DDL = """
CREATE TABLE IF NOT EXISTS leases (
    lease_id TEXT PRIMARY KEY,
    target TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    created REAL NOT NULL,
    last_used REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS lease_touches (
    lease_id TEXT NOT NULL REFERENCES leases(lease_id) ON DELETE CASCADE,
    paths TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS lease_touches_by_lease ON lease_touches (lease_id);
"""


@dataclass(frozen=True)
class Lease:
    """One lease as stored."""

    lease_id: str
    target: str
    fingerprint: Fingerprint


class LeaseStore:
    """Leases persisted in the state database."""

    def __init__(self, state: Any, ttl: float = DEFAULT_TTL, clock: Callable[[], float] = time.time) -> None:
        self.state = state
        self.ttl = ttl
        self.clock = clock
        state.ensure_schema("leases", _DDL)

    def issue(self, target: str, fingerprint: Fingerprint) -> Lease:
        """A new lease on ``target`` at ``fingerprint``."""
        self.expire()
        lease_id = "lease_" + secrets.token_hex(12)
        now = self.clock()
        self.state.execute(
            "INSERT INTO leases (lease_id, target, fingerprint, created, last_used) VALUES (?, ?, ?, ?, ?)",
            (lease_id, target, canonical_text(fingerprint.to_dict()), now, now),
        )
        return Lease(lease_id, target, fingerprint)

    def get(self, lease_id: str, target: str) -> Lease:
        """The lease, if it exists, is unexpired and belongs to ``target``; else NOT_FOUND."""
        rows = self.state.execute(
            "SELECT target, fingerprint, last_used FROM leases WHERE lease_id = ?", (lease_id,)
        )
        if not rows or rows[0]["last_used"] + self.ttl < self.clock():
            raise CcwError(
                "NOT_FOUND",
                f"lease {lease_id!r} is unknown or expired (idle longer than {int(self.ttl)} s); "
                "read again without lease_id to get a new lease",
                {"lease_id": lease_id},
            )
        if rows[0]["target"] != target:
            raise CcwError(
                "INVALID_ARGUMENT",
                f"lease {lease_id!r} was issued for another target ({rows[0]['target']}); "
                "use a lease issued for this workspace or capsule",
                {"lease_id": lease_id},
            )
        return Lease(lease_id, target, Fingerprint.from_dict(json.loads(rows[0]["fingerprint"])))

    def validate(self, lease_id: str, target: str, live: Fingerprint) -> Lease:
        """The lease, if its fingerprint equals the live one; else STALE_LEASE."""
        lease = self.get(lease_id, target)
        if lease.fingerprint != live:
            raise CcwError(
                "STALE_LEASE",
                "the worktree changed since this lease was issued; read again without lease_id "
                "(or with a fresh lease) and retry",
                {
                    "fingerprint": live.to_dict(),
                    "lease_fingerprint": lease.fingerprint.to_dict(),
                    "lease_id": lease_id,
                },
            )
        self.state.execute("UPDATE leases SET last_used = ? WHERE lease_id = ?", (self.clock(), lease_id))
        return lease

    def acquire(self, lease_id: str | None, target: str, live: Fingerprint) -> Lease:
        """Validate ``lease_id`` when given, else issue a new lease (§2.3 issuance)."""
        if lease_id:
            return self.validate(lease_id, target, live)
        return self.issue(target, live)

    def rebase(self, lease_id: str, fingerprint: Fingerprint) -> None:
        """Move a lease onto the fingerprint its holder's own write produced."""
        self.state.execute(
            "UPDATE leases SET fingerprint = ?, last_used = ? WHERE lease_id = ?",
            (canonical_text(fingerprint.to_dict()), self.clock(), lease_id),
        )

    def touch(self, lease_id: str, paths: Iterable[str]) -> None:
        """Add paths to the lease's touched set."""
        batch = sorted(set(paths), key=path_key)
        if batch:
            self.state.execute(
                "INSERT INTO lease_touches (lease_id, paths) VALUES (?, ?)", (lease_id, json.dumps(batch))
            )

    def touched(self, lease_id: str) -> list[str]:
        """The touched set, in byte order."""
        rows = self.state.execute("SELECT paths FROM lease_touches WHERE lease_id = ?", (lease_id,))
        union: set[str] = set()
        for row in rows:
            union.update(json.loads(row["paths"]))
        return sorted(union, key=path_key)

    def expire(self) -> int:
        """Delete leases idle longer than the TTL; return how many."""
        cutoff = self.clock() - self.ttl
        with self.state.transaction() as db:
            ids = [r[0] for r in db.execute("SELECT lease_id FROM leases WHERE last_used < ?", (cutoff,))]
            for lease_id in ids:
                db.execute("DELETE FROM lease_touches WHERE lease_id = ?", (lease_id,))
                db.execute("DELETE FROM leases WHERE lease_id = ?", (lease_id,))
        return len(ids)
