"""TLS the proxy terminates: a jail's CONNECT to a host whose requests a rule must see (issue 38).

A ``CONNECT`` to a host:port a capsule's secret is bound to or an https method/path rule
names (``terminated_hosts`` is where those join) is not a tunnel: the
proxy answers ``200``, reads the jail's ClientHello, completes the handshake itself with
a leaf for the CONNECT's host (fs/castore.py ``ServerContexts``, from the capsule's
name-constrained CA), and hands each decrypted request to the plain-HTTP request path
(egress/proxy.py), which sends it upstream over the proxy's own TLS connection.  Every
other CONNECT stays an end-to-end tunnel.  What this module decides:

- **The name is the CONNECT's.**  The ClientHello is read before the handshake
  (core/clienthello.py): a server name other than the CONNECT's host is refused and
  recorded, and the leaf is only ever asked for the CONNECT's host, which the CA was
  made for; no hello can make the proxy sign for another name.  A hello with no name
  (a client connecting to an IP address sends none) gets the CONNECT host's leaf, which
  the client then checks against what it meant to reach.
- **HTTP/1.1 only.**  The leaf's context offers ALPN ``http/1.1`` alone; a jail that
  speaks HTTP/2 anyway (the ``PRI * HTTP/2.0`` preface, "prior knowledge") is refused
  and recorded before any request is read.
- **The upstream is verified** against the host's own trust store (``ssl``'s default
  context: OpenSSL's default paths, which ``SSL_CERT_FILE`` in the front end's
  environment may name), with the CONNECT's host as the name checked; ALPN
  ``http/1.1`` there too.  Its handshake starts once the jail's hello is judged and runs
  beside the jail's handshake and request (``accept``); the request's head goes only once
  judged.  Each upstream's last session is offered at its next connection (``_SESSIONS``).
- **One request per connection**, as on the plain path: the proxy says
  ``Connection: close`` both ways, so a second request never rides a connection judged
  for the first.
- **The record** is the CONNECT's, ``https`` with ``tls: "terminated"``; a refusal
  (another name, HTTP/2, a request naming another host, a placeholder where it may not
  go) turns it into a denial saying why.

``TlsWire`` gives a TLS stream the shape of a socket (egress/relay.py ``Wire``), so the
plain path's relay runs on it unchanged; a closed or broken TLS stream reads as the end
of the stream, as a reset socket does.  Which end it was is kept (``peer_closed``): a body
its close delimits ends at the jail with close_notify only if the upstream's did
(egress/exchange.py ``Exchange.run`` sets ``cut``), so a cut body never reads as whole.

A response body's relay, in trio or a worker thread, is egress/tlsbody.py's.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import ssl
import typing
from dataclasses import dataclass

import trio

from mcp_server.core import clienthello
from mcp_server.core.tlsca import ALPN
from mcp_server.egress.credentials import Carrier, LeafContexts
from mcp_server.egress.relay import BUFFER_SIZE, Attempt, Budget, Gate, send_all
from mcp_server.egress.ruled import Ruled
from sandbox.errors import CcwError

H2_PREFACE = b"PRI * HTTP/2.0\r\n"
RECORD = 16 * 1024  # a TLS record's most plaintext
TERMINATED = "terminated"
HANDSHAKE_TIMEOUT = 30.0


@functools.cache
def upstream_context() -> ssl.SSLContext:
    """The context the proxy verifies upstreams with, made once (loading the trust store costs
    milliseconds): the host's trust store (``SSL_CERT_FILE`` as the process started), HTTP/1.1."""
    context = ssl.create_default_context()
    context.set_alpn_protocols(ALPN)
    return context


# The last session each upstream host:port gave (a TLS 1.3 ticket), offered at the next
# connection there: a resumed handshake skips the certificate chain's verification and the
# server's signature, which the session proves was done for that name with
# ``upstream_context``.  Measured in memory: the client's side of a handshake 0.7-0.85 ms
# full, 0.25-0.4 ms resumed, but ``wrap_bio(session=)`` takes 0.23-0.38 ms more (Python
# copies the session through DER, parsing the peer's certificate again): the proxy saves
# little CPU; the upstream is spared its signature and its chain's bytes.  A session of another context (the
# trust store reloaded) is not offered; the server may refuse a ticket, and then the
# handshake is a full one, verified.  The key is the name the session was verified for and
# the port: OpenSSL offers whatever session it is given, and a server whose ticket key
# serves several names would resume it for another (tests/test_egress_tls.py).
_SESSIONS: dict[tuple[str, int], tuple[ssl.SSLContext, ssl.SSLSession]] = {}
MAX_SESSIONS = 1024


def terminated_hosts(gate: Gate) -> tuple[LeafContexts | None, frozenset[tuple[str, int]]]:
    """The capsule's CAs (None: it has none, nothing is terminated) and the host:port pairs whose
    CONNECTs it terminates: those its secrets are bound to, and those an https method/path rule
    names (core/httprules.py; the rules now in force: a rule added live joins at the next
    CONNECT), the one place the proxy asks.  A rule's host no CA of the capsule names is
    still terminated, and refused at the handshake saying so (``accept``): never tunnelled."""
    creds = gate.credentials if isinstance(gate, Carrier) else None
    if creds is None or creds.contexts is None:
        return None, frozenset()
    ruled_hosts = gate.requests.tls_hosts() if isinstance(gate, Ruled) else frozenset()
    bound = frozenset(pair for binding in creds.capsule.bindings.values() for pair in binding.hosts)
    return creds.contexts, bound | ruled_hosts


class TlsWire:
    """A TLS connection over a trio socket, as the relay uses a socket (egress/relay.py ``Wire``).

    ``ssl.SSLObject`` over memory BIOs rather than ``trio.SSLStream``: a read decrypts every
    record a socket read brought (up to the caller's buffer) and a write sends all its
    records in one ``send``, where SSLStream takes a trio round and a syscall per 16 KiB
    record.  One task reads and one writes at a time (the relay's two directions); writes
    to the socket are serialised, since a read may have records to send too (TLS 1.3's
    key updates)."""

    def __init__(self, raw: trio.socket.SocketType, tls: ssl.SSLObject, incoming: ssl.MemoryBIO,
                 outgoing: ssl.MemoryBIO) -> None:
        self.raw, self.tls, self.incoming, self.outgoing = raw, tls, incoming, outgoing
        self._sending = trio.Lock()
        # The socket's bytes, on their way into ``incoming``: two records' room, grown to BUFFER_SIZE
        # by the first read that fills it (``_took``).  A connection that carries one short exchange
        # (most) then never asks for 256 KiB that malloc hands back to the system at its free and
        # the kernel faults in and zeroes again at the next connection's.
        self._received = bytearray(2 * RECORD)
        self._view = memoryview(self._received)
        # How a relayed stream ended: the jail's TLS says close_notify only where the upstream's did
        # (``peer_closed``), so a body the upstream's network cut, or the exec's byte cap did
        # (``cut``), reads as cut to the jail's client as it would end to end (``finish``).
        self.peer_closed = False
        self.cut = False
        self.resumes: tuple[str, int] | None = None  # an upstream's host:port, whose session ``close`` keeps

    @classmethod
    async def handshake(cls, raw: trio.socket.SocketType, context: ssl.SSLContext, first: bytes, *,
                        server_hostname: str | None = None, session: ssl.SSLSession | None = None) -> TlsWire:
        """The handshake done over ``raw`` (``first``: bytes already read from it; a server without
        ``server_hostname``; ``session``: one to resume); ssl.SSLError or ConnectionError if it fails.
        A server's last flight (TLS 1.3's tickets, 1.2's Finished) is left for the wire's next
        send or wait to carry (``recv_into`` flushes before it waits): it travels with the
        answer, a segment and a wakeup fewer.  A client's Finished goes at once: the upstream
        would otherwise wait for it until the jail's request is judged, and a server may give
        a handshake less time than a request."""
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = context.wrap_bio(incoming, outgoing, server_side=server_hostname is None,
                               server_hostname=server_hostname, session=session)
        incoming.write(first)
        wire = cls(raw, tls, incoming, outgoing)
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                await wire._flush()
                if not await wire._fill():
                    raise ConnectionError("the other side closed during the TLS handshake") from None
        if server_hostname is not None:
            await wire._flush()
        return wire

    async def _flush(self) -> None:
        """What the TLS object has made to send, sent; nothing to send takes no trip through trio's
        scheduler, and an uncontended lock none either (the send is one)."""
        if not self.outgoing.pending:
            return
        if self._sending.locked():
            await self._sending.acquire()
        else:
            self._sending.acquire_nowait()
        try:
            data = self.outgoing.read()
            if data:
                await send_all(self.raw, data)
        finally:
            self._sending.release()

    async def _fill(self) -> bool:
        received = await self.raw.recv_into(self._received)
        if not received:
            self.incoming.write_eof()
            return False
        self._took(received)
        return True

    def _took(self, received: int) -> None:
        """``received`` bytes of the socket's, read into ``_received``, into ``incoming``; a read
        that filled it grows it for the next (a bulk body)."""
        self.incoming.write(self._view[:received])
        if received == len(self._received) < BUFFER_SIZE:
            self._view.release()
            self._received = bytearray(BUFFER_SIZE)
            self._view = memoryview(self._received)

    def _decrypted(self, view: memoryview) -> tuple[int, bool]:
        """The plaintext the records already read hold, decrypted straight into ``view`` (as much as
        fits: no bytes object a record, no join), its length, and whether more may come."""
        size = 0
        try:
            while size < len(view):
                got = typing.cast(int, self.tls.read(len(view) - size, view[size:]))  # with a buffer: a count
                if not got:
                    self.peer_closed = True
                    return size, False  # close_notify
                size += got
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLError:  # a ragged end, or a record that does not decrypt: the end of the stream
            return size, False
        return size, True

    async def recv_into(self, buffer: bytearray, /) -> int:
        view = memoryview(buffer)
        while True:
            size, more = self._decrypted(view)
            if size or not more:
                return size
            await self._flush()
            try:
                await self._fill()  # at the socket's end, the next read says so
            except OSError:
                return 0

    async def recv(self, buflen: int, /) -> bytes:
        buffer = bytearray(buflen)
        return bytes(memoryview(buffer)[:await self.recv_into(buffer)])

    async def send(self, data: memoryview, /) -> int:
        try:
            self.tls.write(data)
        except ssl.SSLError as exc:
            raise BrokenPipeError(str(exc)) from None
        await self._flush()
        return len(data)

    def shutdown(self, how: int, /) -> None:
        """The relay's half-close: TLS has none; ``finish`` ends the stream with close_notify."""
        if how == socket.SHUT_RDWR:
            with contextlib.suppress(OSError):
                self.raw.shutdown(how)

    def close(self) -> None:
        # Kept only when new (not resumed): ``session`` copies it (Python serialises and parses it
        # back, the peer's certificate too: a third of a millisecond), and a server that takes a
        # ticket twice keeps taking it; one that does not gives a full handshake, and the next.
        fresh = self.resumes is not None and not self.tls.session_reused
        session = self.tls.session if fresh else None
        if self.resumes is not None and session is not None and session.has_ticket:
            if len(_SESSIONS) >= MAX_SESSIONS:
                _SESSIONS.clear()
            _SESSIONS[self.resumes] = (self.tls.context, session)
        self.raw.close()

    def _seal(self, plain: memoryview, attempt: Attempt, budget: Budget) -> int:
        """``plain`` charged as relayed in and encrypted into the outgoing buffer: how much of it the
        budget let through.  BrokenPipeError if the TLS object refuses it."""
        granted = attempt.charge(budget, len(plain), outbound=False)
        try:
            self.tls.write(plain[:granted])
        except ssl.SSLError as exc:
            raise BrokenPipeError(str(exc)) from None
        return granted

    def _read_socket(self) -> None:
        """One read of the socket, without waiting, into the TLS object: the socket's end or a reset
        as the stream's end (as ``recv_into`` reads them).  BlockingIOError if nothing has come."""
        try:
            received = os.readv(self.raw.fileno(), [self._received])
        except BlockingIOError:
            raise
        except OSError:
            received = 0
        if received:
            self._took(received)
        else:
            self.incoming.write_eof()

    def _notify_close(self) -> None:
        """close_notify into the outgoing buffer (the next flush sends it); once said, saying it
        again adds nothing."""
        with contextlib.suppress(ssl.SSLError, OSError):
            self.tls.unwrap()  # raises SSLWantReadError once sent: the peer's has not come

    async def finish(self) -> None:
        """Say close_notify (a client reading a body to its end needs it: GnuTLS's, in git,
        fails without it), unless what this side relayed was ``cut``, then close."""
        with contextlib.suppress(OSError), trio.move_on_after(5):
            if not self.cut:
                self._notify_close()
            await self._flush()
        self.raw.close()


@dataclass
class Terminated:
    """A CONNECT the proxy terminated: its attempt (host and port as the CONNECT named them), the TLS to each side."""

    attempt: Attempt
    jail: TlsWire
    upstream: TlsWire


class Refusal(Exception):
    """A terminated connection refused before any request: the reason goes into its record."""


async def _hello(sock: trio.socket.SocketType, early: bytes) -> tuple[bytes, clienthello.Hello]:
    """The jail's ClientHello (its bytes, and what it asks for); Refusal if it is not one."""
    data = early
    while (parsed := clienthello.parse(data)) == clienthello.INCOMPLETE:
        more = await sock.recv(clienthello.MAX_RECORD)
        if not more:
            raise Refusal("the client closed before its TLS ClientHello")
        data += more
    if isinstance(parsed, str):
        raise Refusal(f"no TLS ClientHello after CONNECT: {parsed}")
    return data, parsed


async def _judged_hello(contexts: LeafContexts, sock: trio.socket.SocketType, early: bytes,
                        attempt: Attempt) -> tuple[bytes, ssl.SSLContext]:
    """The jail's hello checked against the CONNECT's host, and that host's leaf context.
    Refusal naming what was wrong; nothing is signed for another name."""
    with trio.move_on_after(HANDSHAKE_TIMEOUT) as deadline:
        first, hello = await _hello(sock, early)
    if deadline.cancelled_caught:
        raise Refusal("no TLS ClientHello in time after CONNECT")
    if hello.server_name is not None and hello.server_name != attempt.host:
        raise Refusal(f"the TLS ClientHello asks for {hello.server_name[:255]!r}, not {attempt.host}, the host "
                      "the CONNECT named: nothing is signed for another name")
    try:
        return first, contexts.get(attempt.host)  # held, or signed now (about a millisecond, once a day a host)
    except CcwError as exc:
        raise Refusal(exc.message) from None


async def _accept(sock: trio.socket.SocketType, context: ssl.SSLContext, first: bytes,
                  attempt: Attempt) -> TlsWire:
    """The jail's handshake with the CONNECT host's leaf; Refusal if it fails."""
    with trio.move_on_after(HANDSHAKE_TIMEOUT) as deadline:
        try:
            wire = await TlsWire.handshake(sock, context, first)
        except (ssl.SSLError, OSError) as exc:
            raise Refusal(f"the TLS handshake with the client failed: {exc}") from None
    if deadline.cancelled_caught:
        raise Refusal("the client did not complete its TLS handshake in time")
    attempt.tls = TERMINATED
    return wire


async def connect(upstream: trio.socket.SocketType, host: str) -> TlsWire:
    """The proxy's own TLS to the upstream, verified for ``host``; OSError saying why not."""
    context = upstream_context()
    key = (host, upstream.getpeername()[1])
    made, session = _SESSIONS.get(key, (None, None))
    with trio.move_on_after(HANDSHAKE_TIMEOUT):
        try:
            wire = await TlsWire.handshake(upstream, context, b"", server_hostname=host,
                                           session=session if made is context else None)
            wire.resumes = key
            return wire
        except (ssl.SSLError, OSError) as exc:
            upstream.close()
            raise ConnectionError(f"TLS to {host} failed: {exc}") from None
    upstream.close()
    raise ConnectionError(f"TLS to {host}: no handshake in time")


async def first_bytes(jail: TlsWire) -> bytes:
    """The decrypted stream's first bytes, enough to tell an HTTP/2 preface; Refusal if it is one."""
    data = b""
    while len(data) < len(H2_PREFACE) and H2_PREFACE.startswith(data[:len(H2_PREFACE)]):
        more = await jail.recv(64 * 1024)
        if not more:
            break
        data += more
    if data.startswith(H2_PREFACE):
        raise Refusal("HTTP/2 (prior knowledge) in a terminated connection: the proxy speaks HTTP/1.1 here, "
                      "as its ALPN said")
    return data


async def accept(contexts: LeafContexts, sock: trio.socket.SocketType, early: bytes, attempt: Attempt,
                 upstream: trio.socket.SocketType, jails: list[TlsWire]) -> tuple[bytes, TlsWire | OSError]:
    """The jail's side accepted (its hello judged, ``_judged_hello``; its handshake done, the
    wire appended to ``jails`` for the caller to answer through and finish), its first bytes
    (``first_bytes``), and the proxy's TLS to the upstream (``connect``, or why it failed).
    The upstream's handshake starts once the hello is judged and runs while the jail's
    handshake and request do; nothing but the handshake goes upstream before the request
    is judged.  Refusal (or OSError) if the jail's side fails."""
    first, context = await _judged_hello(contexts, sock, early, attempt)
    made: list[TlsWire | OSError] = []

    async def up() -> None:
        try:
            made.append(await connect(upstream, attempt.host))
        except OSError as exc:
            made.append(exc)

    failed: Refusal | OSError | None = None
    data = b""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(up)
        try:
            jails.append(await _accept(sock, context, first, attempt))
            data = await first_bytes(jails[0])
        except (Refusal, OSError) as exc:  # raised below, not as a nursery's group
            failed = exc
            nursery.cancel_scope.cancel()
    if failed is not None:
        raise failed
    return data, made[0]
