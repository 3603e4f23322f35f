"""mcp_server/transports/asgi.py on scripted ASGI messages: a body read up to its bound (a
larger one drained, its head kept), a body handed on as if unread, a refusal that reads the
body so the connection stays (``Connection: close`` when it would not), and lifespan."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from mcp_server import framing
from mcp_server.transports import asgi


def _receiver(*chunks: bytes, then: str = "http.disconnect") -> tuple[Any, list[dict[str, Any]]]:
    """A ``receive`` giving ``chunks`` as one request's body, then ``then``; and what it gave."""
    messages = [{"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
                for i, chunk in enumerate(chunks)]
    given: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        message = messages.pop(0) if messages else {"type": then}
        given.append(message)
        return message

    return receive, given


def _sender() -> tuple[Any, list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    return send, sent


def test_a_body_is_read_whole_within_its_bound_and_drained_past_it() -> None:
    receive, _ = _receiver(b'{"a":', b"1}")
    assert trio.run(asgi.read_body, receive, 10) == (b'{"a":1}', None)
    big = b"x" * (framing.HEAD_SCAN + 100)
    receive, given = _receiver(big[:50], big[50:], b"tail")
    assert trio.run(asgi.read_body, receive, 60) == (None, big[: framing.HEAD_SCAN])
    assert len(given) == 3  # all of it read, so the connection can serve the next request


def test_a_replayed_body_comes_first_then_what_the_client_sends() -> None:
    receive, _ = _receiver(then="http.disconnect")
    replayed = asgi.replay(b"read already", receive)

    async def main() -> list[dict[str, Any]]:
        return [await replayed(), await replayed()]

    assert trio.run(main) == [{"type": "http.request", "body": b"read already", "more_body": False},
                              {"type": "http.disconnect"}]


def test_a_refusal_reads_a_small_body_and_closes_after_a_large_one() -> None:
    async def refused(*chunks: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
        receive, _ = _receiver(*chunks)
        send, sent = _sender()
        await asgi.refuse(receive, send, 403, {"error": "no"}, [(b"x-why", b"test")])
        return sent[0], sent[1]

    start, body = trio.run(refused, b"small")
    assert start["status"] == 403 and (b"x-why", b"test") in start["headers"] and asgi.CLOSE not in start["headers"]
    assert body == {"type": "http.response.body", "body": framing.dumps({"error": "no"})}
    start, _ = trio.run(refused, *[b"y" * 1024] * (asgi.REFUSED_BODY_MAX // 1024 + 2))
    assert asgi.CLOSE in start["headers"]


def test_a_refusal_waits_for_a_trickled_body_only_so_long() -> None:
    # A byte every few seconds, forever: the refused sender holds no token, so it may not hold
    # the connection (and a descriptor of the server's) for as long as it keeps sending.
    async def trickle() -> dict[str, Any]:
        await trio.sleep(3)
        return {"type": "http.request", "body": b" ", "more_body": True}

    async def refused() -> tuple[float, list[dict[str, Any]]]:
        send, sent = _sender()
        with trio.move_on_after(3600):  # so a refusal that waits on ends this test as a failure
            await asgi.refuse(trickle, send, 401, {"error": "no token"})
        return trio.current_time(), sent

    took, sent = trio.run(refused, clock=trio.testing.MockClock(autojump_threshold=0))
    assert took <= 10 and sent and sent[0]["status"] == 401 and asgi.CLOSE in sent[0]["headers"], (took, sent)


def test_an_answer_without_a_payload_has_an_empty_body() -> None:
    send, sent = _sender()
    trio.run(asgi.respond, send, 202, None)
    assert (b"content-length", b"0") in sent[0]["headers"] and sent[1]["body"] == b""


def test_lifespan_answers_startup_and_ends_at_shutdown() -> None:
    steps = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]

    async def receive() -> dict[str, Any]:
        return steps.pop(0)

    send, sent = _sender()
    trio.run(asgi.lifespan, receive, send)
    assert [message["type"] for message in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
