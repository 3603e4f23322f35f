"""An EgressSession on ordinary loopback sockets, and upstream servers, for the egress tests.

The helper's listeners live in a capsule's egress namespace; here the session is given
plain listening sockets on 127.0.0.1 (ephemeral ports) and one end of a datagram
socketpair as its sniffer, so the tests need no privilege.  Upstream servers listen on
127.0.0.1 (or ::1) and are allowed by exact IP rules, which re-open loopback
(core/netspace.py).
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial

import pytest
import trio

from mcp_server.core.netrules import NetworkSpec, parse_network
from mcp_server.egress import splice
from mcp_server.egress.forward import Client
from mcp_server.egress.relay import Attempt, Resolver, SpaceReader, system_resolver
from mcp_server.egress.session import EgressSession


@pytest.fixture(params=["splice", "trio"])
def relay_engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test with the spliced relay and again with the trio one."""
    monkeypatch.setattr(splice, "ENABLED", request.param == "splice")
    return str(request.param)


def network(*rules: str, max_bytes: int | None = None, max_connections: int | None = None) -> NetworkSpec:
    value: dict[str, object] = {"allow": list(rules)}
    if max_bytes is not None:
        value["max_bytes"] = max_bytes
    if max_connections is not None:
        value["max_connections"] = max_connections
    spec = parse_network(value)
    assert spec is not None
    return spec


def _listening_fd() -> tuple[int, int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.setblocking(False)
    port = sock.getsockname()[1]
    return sock.detach(), port


@dataclass
class Running:
    """A serving session and where to reach it."""

    session: EgressSession
    http_port: int
    socks_port: int
    sniff_peer: socket.socket  # write fake packets here; the session reads the other end

    async def http(self) -> trio.SocketStream:
        return await trio.open_tcp_stream("127.0.0.1", self.http_port)

    async def socks(self) -> trio.SocketStream:
        return await trio.open_tcp_stream("127.0.0.1", self.socks_port)


@asynccontextmanager
async def egress(spec: NetworkSpec, *, resolver: Resolver = system_resolver, space: SpaceReader | None = None,
                 header_timeout: float = 5.0,
                 observe: Callable[[Attempt], None] | None = None) -> AsyncIterator[Running]:
    """A session serving in a nursery for the block; closed after it (``space``: the host's
    space it judges against; None, the real host's)."""
    http_fd, http_port = _listening_fd()
    socks_fd, socks_port = _listening_fd()
    sniff_peer, sniff_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    session = EgressSession(spec, http_fd, socks_fd, sniff_end.detach(), ["10.99.0.2", "fd63:6377::2"],
                            resolver=resolver, space=space, header_timeout=header_timeout, observe=observe)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(session.serve)
            session.begin_exec()
            try:
                yield Running(session, http_port, socks_port, sniff_peer)
            finally:
                await session.aclose()
    finally:
        sniff_peer.close()


@dataclass
class Upstream:
    """A server on loopback; ``seen`` keeps what each connection sent."""

    port: int
    seen: list[bytes] = field(default_factory=list)


Serve = Callable[[trio.SocketStream, Upstream], Awaitable[None]]


@asynccontextmanager
async def upstream(serve: Serve, host: str = "127.0.0.1") -> AsyncIterator[Upstream]:
    """Run ``serve`` for every connection to a fresh loopback port."""
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, lambda s: serve(s, state), 0, host=host))
        state = Upstream(listeners[0].socket.getsockname()[1])
        yield state
        nursery.cancel_scope.cancel()


async def shout(stream: trio.SocketStream, state: Upstream) -> None:
    """Echo upper-cased until EOF (proves bytes went both ways)."""
    received = b""
    async for data in stream:
        received += data
        await stream.send_all(data.upper())
    state.seen.append(received)


def http_responder(response: bytes) -> Serve:
    """Read one request head (and a body per Content-Length / chunked end), answer, close."""

    async def serve(stream: trio.SocketStream, state: Upstream) -> None:
        received = b""
        while b"\r\n\r\n" not in received:
            data = await stream.receive_some()
            if not data:
                break
            received += data
        head = received.split(b"\r\n\r\n")[0].lower()
        if b"transfer-encoding: chunked" in head:
            while not received.endswith(b"0\r\n\r\n"):
                received += await stream.receive_some()
        state.seen.append(received)
        with contextlib.suppress(trio.BrokenResourceError):  # a cut relay resets it
            await stream.send_all(response)
        await stream.aclose()

    return serve


async def slow_reader(stream: trio.SocketStream, state: Upstream) -> None:
    """Read in small pieces, slowly, and answer only at EOF (how many bytes came): an upload
    beyond the socket buffers waits on the relay's capsule side while its answer waits too."""
    total = 0
    while data := await stream.receive_some(16384):
        total += len(data)
        await trio.sleep(0.0002)
    await stream.send_all(b"%d" % total)


async def echo_both_ways(client: trio.SocketStream, payload: bytes, limit: float = 30.0) -> bytes:
    """Send ``payload`` (then EOF) while reading the answer, both at once, and close the
    stream: what came back.  Against ``shout`` both directions beyond the buffers."""
    echoed = bytearray()

    async def send() -> None:
        await client.send_all(payload)
        await client.send_eof()

    async def receive() -> None:
        while data := await client.receive_some(1 << 16):
            echoed.extend(data)

    with trio.fail_after(limit):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            nursery.start_soon(receive)
    await client.aclose()
    return bytes(echoed)


async def read_all(stream: trio.SocketStream, limit: float = 10.0) -> bytes:
    """Everything until the peer closes; then the stream is closed too."""
    received = bytearray()
    with trio.fail_after(limit):
        while True:
            try:
                data = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                break
            if not data:
                break
            received += data
    await stream.aclose()
    return bytes(received)


async def read_head(stream: trio.SocketStream) -> bytes:
    """A response head (through the blank line); what followed it is lost to the caller."""
    received = b""
    with trio.fail_after(10):
        while b"\r\n\r\n" not in received:
            data = await stream.receive_some()
            assert data, f"closed after {received!r}"
            received += data
    head, _, rest = received.partition(b"\r\n\r\n")
    assert not rest, rest
    return head


class NoDns:
    """A resolver that must not be called for denied names; answers fixed addresses."""

    def __init__(self, answers: dict[str, list[str]] | None = None) -> None:
        self.answers = answers or {}
        self.calls: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append(host)
        if host not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return self.answers[host]


class Told:
    """What the forward told its observers."""

    def __init__(self) -> None:
        self.refused: list[Client] = []
        self.errors: list[tuple[Client, Exception]] = []
        self.changed = trio.Event()

    def on_refused(self, who: Client) -> None:
        self.refused.append(who)
        self.changed.set()

    def on_error(self, who: Client, error: Exception) -> None:
        self.errors.append((who, error))
        self.changed.set()

    async def until(self, refused: int = 0, errors: int = 0) -> None:
        """Wait until this much has been told: ccw-forward tells this process after the
        client's socket is closed, so a client may see its end first."""
        with trio.fail_after(10):
            while len(self.refused) < refused or len(self.errors) < errors:
                await self.changed.wait()
                self.changed = trio.Event()
