"""capsules/witness.py, services (issue 36): an exec's entry carries the specs of the services
beside it, a service's own run is an entry marked with its name, and a service whose run is
not journaled yet makes the witness carry the whole base."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mcp_server.capsules.witness import build_manifest
from mcp_server.core.witness_manifest import check
from mcp_server.fs.view import RootView
from mcp_server.journal import Journal
from mcp_server.journal_records import CapsuleRecord
from mcp_server.state import State
from sandbox.spec import CapsuleSpec

WEB = {"name": "web", "argv": ["python3", "server.py"], "cwd": None, "restart": "no", "env": ["PORT"],
       "ready": {"port": 8765, "timeout_ms": 20000}}
TEST = ["python3", "test_app.py"]


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "server.py").write_text("print('serving')\n")
    (ws / "test_app.py").write_text("print('testing')\n")
    (ws / "unused.txt").write_text("nobody opens this\n")
    return ws


def _row(ws: Path, argv: list[str], read: list[str], **extra: Any) -> dict[str, Any]:
    """An exec's journal entry, as capsules/exec.py: journal_entry writes it."""
    return {"started_at": "", "argv": argv, "cwd": str(ws), "env_keys": ["LANG", "PATH"], "stdin_blake3": None,
            "stdin_b64": None, "timeout_ms": 60_000, "exit_code": 0, "signal": None, "timed_out": 0, "oom_killed": 0,
            "stdout_blake3": "blake3:" + "0" * 64, "stderr_blake3": "blake3:" + "0" * 64, "stdout_bytes": 0,
            "stderr_bytes": 0, "duration_ms": 3, "usage": {}, "touched": {"read": read, "written": []}, **extra}


def _journaled(tmp_path: Path, ws: Path, rows: list[dict[str, Any]]) -> tuple[CapsuleRecord, list[dict[str, Any]]]:
    journal = Journal(State(tmp_path / "state"))
    record = CapsuleRecord(capsule_id="cap_1", spec=CapsuleSpec(workspace=str(ws)), parent=None, created_at="",
                           clock="", isolation={}, mount="", base_fingerprint=None, destroyed_at=None)
    journal.add_capsule(record)
    for row in rows:
        journal.add_exec("cap_1", row)
    return record, journal.execs("cap_1")


def _manifest(ws: Path, record: CapsuleRecord, execs: list[dict[str, Any]]) -> dict[str, Any]:
    with RootView.open(str(ws)) as base, RootView.open(str(ws)) as capsule:
        manifest, _ = build_manifest(record, execs, (), base, capsule, True)
    check(manifest)  # what ccw writes, its schema takes
    return manifest


def test_an_exec_carries_its_services_and_a_services_run_is_marked(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    record, execs = _journaled(tmp_path, ws, [
        _row(ws, ["true"], []),
        _row(ws, TEST, ["test_app.py"], services=json.dumps([WEB], sort_keys=True)),
        _row(ws, ["python3", "server.py"], ["server.py"], service="web", timeout_ms=0),  # ended after the exec
    ])
    manifest = _manifest(ws, record, execs)
    plain, beside, run = manifest["execs"]
    assert "services" not in plain and "service" not in plain  # a witness without services stays as before
    assert beside["services"] == [WEB] and "service" not in beside
    assert run["service"] == "web" and run["timeout_ms"] == 0 and "services" not in run
    # The service's reads bring its script: a replay that starts it finds it.
    assert {entry["path"] for entry in manifest["base"]["files"]} == {"server.py", "test_app.py"}
    assert manifest["base"]["read_sets_complete"] is True and manifest["base"]["carried"] == "used"


@pytest.mark.parametrize("earlier", [False, True])
def test_a_service_whose_run_is_not_journaled_yet_makes_the_witness_carry_all(tmp_path: Path, earlier: bool) -> None:
    ws = _workspace(tmp_path)
    rows = [_row(ws, TEST, ["test_app.py"], services=json.dumps([WEB], sort_keys=True))]
    if earlier:  # a run of "web" that ended before this exec is another run: this one still goes on
        rows.insert(0, _row(ws, ["python3", "server.py"], ["server.py"], service="web", timeout_ms=0))
    record, execs = _journaled(tmp_path, ws, rows)
    manifest = _manifest(ws, record, execs)
    assert manifest["base"]["read_sets_complete"] is False and manifest["base"]["carried"] == "all"
    assert {entry["path"] for entry in manifest["base"]["files"]} == {"server.py", "test_app.py", "unused.txt"}
