"""The journal's tables, and how a state dir made by an older ccw is brought up to them.

``capsules`` holds one row per capsule; ``execs`` and ``writes`` one per exec and per
file-tool change (one sequence numbers both, within a capsule); ``exec_outputs`` what each
exec printed, and ``capsule_base`` what the base held at each path a capsule changed.  A
merge's changes, thousands at once, are one ``write_batches`` row (numbered as that many
``writes`` rows, which ``Journal.writes`` gives back) and one ``capsule_base_batches`` row.

``CREATE TABLE IF NOT EXISTS`` leaves a table made by an older ccw as it was, so a column
added since the first release is listed in ``_ADDED_COLUMNS`` too, and ``State.add_columns``
adds it at first open.  Generations came later than the rows they describe: a journal
written before them gets them replayed from its own order (``_backfill``), by the rule
the journal follows as it writes (``core.generations.exec_advances``).  ``_TABLES`` is kept
as it is: ``State.ensure_schema`` records its text in ``schema_versions``.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from mcp_server.core.generations import exec_advances
from mcp_server.state import State

_TABLES = """
CREATE TABLE IF NOT EXISTS capsules (
    capsule_id TEXT PRIMARY KEY,
    workspace TEXT NOT NULL,
    base TEXT NOT NULL,
    parent TEXT,
    created_at TEXT NOT NULL,
    clock TEXT NOT NULL,
    clock_offset_sec INTEGER NOT NULL,
    env_whitelist TEXT NOT NULL,
    limits TEXT NOT NULL,
    network TEXT NOT NULL,
    isolation TEXT NOT NULL,
    mount TEXT NOT NULL,
    base_fingerprint TEXT,
    destroyed_at TEXT,
    generation INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS execs (
    capsule_id TEXT NOT NULL REFERENCES capsules(capsule_id),
    seq INTEGER NOT NULL,
    started_at TEXT NOT NULL,
    argv TEXT NOT NULL,
    cwd TEXT NOT NULL,
    env_keys TEXT NOT NULL,
    stdin_blake3 TEXT,
    stdin_b64 TEXT,
    timeout_ms INTEGER NOT NULL,
    exit_code INTEGER,
    signal TEXT,
    timed_out INTEGER NOT NULL,
    oom_killed INTEGER NOT NULL,
    stdout_blake3 TEXT NOT NULL,
    stderr_blake3 TEXT NOT NULL,
    stdout_bytes INTEGER NOT NULL,
    stderr_bytes INTEGER NOT NULL,
    duration_ms INTEGER NOT NULL,
    usage TEXT NOT NULL,
    touched TEXT NOT NULL,
    generation INTEGER,
    generation_out INTEGER,
    written_mtimes TEXT,
    PRIMARY KEY (capsule_id, seq)
);
CREATE TABLE IF NOT EXISTS writes (
    capsule_id TEXT NOT NULL REFERENCES capsules(capsule_id),
    seq INTEGER NOT NULL,
    path TEXT NOT NULL,
    action TEXT NOT NULL,
    content_b64 TEXT,
    target TEXT,
    mode INTEGER,
    generation INTEGER,
    PRIMARY KEY (capsule_id, seq)
);
CREATE TABLE IF NOT EXISTS exec_outputs (
    capsule_id TEXT NOT NULL REFERENCES capsules(capsule_id),
    seq INTEGER NOT NULL,
    stream TEXT NOT NULL,
    zstd BLOB NOT NULL,
    kept_bytes INTEGER NOT NULL,
    cap INTEGER NOT NULL,
    PRIMARY KEY (capsule_id, seq, stream)
);
CREATE TABLE IF NOT EXISTS capsule_base (
    capsule_id TEXT NOT NULL REFERENCES capsules(capsule_id),
    path TEXT NOT NULL,
    state TEXT NOT NULL,
    PRIMARY KEY (capsule_id, path)
);
CREATE TABLE IF NOT EXISTS write_batches (
    capsule_id TEXT NOT NULL REFERENCES capsules(capsule_id),
    seq INTEGER NOT NULL,
    count INTEGER NOT NULL,
    generation INTEGER NOT NULL,
    step INTEGER NOT NULL,
    rows TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (capsule_id, seq)
);
CREATE TABLE IF NOT EXISTS capsule_base_batches (
    capsule_id TEXT NOT NULL PRIMARY KEY REFERENCES capsules(capsule_id),
    states TEXT NOT NULL
);
"""
# An exec the helper was given and whose row is not written yet, as its row would be if its end never
# came (Journal.mark_running): a front end killed meanwhile leaves it, and the next one journals it.
_RUNNING = """
CREATE TABLE IF NOT EXISTS execs_running (
    capsule_id TEXT NOT NULL,
    started_at TEXT NOT NULL,
    entry TEXT NOT NULL,
    PRIMARY KEY (capsule_id, started_at)
);
"""
# Columns added since the first release, for state dirs made before them.
_ADDED_COLUMNS = {
    "capsules": {"generation": "INTEGER NOT NULL DEFAULT 0", "volatile": "TEXT", "expose": "TEXT",
                 "gitdirs": "TEXT", "merged_from": "TEXT"},
    "execs": {"generation": "INTEGER", "generation_out": "INTEGER", "written_mtimes": "TEXT", "console": "TEXT",
              "terminal": "INTEGER NOT NULL DEFAULT 0", "service": "TEXT", "services": "TEXT"},
    "writes": {"generation": "INTEGER", "mtime_ns": "INTEGER"},
}


def _backfill(db: sqlite3.Connection) -> None:
    """Generations for a journal written before they existed, replayed in seq order."""
    steps: dict[str, list[tuple[int, str, Any]]] = {}
    for row in db.execute("SELECT capsule_id, seq, touched FROM execs"):
        steps.setdefault(row["capsule_id"], []).append((row["seq"], "exec", json.loads(row["touched"])))
    for row in db.execute("SELECT capsule_id, seq FROM writes"):
        steps.setdefault(row["capsule_id"], []).append((row["seq"], "write", None))
    for capsule_id, ordered in steps.items():
        generation = 0
        for seq, kind, touched in sorted(ordered, key=lambda step: step[0]):
            if kind == "write":
                generation += 1
                db.execute("UPDATE writes SET generation = ? WHERE capsule_id = ? AND seq = ?",
                           (generation, capsule_id, seq))
                continue
            started = generation
            if exec_advances(touched):
                generation += 1
            db.execute("UPDATE execs SET generation = ?, generation_out = ? WHERE capsule_id = ? AND seq = ?",
                       (started, generation if generation != started else None, capsule_id, seq))
        db.execute("UPDATE capsules SET generation = ? WHERE capsule_id = ?", (generation, capsule_id))


def ensure(state: State) -> None:
    """Give ``state`` the journal's tables, and an older state dir the columns it lacks."""
    state.ensure_schema("journal", _TABLES)
    state.ensure_schema("journal_running", _RUNNING)
    state.add_columns(_ADDED_COLUMNS, backfill=_backfill)
