"""capsules/witness_rerun.py and its use by capsules/witness.py (issue 36): a witness made while a
service its execs ran beside still runs learns what that service read by running the capsule's
runs again beside it, and carries those files instead of the whole base; a re-run that does not
go as recorded leaves the witness carrying the whole base.  The helper and the services are
faked: the real ones are in vm-tests/test_services_rerun.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import trio

from mcp_server.capsules.service_spec import ServiceSpec, SpecTable
from mcp_server.capsules.witness import build_manifest
from mcp_server.capsules.witness_rerun import services_read
from mcp_server.core.witness_manifest import check
from mcp_server.fs.view import RootView
from mcp_server.journal import CapsuleRecord, Journal
from mcp_server.state import State
from sandbox.ops import ExecRequest
from sandbox.spec import CapsuleSpec
from tests.support.scratch_services import exec_reply

WEB = {"name": "web", "argv": ["python3", "server.py"], "cwd": None, "restart": "no", "env": ["PORT"],
       "ready": {"port": 8765, "timeout_ms": 20000}}
TEST = ["python3", "test_app.py"]
SERVED = ["server.py", "static/page.html"]  # what the faked service reads in the re-run


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "static").mkdir(parents=True)
    (ws / "server.py").write_text("print('serving')\n")
    (ws / "test_app.py").write_text("print('testing')\n")
    (ws / "static" / "page.html").write_text("<p>page</p>\n")
    (ws / "unused.txt").write_text("nobody opens this\n")
    return ws


def _row(ws: Path, argv: list[str], read: list[str], **extra: Any) -> dict[str, Any]:
    """An exec's journal entry, as capsules/exec.py: journal_entry writes it."""
    return {"started_at": "", "argv": argv, "cwd": str(ws), "env_keys": ["LANG", "PATH"], "stdin_blake3": None,
            "stdin_b64": None, "timeout_ms": 60_000, "exit_code": 0, "signal": None, "timed_out": 0, "oom_killed": 0,
            "stdout_blake3": "blake3:" + "0" * 64, "stderr_blake3": "blake3:" + "0" * 64, "stdout_bytes": 0,
            "stderr_bytes": 0, "duration_ms": 3, "usage": {}, "touched": {"read": read, "written": []}, **extra}


def _record(ws: Path, capsule_id: str = "cap_1") -> CapsuleRecord:
    return CapsuleRecord(capsule_id=capsule_id, spec=CapsuleSpec(workspace=str(ws)), parent=None, created_at="",
                         clock="", isolation={}, mount="", base_fingerprint=None, destroyed_at=None)


class _Services:
    """Services as the re-run uses them: a start says whether it got ready, a stop journals the run."""

    def __init__(self, state: State, journal: Journal, ws: Path, ready: bool) -> None:
        self.table, self.journal, self.ws, self.ready = SpecTable(state), journal, ws, ready
        self.running: list[str] = []
        self.started: list[ServiceSpec] = []

    async def start(self, capsules: Any, spec: ServiceSpec) -> dict[str, Any]:
        self.started.append(spec)
        self.running.append(spec.name)
        return {"ready": self.ready}

    async def stop(self, capsule_id: str, name: str) -> dict[str, Any]:
        self.running.remove(name)
        self.journal.add_exec(capsule_id, _row(self.ws, list(self.started[-1].argv), SERVED, service=name))
        return {}


class _Capsules:
    """The capsule service: journaled capsules whose execs exit as ``exit_code`` says."""

    def __init__(self, tmp_path: Path, ws: Path, ready: bool = True, exit_code: int = 0) -> None:
        self.state = State(tmp_path / "state")
        self.journal = Journal(self.state)
        self.services = _Services(self.state, self.journal, ws, ready)
        self.ws, self.exit_code = ws, exit_code
        self.steps: list[tuple[str, Any, list[str]]] = []  # (kind, what, services running)
        self.destroyed: list[str] = []

    async def create(self, spec: CapsuleSpec, network: Any = None) -> CapsuleRecord:
        record = _record(self.ws, "cap_rerun")
        self.journal.add_capsule(record)
        return record

    async def open_root(self, capsule_id: str) -> int:
        self.steps.append(("write", capsule_id, list(self.services.running)))
        return os.open(self.ws, os.O_PATH | os.O_DIRECTORY)

    async def exec(self, request: ExecRequest) -> Any:
        self.steps.append(("exec", list(request.argv), list(self.services.running)))
        return SimpleNamespace(reply=exec_reply(self.exit_code))

    async def destroy(self, capsule_id: str) -> None:
        self.destroyed.append(capsule_id)


def _journaled(capsules: _Capsules, ws: Path) -> tuple[CapsuleRecord, list[dict[str, Any]], list[dict[str, Any]]]:
    """A capsule that wrote a file, ran a setup, ran its test beside "web" (still running), then ran more."""
    journal = capsules.journal
    record = _record(ws)
    journal.add_capsule(record)
    journal.add_write("cap_1", "notes.txt", "write", b"edited\n", None, 0o644)
    journal.add_exec("cap_1", _row(ws, ["true"], []))
    journal.add_exec("cap_1", _row(ws, TEST, ["test_app.py"], services=json.dumps([WEB], sort_keys=True)))
    journal.add_exec("cap_1", _row(ws, ["echo", "after"], []))
    return record, journal.execs("cap_1"), journal.writes("cap_1")


def test_the_rerun_redoes_the_runs_beside_the_services_and_gives_their_rows(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    capsules = _Capsules(tmp_path, ws)
    record, execs, writes = _journaled(capsules, ws)
    rows = trio.run(services_read, capsules, record, execs, writes)
    assert rows is not None and [(r["service"], r["touched"]["read"]) for r in rows] == [("web", SERVED)]
    # In order, the test beside the service, which was started in the re-run's capsule; nothing after
    # the last stretch with services is run again (it changes nothing the service did).
    assert capsules.steps == [("write", "cap_rerun", []), ("exec", ["true"], []), ("exec", TEST, ["web"])]
    assert [(s.capsule_id, s.name) for s in capsules.services.started] == [("cap_rerun", "web")]
    assert capsules.services.running == [] and capsules.destroyed == ["cap_rerun"]
    assert (ws / "notes.txt").read_bytes() == b"edited\n"  # the file tool's write was redone

    # The witness then carries what the test and the service read: not the whole base.
    with RootView.open(str(ws)) as base, RootView.open(str(ws)) as capsule:
        manifest, _ = build_manifest(record, execs, (), base, capsule, True, writes, service_runs=rows)
        without, _ = build_manifest(record, execs, (), base, capsule, True, writes)
    check(manifest)
    carried = {entry["path"] for entry in manifest["base"]["files"]}
    assert {"server.py", "static/page.html", "test_app.py"} <= carried and "unused.txt" not in carried
    assert manifest["base"]["carried"] == "used" and manifest["base"]["read_sets_complete"] is True
    assert [e["seq"] for e in manifest["execs"]] == [e["seq"] for e in execs]  # the re-run's rows are no entries
    assert without["base"]["carried"] == "all" and "unused.txt" in {e["path"] for e in without["base"]["files"]}


def test_a_rerun_that_does_not_go_as_recorded_gives_nothing(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    differs = _Capsules(tmp_path / "differs", ws, exit_code=1)
    record, execs, writes = _journaled(differs, ws)
    assert trio.run(services_read, differs, record, execs, writes) is None
    assert differs.steps[-1] == ("exec", ["true"], [])  # the first exec already ended otherwise
    assert differs.destroyed == ["cap_rerun"]

    unready = _Capsules(tmp_path / "unready", ws, ready=False)
    record, execs, writes = _journaled(unready, ws)
    assert trio.run(services_read, unready, record, execs, writes) is None
    assert TEST not in [what for _, what, _ in unready.steps]  # no test without its service
    assert unready.services.running == [] and unready.destroyed == ["cap_rerun"]
