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
  failures: ``502`` with the error.  Requests h11 cannot parse, or framed both by
  Content-Length and chunks (``_read_request``), request heads over 64 KiB or not complete
  within the gate's ``header_timeout``: ``400`` (or a close, when the client has gone),
  and the session goes on.

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

import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial

import h11
import trio

from mcp_server.core.netrules import normalize_host
from mcp_server.core.secretbind import host_text
from mcp_server.egress import ruled, tlsterm
from mcp_server.egress.credentials import (
    EXFILTRATION,
    ROUTE,
    Carrier,
    Credentials,
    LeafContexts,
    Masker,
)
from mcp_server.egress.exchange import (
    MAX_HEAD,
    Exchange,
    connection_tokens,
    early_body,
    reply,
    response,
    trailers_attempt,
)
from mcp_server.egress.exchange import (
    rewrite_response_head as rewrite_response_head,  # its tests' name
)
from mcp_server.egress.relay import (
    Attempt,
    Gate,
    Protocol_,
    Refused,
    Wire,
    send_all,
)
from mcp_server.egress.splice import tunnel


class BadRequest(Exception):
    """A request the proxy will not forward; the message goes into the 400."""



def unreadable(exc: Exception) -> str:
    """A 400's body for a request the proxy could not read.  h11 quotes the line it refused as a
    Python repr (``illegal header line: bytearray(b'...')``): the client is told which kind of
    line, in words, and not shown bytes it sent (a placeholder among them)."""
    text = str(exc)
    if isinstance(exc, h11.RemoteProtocolError) and text.startswith("illegal ") and ":" in text:
        text = text.split(":", 1)[0] + ": a bare CR or LF, or a byte HTTP does not allow there"
    return f"ccw: {text}\n"

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


def forward_headers(headers: list[tuple[bytes, bytes]], authority: bytes) -> list[tuple[bytes, bytes]]:
    """The request headers to send upstream: hop-by-hop out, Host from the URL, close."""
    drop = connection_tokens(headers) | {b"host"}
    kept = [(name, value) for name, value in headers if name not in drop]
    return [(b"host", authority), *kept, (b"connection", b"close")]


def dropped_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The request headers ``forward_headers`` does not send on (a placeholder there is judged:
    ``Credentials.dropped_attempt``)."""
    drop = connection_tokens(headers) | {b"host"}
    return [(name, value) for name, value in headers if name in drop]


async def _read_request(sock: Wire, conn: h11.Connection) -> h11.Request | None:
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
            framed = {name for name, _ in event.headers if name in (b"content-length", b"transfer-encoding")}
            if len(framed) == 2:
                # h11 frames the body by the chunks and would pass the length on beside them; an
                # upstream that reads the length instead takes the chunks' bytes as a next request,
                # one the method/path rules never judged (RFC 9112 6.3 asks a proxy to refuse or drop it).
                raise BadRequest("a request with both Content-Length and Transfer-Encoding: chunked can be read as "
                                 "two; send one of them")
            return event
        return None


async def handle_http(gate: Gate, sock: trio.socket.SocketType) -> None:
    """Serve one client connection of the HTTP proxy, then close it."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    try:
        with trio.move_on_after(gate.header_timeout) as deadline:
            request = await _read_request(sock, conn)
        if deadline.cancelled_caught:
            await reply(sock, response(408, "Request Timeout", "ccw: request head not complete in time\n"))
            return
        if request is None:
            return
        if request.method == b"CONNECT":
            await _connect(gate, sock, conn, request)
        else:
            await _forward(gate, sock, conn, request)
    except (h11.RemoteProtocolError, BadRequest) as exc:
        await reply(sock, response(400, "Bad Request", unreadable(exc)))
    except OSError:
        pass  # the client went away; nothing to answer
    finally:
        sock.close()


# Judges an admitted attempt before it connects: None, or why it is refused (credentials).
Check = Callable[[Attempt], Awaitable[str | None]]


async def _open(gate: Gate, sock: Wire, host: str, port: int,
                protocol: Protocol_, check: Check | None = None) -> tuple[Attempt, trio.socket.SocketType] | None:
    """Admit, ``check`` and connect, or answer 403/502 and return None."""
    attempt = await gate.consider(gate.admit(host, port, protocol))
    if not attempt.allowed:  # each body here ends its line: a client prints it, and ccw's notes follow
        await reply(sock, response(403, "Forbidden", f"ccw: {attempt.reason}; allowed: {gate.allowed_text()}\n"))
        return None
    why = None if check is None else await check(attempt)
    if why is not None:
        assert isinstance(gate, Carrier | ruled.Ruled)  # only a carrier's or a ruled gate's requests are checked
        gate.refuse(attempt, why)
        await reply(sock, response(403, "Forbidden", f"ccw: {why}\n"))
        return None
    try:
        return attempt, await gate.open(attempt)
    except Refused as exc:
        if exc.denied:
            await reply(sock, response(403, "Forbidden", f"ccw: {exc.message}; allowed: {gate.allowed_text()}\n"))
        else:
            await reply(sock, response(502, "Bad Gateway", f"ccw: {exc.message}\n"))
        return None


async def _connect(gate: Gate, sock: trio.socket.SocketType, conn: h11.Connection,
                   request: h11.Request) -> None:
    host, port = split_authority(request.target.decode("ascii", "replace"), None)
    contexts, terminated = tlsterm.terminated_hosts(gate)

    async def unread(attempt: Attempt) -> str | None:  # a host with method/path rules is never tunnelled
        creds = _credentials(gate)  # and a CONNECT's own headers go nowhere: no placeholder is swapped there
        why = None if creds is None else creds.dropped_attempt(list(request.headers))
        return why or (None if (attempt.host, attempt.port) in terminated else ruled.unread(gate, attempt))

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
    if contexts is not None and (attempt.host, attempt.port) in terminated:
        await _terminate(gate, sock, bytes(early), attempt, upstream, contexts)
    else:
        await tunnel(sock, upstream, attempt, gate.budget, bytes(early))


async def _terminate(gate: Gate, sock: trio.socket.SocketType, early: bytes, attempt: Attempt,
                     upstream: trio.socket.SocketType, contexts: LeafContexts) -> None:
    """A CONNECT the proxy terminates (egress/tlsterm.py): the jail's TLS accepted with the
    host's leaf, the proxy's own to the upstream, then the one request inside served."""
    jails: list[tlsterm.TlsWire] = []  # the jail's TLS, once its handshake is done
    try:
        first, verified = await tlsterm.accept(contexts, sock, early, attempt, upstream, jails)
        jail = jails[0]
        if isinstance(verified, OSError):
            attempt.reason = str(verified)
            await reply(jail, response(502, "Bad Gateway", f"ccw: {verified}\n"))
            return
        await _serve_terminated(gate, tlsterm.Terminated(attempt, jail, verified), first)
    except tlsterm.Refusal as exc:
        _refuse(gate, attempt, str(exc))
        if jails:
            await reply(jails[0], response(403, "Forbidden", f"ccw: {exc}\n"))
    finally:
        upstream.close()
        if jails:
            await jails[0].finish()


def _refuse(gate: Gate, attempt: Attempt, why: str) -> None:
    if isinstance(gate, Carrier | ruled.Ruled):
        gate.refuse(attempt, why)  # recorded, and told at once
    else:
        attempt.deny(why)


async def _serve_terminated(gate: Gate, terminated: tlsterm.Terminated, first: bytes) -> None:
    """The request read out of a terminated connection: it must name the CONNECT's host, then
    goes the plain path's way (``_send_on``), upstream over the verified TLS."""
    jail, attempt = terminated.jail, terminated.attempt
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    conn.receive_data(first)
    try:
        with trio.move_on_after(gate.header_timeout):
            request = await _read_request(jail, conn)
    except (h11.RemoteProtocolError, BadRequest) as exc:
        await reply(jail, response(400, "Bad Request", unreadable(exc)))
        return
    if request is None:
        return
    named = [value for name, value in request.headers if name == b"host"]
    try:
        names = [split_authority(value.decode("ascii", "replace"), 443) for value in named]
    except BadRequest:
        names = []
    if len(names) != 1 or names[0][1] != attempt.port or normalize_host(names[0][0])[0] != attempt.host \
            or not request.target.startswith(b"/"):
        creds = _credentials(gate)
        shown = b", ".join(named)[:255].decode("ascii", "replace") or "none"
        why = (f"a request in the TLS connection to {host_text(attempt.host, attempt.port)} names Host {shown} "
               f"(target {request.target[:80].decode('ascii', 'replace')!r}): a terminated connection carries "
               "requests to the CONNECT's host only, in origin form")
        if creds is not None and creds.holds(b"".join(b"%s: %s\r\n" % pair for pair in request.headers)):
            why = f"{EXFILTRATION}? {why}, with a placeholder in it"
        _refuse(gate, attempt, why)
        await reply(jail, response(403, "Forbidden", f"ccw: {why}\n"))
        return
    authority = host_text(attempt.host, attempt.port).encode("ascii")
    headers = forward_headers(list(request.headers), authority)
    await _send_on(gate, jail, conn, request.method, request.target.decode("ascii"), headers,
                   _Via(attempt.host, attempt.port, "https", terminated), dropped_headers(list(request.headers)))


def _credentials(gate: Gate) -> Credentials | None:
    return gate.credentials if isinstance(gate, Carrier) else None


def _target(request: h11.Request, creds: Credentials | None, own: str) -> tuple[str, str, str | None, str]:
    """Where a plain request goes: its authority, its origin-form target, the secret
    whose reverse route it came by, if it did (``/route/NAME/...``: the value is added, not swapped in), sent
    to the proxy itself in origin form or, by a client that honours HTTP_PROXY, in
    absolute form naming the proxy's own address ``own``; and the scheme upstream (a route
    reaches a secret bound to port 443, or one named ``NAME+https``, over verified TLS)."""
    target = request.target
    if target.startswith(b"http://" + own.encode() + ROUTE):
        target = target[len(b"http://") + len(own):]
    routed = None if creds is None else creds.route(target)
    if routed is not None:
        name, host, port, origin, scheme = routed
        return host_text(host, port), origin.decode("ascii"), name, scheme
    if target.startswith(ROUTE):  # a route's name mistyped: say which exist (it read "this is a proxy", or
        # in absolute form "no rule allows" the proxy's own address, with a rule to add for it)
        asked = target[len(ROUTE):].split(b"/", 1)[0][:64].decode("ascii", "replace")
        names = sorted(creds.capsule.bindings) if creds is not None else []
        raise BadRequest(f"no route {asked!r}: " + (
            "this capsule's routes are " + ", ".join(f"/route/{name}/" for name in names)
            + " (/route/NAME+https/ for a TLS upstream)" if names else "this capsule holds no secrets"))
    url = urllib.parse.urlsplit(request.target.decode("ascii", "replace"))
    if url.scheme != "http" or not url.netloc:
        raise BadRequest(
            "this is a proxy: send CONNECT host:port, or an absolute http:// URL "
            f"(got {request.target[:80]!r})"
        )
    return url.netloc.rpartition("@")[2], (url.path or "/") + (f"?{url.query}" if url.query else ""), None, "http"


async def _forward(gate: Gate, sock: trio.socket.SocketType, conn: h11.Connection,
                   request: h11.Request) -> None:
    creds = _credentials(gate)
    own = host_text(*sock.getsockname()[:2])  # the proxy's address as the jail reached it
    authority, origin, routed, scheme = _target(request, creds, own)
    host, port = split_authority(authority, 80)
    headers = forward_headers(list(request.headers), authority.encode("ascii"))
    if routed is not None:
        assert creds is not None
        origin, headers = creds.routed(routed, origin, headers)
    await _send_on(gate, sock, conn, request.method, origin, headers, _Via(host, port, scheme),
                   dropped_headers(list(request.headers)))


@dataclass(frozen=True)
class _Via:
    """Where a request goes: host, port, and scheme upstream ("https": over the proxy's own verified
    TLS); ``terminated``: read out of a CONNECT the proxy terminated, whose attempt and TLS it uses."""

    host: str
    port: int
    scheme: str
    terminated: tlsterm.Terminated | None = None


async def _send_on(gate: Gate, sock: Wire, conn: h11.Connection, method: bytes, origin: str,
                   headers: list[tuple[bytes, bytes]], via: _Via, dropped: list[tuple[bytes, bytes]]) -> None:
    """The per-request path, plain or terminated: method/path rules and the placeholders judged
    before anything goes upstream (``dropped``: the client's headers ``headers`` lacks), then the
    request sent and its response relayed."""
    creds = _credentials(gate)
    outgoing = h11.Connection(h11.CLIENT)
    head = outgoing.send(h11.Request(method=method, target=origin.encode("ascii"), headers=headers))
    assert head is not None
    masker: Masker | None = None
    early = early_body(conn) if creds is not None else []

    async def swap(attempt: Attempt) -> str | None:
        nonlocal head, masker
        assert creds is not None
        why = creds.dropped_attempt(dropped) \
            or creds.body_attempt(b"".join(bytes(event.data) for event in early if isinstance(event, h11.Data))) \
            or next(filter(None, (trailers_attempt(creds, event) for event in early)), None)
        if why is not None or not creds.carries(head):
            return why  # a placeholder in the body's first bytes; or none anywhere, nothing to judge
        cleartext = via.terminated is None and via.scheme == "http"
        judged = await trio.to_thread.run_sync(partial(creds.judge, head, attempt.host, attempt.port, cleartext))
        head, masker = judged.head or b"", judged.masker
        return judged.reason

    async def check(attempt: Attempt) -> str | None:  # method/path rules first (egress/ruled.py), then secrets
        why = ruled.refusal(gate, attempt, via.scheme, method, origin)
        return why if why is not None or creds is None else await swap(attempt)

    opened = await _upstream(gate, sock, via, check)
    if opened is None:
        return
    attempt, upstream = opened
    exchange = Exchange(sock, conn, upstream, outgoing, attempt, gate.budget)
    exchange.head_only = method == b"HEAD"
    if creds is not None:
        assert isinstance(gate, Carrier)
        exchange.creds, exchange.masker = creds, masker
        exchange.refuse = lambda why: gate.refuse(attempt, why)
        exchange.early = early
    await exchange.run(head)


async def _upstream(gate: Gate, sock: Wire, via: _Via, check: Check) -> tuple[Attempt, Wire] | None:
    """The judged request's attempt and upstream: a terminated connection's own, or one opened
    now (with the proxy's verified TLS for an https route); None once a refusal is answered."""
    if via.terminated is not None:
        attempt = via.terminated.attempt
        why = await check(attempt)
        if why is None:
            return attempt, via.terminated.upstream
        _refuse(gate, attempt, why)
        await reply(sock, response(403, "Forbidden", f"ccw: {why}\n"))
        return None
    opened = await _open(gate, sock, via.host, via.port, "http", check)
    if opened is None or via.scheme == "http":
        return opened
    attempt, upstream = opened
    try:
        return attempt, await tlsterm.connect(upstream, attempt.host)
    except OSError as exc:
        attempt.reason = str(exc)
        await reply(sock, response(502, "Bad Gateway", f"ccw: {exc}\n"))
        return None



