"""capsules/services.py and service_run.py against a fake helper: what a service's log holds when
its run ends, that a stopped service's log stays readable until its capsule is destroyed, and
what a starting front end does with the kept services (a run the helper still holds waited for).
The real helper's side (its last report before the reply) is in vm-tests/test_helper_services.py,
a front end's kill -9 in vm-tests/test_services_faults.py."""

from __future__ import annotations

import base64
import dataclasses
import socket
from pathlib import Path
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from mcp_server.capsules.networks import Networks
from mcp_server.capsules.service_log import LogRing
from mcp_server.capsules.service_ready import TAIL_LINES
from mcp_server.capsules.service_run import ServiceRun
from mcp_server.capsules.service_spec import Ready, ServiceSpec
from mcp_server.capsules.services import HELPER_POLL_S, Services
from mcp_server.journal import Journal
from mcp_server.journal_records import CapsuleRecord
from mcp_server.state import State
from sandbox.errors import CcwError
from sandbox.ops import ExecRequest, OpRequest, SignalRequest
from sandbox.replies import ExecProgress
from sandbox.spec import CapsuleSpec
from tests.support.journal_rows import capsule_record
from tests.support.scratch_services import exec_reply


def _report(out: bytes, err: bytes, counts: tuple[int, int], last: bool = False) -> dict[str, Any]:
    return {"elapsed_ms": 1, "stdout_bytes": counts[0], "stderr_bytes": counts[1],
            "stdout_tail_b64": base64.b64encode(out).decode(), "stderr_tail_b64": base64.b64encode(err).decode(),
            **({"last": True} if last else {})}


class FakeHelper:
    """A service prints ``reports`` (stdout, stderr) then waits for a signal (reporting every
    ``REPORT_S`` while it does, as the helper does), or ends at once with ``exit_code``.  A port
    accepts (``net_connect``) once a service ``binds`` it; with ``reply_after_connect``, an
    ending run's reply waits for the next connect that is accepted (the helper's reply comes
    after its process's exit, and a check may pass in between); with ``words_after_check``,
    its last words do too."""

    REPORT_S = 0.05

    def __init__(self) -> None:
        self.reports: list[tuple[bytes, bytes]] = []
        self.until_signalled = False
        self.exit_code = 0
        self.held = 0  # execs refused first as the helper's own run of that name (a gone front end's) ends
        self.execs = 0
        self._signalled = trio.Event()
        self.binds: dict[str, int] = {}  # service name: the port it listens on once it runs
        self.accepting: set[int] = set()
        self.reply_after_connect = False
        self.words_after_check = False
        self.paths: dict[str, str] = {}  # path: the identity a path check's probe finds
        self.makes: dict[str, str] = {}  # path: the identity a service's run gives it once it runs
        self.probe_s = 0.0  # how long a path check's probe runs
        self.probing = 0  # probes running now: the helper holds the capsule for each, as for an exec
        self.probes = 0  # probes begun
        self.check_probing = trio.Event()  # a probe of a ready check (after the service's run began) runs
        self.ending: set[str] = set()  # services that end at once though others wait for a signal
        self._connected = trio.Event()

    async def net_connect(self, capsule_id: str, port: int) -> socket.socket:
        if port not in self.accepting:
            raise CcwError("CONFLICT", f"nothing listens on port {port} of capsule {capsule_id}", {"reason": "refused"})
        self._connected.set()
        return socket.socket()

    async def _probe(self, ended: trio.Event) -> None:
        self.probing += 1
        self.probes += 1
        if self.execs:
            self.check_probing.set()
        await trio.sleep(self.probe_s)
        self.probing -= 1
        ended.set()

    async def call(self, request: OpRequest[Any], on_progress: Any = None) -> Any:
        if isinstance(request, SignalRequest):
            self._signalled.set()
            return None
        if isinstance(request, ExecRequest) and request.argv[0] == "stat":  # a path check's probe
            if self.execs:  # not the one before the service's run
                self._connected.set()
            found = self.paths.get(request.argv[-1])
            ended = trio.Event()
            trio.lowlevel.spawn_system_task(self._probe, ended)  # goes on if the call is cancelled, as the helper's
            await ended.wait()
            return exec_reply(0, f"{found}\n".encode()) if found else exec_reply(1)
        assert isinstance(request, ExecRequest) and request.stream
        self.execs += 1
        if self.held:
            self.held -= 1
            raise CcwError("CONFLICT", f"service {request.service!r} already runs in capsule {request.capsule_id}",
                           {"service": request.service})
        out = err = 0
        self.paths.update(self.makes)
        if self.words_after_check:
            await self._connected.wait()
        for index, (stdout, stderr) in enumerate(self.reports):
            out, err = out + len(stdout), err + len(stderr)
            ending = not self.until_signalled and index == len(self.reports) - 1  # the helper's last words
            await on_progress(_report(stdout, stderr, (out, err), last=ending))
        if request.service in self.binds:
            self.accepting.add(self.binds[request.service])
        while self.until_signalled and request.service not in self.ending and not self._signalled.is_set():
            with trio.move_on_after(self.REPORT_S):
                await self._signalled.wait()
            if not self._signalled.is_set():
                await on_progress(_report(b"", b"", (out, err)))
        self._signalled = trio.Event()
        if self.reply_after_connect:
            await self._connected.wait()
        return dataclasses.replace(exec_reply(self.exit_code), stdout_bytes=out, stderr_bytes=err)


class FakeCapsules:
    """What ``Services`` needs of the capsule service: one live capsule, runs journaled as rows."""

    def __init__(self, state: State, workspace: Path) -> None:
        self.state, self.workspace = state, workspace
        self.rows = 0

    @property
    def journal(self) -> Journal:
        return Journal(self.state)

    def live_record(self, capsule_id: str) -> CapsuleRecord:
        return CapsuleRecord(capsule_id=capsule_id, spec=CapsuleSpec(workspace=str(self.workspace)), parent=None,
                             created_at="", clock="", isolation={}, mount="", base_fingerprint=None,
                             destroyed_at=None)

    def background(self) -> FakeCapsules:
        return self

    async def record_service_run(self, record: Any, request: Any, outcome: Any, started: Any) -> int:
        self.rows += 1
        return self.rows


@pytest.fixture
def world(tmp_path: Path) -> tuple[Services, FakeCapsules, FakeHelper]:
    helper, state = FakeHelper(), State(tmp_path / "state")

    async def get_helper() -> FakeHelper:
        return helper

    return Services(state, get_helper, Networks()), FakeCapsules(state, tmp_path), helper  # type: ignore[arg-type]


def _spec(name: str, ready: Ready | None = None) -> ServiceSpec:
    return ServiceSpec("cap_1", name, ("sh", "-c", "..."), None, None, ready)


def test_what_a_service_printed_last_is_logged_before_its_end_and_shown_by_a_refused_start(world: Any) -> None:
    services, capsules, helper = world
    helper.reports = [(b"started\n", b""), (b"", b"Traceback-last-words\n")]  # the last: the helper's final report
    helper.exit_code = 1

    async def main() -> tuple[dict[str, Any], str]:
        answer = await services.start(capsules, _spec("crashy", Ready(line="listening", timeout_ms=5000)))
        await services.aclose()
        return answer, services.logs("cap_1", "crashy")[1].text

    answer, text = trio.run(main)
    assert answer["ready"] is False and answer["why"] == "it exited before it was ready", answer
    lines = text.splitlines()
    assert lines[1:] == ["started", "Traceback-last-words", "[ccw: crashy ended: exit 1]"], text
    assert answer["log_tail"] == text


def test_output_the_reports_did_not_carry_is_said_before_the_end(tmp_path: Path) -> None:
    run = ServiceRun(_spec("old"), LogRing(tmp_path, "old"))
    run.take_output(ExecProgress.from_args(_report(b"one\n", b"", (4, 0))))
    reply = exec_reply(0, b"one\nlost by an older helper\n")  # counted by its reply, never reported
    run.take_end(reply)
    assert run.log.read().text.splitlines() == [
        "one", "[ccw: 24 bytes of output were not kept]", "[ccw: old ended: exit 0]"]
    again = ServiceRun(_spec("new"), LogRing(tmp_path, "new"))
    again.take_output(ExecProgress.from_args(_report(b"two\n", b"", (4, 0))))
    again.take_end(exec_reply(0, b"two\n"))  # every byte reported: nothing to say but the end
    assert again.log.read().text.splitlines() == ["two", "[ccw: new ended: exit 0]"]
    # Found in a developer's trial: a stopped service's log ended "exit None, signal SIGTERM".
    stopped = ServiceRun(_spec("web"), LogRing(tmp_path, "web"))
    stopped.take_end(dataclasses.replace(exec_reply(0), exit_code=None, signal="SIGTERM"))
    assert stopped.log.read().text == "[ccw: web ended: killed by SIGTERM]\n"


def test_a_stopped_services_log_stays_until_its_capsule_is_destroyed(world: Any, tmp_path: Path) -> None:
    services, capsules, helper = world
    helper.reports, helper.until_signalled = [(b"GET /index.txt 200\n", b"")], True

    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {}
        await services.start(capsules, _spec("web"))
        out["stop"] = await services.stop("cap_1", "web", grace_ms=5000)
        out["after_stop"] = services.logs("cap_1", "web")
        out["listed"] = services.summaries("cap_1")
        with pytest.raises(CcwError) as never:
            services.logs("cap_1", "api")
        out["never"] = never.value
        # A front end started later (the same state dir) reads it too.
        again = Services(services.state, services._helper, Networks())
        out["later"] = again.logs("cap_1", "web", since=out["after_stop"][1].start, tail=1)
        # A new start of that name continues its log.
        await services.start(capsules, _spec("web"))
        await services.stop("cap_1", "web")
        out["restarted"] = services.logs("cap_1", "web")
        await services.stop_all("cap_1")  # its capsule is destroyed
        with pytest.raises(CcwError) as gone:
            services.logs("cap_1", "web")
        out["gone"] = gone.value
        await services.aclose()
        return out

    out = trio.run(main)
    assert out["stop"]["state"] == "stopped" and out["listed"] == []
    state, part = out["after_stop"]
    assert state == "stopped" and part.text.splitlines()[1:] == [
        "GET /index.txt 200", "[ccw: web ended: exit 0]"], part.text
    assert out["never"].code == "NOT_FOUND" and out["never"].details["stopped"] == ["web"]
    assert "its services: none; stopped, their logs kept: ['web']" in out["never"].message
    assert out["later"][0] == "stopped" and out["later"][1].text == "[ccw: web ended: exit 0]\n"
    state, restarted = out["restarted"]
    assert restarted.text.startswith(part.text) and restarted.text.count("GET /index.txt 200") == 2
    assert out["gone"].code == "NOT_FOUND" and out["gone"].details["stopped"] == []
    assert not (tmp_path / "state" / "services" / "cap_1").exists()


def test_a_starting_front_end_brings_back_the_kept_services_and_waits_for_a_held_one(world: Any) -> None:
    services, capsules, helper = world
    Journal(services.state).add_capsule(capsule_record("cap_1"))
    for name, restart in (("web", "no"), ("keeper", "always"), ("fragile", "on-failure")):
        services.table.save(dataclasses.replace(_spec(name), restart=restart), "2026-01-01T00:00:00")
    helper.held, helper.until_signalled = 2, True  # the helper still ends the old keeper: refused twice
    helper.reports = [(b"serving\n", b"")]

    async def main() -> dict[str, Any]:
        await services.reopen_kept(capsules)  # a front end's start: no call about services
        listed = {one["name"]: one for one in services.summaries("cap_1")}
        await trio.sleep(5 * HELPER_POLL_S)  # virtual time: two refusals, a poll after each, then the run
        out = {"listed": listed, "later": {one["name"]: one for one in services.summaries("cap_1")},
               "log": services.logs("cap_1", "keeper")[1].text}
        await services.aclose()
        return out

    out = trio.run(main, clock=MockClock(autojump_threshold=0))
    listed, later = out["listed"], out["later"]
    assert {name: one["state"] for name, one in listed.items()} == {
        "web": "lost", "keeper": "starting", "fragile": "pending"}, listed
    assert helper.execs == 3 and later["keeper"]["state"] == "running" and later["keeper"]["restarts"] == 0, later
    assert out["log"].count("started at") == 1 and "failed" not in out["log"], out["log"]


def test_a_run_the_helper_holds_past_the_wait_fails_with_its_reason(world: Any) -> None:
    services, capsules, helper = world
    helper.held = 10**6  # never let go

    async def main() -> dict[str, Any]:
        answer = await services.start(capsules, _spec("web", Ready(line="listening", timeout_ms=10**6)))
        await services.aclose()
        return answer

    answer = trio.run(main, clock=MockClock(autojump_threshold=0))
    assert answer["state"] == "failed" and "already runs" in answer["reason"], answer


def test_a_start_whose_ready_port_another_service_holds_is_refused_before_it_starts(world: Any) -> None:
    services, capsules, helper = world
    helper.until_signalled, helper.binds = True, {"s1": 8000}

    async def main() -> tuple[dict[str, Any], CcwError]:
        first = await services.start(capsules, _spec("s1", Ready(port=8000, timeout_ms=5000)))
        with pytest.raises(CcwError) as refused:
            await services.start(capsules, _spec("s2", Ready(port=8000, timeout_ms=5000)))
        await services.aclose()
        return first, refused.value

    first, refused = trio.run(main)
    assert first["ready"] is True, first
    assert refused.code == "CONFLICT" and refused.details == {"port": 8000, "service": "s1"}, refused
    assert "port 8000 of capsule cap_1 already accepts connections (service 's1' listens there)" in refused.message
    assert "stop 's1' (capsule_service_stop), or start it on another port" in refused.message
    assert helper.execs == 1  # s2 never ran
    assert [one["name"] for one in services.summaries("cap_1")] == ["s1"]


@pytest.mark.parametrize("words_after_check", [False, True])
def test_a_service_that_ended_when_its_path_check_passed_is_not_ready(world: Any, words_after_check: bool) -> None:
    # The ready path is there already (a run before left it), and the service's command
    # fails: its check passes while the helper's reply, which says it ended, is on its way,
    # and maybe its last words too (which are no sign that it runs).
    services, capsules, helper = world
    helper.reports = [(b"", b"OSError: [Errno 98] Address already in use\n")]
    helper.exit_code, helper.paths, helper.reply_after_connect = 1, {"run/s2.pid": "1:2:3.0"}, True
    helper.makes = {"run/s2.pid": "1:2:4.0"}  # written again, so its check passes
    helper.words_after_check = words_after_check

    async def main() -> tuple[dict[str, Any], float]:
        began = trio.current_time()
        answer = await services.start(capsules, _spec("s2", Ready(path="run/s2.pid", timeout_ms=5000)))
        took = trio.current_time() - began
        await services.aclose()
        return answer, took

    answer, took = trio.run(main)
    assert took < 2.5, took  # at its end, not its deadline (its end may come while the check's probe runs)
    assert answer["ready"] is False and answer["state"] == "exited" and answer["exit_code"] == 1, answer
    assert answer["why"] == "it exited before it was ready", answer
    assert answer["log_tail"].splitlines()[-2:] == ["OSError: [Errno 98] Address already in use",
                                                    "[ccw: s2 ended: exit 1]"], answer
    assert len(answer["log_tail"].splitlines()) <= TAIL_LINES


def test_a_start_past_its_deadline_answers_once_its_path_probe_has_ended(world: Any) -> None:
    # A probe is an exec of the capsule: one the deadline cut off went on in the helper, and
    # the destroy sent after the answer was refused ("is running a command").
    services, capsules, helper = world
    helper.until_signalled, helper.probe_s = True, 0.3  # the path is never made: each probe runs 0.3 s
    ends: list[int] = []

    async def main() -> dict[str, Any]:
        answer = await services.start(capsules, _spec("idle", Ready(path="run/ready.txt", timeout_ms=1000)))
        ends.append(helper.probing)
        await services.aclose()
        return answer

    answer = trio.run(main, clock=MockClock(autojump_threshold=0))
    assert answer["ready"] is False and answer["why"].startswith("not ready after 1000 ms"), answer
    assert ends == [0]


def test_a_destroy_waits_for_the_probe_a_restarts_readiness_check_has_out(world: Any) -> None:
    # A restart's readiness is checked in the background, outside the capsule's turn.
    services, capsules, helper = world
    Journal(services.state).add_capsule(capsule_record("cap_1"))
    services.table.save(dataclasses.replace(_spec("web", Ready(path="run/ready.txt")), restart="always"),
                        "2026-01-01T00:00:00")
    helper.until_signalled, helper.probe_s = True, 0.3

    async def main() -> list[int]:
        await services.reopen_kept(capsules)  # brought back at once, its check in the background
        await helper.check_probing.wait()
        await services.stop_all("cap_1")  # what a destroy does before it asks the helper
        left = [helper.probing]
        await services.aclose()
        return left

    assert trio.run(main, clock=MockClock(autojump_threshold=0)) == [0]


def test_an_exec_or_a_fork_holds_off_a_background_readiness_check(world: Any) -> None:
    # The helper refuses an exec or a fork while it runs a probe ("is running a command"), and
    # a restart's check probes outside the capsule's turn: an agent's exec could be refused.
    services, capsules, helper = world
    Journal(services.state).add_capsule(capsule_record("cap_1"))
    services.table.save(dataclasses.replace(_spec("web", Ready(path="run/ready.txt")), restart="always"),
                        "2026-01-01T00:00:00")
    helper.until_signalled, helper.probe_s = True, 0.3  # the path is never made: probes go on

    async def main() -> tuple[int, int, int]:
        await services.reopen_kept(capsules)
        await helper.check_probing.wait()  # a probe is out
        async with services.held_off("cap_1"):
            out_then, begun = helper.probing, helper.probes
            await trio.sleep(2)  # what the exec takes
            begun_meanwhile = helper.probes - begun
        await trio.sleep(1)
        resumed = helper.probes - begun - begun_meanwhile
        await services.stop_all("cap_1")
        await services.aclose()
        return out_then, begun_meanwhile, resumed

    out_then, begun_meanwhile, resumed = trio.run(main, clock=MockClock(autojump_threshold=0))
    assert (out_then, begun_meanwhile) == (0, 0)  # the probe out was waited for, and none began
    assert resumed >= 1  # the check goes on once the exec has its answer


def test_a_lost_services_log_says_so_once_however_many_front_ends_find_it(world: Any, tmp_path: Path) -> None:
    services, capsules, _helper = world
    Journal(services.state).add_capsule(capsule_record("cap_1"))
    services.table.save(_spec("web"), "2026-01-01T00:00:00")  # restart "no"
    LogRing(tmp_path / "state" / "services" / "cap_1", "web").append(b"GET / 200\nhalf a li")  # died mid-line

    async def front_end() -> str:  # a new process: its own Services over the state dir
        again = Services(services.state, services._helper, Networks())
        await again.reopen_kept(capsules)
        text = again.logs("cap_1", "web")[1].text
        await again.aclose()
        return text

    logs = [trio.run(front_end) for _ in range(3)]
    said = "[ccw: web lost: the front end or helper that ran it stopped]\n"
    assert logs[0] == "GET / 200\nhalf a li\n" + said, logs[0]
    assert logs[1] == logs[2] == logs[0], logs


def test_a_frozen_capsules_live_services_are_listed_paused_and_its_ended_ones_as_they_ended(world: Any) -> None:
    services, capsules, helper = world
    helper.until_signalled, helper.ending = True, {"once"}

    async def main() -> dict[str, list[tuple[str, str | None]]]:
        await services.start(capsules, _spec("web"))
        await services.start(capsules, _spec("once"))  # ends at once: exit 0
        listed = {frozen: [(one["state"], one.get("reason")) for one in services.summaries("cap_1", frozen)]
                  for frozen in ("paused", "frozen", "ready")}
        await services.aclose()
        return listed

    listed = trio.run(main, clock=MockClock(autojump_threshold=0))
    assert listed["paused"] == [("exited", None), ("paused", "its capsule is paused: it was running, and runs nothing "
                                                   "(a connection to it waits) until capsule_resume")], listed
    assert listed["frozen"] == [("exited", None), ("paused", "its capsule has forks, which freeze it: it was running, "
                                                   "and runs nothing (a connection to it waits) until they are "
                                                   "destroyed")], listed
    assert listed["ready"] == [("exited", None), ("running", None)], listed


def test_a_services_run_a_killed_front_end_left_advances_its_capsules_generation_at_the_next(world: Any) -> None:
    # The next front end's start journals what a killed one left running (Journal.recover_running); a
    # service's run, like one the helper lost, gets no row, but what it wrote is not known either.
    services, capsules, helper = world
    journal = Journal(services.state)
    journal.add_capsule(capsule_record("cap_1"))
    helper.until_signalled = True

    async def main() -> tuple[int, list[Any], int]:
        await services.start(capsules, _spec("web"))
        before = journal.generation("cap_1")
        recovered = Journal(State(services.state.root)).recover_running()  # as if this front end were dead
        after = journal.generation("cap_1")
        await services.aclose()
        return before, recovered, after

    before, recovered, after = trio.run(main)
    assert recovered == [] and journal.execs("cap_1") == [] and after == before + 1


def test_a_start_brings_up_the_kept_services_its_capsule_waits_to_start_first(world: Any) -> None:
    # After a restart an on-failure database waits for the capsule's next use; the app started
    # next connects to it as it starts, so the database comes up first (a start is a use).
    services, capsules, helper = world
    Journal(services.state).add_capsule(capsule_record("cap_1"))
    for name in ("db", "web"):
        services.table.save(dataclasses.replace(_spec(name), restart="on-failure"), "2026-01-01T00:00:00")
    helper.until_signalled = True

    async def main() -> dict[str, Any]:
        await services.reopen_kept(capsules)
        before = {one["name"]: one["state"] for one in services.summaries("cap_1")}
        started = await services.start(capsules, dataclasses.replace(_spec("web"), argv=("python3", "app.py")))
        after = {one["name"]: one["state"] for one in services.summaries("cap_1")}
        await services.aclose()
        return {"before": before, "started": started, "after": after}

    out = trio.run(main)
    assert out["before"] == {"db": "pending", "web": "pending"}, out
    assert out["started"]["ready"] is True and out["started"]["argv"] == ["python3", "app.py"], out
    assert out["after"] == {"db": "running", "web": "running"} and helper.execs == 2, out  # the old web never ran
