"""One forwarded request's exchange, plain or read out of terminated TLS (egress/proxy.py, egress/tlsterm.py).

The request's head has been judged and sent upstream; ``Exchange`` then sends its body
(re-framed by h11, each piece scanned for placeholders when the capsule holds secrets;
a request without one, read whole with its head, needs no task beside the response's)
and relays the response: its head rewritten without hop-by-hop headers and with
``Connection: close``, its body raw until the upstream closes (spliced when both ends
are sockets: ``splice.copy_to_eof``), or through a ``Masker`` when values went in.
Interim heads (``100 Continue``, ``103``) pass first, each as a head of its own, so the
final response behind them is judged as any other.
A request to a bound host asks for no coding, and a masked response must be one the
masker can read (egress/maskedbody.py says why).
Both ends are ``relay.Wire``s: a socket, or a TLS stream (``tlsterm.TlsWire``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import h11
import trio

from mcp_server.egress import maskedbody, tlsbody
from mcp_server.egress.credentials import Credentials, Masker
from mcp_server.egress.relay import (
    BUFFER_SIZE,
    Attempt,
    Budget,
    ByteCapReached,
    Wire,
    charge_and_send,
    pump,
    send_all,
)
from mcp_server.egress.splice import copy_to_eof
from mcp_server.egress.tlsterm import TlsWire

MAX_HEAD = 64 * 1024
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authorization",
        b"proxy-authenticate",
        b"te",
        b"trailer",
        b"upgrade",
    }
)


def response(status: int, reason: str, body: str = "") -> bytes:
    """A complete ``Connection: close`` response with a text/plain body."""
    data = body.encode("utf-8", "replace")
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + data



def connection_tokens(headers: list[tuple[bytes, bytes]]) -> set[bytes]:
    tokens = set(HOP_BY_HOP)
    for name, value in headers:
        if name == b"connection":
            tokens.update(token.strip().lower() for token in value.split(b","))
    return tokens



def close_delimited(head: bytes, head_only: bool) -> bool:
    """Whether the body after a response ``head`` (as the jail gets it) ends only where the
    connection does: no Content-Length and no chunked coding, and a status and request that
    have a body (RFC 9112 6.3).  Only such a body can be cut without the client knowing."""
    if no_body(head, head_only):
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length" or (name == b"transfer-encoding" and b"chunked" in value.lower()):
            return False
    return True


def no_body(head: bytes, head_only: bool) -> bool:
    """Whether a response ``head`` has no body whatever its headers say: an answer to HEAD,
    1xx, 204, 304 (RFC 9112 6.3)."""
    status = head.split(b"\r\n", 1)[0].split(b" ", 2)
    return head_only or len(status) < 2 or status[1][:1] == b"1" or status[1] in (b"204", b"304")


def content_length(head: bytes) -> int | None:
    """A response head's Content-Length, if it has one that reads as a number."""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value) if value.strip().isdigit() else None
    return None


def rewrite_response_head(head: bytes, close: bool = True) -> bytes:
    """An upstream response head (through its blank line) with hop-by-hop headers out, and
    ``Connection: close`` added unless ``close`` is False (an interim 1xx's: ``interim``)."""
    lines = head[:-4].split(b"\r\n")
    status, fields = lines[0], lines[1:]
    if not status.startswith(b"HTTP/"):
        raise ValueError(f"not an HTTP response: {status[:60]!r}")
    parsed: list[tuple[bytes, bytes]] = []
    for line in fields:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip():
            raise ValueError(f"bad response header line {line[:60]!r}")
        parsed.append((name.lower(), value.strip()))
    drop = connection_tokens(parsed)
    kept = [line for line, (name, _) in zip(fields, parsed, strict=True) if name not in drop]
    return b"\r\n".join([status, *kept, *([b"Connection: close"] if close else []), b"", b""])


def interim(head: bytes) -> bool:
    """Whether a response ``head`` is an interim one (RFC 9110 15.2: ``100 Continue``, ``103 Early
    Hints``), with the request's final response still to follow on the connection.  101 is not:
    the proxy drops ``Upgrade``, and the bytes after a 101 are no longer HTTP."""
    status = head.split(b"\r\n", 1)[0].split(b" ", 2)
    return len(status) >= 2 and len(status[1]) == 3 and status[1][:1] == b"1" and status[1] != b"101"



async def reply(sock: Wire, data: bytes) -> None:
    with contextlib.suppress(OSError), trio.move_on_after(5):
        await send_all(sock, data)



def early_body(conn: h11.Connection) -> list[object]:
    """The request body's events already read with its head (h11 has them buffered): judged
    before the head goes, then sent first.  Ends at the first that is not Data."""
    early: list[object] = []
    while (event := conn.next_event()) is not h11.NEED_DATA:
        early.append(event)
        if not isinstance(event, h11.Data):
            break
    return early


def trailers_attempt(creds: Credentials, event: object) -> str | None:
    """The refusal's reason if a chunked request body's trailers (h11's ``EndOfMessage`` headers)
    carry a placeholder: h11 sends them on after the body, and nothing swaps one there, so they
    are judged as the body is (a placeholder in one went upstream unrecorded)."""
    if not isinstance(event, h11.EndOfMessage) or not event.headers:
        return None
    return creds.body_attempt(b"".join(b"%s: %s\r\n" % pair for pair in event.headers), "the trailers")


class Exchange:
    """One forwarded request: its body upstream (re-framed by h11), the response back raw."""

    def __init__(self, sock: Wire, conn: h11.Connection,
                 upstream: Wire, outgoing: h11.Connection, attempt: Attempt,
                 budget: Budget) -> None:
        self.sock, self.conn, self.upstream, self.outgoing = sock, conn, upstream, outgoing
        self.attempt, self.budget = attempt, budget
        self.answered = False
        self.creds: Credentials | None = None  # scans the body for placeholders
        self.masker: Masker | None = None  # masks the values put in, echoed
        self.refuse: Callable[[str], None] | None = None  # records a placeholder in the body
        self.early: list[object] = []  # body events read before the head went (_early_body)
        self.sent = False  # the request's body is all sent upstream
        self.head_only = False  # a HEAD request's: its response has no body whatever its head says
        self.delimited_by_close = False  # the response's body ends with the connection (``close_delimited``)
        self.short = False  # a masked body, its length gone from the jail's head, short of the upstream's

    async def run(self, head: bytes) -> None:
        ended = capped = False  # the response relayed to the upstream's end of it; cut by the byte cap
        if self.creds is not None and self.creds.binds(self.attempt.host, self.attempt.port):
            # A value in it or not: a bound host's answers stay readable (and whole, with one in it).
            head = maskedbody.identity_head(head, valued=self.masker is not None)
        try:
            await charge_and_send(self.upstream, head, self.attempt, self.budget, outbound=True)
            if self._bodiless():
                await self._request_body()  # its end only: nothing to wait for, no task to start
                await self._response()
            else:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._request_body)
                    await self._response()
                    nursery.cancel_scope.cancel()
            ended = not isinstance(self.upstream, TlsWire) or self.upstream.peer_closed
        except* UpstreamGarbage as group:
            if self.attempt.reason is None:  # the record says why the jail got no answer (a refusal's stays)
                self.attempt.reason = str(group.exceptions[0])
            if not self.answered:
                await reply(self.sock, response(502, "Bad Gateway", f"ccw: {group.exceptions[0]}\n"))
        except* PlaceholderInBody as group:
            if not self.answered:
                await reply(self.sock, response(403, "Forbidden", f"ccw: {group.exceptions[0]}\n"))
        except* ByteCapReached:
            capped = True  # the record keeps the bytes so far and the cut; both sides close
        except* (OSError, h11.ProtocolError):
            pass  # as for the cap
        finally:
            self.upstream.close()
            cut = capped or self.short or (self.delimited_by_close and not ended)
            if isinstance(self.sock, TlsWire) and self.answered and cut:
                # A response the byte cap cut, or one whose body the close delimits and that did not
                # end with the upstream's close_notify (a reset, a bare close: a cut on its network
                # looks so), ends the jail's TLS without one too: the client must be able to tell
                # it from a whole body, as it could end to end.  A framed body's end is its
                # framing's (a short one the client sees as short): close_notify still follows it,
                # as strict clients (GnuTLS's, in git) want even after a server that closes without
                # one (Python's ssl does).
                self.sock.cut = True

    def _bodiless(self) -> bool:
        """Whether the request's next event is its end (a GET's, most often): read with its head, so
        sending its body is sending nothing, or a chunked body's last chunk, and it needs no task
        beside the response's."""
        if not self.early:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                return False
            self.early.append(event)
        return isinstance(self.early[0], h11.EndOfMessage)

    async def _request_body(self) -> None:
        while True:
            event = self.early.pop(0) if self.early else self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(await self.sock.recv(BUFFER_SIZE))
                continue
            if self.creds is not None:
                why = (self.creds.body_attempt(bytes(event.data)) if isinstance(event, h11.Data)
                       else trailers_attempt(self.creds, event))
                if why is not None:
                    if self.refuse is not None:
                        self.refuse(why)
                    raise PlaceholderInBody(why)
            if isinstance(event, h11.Data | h11.EndOfMessage):
                data = self.outgoing.send(event)
                if data:
                    await charge_and_send(self.upstream, data, self.attempt, self.budget, outbound=True)
            if not isinstance(event, h11.Data):
                self.sent = True  # nothing more reads the jail or writes the upstream (``_response``)
                return  # EndOfMessage, or the client closed

    async def _head(self, received: bytearray) -> tuple[bytes, bytearray]:
        """The next response head, rewritten (an interim one keeps no ``Connection: close``), and
        the bytes read after it."""
        while (end := received.find(b"\r\n\r\n")) == -1:
            if len(received) > MAX_HEAD:
                raise UpstreamGarbage(f"response head over {MAX_HEAD} bytes")
            try:
                data = await self.upstream.recv(MAX_HEAD)
            except OSError as exc:  # a reset: the jail gets a 502 saying so, not an empty close
                raise UpstreamGarbage(f"the upstream's connection failed before its answer: {exc}") from None
            if not data:
                raise UpstreamGarbage("the upstream closed without a response")
            received += data
        raw = bytes(received[: end + 4])
        try:
            return rewrite_response_head(raw, close=not interim(raw)), received[end + 4 :]
        except ValueError as exc:
            raise UpstreamGarbage(str(exc)) from None

    async def _response(self) -> None:
        head, rest = await self._head(bytearray())
        # Each interim answer (a 100 Continue, a 103) passes as a head of its own: the final one
        # behind it is judged as any (its coding, its chunks unmasked), not passed on as a body.
        while interim(head):
            shown = head if self.masker is None else self.masker.feed(head) + self.masker.close()
            await charge_and_send(self.sock, shown, self.attempt, self.budget, outbound=False)
            head, rest = await self._head(rest)
        self.delimited_by_close = close_delimited(head, self.head_only)
        if self.masker is not None:
            await self._masked(head, bytes(rest), self.masker)
            return
        self.answered = True
        await charge_and_send(self.sock, head + bytes(rest), self.attempt,
                              self.budget, outbound=False)
        if isinstance(self.upstream, trio.socket.SocketType) and isinstance(self.sock, trio.socket.SocketType):
            await copy_to_eof(self.upstream, self.sock, self.attempt, self.budget, outbound=False)
        elif isinstance(self.upstream, TlsWire) and isinstance(self.sock, TlsWire) and self.sent:
            await tlsbody.copy_to_eof(self.upstream, self.sock, self.attempt, self.budget)  # in a thread
        else:  # TLS at one end, or the request's body still going: no splice, no thread
            await pump(self.upstream, self.sock, self.attempt, self.budget, outbound=False)

    async def _masked(self, head: bytes, first: bytes, masker: Masker) -> None:
        """The response with each value put in the request masked back to its placeholder.
        A masked echo may change the body's length (a placeholder longer than a short
        value): its Content-Length goes, and the close ends the body (the proxy's, once the
        upstream's length has come), or its chunks do (``_rechunked``).  A body the masker
        cannot read (compressed) is refused, recorded, and none of it passes."""
        bodiless = no_body(head, self.head_only)
        why = None if bodiless else maskedbody.unreadable(head)
        if why is not None:
            if self.refuse is not None:
                self.refuse(why)
            raise UpstreamGarbage(why)
        framed = not bodiless and maskedbody.chunked(head)
        length = None if framed else content_length(head)
        # The jail's head loses the length that framed the upstream's body, so a body short of it
        # ends where the connection does, and must read as cut (``run``) until it is whole.
        self.short = bool(length)
        masked = masker.feed(head) + masker.close()
        head = b"\r\n".join(line for line in masked.split(b"\r\n") if not line.lower().startswith(b"content-length:"))
        self.answered = True
        if framed:
            await self._rechunked(head, first, masker)
            return
        if bodiless:  # whatever its length says, nothing follows the head: the answer is whole
            self.short = False
            await charge_and_send(self.sock, head, self.attempt, self.budget, outbound=False)
            return
        # The jail's close ends the body: once the upstream's length has come it is whole, and an
        # upstream that keeps its connection past it (``Connection: close`` ignored) is not waited
        # for; bytes past the length are no part of this answer.
        body, data = 0, first
        while True:
            data = data if length is None else data[: length - body]
            body += len(data)
            self.short = body < (length or 0)
            await charge_and_send(self.sock, head + masker.feed(data), self.attempt, self.budget, outbound=False)
            head = b""
            if (length is not None and body >= length) or not (data := await self.upstream.recv(BUFFER_SIZE)):
                break
        await charge_and_send(self.sock, masker.close(), self.attempt, self.budget, outbound=False)

    async def _rechunked(self, head: bytes, first: bytes, masker: Masker) -> None:
        """A chunked body out of its chunks, masked, and chunked again: the upstream's chunk
        boundaries may split a value.  Its trailers go; a body the upstream did not end
        gets no last chunk, and reads as cut (``run``)."""
        self.short = True  # until the upstream's last chunk
        chunks = maskedbody.Dechunker()
        await charge_and_send(self.sock, head, self.attempt, self.budget, outbound=False)
        data = first
        while True:
            try:
                out = maskedbody.chunk(masker.feed(chunks.feed(data)))
            except ValueError as exc:
                raise UpstreamGarbage(str(exc)) from None
            if chunks.done:
                self.short = False
                out += maskedbody.chunk(masker.close()) + maskedbody.LAST_CHUNK
            await charge_and_send(self.sock, out, self.attempt, self.budget, outbound=False)
            if chunks.done or not (data := await self.upstream.recv(BUFFER_SIZE)):
                break
        if self.short:  # the held bytes, a value's beginning as its placeholder's (``ResponseMasker.close``)
            await charge_and_send(self.sock, maskedbody.chunk(masker.close()), self.attempt, self.budget,
                                  outbound=False)


class UpstreamGarbage(Exception):
    """The upstream's answer is not an HTTP response the proxy can pass on."""


class PlaceholderInBody(Exception):
    """A request body carries a placeholder: the request ends, refused and recorded."""
