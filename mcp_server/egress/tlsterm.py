"""TLS the proxy terminates: a jail's CONNECT to a host whose requests a rule must see (issue 38).

A ``CONNECT`` to a host:port a capsule's secret is bound to (or, once they exist, a
method/path rule names: ``terminated_hosts`` is where those join) is not a tunnel: the
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
  ``http/1.1`` there too.  Its handshake runs after the jail's, before the request is
  judged; the request's head is sent only once judged.
- **One request per connection**, as on the plain path: the proxy says
  ``Connection: close`` both ways, so a second request never rides a connection judged
  for the first.
- **The record** is the CONNECT's, ``https`` with ``tls: "terminated"``; a refusal
  (another name, HTTP/2, a request naming another host, a placeholder where it may not
  go) turns it into a denial saying why.

``TlsWire`` gives a TLS stream the shape of a socket (egress/relay.py ``Wire``), so the
plain path's relay runs on it unchanged; a closed or broken TLS stream reads as the end
of the stream, as a reset socket does.
"""

from __future__ import annotations

import contextlib
import functools
import socket
import ssl
from dataclasses import dataclass
from typing import Any

import trio

from mcp_server.core import clienthello
from mcp_server.core.tlsca import ALPN
from mcp_server.egress.credentials import Carrier, LeafContexts
from mcp_server.egress.relay import Attempt, Gate
from sandbox.errors import CcwError

H2_PREFACE = b"PRI * HTTP/2.0\r\n"
TERMINATED = "terminated"
HANDSHAKE_TIMEOUT = 30.0


@functools.cache
def upstream_context() -> ssl.SSLContext:
    """The context the proxy verifies upstreams with, made once (loading the trust store costs
    milliseconds): the host's trust store (``SSL_CERT_FILE`` as the process started), HTTP/1.1."""
    context = ssl.create_default_context()
    context.set_alpn_protocols(ALPN)
    return context


def terminated_hosts(gate: Gate) -> tuple[LeafContexts | None, frozenset[tuple[str, int]]]:
    """The capsule's CA (None: it has none, nothing is terminated) and the host:port pairs whose
    CONNECTs it terminates: those its secrets are bound to.  Method/path rules' hosts
    (core/httprules.py) join the set here, the one place the proxy asks."""
    creds = gate.credentials if isinstance(gate, Carrier) else None
    if creds is None or creds.contexts is None:
        return None, frozenset()
    return creds.contexts, frozenset(pair for binding in creds.capsule.bindings.values() for pair in binding.hosts)


class TlsWire:
    """A TLS stream as the relay uses a socket (egress/relay.py ``Wire``)."""

    def __init__(self, stream: trio.SSLStream[Any], raw: trio.socket.SocketType) -> None:
        self.stream, self.raw = stream, raw

    async def recv(self, buflen: int, /) -> bytes:
        try:
            data = await self.stream.receive_some(buflen)
            return data if isinstance(data, bytes) else bytes(data)  # ssl's reads are bytes already
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return b""

    async def recv_into(self, buffer: bytearray, /) -> int:
        data = await self.recv(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    async def send(self, data: memoryview, /) -> int:
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise BrokenPipeError(str(exc)) from None
        return len(data)

    def shutdown(self, how: int, /) -> None:
        """The relay's half-close: TLS has none; ``finish`` ends the stream with close_notify."""
        if how == socket.SHUT_RDWR:
            with contextlib.suppress(OSError):
                self.raw.shutdown(how)

    def close(self) -> None:
        self.raw.close()

    async def finish(self) -> None:
        """Say close_notify (a client reading a body to its end needs it), then close."""
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError), trio.move_on_after(5):
            await self.stream.aclose()
        self.raw.close()


class _Prefixed(trio.abc.Stream):
    """A socket's stream with bytes already read from it (the ClientHello) given back first."""

    def __init__(self, sock: trio.socket.SocketType, first: bytes) -> None:
        self.inner, self.first = trio.SocketStream(sock), first

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self.first:
            data, self.first = self.first, b""
            return data
        return await self.inner.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.inner.aclose()


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


async def accept(contexts: LeafContexts, sock: trio.socket.SocketType, early: bytes,
                 attempt: Attempt) -> TlsWire:
    """The jail's side: its hello checked against the CONNECT's host, the handshake done with
    that host's leaf.  Refusal naming what was wrong; nothing is signed for another name."""
    with trio.move_on_after(HANDSHAKE_TIMEOUT) as deadline:
        first, hello = await _hello(sock, early)
    if deadline.cancelled_caught:
        raise Refusal("no TLS ClientHello in time after CONNECT")
    if hello.server_name is not None and hello.server_name != attempt.host:
        raise Refusal(f"the TLS ClientHello asks for {hello.server_name[:255]!r}, not {attempt.host}, the host "
                      "the CONNECT named: nothing is signed for another name")
    try:
        context = await trio.to_thread.run_sync(contexts.get, attempt.host)
    except CcwError as exc:
        raise Refusal(exc.message) from None
    # Not https_compatible: its aclose says close_notify (``finish``), which a client reading a
    # body to the end needs (GnuTLS's, in git, fails without it); a ragged EOF from the jail
    # reads as the end (``TlsWire.recv``).
    stream = trio.SSLStream(_Prefixed(sock, first), context, server_side=True)
    with trio.move_on_after(HANDSHAKE_TIMEOUT) as deadline:
        try:
            await stream.do_handshake()
        except trio.BrokenResourceError as exc:
            raise Refusal(f"the TLS handshake with the client failed: {exc.__cause__ or exc}") from None
    if deadline.cancelled_caught:
        raise Refusal("the client did not complete its TLS handshake in time")
    attempt.tls = TERMINATED
    return TlsWire(stream, sock)


async def connect(upstream: trio.socket.SocketType, host: str) -> TlsWire:
    """The proxy's own TLS to the upstream, verified for ``host``; OSError saying why not."""
    stream = trio.SSLStream(trio.SocketStream(upstream), upstream_context(), server_hostname=host,
                            https_compatible=True)
    with trio.move_on_after(HANDSHAKE_TIMEOUT) as deadline:
        try:
            await stream.do_handshake()
        except trio.BrokenResourceError as exc:
            upstream.close()
            raise ConnectionError(f"TLS to {host} failed: {exc.__cause__ or exc}") from None
    if deadline.cancelled_caught:
        upstream.close()
        raise ConnectionError(f"TLS to {host}: no handshake in time")
    return TlsWire(stream, upstream)


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
