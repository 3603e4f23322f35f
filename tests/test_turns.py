"""Capsule turns (mcp_server/capsules/turns.py): arrival order, places taken on arrival,
cancellation while waiting, and the reports a waiting call gets."""

from __future__ import annotations

import trio
import trio.testing

from mcp_server.capsules.service import DESTROY, EXEC
from mcp_server.capsules.turns import CapsuleQueue, TakesTurn, Ticket


def test_turns_go_in_arrival_order_and_report_who_is_ahead() -> None:
    queue = CapsuleQueue()
    ran: list[str] = []
    reports: list[tuple[str, int, str]] = []

    async def call(name: str, hold: trio.Event | None = None) -> None:
        async def report(ticket: Ticket, ahead: int, holder: Ticket) -> None:
            reports.append((name, ahead, holder.label))

        async with queue.turn("cap", name, report):
            ran.append(name)
            if hold is not None:
                await hold.wait()

    async def main() -> None:
        release = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call, "first", release)
            await trio.testing.wait_all_tasks_blocked()
            for name in ("second", "third"):
                nursery.start_soon(call, name)
                await trio.testing.wait_all_tasks_blocked()
            assert [t.label for t in queue.line("cap")] == ["first", "second", "third"]
            release.set()
        assert queue.line("cap") == []

    trio.run(main)
    assert ran == ["first", "second", "third"]
    assert ("second", 1, "first") in reports and ("third", 2, "first") in reports


def test_places_taken_on_arrival_hold_whatever_order_the_handlers_start_in() -> None:
    queue = CapsuleQueue()
    ran: list[str] = []

    async def handler(name: str, ticket: Ticket) -> None:
        async with queue.turn("cap", name, ticket=ticket):
            ran.append(name)

    async def main() -> None:
        first, second = queue.reserve("cap", "first"), queue.reserve("cap", "second")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(handler, "second", second)  # the later arrival starts first
            await trio.testing.wait_all_tasks_blocked()
            assert ran == []
            nursery.start_soon(handler, "first", first)

    trio.run(main)
    assert ran == ["first", "second"]


def test_a_cancelled_waiter_never_runs_and_an_unclaimed_place_is_given_back() -> None:
    queue = CapsuleQueue()
    ran: list[str] = []

    async def call(name: str, scope: trio.CancelScope | None = None, hold: trio.Event | None = None) -> None:
        with scope or trio.CancelScope():
            async with queue.turn("cap", name):
                ran.append(name)
                if hold is not None:
                    await hold.wait()

    async def main() -> None:
        release, doomed = trio.Event(), trio.CancelScope()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call, "first", None, release)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(call, "cancelled", doomed)
            await trio.testing.wait_all_tasks_blocked()
            stranded = queue.reserve("cap", "never claimed")  # e.g. a request with bad arguments
            nursery.start_soon(call, "last")
            await trio.testing.wait_all_tasks_blocked()
            doomed.cancel()
            queue.release("cap", stranded)
            queue.release("cap", stranded)  # twice is harmless
            release.set()

    trio.run(main)
    assert ran == ["first", "last"]


def test_turn_labels_name_the_command() -> None:
    assert EXEC.label_of({"cmd": ["pytest", "-q", "tests/a b.py"]}) == "exec `pytest -q 'tests/a b.py'`"
    assert EXEC.label_of({"cmd": ["x" * 100]}).endswith("…`")
    assert EXEC.label_of({"cmd": "not an argv"}) == "exec"
    assert DESTROY.label_of({"capsule_id": "cap_1"}) == "destroy"
    assert DESTROY.capsule_of({"capsule_id": "cap_1"}) == "cap_1"
    assert DESTROY.capsule_of({"capsule_id": 7}) is None
    assert TakesTurn("x", capsule_arg="parent").capsule_of({"parent": "cap_2", "capsule_id": "cap_1"}) == "cap_2"


def test_a_claimed_place_is_the_handlers_and_an_unclaimed_one_is_given_back() -> None:
    queue = CapsuleQueue()
    ran: list[str] = []

    async def main() -> None:
        held, stranded, later = (queue.reserve("cap", name) for name in ("held", "stranded", "later"))
        release = trio.Event()

        async def handler(name: str, ticket: Ticket, hold: trio.Event | None = None) -> None:
            async with queue.turn("cap", name, ticket=ticket):
                ran.append(name)
                if hold is not None:
                    await hold.wait()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(handler, "held", held, release)
            nursery.start_soon(handler, "later", later)
            await trio.testing.wait_all_tasks_blocked()
            assert held.claimed and later.claimed and not stranded.claimed
            queue.give_back(held)  # the transport answered: a claimed place stays its handler's
            queue.give_back(later)  # waiting, but claimed: it keeps its place too
            assert queue.line("cap") == [held, stranded, later]
            queue.give_back(stranded)  # its call ended without claiming it (bad arguments)
            assert queue.line("cap") == [held, later]
            release.set()
        assert queue.line("cap") == []
        # A ticket is claimed once, and only in its own capsule's line.
        other = queue.reserve("elsewhere", "other")
        async with queue.turn("cap", "fresh", ticket=other) as got:
            assert got is not other and got.capsule_id == "cap"
        queue.give_back(other)

    trio.run(main)
    assert ran == ["held", "later"]


def test_an_exec_that_fails_holding_its_turn_is_told_as_failed() -> None:
    # Found in a trial: an exec the helper refused (its capsule frozen by forks) showed in
    # ccw watch and ccw ui as started and never ended, as if it still ran.
    from sandbox.errors import CcwError

    told: list[tuple[str, str, str | None]] = []
    queue = CapsuleQueue(observer=lambda what, _capsule, ticket: told.append((what, ticket.label, ticket.failed)))

    async def main() -> None:
        try:
            async with queue.turn("cap", EXEC.label + " `pytest`"):
                raise CcwError("CONFLICT", "capsule cap has forks")
        except CcwError:
            pass
        async with queue.turn("cap", EXEC.label + " `true`"):
            pass  # ended well: its end is its run's (run.finished), not a turn event

    trio.run(main)
    assert told == [("started", "exec `pytest`", None), ("failed", "exec `pytest`", "CONFLICT: capsule cap has forks"),
                    ("started", "exec `true`", None)]
