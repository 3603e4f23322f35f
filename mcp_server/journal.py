"""The capsule journal: every capsule the front end created and every exec run in it.

Witnesses, policies and delta minimisation read it, so it records what is needed to
re-run and to judge a run: argv, cwd, the environment's keys (never its values: they may
be secrets), exit status, blake3 of stdout/stderr, usage and touched sets.  Rows are
append-only; a capsule's execs are numbered from 1 in the order they finished.  stdin is
kept (a replay must feed it again); environment values are not.

``capsule_base`` holds, for each path a capsule changed, what the base held there when
the change was first seen (kind, mode, blake3 or link target, or "absent").

``exec_outputs`` keeps what each exec printed, so a witness can carry it and a replay can
show the lines that differ: the first ``OUTPUT_KEEP_BYTES`` of each stream (the helper's
default capture cap, so normally all it captured), zstd-compressed, with the cap in
force recorded.  It is bounded per exec, and a capsule's rows go when it is destroyed
(a witness can only be made of a live capsule); the hashes in ``execs`` stay.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import zstandard

from mcp_server.state import State

OUTPUT_KEEP_BYTES = 1 << 20  # per stream and exec

_DDL = """
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
    destroyed_at TEXT
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
"""

_JSON_CAPSULE_FIELDS = ("env_whitelist", "limits", "isolation", "base_fingerprint")
_JSON_EXEC_FIELDS = ("argv", "env_keys", "usage", "touched")


@dataclass(frozen=True)
class CapsuleRecord:
    """A capsule as the journal knows it."""

    capsule_id: str
    workspace: str
    base: str
    parent: str | None
    created_at: str
    clock: str
    clock_offset_sec: int
    env_whitelist: list[str]
    limits: dict[str, Any]
    network: str
    isolation: dict[str, Any]
    mount: str
    base_fingerprint: dict[str, Any] | None
    destroyed_at: str | None


class Journal:
    """Reads and appends capsule and exec records in the state database."""

    def __init__(self, state: State) -> None:
        self.state = state
        state.ensure_schema("journal", _DDL)

    def add_capsule(self, record: CapsuleRecord) -> None:
        """Record a new capsule."""
        row = dict(record.__dict__)
        for key in _JSON_CAPSULE_FIELDS:
            row[key] = None if row[key] is None else json.dumps(row[key], sort_keys=True)
        cols = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        self.state.execute(f"INSERT OR REPLACE INTO capsules ({cols}) VALUES ({marks})", list(row.values()))

    def capsule(self, capsule_id: str) -> CapsuleRecord | None:
        """The record of one capsule, or None."""
        rows = self.state.execute("SELECT * FROM capsules WHERE capsule_id = ?", (capsule_id,))
        if not rows:
            return None
        data = dict(rows[0])
        for key in _JSON_CAPSULE_FIELDS:
            data[key] = None if data[key] is None else json.loads(data[key])
        return CapsuleRecord(**data)

    def mark_destroyed(self, capsule_id: str, when: str) -> None:
        """Note that a capsule is gone (its execs stay, for witnesses already made)."""
        with self.state.transaction() as db:
            db.execute("UPDATE capsules SET destroyed_at = ? WHERE capsule_id = ?", (when, capsule_id))
            db.execute("DELETE FROM exec_outputs WHERE capsule_id = ?", (capsule_id,))

    def add_outputs(self, capsule_id: str, seq: int, streams: dict[str, bytes]) -> None:
        """Keep what exec ``seq`` printed (the first OUTPUT_KEEP_BYTES of each stream)."""
        cctx = zstandard.ZstdCompressor(level=3)
        rows = [
            (capsule_id, seq, stream, cctx.compress(data[:OUTPUT_KEEP_BYTES]), min(len(data), OUTPUT_KEEP_BYTES),
             OUTPUT_KEEP_BYTES)
            for stream, data in sorted(streams.items())
        ]
        with self.state.transaction() as db:
            db.executemany("INSERT OR REPLACE INTO exec_outputs VALUES (?, ?, ?, ?, ?, ?)", rows)

    def outputs(self, capsule_id: str) -> dict[tuple[int, str], tuple[bytes, int]]:
        """What each exec printed, as kept: (seq, stream) -> (bytes, cap in force)."""
        rows = self.state.execute("SELECT * FROM exec_outputs WHERE capsule_id = ?", (capsule_id,))
        dctx = zstandard.ZstdDecompressor()
        return {(row["seq"], row["stream"]): (dctx.decompress(row["zstd"]), row["cap"]) for row in rows}

    @staticmethod
    def _last_seq(db: Any, capsule_id: str) -> int:
        # Execs and writes share one sequence: a replay must redo them in this order.
        (last,) = db.execute(
            "SELECT MAX(COALESCE((SELECT MAX(seq) FROM execs WHERE capsule_id = ?), 0),"
            " COALESCE((SELECT MAX(seq) FROM writes WHERE capsule_id = ?), 0))",
            (capsule_id, capsule_id),
        ).fetchone()
        return int(last)

    def add_write(self, capsule_id: str, path: str, action: str, content: bytes | None = None,
                  target: str | None = None, mode: int | None = None) -> int:
        """Record a change made to a capsule by a file tool (not by a command).

        ``action`` is write | delete | symlink | chmod.  Replays redo these between the
        execs, so a witness of a capsule edited by tools still replays.
        """
        import base64

        with self.state.transaction() as db:
            seq = self._last_seq(db, capsule_id) + 1
            db.execute(
                "INSERT INTO writes (capsule_id, seq, path, action, content_b64, target, mode) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (capsule_id, seq, path, action, base64.b64encode(content).decode() if content is not None else None, target, mode),
            )
            return seq

    def writes(self, capsule_id: str) -> list[dict[str, Any]]:
        """Every file-tool change of a capsule, in order."""
        rows = self.state.execute("SELECT * FROM writes WHERE capsule_id = ? ORDER BY seq", (capsule_id,))
        return [dict(row) for row in rows]

    def add_exec(self, capsule_id: str, entry: dict[str, Any]) -> int:
        """Append an exec record; returns its sequence number."""
        with self.state.transaction() as db:
            last = self._last_seq(db, capsule_id)
            row = {"capsule_id": capsule_id, "seq": last + 1, **entry}
            for key in _JSON_EXEC_FIELDS:
                row[key] = json.dumps(row[key], sort_keys=True)
            cols = ", ".join(row)
            marks = ", ".join("?" for _ in row)
            db.execute(f"INSERT INTO execs ({cols}) VALUES ({marks})", list(row.values()))
            return int(last + 1)

    def record_base(self, capsule_id: str, states: dict[str, str]) -> None:
        """Remember what the base held at paths the capsule just changed (first record wins).

        Promotion compares these with the live workspace to detect that it moved
        underneath the capsule (REPO_CHANGED).
        """
        with self.state.transaction() as db:
            db.executemany(
                "INSERT OR IGNORE INTO capsule_base (capsule_id, path, state) VALUES (?, ?, ?)",
                [(capsule_id, path, state) for path, state in sorted(states.items())],
            )

    def base_states(self, capsule_id: str) -> dict[str, str]:
        """Every recorded base state of a capsule, by path."""
        rows = self.state.execute("SELECT path, state FROM capsule_base WHERE capsule_id = ?", (capsule_id,))
        return {row["path"]: row["state"] for row in rows}

    def known_paths(self, capsule_id: str) -> set[str]:
        """Paths with a recorded base state."""
        return set(self.base_states(capsule_id))

    def execs(self, capsule_id: str) -> list[dict[str, Any]]:
        """Every exec of a capsule, in order."""
        rows = self.state.execute("SELECT * FROM execs WHERE capsule_id = ? ORDER BY seq", (capsule_id,))
        out = []
        for row in rows:
            data = dict(row)
            for key in _JSON_EXEC_FIELDS:
                data[key] = json.loads(data[key])
            data["timed_out"] = bool(data["timed_out"])
            data["oom_killed"] = bool(data["oom_killed"])
            out.append(data)
        return out
