"""The front end's state directory: one SQLite database (WAL) and the content stores.

Layout under ``CCW_STATE_DIR``::

    ccw.sqlite3     capsules, exec journal, leases, snapshots, policies, witnesses
    objects/        content-addressed blobs (zstd), see core/blobstore
    witnesses/      witness archives
    helper/         the embedded helper's own state (capsule upper/work dirs)

Each tool family declares its tables with ``ensure_schema``; statements run under one
lock because the trio thread and worker threads share the connection.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from sandbox.errors import wrap_oserror


class State:
    """Handle on the state directory."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        with wrap_oserror("create state dir", str(self.root), "set CCW_STATE_DIR to a writable directory"):
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            for sub in ("objects", "witnesses", "tmp"):
                (self.root / sub).mkdir(exist_ok=True, mode=0o700)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(
            self.root / "ccw.sqlite3", check_same_thread=False, isolation_level=None, timeout=30
        )
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS schema_versions (name TEXT PRIMARY KEY, ddl TEXT NOT NULL)"
        )
        self._schemas: set[str] = set()

    @property
    def objects_dir(self) -> Path:
        """Where content-addressed blobs live."""
        return self.root / "objects"

    @property
    def witnesses_dir(self) -> Path:
        """Where witness archives live."""
        return self.root / "witnesses"

    @property
    def tmp_dir(self) -> Path:
        """Scratch space on the same filesystem as the stores (for atomic renames)."""
        return self.root / "tmp"

    def ensure_schema(self, name: str, ddl: str) -> None:
        """Create a family's tables once per process (``ddl`` uses IF NOT EXISTS)."""
        if name in self._schemas:
            return
        with self._lock:
            self._db.executescript(ddl)
            self._db.execute(
                "INSERT OR REPLACE INTO schema_versions (name, ddl) VALUES (?, ?)", (name, ddl)
            )
            self._schemas.add(name)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        """Run one statement and return all rows."""
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE … COMMIT (ROLLBACK on error), holding the lock throughout."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()
