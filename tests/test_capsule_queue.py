"""Capsule turns (mcp_server/capsules/turns.py): arrival order, places taken on arrival,
cancellation while waiting, and the reports a waiting call gets."""

from __future__ import annotations

import trio
import trio.testing

from mcp_server.capsules.turns import CapsuleQueue, Ticket, turn_label


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
    assert turn_label("capsule_exec", {"cmd": ["pytest", "-q", "tests/a b.py"]}) == "exec `pytest -q 'tests/a b.py'`"
    assert turn_label("capsule_exec", {"cmd": ["x" * 100]}).endswith("…`")
    assert turn_label("capsule_destroy", {"capsule_id": "cap_1"}) == "destroy"
