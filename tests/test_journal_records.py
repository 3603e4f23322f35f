"""The journal's record codec (mcp_server/journal_records.py): a capsule's record and an
exec's entry become rows and come back equal, and the rows' JSON text is canonical."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mcp_server.core.netrules import parse_network
from mcp_server.journal_records import (
    CapsuleRecord,
    capsule_record,
    capsule_row,
    exec_entry,
    exec_row,
    helper_network,
    network_column,
    network_from_column,
)
from sandbox.spec import CapsuleSpec, Limits

ALLOWLIST = parse_network({"allow": ["pypi.org:443"], "max_connections": 4})


def _record(spec: CapsuleSpec, **changes: Any) -> CapsuleRecord:
    fields: dict[str, Any] = {
        "capsule_id": "cap_1", "spec": spec, "parent": "cap_0", "created_at": "2026-01-01T00:00:00Z",
        "clock": "real", "isolation": {"user": "root", "net": True}, "mount": "overlay",
        "base_fingerprint": {"head": "abc"}, "destroyed_at": None, **changes}
    return CapsuleRecord(**fields)


@pytest.mark.parametrize("record", [
    _record(CapsuleSpec(workspace="/ws")),
    _record(CapsuleSpec(workspace="/ws", given_base="/snapshots/s1", clock_offset_sec=-60,
                        env_whitelist=("HOME", "LANG"),
                        limits=Limits(memory_mb=512, pids_max=64), network="egress", expose=("/opt/py",),
                        gitdirs=("/repo/.git",)),
            generation=7, network_spec=ALLOWLIST, volatile=("*.log",), destroyed_at="2026-01-02T00:00:00Z",
            base_fingerprint=None),
], ids=["plain", "every-field"])
def test_a_capsule_record_comes_back_from_its_row(record: CapsuleRecord) -> None:
    row = capsule_row(record)
    assert capsule_record(row) == record


def test_a_capsule_on_its_own_workspace_is_read_back_without_a_base() -> None:
    row = capsule_row(_record(CapsuleSpec(workspace="/ws")))
    assert row["base"] == "/ws"  # the column predates CapsuleSpec: it always names a directory
    assert capsule_record(row).spec.given_base is None


def test_capsule_rows_hold_canonical_json() -> None:
    row = capsule_row(_record(CapsuleSpec(workspace="/ws", limits=Limits(pids_max=8, memory_mb=64))))
    assert row["isolation"] == '{"net": true, "user": "root"}'
    assert row["limits"] == '{"memory_mb": 64, "pids_max": 8}'
    assert (row["volatile"], row["expose"], row["gitdirs"]) == (None, None, None)  # empty: no text at all


def test_the_network_column_and_what_the_helper_is_told() -> None:
    assert network_column(None) == "none" and network_from_column("none") is None
    assert network_from_column(network_column(ALLOWLIST)) == ALLOWLIST
    assert json.loads(network_column(ALLOWLIST)) == ALLOWLIST.to_json()  # type: ignore[union-attr]
    assert (helper_network(None), helper_network(ALLOWLIST)) == ("none", "egress")


def _entry() -> dict[str, Any]:
    return {"capsule_id": "cap_1", "seq": 3, "started_at": "", "argv": ["pytest", "-q"], "cwd": "/ws",
            "env_keys": ["LANG"], "stdin_blake3": None, "stdin_b64": None, "timeout_ms": 1000, "exit_code": 1,
            "signal": None, "timed_out": False, "oom_killed": True, "stdout_blake3": "b", "stderr_blake3": "b",
            "stdout_bytes": 2, "stderr_bytes": 0, "duration_ms": 12, "usage": {"rss_max_kb": 9, "cpu_ms": 7},
            "touched": {"written": ["a.py"], "read": None}, "generation": 2, "generation_out": 3,
            "written_mtimes": {"a.py": 17}, "terminal": False}


def test_an_exec_entry_comes_back_from_its_row() -> None:
    row = exec_row(_entry())
    assert row["usage"] == '{"cpu_ms": 7, "rss_max_kb": 9}' and row["written_mtimes"] == '{"a.py": 17}'
    # SQLite keeps booleans as integers
    stored = {**row, "timed_out": 0, "oom_killed": 1, "terminal": 0}
    assert exec_entry(stored) == _entry()


def test_an_exec_row_without_optional_columns() -> None:
    entry = {key: value for key, value in _entry().items() if key not in ("written_mtimes", "terminal")}
    row = exec_row(entry)
    assert "written_mtimes" not in row and "terminal" not in row  # the columns' defaults apply
    back = exec_entry({**row, "written_mtimes": None, "terminal": None})
    assert back["written_mtimes"] is None and back["terminal"] is False
