"""The HTTP proxy the jail reaches at 10.99.0.1:3128: CONNECT tunnels and plain requests.

- ``CONNECT host:port``: the gate decides, the proxy connects, answers ``200`` and then
  relays bytes untouched both ways (TLS stays end to end; the record is ``https``).
- Absolute-form requests (``GET http://host:port/path``): forwarded with the
  origin-form request line, ``Host`` from the URL, hop-by-hop headers dropped and
  ``Connection: close``; the response head gets the same treatment and its body is
  relayed raw until the upstream closes (record ``http``).  One request per
  connection: the proxy says ``Connection: close`` both ways, so a client never sends a
  second request that would travel to the first one's host.
- Denied: ``403`` with a text/plain body "ccw: <reason>; allowed: <rules>".  Upstream
  failures: ``502`` with the error.  Requests h11 cannot parse, request heads over
  64 KiB or not complete within the gate's ``header_timeout``: ``400`` (or a close,
  when the client has gone), and the session goes on.

The request is parsed with h11 (it comes with hypercorn); response heads with the small
bounded parser below, since the body after it is relayed as raw bytes (no per-chunk
parsing on the download path).

Credentials (issue 38): a session holding a capsule's secrets (egress/credentials.py)
has each plain request's head judged before the upstream is connected: placeholders
swapped for values where their bindings allow, the response's echoes of a value masked,
and a placeholder anywhere else a ``403`` recorded as an exfiltration attempt.  Its
reverse routes (``GET /route/NAME/...`` sent to the proxy itself) reach a secret's bound
upstream with the value added.  CONNECT tunnels are never looked into.

Throughput (2-core VM, loopback, 200 MiB): the figures are in ``splice.py``.
"""

from __future__ import annotations

import contextlib
import urllib.parse
from collections.abc import Awaitable, Callable

import h11
import trio

from mcp_server.core.secretbind import host_text
from mcp_server.egress import ruled
from mcp_server.egress.credentials import ROUTE, Carrier, Credentials, Masker
from mcp_server.egress.relay import (
    BUFFER_SIZE,
    Attempt,
    Budget,
    ByteCapReached,
    Gate,
    Protocol_,
    Refused,
    charge_and_send,
    send_all,
)
from mcp_server.egress.splice import copy_to_eof, tunnel

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


class BadRequest(Exception):
    """A request the proxy will not forward; the message goes into the 400."""


def response(status: int, reason: str, body: str = "") -> bytes:
    """A complete ``Connection: close`` response with a text/plain body."""
    data = body.encode("utf-8", "replace")
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + data


def split_authority(text: str, default_port: int | None) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or ``host`` (with ``default_port``) -> (host, port)."""
    if text.startswith("["):
        close = text.find("]")
        if close == -1:
            raise BadRequest(f"bad authority {text!r}")
        host, rest = text[1:close], text[close + 1 :]
        if rest and not rest.startswith(":"):
            raise BadRequest(f"bad authority {text!r}")
        port_text = rest[1:] if rest else None
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    elif ":" in text:
        raise BadRequest(f"bad authority {text!r}: IPv6 goes in brackets")
    else:
        host, port_text = text, None
    if port_text is None:
        if default_port is None:
            raise BadRequest(f"{text!r} has no port")
        return host, default_port
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise BadRequest(f"bad port in {text!r}")
    return host, int(port_text)


def _connection_tokens(headers: list[tuple[bytes, bytes]]) -> set[bytes]:
    tokens = set(HOP_BY_HOP)
    for name, value in headers:
        if name == b"connection":
            tokens.update(token.strip().lower() for token in value.split(b","))
    return tokens


def forward_headers(headers: list[tuple[bytes, bytes]], authority: bytes) -> list[tuple[bytes, bytes]]:
    """The request headers to send upstream: hop-by-hop out, Host from the URL, close."""
    drop = _connection_tokens(headers) | {b"host"}
    kept = [(name, value) for name, value in headers if name not in drop]
    return [(b"host", authority), *kept, (b"connection", b"close")]


def rewrite_response_head(head: bytes) -> bytes:
    """An upstream response head (through its blank line) with hop-by-hop headers out."""
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
    drop = _connection_tokens(parsed)
    kept = [line for line, (name, _) in zip(fields, parsed, strict=True) if name not in drop]
    return b"\r\n".join([status, *kept, b"Connection: close", b"", b""])


async def _read_request(sock: trio.socket.SocketType, conn: h11.Connection) -> h11.Request | None:
    """The request head, or None if the client closed before sending one."""
    received = 0
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            # h11's own limit only applies while an event is incomplete; a head that
            # arrives whole in one large read would pass it, so count here too.
            if received >= MAX_HEAD:
                raise BadRequest(f"request head over {MAX_HEAD} bytes")
            data = await sock.recv(16 * 1024)
            received += len(data)
            conn.receive_data(data)
            continue
        if isinstance(event, h11.Request):
            return event
        return None


async def handle_http(gate: Gate, sock: trio.socket.SocketType) -> None:
    """Serve one client connection of the HTTP proxy, then close it."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    try:
        with trio.move_on_after(gate.header_timeout) as deadline:
            request = await _read_request(sock, conn)
        if deadline.cancelled_caught:
            await _reply(sock, response(408, "Request Timeout", "ccw: request head not complete in time"))
            return
        if request is None:
            return
        if request.method == b"CONNECT":
            await _connect(gate, sock, conn, request)
        else:
            await _forward(gate, sock, conn, request)
    except (h11.RemoteProtocolError, BadRequest) as exc:
        await _reply(sock, response(400, "Bad Request", f"ccw: {exc}"))
    except OSError:
        pass  # the client went away; nothing to answer
    finally:
        sock.close()


async def _reply(sock: trio.socket.SocketType, data: bytes) -> None:
    with contextlib.suppress(OSError), trio.move_on_after(5):
        await send_all(sock, data)


# Judges an admitted attempt before it connects: None, or why it is refused (credentials).
Check = Callable[[Attempt], Awaitable[str | None]]


async def _open(gate: Gate, sock: trio.socket.SocketType, host: str, port: int,
                protocol: Protocol_, check: Check | None = None) -> tuple[Attempt, trio.socket.SocketType] | None:
    """Admit, ``check`` and connect, or answer 403/502 and return None."""
    attempt = await gate.consider(gate.admit(host, port, protocol))
    if not attempt.allowed:
        await _reply(sock, response(403, "Forbidden", f"ccw: {attempt.reason}; allowed: {gate.allowed_text()}"))
        return None
    why = None if check is None else await check(attempt)
    if why is not None:
        assert isinstance(gate, Carrier | ruled.Ruled)  # only a carrier's or a ruled gate's requests are checked
        gate.refuse(attempt, why)
        await _reply(sock, response(403, "Forbidden", f"ccw: {why}"))
        return None
    try:
        return attempt, await gate.open(attempt)
    except Refused as exc:
        if exc.denied:
            await _reply(sock, response(403, "Forbidden", f"ccw: {exc.message}; allowed: {gate.allowed_text()}"))
        else:
            await _reply(sock, response(502, "Bad Gateway", f"ccw: {exc.message}"))
        return None


async def _connect(gate: Gate, sock: trio.socket.SocketType, conn: h11.Connection,
                   request: h11.Request) -> None:
    host, port = split_authority(request.target.decode("ascii", "replace"), None)

    async def unread(attempt: Attempt) -> str | None:  # a host with method/path rules is never tunnelled
        return ruled.unread(gate, attempt)

    opened = await _open(gate, sock, host, port, "https", unread)
    if opened is None:
        return
    attempt, upstream = opened
    while conn.next_event() not in (h11.PAUSED, h11.NEED_DATA):
        pass  # the CONNECT's EndOfMessage; what follows is the tunnel's
    early, _closed = conn.trailing_data
    try:
        await send_all(sock, b"HTTP/1.1 200 Connection established\r\n\r\n")
    except OSError:
        upstream.close()
        raise
    await tunnel(sock, upstream, attempt, gate.budget, bytes(early))


def _credentials(gate: Gate) -> Credentials | None:
    return gate.credentials if isinstance(gate, Carrier) else None


def _target(request: h11.Request, creds: Credentials | None, own: str) -> tuple[str, str, str | None]:
    """Where a plain request goes: its authority, its origin-form target, and the secret
    whose reverse route it came by, if it did (``/route/NAME/...``: the value is added, not swapped in), sent
    to the proxy itself in origin form or, by a client that honours HTTP_PROXY, in
    absolute form naming the proxy's own address ``own``."""
    target = request.target
    if target.startswith(b"http://" + own.encode() + ROUTE):
        target = target[len(b"http://") + len(own):]
    routed = None if creds is None else creds.route(target)
    if routed is not None:
        name, host, port, origin = routed
        if port == 443:
            raise BadRequest(f"route {name}: its secret is bound to {host}:443 (https); reverse routes reach "
                             "plain http upstreams only so far: bind the secret to the host's http port too")
        return host_text(host, port), origin.decode("ascii"), name
    url = urllib.parse.urlsplit(request.target.decode("ascii", "replace"))
    if url.scheme != "http" or not url.netloc:
        raise BadRequest(
            "this is a proxy: send CONNECT host:port, or an absolute http:// URL "
            f"(got {request.target[:80]!r})"
        )
    return url.netloc.rpartition("@")[2], (url.path or "/") + (f"?{url.query}" if url.query else ""), None


async def _forward(gate: Gate, sock: trio.socket.SocketType, conn: h11.Connection,
                   request: h11.Request) -> None:
    creds = _credentials(gate)
    own = host_text(*sock.getsockname()[:2])  # the proxy's address as the jail reached it
    authority, origin, routed = _target(request, creds, own)
    host, port = split_authority(authority, 80)
    headers = forward_headers(list(request.headers), authority.encode("ascii"))
    if routed is not None:
        assert creds is not None
        origin, headers = creds.routed(routed, origin, headers)
    outgoing = h11.Connection(h11.CLIENT)
    head = outgoing.send(h11.Request(method=request.method, target=origin.encode("ascii"), headers=headers))
    assert head is not None
    masker: Masker | None = None
    early = _early_body(conn) if creds is not None else []

    async def swap(attempt: Attempt) -> str | None:
        nonlocal head, masker
        assert creds is not None
        why = creds.body_attempt(b"".join(bytes(event.data) for event in early if isinstance(event, h11.Data)))
        if why is not None or not creds.carries(head):
            return why  # a placeholder in the body's first bytes; or none anywhere, nothing to judge
        judged = await trio.to_thread.run_sync(creds.judge, head, attempt.host, attempt.port)
        head, masker = judged.head or b"", judged.masker
        return judged.reason

    async def check(attempt: Attempt) -> str | None:  # method/path rules first (egress/ruled.py), then secrets
        why = ruled.refusal(gate, attempt, "http", request.method, origin)
        return why if why is not None or creds is None else await swap(attempt)

    opened = await _open(gate, sock, host, port, "http", check)
    if opened is None:
        return
    attempt, upstream = opened
    exchange = _Exchange(sock, conn, upstream, outgoing, attempt, gate.budget)
    if creds is not None:
        assert isinstance(gate, Carrier)
        exchange.creds, exchange.masker = creds, masker
        exchange.refuse = lambda why: gate.refuse(attempt, why)
        exchange.early = early
    await exchange.run(head)


def _early_body(conn: h11.Connection) -> list[object]:
    """The request body's events already read with its head (h11 has them buffered): judged
    before the head goes, then sent first.  Ends at the first that is not Data."""
    early: list[object] = []
    while (event := conn.next_event()) is not h11.NEED_DATA:
        early.append(event)
        if not isinstance(event, h11.Data):
            break
    return early


class _Exchange:
    """One forwarded request: its body upstream (re-framed by h11), the response back raw."""

    def __init__(self, sock: trio.socket.SocketType, conn: h11.Connection,
                 upstream: trio.socket.SocketType, outgoing: h11.Connection, attempt: Attempt,
                 budget: Budget) -> None:
        self.sock, self.conn, self.upstream, self.outgoing = sock, conn, upstream, outgoing
        self.attempt, self.budget = attempt, budget
        self.answered = False
        self.creds: Credentials | None = None  # scans the body for placeholders
        self.masker: Masker | None = None  # masks the values put in, echoed
        self.refuse: Callable[[str], None] | None = None  # records a placeholder in the body
        self.early: list[object] = []  # body events read before the head went (_early_body)

    async def run(self, head: bytes) -> None:
        try:
            await charge_and_send(self.upstream, head, self.attempt, self.budget, outbound=True)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._request_body)
                await self._response()
                nursery.cancel_scope.cancel()
        except* UpstreamGarbage as group:
            if not self.answered:
                await _reply(self.sock, response(502, "Bad Gateway", f"ccw: {group.exceptions[0]}"))
        except* PlaceholderInBody as group:
            if not self.answered:
                await _reply(self.sock, response(403, "Forbidden", f"ccw: {group.exceptions[0]}"))
        except* (ByteCapReached, OSError, h11.ProtocolError):
            pass  # the record keeps the bytes so far and any cut; both sides close
        finally:
            self.upstream.close()

    async def _request_body(self) -> None:
        while True:
            event = self.early.pop(0) if self.early else self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(await self.sock.recv(BUFFER_SIZE))
                continue
            if isinstance(event, h11.Data) and self.creds is not None:
                why = self.creds.body_attempt(bytes(event.data))
                if why is not None:
                    if self.refuse is not None:
                        self.refuse(why)
                    raise PlaceholderInBody(why)
            if isinstance(event, h11.Data | h11.EndOfMessage):
                data = self.outgoing.send(event)
                if data:
                    await charge_and_send(self.upstream, data, self.attempt, self.budget, outbound=True)
            if not isinstance(event, h11.Data):
                return  # EndOfMessage, or the client closed

    async def _response(self) -> None:
        received = bytearray()
        while (end := received.find(b"\r\n\r\n")) == -1:
            if len(received) > MAX_HEAD:
                raise UpstreamGarbage(f"response head over {MAX_HEAD} bytes")
            data = await self.upstream.recv(MAX_HEAD)
            if not data:
                raise UpstreamGarbage("the upstream closed without a response")
            received += data
        try:
            head = rewrite_response_head(bytes(received[: end + 4]))
        except ValueError as exc:
            raise UpstreamGarbage(str(exc)) from None
        if self.masker is not None:
            await self._masked(head, bytes(received[end + 4 :]), self.masker)
            return
        self.answered = True
        await charge_and_send(self.sock, head + bytes(received[end + 4 :]), self.attempt,
                              self.budget, outbound=False)
        await copy_to_eof(self.upstream, self.sock, self.attempt, self.budget, outbound=False)

    async def _masked(self, head: bytes, first: bytes, masker: Masker) -> None:
        """The response with each value put in the request masked back to its placeholder.
        A masked echo may change the body's length (a placeholder longer than a short
        value): its Content-Length goes, and the close ends the body."""
        masked = masker.feed(head) + masker.close()
        head = b"\r\n".join(line for line in masked.split(b"\r\n") if not line.lower().startswith(b"content-length:"))
        self.answered = True
        await charge_and_send(self.sock, head + masker.feed(first), self.attempt, self.budget, outbound=False)
        while data := await self.upstream.recv(BUFFER_SIZE):
            await charge_and_send(self.sock, masker.feed(data), self.attempt, self.budget, outbound=False)
        await charge_and_send(self.sock, masker.close(), self.attempt, self.budget, outbound=False)


class UpstreamGarbage(Exception):
    """The upstream's answer is not an HTTP response the proxy can pass on."""


class PlaceholderInBody(Exception):
    """A request body carries a placeholder: the request ends, refused and recorded."""
