"""capsules/witness.py with services still running (issue 36): a witness made while a service its
execs ran beside still runs asks the helper what that service has touched so far (``run_reads``)
and carries those files, not the whole base, running nothing again; when the helper cannot say,
it carries the whole base and says why.  The helper is faked: the real one is in
vm-tests/test_services_trials_witness.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import trio

from mcp_server.capsules.witness import WitnessOptions, make_witness
from mcp_server.fs import witness as wfmt
from mcp_server.journal import Journal
from mcp_server.journal_records import CapsuleRecord
from mcp_server.state import State
from sandbox.errors import CcwError
from sandbox.ops import OpRequest, RunReadsRequest
from sandbox.replies import RunReadsReply, Touched
from sandbox.spec import CapsuleSpec
from tests.support.journal_rows import exec_entry

WEB = {"name": "web", "argv": ["python3", "server.py"], "cwd": None, "restart": "no", "env": ["PORT"],
       "ready": {"port": 8765, "timeout_ms": 20000}}
TEST = ["python3", "test_app.py"]
SERVED = Touched(("server.py", "static/page.html"), ("web.log",), ("static",), ())  # what "web" touched so far


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "static").mkdir(parents=True)
    (ws / "server.py").write_text("print('serving')\n")
    (ws / "test_app.py").write_text("print('testing')\n")
    (ws / "static" / "page.html").write_text("<p>page</p>\n")
    (ws / "unused.txt").write_text("nobody opens this\n")
    return ws


def _row(ws: Path, argv: list[str], read: list[str], **extra: Any) -> dict[str, Any]:
    """An exec's journal entry (tests/support/journal_rows.py), with hashes a witness's schema takes."""
    no_output = "blake3:" + "0" * 64
    return {**exec_entry({"read": read, "written": []}), "argv": argv, "cwd": str(ws), "stdout_blake3": no_output,
            "stderr_blake3": no_output, **extra}


class _Capsules:
    """The capsule service a witness uses: a journaled capsule over ``ws``, and a helper whose
    ``run_reads`` answers ``answer`` (a reply, or an error to raise); every other call is refused."""

    def __init__(self, tmp_path: Path, ws: Path, answer: RunReadsReply | CcwError) -> None:
        self.state = State(tmp_path / "state")
        self.journal = Journal(self.state)
        self.ws, self.answer = ws, answer
        self.asked: list[OpRequest[Any]] = []
        self.record = CapsuleRecord(capsule_id="cap_1", spec=CapsuleSpec(workspace=str(ws)), parent=None,
                                    created_at="", clock="", isolation={}, mount="", base_fingerprint=None,
                                    destroyed_at=None)
        self.journal.add_capsule(self.record)
        self.journal.add_exec("cap_1", _row(ws, ["true"], []))
        self.journal.add_exec("cap_1", _row(ws, TEST, ["test_app.py"], services=json.dumps([WEB], sort_keys=True)))

    def live_record(self, capsule_id: str) -> CapsuleRecord:
        return self.record

    async def changes(self, capsule_id: str) -> tuple[()]:
        return ()

    async def open_root(self, capsule_id: str) -> int:
        return os.open(self.ws, os.O_PATH | os.O_DIRECTORY)

    async def call(self, request: OpRequest[Any]) -> Any:
        self.asked.append(request)
        if isinstance(self.answer, CcwError):
            raise self.answer
        return self.answer


def _witness(capsules: _Capsules, carry_all: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    made = trio.run(make_witness, capsules, "cap_1", WitnessOptions(carry_all=carry_all))
    with open(made["path"], "rb") as f:
        return made, wfmt.read_archive(f, None, keep_blobs=False).manifest


def test_a_running_service_s_reads_so_far_are_carried_and_nothing_runs_again(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    capsules = _Capsules(tmp_path, ws, RunReadsReply("web", SERVED))
    made, manifest = _witness(capsules)
    assert capsules.asked == [RunReadsRequest("cap_1", "web")]  # one question, and no exec
    carried = {entry["path"] for entry in manifest["base"]["files"]}
    assert {"server.py", "static/page.html", "test_app.py"} <= carried and "unused.txt" not in carried
    assert made["base"]["carried"] == "used" and made["base"]["read_sets_complete"] is True
    assert "unknown_reads" not in made["base"]
    assert [e["argv"] for e in manifest["execs"]] == [["true"], TEST]  # the service's reads are no entry

    # Asked for everything, the helper is not asked.
    everything = _Capsules(tmp_path / "all", ws, RunReadsReply("web", SERVED))
    made, manifest = _witness(everything, carry_all=True)
    assert everything.asked == [] and "unused.txt" in {e["path"] for e in manifest["base"]["files"]}


def test_when_the_helper_cannot_say_the_whole_base_is_carried_and_why(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    for name, answer, why in (
        ("lost", CcwError("NOT_FOUND", "no service named 'web' runs in capsule cap_1"), "no service named"),
        ("large", RunReadsReply("web", None, "the service has touched too many paths for one reply"), "too many"),
    ):
        capsules = _Capsules(tmp_path / name, ws, answer)
        made, manifest = _witness(capsules)
        assert made["base"]["carried"] == "all" and made["base"]["read_sets_complete"] is False
        assert made["base"]["unknown_reads"].startswith("what service 'web' read is not known: ")
        assert why in made["base"]["unknown_reads"]
        assert "unused.txt" in {entry["path"] for entry in manifest["base"]["files"]}
