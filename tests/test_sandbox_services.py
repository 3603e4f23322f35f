"""sandbox/services.py: what a capsule may run at once, and what pause, signals and destroy do to its runs.

No jail here: the runs' handles and cgroups are doubles that record what was asked of
them, so each rule of the module is seen on its own (the real kernel's side is
vm-tests/test_helper_services.py).
"""

from __future__ import annotations

import signal

import pytest

from sandbox import services
from sandbox.errors import CcwError
from sandbox.meta import Capsule
from sandbox.ops import ExecRequest
from sandbox.spec import CapsuleSpec


class FakeHandle:
    def __init__(self) -> None:
        self.sent: list[int] = []

    def send(self, signum: int) -> bool:
        self.sent.append(signum)
        return True


class FakeCgroup:
    def __init__(self, freezable: bool = True) -> None:
        self.freezable = freezable
        self.states: list[bool] = []

    def can_freeze(self) -> bool:
        return self.freezable

    def freeze(self, frozen: bool) -> bool:
        if self.freezable:
            self.states.append(frozen)
        return self.freezable


def _capsule() -> Capsule:
    return Capsule("cap_1", "/state/capsules/cap_1", {"owner_uid": 1000}, CapsuleSpec(workspace="/w"), mounted=True)


def _start(capsule: Capsule, service: str | None, cgroup: FakeCgroup | None = None) -> services.Run:
    request = ExecRequest(capsule.capsule_id, ("true",), service=service, timeout_ms=0 if service else 1000)
    services.admit(capsule, request)
    run = services.begin(capsule, request, f"cap_1.{len(capsule.services)}")
    run.track(FakeHandle(), cgroup or FakeCgroup())  # type: ignore[arg-type]
    return run


def test_services_run_beside_one_exec_and_names_are_unique() -> None:
    capsule = _capsule()
    web = _start(capsule, "web")
    exec_run = _start(capsule, None)
    assert capsule.busy and capsule.exec_run is exec_run
    with pytest.raises(CcwError) as second_exec:
        services.admit(capsule, ExecRequest("cap_1", ("true",)))
    assert second_exec.value.code == "CONFLICT" and second_exec.value.details == {"running": True}
    _start(capsule, "db")  # a service still may
    with pytest.raises(CcwError) as twice:
        services.begin(capsule, ExecRequest("cap_1", ("true",), service="web", timeout_ms=0), "cap_1.9")
    assert twice.value.code == "CONFLICT"
    services.finish(capsule, exec_run)
    services.finish(capsule, web)
    assert not capsule.busy and sorted(capsule.services) == ["db"] and web.finished.is_set()


def test_a_capsule_runs_a_bounded_number_of_services() -> None:
    capsule = _capsule()
    for number in range(services.MAX_SERVICES):
        _start(capsule, f"s{number}")
    with pytest.raises(CcwError) as full:
        _start(capsule, "one-more")
    assert full.value.code == "TOO_LARGE"


def test_pause_freezes_every_run_refuses_new_ones_and_resume_thaws() -> None:
    capsule = _capsule()
    web_cgroup, exec_cgroup = FakeCgroup(), FakeCgroup()
    _start(capsule, "web", web_cgroup)
    _start(capsule, None, exec_cgroup)
    reply = services.freeze(capsule, True)
    assert reply.frozen and sorted(reply.runs) == ["exec", "web"]
    assert web_cgroup.states == [True] and exec_cgroup.states == [True]
    with pytest.raises(CcwError) as paused:
        services.admit(capsule, ExecRequest("cap_1", ("true",), service="late", timeout_ms=0))
    assert paused.value.details["paused"] is True
    # A run spawned as the pause came is frozen as it reports in.
    late_cgroup = FakeCgroup()
    late = services.begin(capsule, ExecRequest("cap_1", ("true",), service="late", timeout_ms=0), "cap_1.7")
    late.track(FakeHandle(), late_cgroup)  # type: ignore[arg-type]
    assert late_cgroup.states == [True]
    services.freeze(capsule, False)
    assert web_cgroup.states == [True, False] and late_cgroup.states == [True, False]


def test_pause_is_refused_when_a_run_has_no_cgroup_to_freeze() -> None:
    capsule = _capsule()
    run = _start(capsule, "web")
    run.cgroup = None
    with pytest.raises(CcwError) as refused:
        services.freeze(capsule, True)
    assert refused.value.code == "UNSUPPORTED" and not capsule.paused


def test_pause_and_fork_are_refused_when_a_cgroup_holds_no_freezer() -> None:
    """A rootless helper's run has a cgroup object with no hierarchy: freezing it does
    nothing, so "paused" would be a lie, and a fork would lie under a service that writes."""
    capsule = _capsule()
    quiet = FakeCgroup(freezable=False)
    _start(capsule, "db", quiet)
    with pytest.raises(CcwError) as paused:
        services.freeze(capsule, True)
    assert paused.value.code == "UNSUPPORTED" and paused.value.details["runs"] == ["db"]
    assert not capsule.paused and quiet.states == []
    with pytest.raises(CcwError) as forked:
        services.check_freezable(capsule, "forked", "stop its services first")
    assert forked.value.code == "UNSUPPORTED" and "forked" in forked.value.message
    services.freeze(capsule, False)  # a resume asks nothing of a freezer it lacks


def test_forks_freeze_services_and_signals_reach_only_a_running_service() -> None:
    capsule = _capsule()
    cgroup = FakeCgroup()
    web = _start(capsule, "web", cgroup)
    capsule.children.add("cap_2")
    services.apply(capsule)
    assert cgroup.states == [True] and web.frozen
    # SIGKILL thaws first (a frozen task takes it only once thawed); other signals wait for the thaw.
    assert services.signal(capsule, "web", "SIGKILL").sent
    assert cgroup.states == [True, False]
    assert web.handle is not None and web.handle.sent == [signal.SIGKILL]  # type: ignore[attr-defined]
    with pytest.raises(CcwError) as unknown:
        services.signal(capsule, "db", "SIGTERM")
    assert unknown.value.code == "NOT_FOUND"


def test_destroy_kills_services_and_a_run_spawned_meanwhile() -> None:
    capsule = _capsule()
    web = _start(capsule, "web")
    with pytest.raises(CcwError):
        capsule.busy = True
        services.check_destroyable(capsule)
    assert not capsule.destroying
    capsule.busy = False
    services.check_destroyable(capsule)
    assert services.kill_all(capsule) == [web]
    assert web.handle is not None and web.handle.sent == [signal.SIGKILL]  # type: ignore[attr-defined]
    late = services.begin(capsule, ExecRequest("cap_1", ("true",), service="late", timeout_ms=0), "cap_1.8")
    handle = FakeHandle()
    late.track(handle, FakeCgroup())  # type: ignore[arg-type]
    assert handle.sent == [signal.SIGKILL]
