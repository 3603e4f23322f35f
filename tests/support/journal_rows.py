"""Rows for a journal written by hand: a capsule's record and one exec's entry, for the
tests of what reads the journal back (events, ``ccw ui``'s server and page).
"""

from __future__ import annotations

from typing import Any

from mcp_server.journal import CapsuleRecord
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
