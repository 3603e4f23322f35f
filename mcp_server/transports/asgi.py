"""ASGI plumbing that ccw's two HTTP servers share: the MCP transport (``transports/http.py``)
and ``ccw ui``'s dashboard (``ui/server.py``), both served on trio by hypercorn.

Nothing here knows MCP, tokens or routes: reading a request's body with a bound,
handing a body already read back to the next app, answering with JSON, refusing a
request so that its connection stays usable, and the lifespan protocol.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import trio

from mcp_server import framing

CLOSE = (b"connection", b"close")
REFUSED_BODY_MAX = 64 * 1024  # a refused request's body is read this far to keep its connection (``refuse``)
REFUSED_BODY_S = 5.0  # and for at most this long (hypercorn's keep_alive_timeout, which bounds a slow head)


async def read_body(receive: Any, limit: int) -> tuple[bytes | None, bytes | None]:
    """(body, None), or (None, head) when the body exceeds ``limit``: the rest is drained."""
    chunks = bytearray()
    too_big = False
    head = b""
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return (None, head) if too_big else (bytes(chunks), None)
        if not too_big:
            chunks += message.get("body", b"")
            if len(chunks) > limit:
                too_big, head = True, bytes(chunks[: framing.HEAD_SCAN])
                chunks.clear()
        if not message.get("more_body", False):
            return (None, head) if too_big else (bytes(chunks), None)


def replay(body: bytes, receive: Any) -> Any:
    """A ``receive`` that gives ``body`` (already read) as the whole request, then what ``receive`` gives."""
    pending = deque([{"type": "http.request", "body": body, "more_body": False}])

    async def replayed() -> dict[str, Any]:
        if pending:
            return pending.popleft()
        return await receive()

    return replayed


async def refuse(receive: Any, send: Any, status: int, payload: Any,
                 extra: list[tuple[bytes, bytes]] | None = None) -> None:
    """Answer a request refused before reading it, once its body is read.

    hypercorn keeps a connection for the next request only if it has read the whole of
    this one when the answer ends; otherwise it closes it, without saying so, and a
    client that has meanwhile sent its next request on it (httpx reuses a connection
    as soon as an answer is complete) sees "Server disconnected without sending a
    response".  Under load, a client's small POST body arriving after its headers made
    that happen to about 1 in 200 refused requests.  So the body is read, up to
    ``REFUSED_BODY_MAX``; a larger one is left unread and the answer says
    ``Connection: close``, which the client heeds.  So is one still coming after
    ``REFUSED_BODY_S``: whoever is refused holds no token, and a body trickled a byte at a
    time held its connection, and one of the server's descriptors, for as long as the
    sender liked (a thousand such, from any local user, left no descriptor to accept with).
    """
    whole = False
    with trio.move_on_after(REFUSED_BODY_S):
        whole = await _drain(receive, REFUSED_BODY_MAX)
    await respond(send, status, payload, [*(extra or []), *([] if whole else [CLOSE])])


async def _drain(receive: Any, limit: int) -> bool:
    """Read and drop a request's body; whether all of it was read before ``limit`` bytes passed."""
    seen = 0
    while seen <= limit:
        message = await receive()
        if message["type"] != "http.request":  # the client went away: nothing to keep
            return False
        seen += len(message.get("body", b""))
        if not message.get("more_body", False):
            return True
    return False


async def respond(send: Any, status: int, payload: Any, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    """Answer with ``payload`` as JSON (no body when None) and the ``extra`` headers."""
    body = b"" if payload is None else framing.dumps(payload)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": body})


async def lifespan(receive: Any, send: Any) -> None:
    """Answer the ASGI lifespan protocol: nothing to start or stop."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
