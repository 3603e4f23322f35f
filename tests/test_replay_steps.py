"""capsules/replay_steps.py: a replay's steps cut where the services beside its execs change,
each set started (and ready) before its execs and ended after them, with the replayer's values
only; a service's own run reported, never re-run.  The helper is faked: the real one is in
vm-tests/test_services_witness.py."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import trio

from mcp_server.capsules import replay_steps
from mcp_server.capsules.networks import Traced
from sandbox.errors import CcwError
from sandbox.ops import ExecRequest
from sandbox.spec import CapsuleSpec
from tests.support import witness_craft as craft
from tests.support.scratch_services import FakeServices, exec_reply

WEB = {"name": "web", "argv": ["python3", "server.py"], "cwd": None, "restart": "no", "env": ["PORT"],
       "ready": {"port": 8765, "timeout_ms": 20000}}
DB = {"name": "db", "argv": ["redis-server"], "cwd": None, "restart": "no"}
SPEC = CapsuleSpec(workspace="/w", env_whitelist=("PORT", "TOKEN"))


def _manifest() -> dict[str, Any]:
    """A write, two execs beside web, web's own run, a write, an exec beside nothing, one beside db."""
    execs = []
    for seq, argv, extra in ((2, ["t1"], {"services": [WEB]}), (3, ["t2"], {"services": [WEB]}),
                             (4, ["python3", "server.py"], {"service": "web", "timeout_ms": 0}),
                             (6, ["t3"], {}), (7, ["t4"], {"services": [DB]})):
        entry, _ = craft.exec_entry(seq, argv)
        execs.append({**entry, **extra, "output": None})
    made = craft.manifest("/w", execs)
    made["writes"] = [{"seq": seq, "path": f"f{seq}", "action": "delete"} for seq in (1, 5)]
    return made


def test_the_steps_are_cut_where_the_services_beside_them_change() -> None:
    tally = replay_steps.Tally()
    cut = [(forms, [(kind, entry["seq"]) for kind, entry in steps])
           for forms, steps in replay_steps.stretches(_manifest(), tally)]
    assert cut == [
        ([], [("write", 1)]),
        ([WEB], [("exec", 2), ("exec", 3), ("write", 5)]),  # web runs on across the write, as it did
        ([], [("exec", 6)]),
        ([DB], [("exec", 7)]),
    ]
    assert tally.not_compared == [{"exec": 4, "service": "web", "argv": ["python3", "server.py"]}]
    assert replay_steps.services_named(_manifest()) and replay_steps.service_env_names(_manifest()) == {"PORT"}
    plain = _manifest()
    plain["execs"] = [ex for ex in plain["execs"] if not ex.get("services")]
    assert not replay_steps.services_named(plain)  # a service's own run starts nothing


def test_a_witness_s_services_get_the_replayer_s_values_and_none_of_this_process(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PORT", "server's own")
    monkeypatch.setenv("TOKEN", "server's secret")
    [spec] = replay_steps.witness_specs("cap_r", [WEB], SPEC, {"PORT": "8765", "OTHER": "not whitelisted"})
    assert spec.capsule_id == "cap_r" and spec.env == {"PORT": "8765"}
    assert spec.argv == ("python3", "server.py") and spec.ready is not None and spec.ready.port == 8765
    request = spec.request(SPEC, 250, 1024)
    assert request.env == {"PORT": "8765"} and request.service == "web"


class _CapsuleService:
    """A scratch capsule's runs: each exec sees which services run beside it."""

    def __init__(self, services: FakeServices | None) -> None:
        self.services = services
        self.ran: list[tuple[tuple[str, ...], list[str], Mapping[str, str] | None]] = []

    async def open_root(self, capsule_id: str) -> int:
        raise AssertionError("these steps write nothing")

    async def scratch_exec(self, request: ExecRequest, spec: CapsuleSpec, network: Any = None,
                  values: Mapping[str, str] | None = None) -> Traced:
        beside = sorted(self.services.running) if self.services is not None else []
        self.ran.append((request.argv, beside, values))
        return Traced(exec_reply())


def test_each_set_of_services_is_ready_before_its_execs_and_ended_after(tmp_path: Path) -> None:
    manifest = _manifest()
    manifest["writes"] = []  # nothing to write through the fake root
    services = FakeServices(tmp_path)
    service: Any = _CapsuleService(services)
    tally = trio.run(replay_steps.rerun, service, "cap_r", SPEC, manifest, {}, None, {"PORT": "8765"})
    assert [(argv, beside) for argv, beside, _ in service.ran] == [
        (("t1",), ["web"]), (("t2",), ["web"]), (("t3",), []), (("t4",), ["db"])]  # web gone before t3, not after
    assert services.running == []  # every one ended with its stretch
    assert [request.service for request in services.requests] == ["web", "db"]  # web once for both execs
    assert tally.started == [{"services": ["web"], "execs": [2, 3]}, {"services": ["db"], "execs": [7]}]
    assert sorted(tally.touched) == [2, 3, 6, 7]  # the service's own run is not compared
    changed, _ = replay_steps.change_mismatches(manifest, tally, [], [])
    assert changed == []


def test_a_service_that_is_not_ready_stops_the_replay_before_its_exec(tmp_path: Path) -> None:
    services = FakeServices(tmp_path, ready=False)
    service: Any = _CapsuleService(services)
    with pytest.raises(CcwError) as refused:  # the CcwError itself, not trio's group around it
        trio.run(replay_steps.rerun, service, "cap_r", SPEC, _manifest() | {"writes": []}, {}, None, {})
    assert refused.value.code == "TIMEOUT" and refused.value.details["service"] == "web"
    assert service.ran == [] and services.running == []


def test_an_error_in_the_block_comes_out_as_itself(tmp_path: Path) -> None:
    services = FakeServices(tmp_path)
    service: Any = _CapsuleService(services)
    [spec] = replay_steps.witness_specs("cap_r", [WEB], SPEC, {})

    async def fails() -> None:
        async with replay_steps.beside(service, "cap_r", SPEC, None, [spec]):
            raise CcwError("CONFLICT", "the capsule is busy")

    with pytest.raises(CcwError, match="busy"):
        trio.run(fails)
    assert services.running == []


def test_without_services_nothing_starts_and_a_process_that_has_none_refuses(tmp_path: Path) -> None:
    service: Any = _CapsuleService(None)
    plain = copy.deepcopy(_manifest())
    plain["execs"] = [ex for ex in plain["execs"] if not ex.get("services")]
    plain["writes"] = []
    tally = trio.run(replay_steps.rerun, service, "cap_r", SPEC, plain, {}, None, {})
    assert tally.started == [] and [argv for argv, _, _ in service.ran] == [("t3",)]
    with pytest.raises(CcwError) as refused:
        trio.run(replay_steps.rerun, service, "cap_r", SPEC, _manifest() | {"writes": []}, {}, None, {})
    assert refused.value.code == "UNSUPPORTED" and "locally" in refused.value.message



def test_a_run_cut_short_is_not_re_run_and_says_why() -> None:
    # capsules/exec.py cut_entry: its end was never known, so there is nothing to compare with;
    # re-run, a cancelled server would run to its end (or forever) and then differ anyway.
    service: Any = _CapsuleService(None)
    plain = copy.deepcopy(_manifest())
    plain["execs"] = [ex for ex in plain["execs"] if not ex.get("services")]
    plain["writes"] = []
    plain["execs"][-1]["usage"] = {**(plain["execs"][-1].get("usage") or {}), "cut_short": "cancelled while it ran"}
    tally = trio.run(replay_steps.rerun, service, "cap_r", SPEC, plain, {}, None, {})
    assert service.ran == []
    assert [(m["exec"], m["field"], m["expected"]) for m in tally.mismatches] == [
        (6, "cut_short", "cancelled while it ran")]
    assert "not re-run" in tally.mismatches[0]["note"] and tally.touched == {}
