"""mcp_server/transports/holdings.py: what a revoked credential holds is cut (its requests in
flight) or handed over to be ended (its sessions), and nothing of another credential is; the
book of sessions forgets one only when nothing of it was in flight for the SDK's idle time."""

from __future__ import annotations

import trio
import trio.testing

from mcp_server.auth import Principal
from mcp_server.transports.holdings import Holdings

OLD = Principal("local", frozenset({"admin"}), "old-key")
NEW = Principal("local", frozenset({"admin"}), "new-key")  # the same name, rotated: another credential
OTHER = Principal("ci", frozenset({"exec"}), "ci-key")


def test_revoking_cuts_that_credentials_requests_and_hands_over_its_sessions() -> None:
    async def main() -> None:
        book = Holdings()
        book.opened("s-old", OLD, frozenset({"old-key", "ci-key"}))
        book.opened("s-ci", OTHER, frozenset({"old-key", "ci-key"}))
        outcome: dict[str, bool] = {}

        async def request(name: str, principal: Principal, is_stream: bool, session: str | None) -> None:
            with book.hold(principal, is_stream, session) as held:
                await trio.sleep_forever()
            outcome[name] = held.cancelled_caught

        async with trio.open_nursery() as nursery:
            nursery.start_soon(request, "old stream", OLD, True, "s-old")
            nursery.start_soon(request, "old direct call", OLD, False, None)
            nursery.start_soon(request, "ci call", OTHER, False, "s-ci")
            await trio.testing.wait_all_tasks_blocked()
            assert not book.wake.is_set()
            book.revoke(frozenset({"old-key"}))
            await trio.testing.wait_all_tasks_blocked()
            assert outcome == {"old stream": True, "old direct call": True}
            assert book.wake.is_set()
            assert book.take_ending() == [("s-old", OLD)]
            assert not book.wake.is_set() and book.take_ending() == []
            book.revoke(frozenset({"old-key"}))  # nothing left of it: no wake
            assert not book.wake.is_set()
            nursery.cancel_scope.cancel()
        assert book.sessions() == {"s-ci": "ci"}

    trio.run(main)


def test_a_session_opened_as_its_credential_was_revoked_is_ended_at_once() -> None:
    # The race: initialize admitted with the old token, answered after the rotation was seen.
    async def main() -> None:
        book = Holdings()
        book.opened("late", OLD, admitted=frozenset({"new-key"}))
        assert book.wake.is_set() and book.take_ending() == [("late", OLD)]
        assert book.sessions() == {}

    trio.run(main)


def test_the_book_forgets_a_session_only_after_the_sdks_idle_time_with_nothing_in_flight() -> None:
    async def main() -> None:
        book = Holdings()
        admitted = frozenset({"old-key", "new-key"})
        book.opened("idle", OLD, admitted)
        book.opened("streaming", OLD, admitted)
        book.opened("stolen", OLD, admitted)

        async def stream() -> None:
            with book.hold(OLD, True, "streaming"):
                await trio.sleep_forever()

        async def other_credential() -> None:
            # The SDK answers 404 to another credential: its request keeps nothing alive.
            with book.hold(NEW, False, "stolen"):
                await trio.sleep_forever()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream)
            nursery.start_soon(other_credential)
            await trio.sleep(100)
            book.forget_idle(120)
            assert set(book.sessions()) == {"idle", "streaming", "stolen"}
            await trio.sleep(100)
            book.forget_idle(120)
            assert set(book.sessions()) == {"streaming"}  # an open GET stream holds its session
            nursery.cancel_scope.cancel()
        await trio.sleep(100)
        book.forget_idle(120)
        assert set(book.sessions()) == {"streaming"}  # idle since its stream ended, not before
        await trio.sleep(21)
        book.forget_idle(120)
        assert book.sessions() == {}

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_shutdown_cuts_only_the_event_streams() -> None:
    async def main() -> None:
        book = Holdings()
        cut: dict[str, bool] = {}

        async def request(name: str, is_stream: bool) -> None:
            with book.hold(OTHER, is_stream, None) as held:
                await trio.sleep(1)
            cut[name] = held.cancelled_caught

        async with trio.open_nursery() as nursery:
            nursery.start_soon(request, "stream", True)
            nursery.start_soon(request, "call", False)
            await trio.testing.wait_all_tasks_blocked()
            book.close_streams()
        assert cut == {"stream": True, "call": False}

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
