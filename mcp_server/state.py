"""The front end's state directory: one SQLite database (WAL) and the content stores.

Layout under ``CCW_STATE_DIR``::

    ccw.sqlite3     capsules, exec journal, leases, snapshots, policies, witnesses
    objects/        content-addressed blobs (zstd), see fs/blobstore
    witnesses/      witness archives
    helper/         the embedded helper's own state (capsule upper/work dirs)

Each tool family declares its tables with ``ensure_schema``; statements run under one
lock because the trio thread and worker threads share the connection.

Faults, and what happens:

- **A corrupt database** (a damaged page, a file that is not SQLite at all): found at
  open by ``PRAGMA quick_check`` (it reads every page; the metadata database is small).
  ccw-mcp does not refuse to start: it moves the damaged file and its ``-wal``/``-shm``
  aside to ``ccw.sqlite3.corrupt-<UTC timestamp>``, logs ``mcp:state-corrupt …`` on
  stderr naming both files, and starts with an empty database.  What lives only in the
  database is lost then: capsule records and their exec journals (the capsules' files
  are still in ``helper/capsules/`` but the front end no longer knows them), leases,
  snapshot and policy records, the witness index.  Blobs, witness archives and the
  workspace are untouched; the moved-aside file can be salvaged with
  ``sqlite3 ccw.sqlite3.corrupt-… .recover``.  A corruption met while serving is
  answered with an INTERNAL error that says to restart ccw-mcp (``storage_error``).
- **A full disk**: SQLite's SQLITE_FULL and ENOSPC/EDQUOT from any write under the state
  dir become a TOO_LARGE error that names the state dir and says what to free
  (``storage_error``); the transaction is rolled back, so the database stays intact and
  every tool works again once space is freed.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from mcp_server.logs import LOGGER
from mcp_server.statedir import make_state_dir
from sandbox.errors import CcwError, wrap_oserror

DB_NAME = "ccw.sqlite3"


class State:
    """Handle on the state directory."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        make_state_dir(self.root)
        with wrap_oserror("create state dir", str(self.root), "set CCW_STATE_DIR to a writable directory"):
            for sub in ("objects", "witnesses", "tmp"):
                (self.root / sub).mkdir(exist_ok=True, mode=0o700)
        self._lock = threading.RLock()
        self.corrupt_copy: Path | None = None  # where a corrupt database was moved at open
        try:
            self._db = self._open()
        except sqlite3.DatabaseError as exc:
            self.corrupt_copy = self._move_aside(exc)
            self._db = self._open()
        self._schemas: set[str] = set()

    @property
    def db_path(self) -> Path:
        """The SQLite database file."""
        return self.root / DB_NAME

    def _open(self) -> sqlite3.Connection:
        self._make_private()
        db = sqlite3.connect(self.db_path, check_same_thread=False, isolation_level=None, timeout=30)
        try:
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA journal_mode=WAL")
            problems = [row[0] for row in db.execute("PRAGMA quick_check(5)").fetchall()]
            if problems != ["ok"]:
                raise sqlite3.DatabaseError("; ".join(str(p) for p in problems))
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA foreign_keys=ON")
            db.execute("CREATE TABLE IF NOT EXISTS schema_versions (name TEXT PRIMARY KEY, ddl TEXT NOT NULL)")
        except BaseException:
            db.close()
            raise
        return db

    def _make_private(self) -> None:
        """The database and its -wal and -shm 0600, whatever the umask: SQLite makes a new
        database 0644 less the umask, and gives its -wal and -shm the database's own mode,
        so the database is made here first; files an older ccw left 0644 are tightened."""
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        with wrap_oserror("create the database", str(self.db_path), "check the state dir's permissions"):
            for suffix in ("", "-wal", "-shm"):
                try:
                    fd = os.open(f"{self.db_path}{suffix}", flags | (os.O_CREAT if suffix == "" else 0), 0o600)
                except FileNotFoundError:
                    continue
                try:
                    if os.fstat(fd).st_mode & 0o077:
                        os.fchmod(fd, 0o600)
                finally:
                    os.close(fd)

    def _move_aside(self, exc: sqlite3.DatabaseError) -> Path:
        # Loud on purpose: this loses the capsule journals (see the module docstring).
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
        aside = self.root / f"{DB_NAME}.corrupt-{stamp}"
        with wrap_oserror("move the corrupt database aside", str(self.db_path), "move or delete it by hand"):
            for suffix in ("", "-wal", "-shm"):
                if os.path.exists(f"{self.db_path}{suffix}"):
                    os.replace(f"{self.db_path}{suffix}", f"{aside}{suffix}")
        LOGGER.error(
            f"mcp:state-corrupt {self.db_path} is damaged ({exc}); moved it to {aside} and started "
            "with an empty database: capsule records, exec journals, leases, snapshot and policy "
            f"records are lost (blobs, witness files and capsule dirs are kept); salvage with "
            f"`sqlite3 {aside} .recover`"
        )
        return aside

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

    def add_columns(
        self, columns: dict[str, dict[str, str]], backfill: Callable[[sqlite3.Connection], None] | None = None
    ) -> list[str]:
        """Give existing tables the columns they lack; returns the ``table.column`` names added.

        ``CREATE TABLE IF NOT EXISTS`` leaves a table made by an older ccw as it was, so a
        family that grows a column lists it here too (``columns``: table -> name ->
        declaration, e.g. ``"INTEGER NOT NULL DEFAULT 0"``).  The check, every ``ALTER
        TABLE`` and ``backfill`` (run only when something was added) share one
        transaction, so two processes opening the same old state dir add each column
        once and never see it half filled.  Once per process.
        """
        key = "columns:" + ";".join(f"{t}.{c}" for t in sorted(columns) for c in sorted(columns[t]))
        if key in self._schemas:
            return []
        added: list[str] = []
        with self.transaction() as db:
            for table, wanted in columns.items():
                present = {row["name"] for row in db.execute(f"PRAGMA table_info({table})")}
                for name, declaration in wanted.items():
                    if name not in present:
                        db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {declaration}")
                        added.append(f"{table}.{name}")
            if added and backfill is not None:
                backfill(db)
        self._schemas.add(key)
        return added

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
            try:
                self._db.execute("COMMIT")
            except sqlite3.Error:
                # SQLite may or may not have rolled back already (SQLITE_FULL, IOERR):
                # make sure no transaction stays open on the shared connection.
                if self._db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                raise

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()


SQLITE_FULL = 13
SQLITE_CORRUPT = 11
SQLITE_NOTADB = 26


def storage_error(exc: BaseException, state_dir: str | Path) -> CcwError | None:
    """The CcwError for a full disk or a corrupt database under the state dir, else None.

    Tools let these through as plain OSError / sqlite3 errors; the server turns them into
    errors that tell the agent what to do instead of "failed unexpectedly".
    """
    code = getattr(exc, "sqlite_errorcode", None)
    full = (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)) or (
        isinstance(exc, sqlite3.Error) and code is not None and code & 0xFF == SQLITE_FULL
    )
    if full:
        return CcwError(
            "TOO_LARGE",
            f"no space left on the device ({exc}); the request did not complete. ccw keeps its state "
            f"in {state_dir}: free space there (capsule_destroy capsules you no longer need, delete old "
            "witness files) or set CCW_STATE_DIR to a larger filesystem, then retry",
            {"state_dir": str(state_dir), "errno": "ENOSPC"},
        )
    if isinstance(exc, sqlite3.DatabaseError) and code is not None and code & 0xFF in (SQLITE_CORRUPT, SQLITE_NOTADB):
        return CcwError(
            "INTERNAL",
            f"ccw's state database {Path(state_dir) / DB_NAME} is corrupt ({exc}); restart ccw-mcp: "
            "it moves the damaged file aside and starts with an empty one (capsule journals are lost)",
            {"state_dir": str(state_dir)},
        )
    return None
