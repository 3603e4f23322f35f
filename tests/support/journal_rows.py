"""Rows for a journal written by hand: a capsule's record and one exec's entry, for the
tests of what reads the journal back (events, ``ccw ui``'s server and page); and the
journal's tables as its first release made them, for the tests of their migration.
"""

from __future__ import annotations

from typing import Any

from mcp_server.journal_records import CapsuleRecord
from sandbox.spec import CapsuleSpec


def capsule_record(capsule_id: str = "cap_1") -> CapsuleRecord:
    """A live capsule's record, as the journal keeps it (workspace /ws)."""
    return CapsuleRecord(capsule_id=capsule_id, spec=CapsuleSpec(workspace="/ws", expose=("/opt/py",)),
                         parent=None, created_at="", clock="", isolation={}, mount="", base_fingerprint=None,
                         destroyed_at=None)


def exec_entry(touched: dict[str, Any], exit_code: int = 0) -> dict[str, Any]:
    """One exec's journal entry (``pytest -q`` in /ws) with what it touched."""
    return {"started_at": "", "argv": ["pytest", "-q"], "cwd": "/ws", "env_keys": [], "stdin_blake3": None,
            "stdin_b64": None, "timeout_ms": 1000, "exit_code": exit_code, "signal": None, "timed_out": 0,
            "oom_killed": 0, "stdout_blake3": "b", "stderr_blake3": "b", "stdout_bytes": 0, "stderr_bytes": 0,
            "duration_ms": 12, "usage": {"cpu_ms": 7, "rss_max_kb": 900}, "touched": touched}


# The journal tables as ccw made them before change generations existed.
FIRST_RELEASE_TABLES = """
CREATE TABLE capsules (capsule_id TEXT PRIMARY KEY, workspace TEXT NOT NULL, base TEXT NOT NULL, parent TEXT,
    created_at TEXT NOT NULL, clock TEXT NOT NULL, clock_offset_sec INTEGER NOT NULL, env_whitelist TEXT NOT NULL,
    limits TEXT NOT NULL, network TEXT NOT NULL, isolation TEXT NOT NULL, mount TEXT NOT NULL,
    base_fingerprint TEXT, destroyed_at TEXT);
CREATE TABLE execs (capsule_id TEXT NOT NULL REFERENCES capsules(capsule_id), seq INTEGER NOT NULL,
    started_at TEXT NOT NULL, argv TEXT NOT NULL, cwd TEXT NOT NULL, env_keys TEXT NOT NULL, stdin_blake3 TEXT,
    stdin_b64 TEXT, timeout_ms INTEGER NOT NULL, exit_code INTEGER, signal TEXT, timed_out INTEGER NOT NULL,
    oom_killed INTEGER NOT NULL, stdout_blake3 TEXT NOT NULL, stderr_blake3 TEXT NOT NULL,
    stdout_bytes INTEGER NOT NULL, stderr_bytes INTEGER NOT NULL, duration_ms INTEGER NOT NULL,
    usage TEXT NOT NULL, touched TEXT NOT NULL, PRIMARY KEY (capsule_id, seq));
CREATE TABLE writes (capsule_id TEXT NOT NULL REFERENCES capsules(capsule_id), seq INTEGER NOT NULL,
    path TEXT NOT NULL, action TEXT NOT NULL, content_b64 TEXT, target TEXT, mode INTEGER,
    PRIMARY KEY (capsule_id, seq));
"""
