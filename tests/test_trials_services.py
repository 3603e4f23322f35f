"""Deltamin's trials beside services (capsules/trials.py, executors.py, deltamin.py): which
services a trial starts, that the command runs only once they are ready (else the trial is
UNRESOLVED), and that an executor that cannot start them refuses before any trial runs.
The helper is faked: the real one is in vm-tests/test_services_witness.py."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import trio

from mcp_server.capsules.executors import LocalExecutor
from mcp_server.capsules.networks import Traced
from mcp_server.capsules.remote import ReapiExecutor
from mcp_server.capsules.service_beside import services_beside
from mcp_server.capsules.service_spec import Ready, ServiceSpec, SpecTable
from mcp_server.capsules.trials import Material, Trials, predicate
from mcp_server.core.deltamin import FAIL, PASS, UNRESOLVED
from mcp_server.journal import Journal
from mcp_server.journal_records import CapsuleRecord
from mcp_server.state import State
from sandbox.errors import CcwError
from sandbox.ops import ExecRequest
from sandbox.spec import CapsuleSpec
from tests.support.journal_rows import exec_entry
from tests.support.scratch_services import FakeServices, exec_reply

WEB = ServiceSpec("cap_1", "web", ("python3", "server.py"), None, None, Ready(port=8765))


class _CapsuleService:
    """Scratch capsules whose command exits ``exit_code`` and sees which services run beside it."""

    def __init__(self, state: State, workspace: Path, services: FakeServices | None, exit_code: int = 1) -> None:
        self.state, self.workspace, self.services, self.exit_code = state, workspace, services, exit_code
        self.ran: list[list[str]] = []

    @property
    def journal(self) -> Journal:
        return Journal(self.state)

    @contextlib.asynccontextmanager
    async def scratch(self, spec: CapsuleSpec, quiet: bool = False, network: Any = None) -> AsyncIterator[str]:
        yield "cap_trial"

    async def open_root(self, capsule_id: str) -> int:
        return os.open(self.workspace, os.O_PATH | os.O_DIRECTORY)

    async def scratch_exec(self, request: ExecRequest, spec: CapsuleSpec, network: Any = None,
                  values: Mapping[str, str] | None = None) -> Traced:
        self.ran.append(sorted(self.services.running) if self.services is not None else [])
        return Traced(exec_reply(self.exit_code))


def _record(workspace: Path) -> CapsuleRecord:
    return CapsuleRecord(capsule_id="cap_1", spec=CapsuleSpec(workspace=str(workspace)), parent=None, created_at="",
                         clock="", isolation={}, mount="", base_fingerprint=None, destroyed_at=None)


def _outcome(tmp_path: Path, services: FakeServices | None, exit_code: int = 1) -> tuple[str, _CapsuleService]:
    state = State(tmp_path / "state")
    service = _CapsuleService(state, tmp_path, services, exit_code)
    trials = Trials(service, _record(tmp_path), Material([], {}, {}, {}), ["python3", "test_app.py"],
                    predicate("exit_code"), 10_000, LocalExecutor(), (WEB,))
    return trio.run(trials.outcome, ()), service


def test_a_trial_runs_its_command_beside_its_ready_services_and_ends_them(tmp_path: Path) -> None:
    services = FakeServices(tmp_path / "tmp")
    verdict, service = _outcome(tmp_path, services)
    assert verdict == FAIL and service.ran == [["web"]] and services.running == []
    assert services.requests[0].capsule_id == "cap_trial" and services.requests[0].argv == WEB.argv
    verdict, _ = _outcome(tmp_path, FakeServices(tmp_path / "tmp"), exit_code=0)
    assert verdict == PASS


def test_a_trial_whose_services_are_not_ready_is_unresolved_and_its_command_never_runs(tmp_path: Path) -> None:
    services = FakeServices(tmp_path / "tmp", ready=False)
    verdict, service = _outcome(tmp_path, services)
    assert verdict == UNRESOLVED and service.ran == [] and services.running == []


def test_an_executor_that_cannot_start_services_refuses_before_any_trial(tmp_path: Path) -> None:
    state = State(tmp_path / "state")
    record = _record(tmp_path)
    without: Any = _CapsuleService(state, tmp_path, None)
    with pytest.raises(CcwError) as refused:
        LocalExecutor().check_trials(without, record, (WEB,))
    assert refused.value.code == "UNSUPPORTED"
    LocalExecutor().check_trials(without, record, ())  # nothing to start: nothing refused
    remote = ReapiExecutor("grpc://127.0.0.1:1")  # a channel connects lazily: nothing reaches it here
    try:
        with pytest.raises(CcwError) as refused:
            remote.check_trials(without, record, (WEB,))
        assert refused.value.code == "UNSUPPORTED" and refused.value.details == {"services": ["web"]}
        assert "locally" in refused.value.message and remote.summary()["executed"] == 0
        remote.check_trials(without, record, ())
    finally:
        remote.close()


def test_the_trials_start_the_services_beside_the_newest_run_of_the_command(tmp_path: Path) -> None:
    state = State(tmp_path / "state")
    journal = Journal(state)
    journal.add_capsule(_record(tmp_path))
    db = {"name": "db", "argv": ["redis-server"], "cwd": None, "restart": "no"}
    web = WEB.for_witness()
    for argv, extra in ((["pytest", "-q"], {"services": json.dumps([db])}),
                        (["pytest", "-q"], {"services": json.dumps([web])}),
                        (["python3", "server.py"], {"service": "web"})):  # a service's run is no run of the command
        journal.add_exec("cap_1", {**exec_entry({"read": [], "written": []}, 1), "argv": argv, **extra})
    service: Any = _CapsuleService(state, tmp_path, FakeServices(tmp_path / "tmp"))
    service.services.table = table = SpecTable(state)
    record = _record(tmp_path)
    from_journal = ServiceSpec("cap_1", "web", WEB.argv, None, None, WEB.ready)  # no values
    assert services_beside(service, record, ["pytest", "-q"]) == (from_journal,)
    # A spec still kept for the capsule gives the values its caller set (the journal has names only).
    kept = ServiceSpec("cap_1", "web", WEB.argv, None, {"PORT": "8765"}, WEB.ready)
    table.save(kept, "2026-01-01T00:00:00Z")
    assert services_beside(service, record, ["pytest", "-q"]) == (from_journal,)  # that run had another web
    journal.add_exec("cap_1", {**exec_entry({"read": [], "written": []}, 1), "argv": ["pytest", "-q"],
                               "services": json.dumps([kept.for_witness()])})
    assert services_beside(service, record, ["pytest", "-q"]) == (kept,)
    assert services_beside(service, record, ["make", "test"]) == ()  # never run, and nothing runs now
    # Found in a trial: deltamin of a command never run in the capsule started none of its services
    # beside the trials.  With no run of it to go by, it runs beside those running now, with values.
    service.services.in_capsule["cap_1"] = [kept.for_witness()]
    assert services_beside(service, record, ["make", "test"]) == (kept,)
    journal.add_exec("cap_1", {**exec_entry({"read": [], "written": []}, 1), "argv": ["make", "test"]})
    assert services_beside(service, record, ["make", "test"]) == ()  # its run went beside none: so do its trials
