"""A forwarded port whose bytes the kernel relays, as root on the real kernel: the socket
hashes and verdict of sandbox/sockmap.py (made here, as the helper makes them) given to a
PortForward (mcp_server/egress/forward.py, egress/kernel_relay.py) with a pool of spare
sockets.  Half-close both ways, bytes sent before the pair was joined, a 4 MiB echo both
ways at once, a 16 MiB upload to a slow reader answered at its EOF, an HTTP request and a
WebSocket-like upgrade; a reset; and maps that refuse a pair fall back to user space.

The capsule's stand-in is a loopback server of this namespace (tests/support/egress_harness.py).
"""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from mcp_server.egress.forward import Pool, PortForward
from mcp_server.egress.kernel_relay import Sockmap
from sandbox import sockmap
from tests.support.egress_harness import (
    Upstream,
    echo_both_ways,
    http_responder,
    read_all,
    shout,
    slow_reader,
    upstream,
)


@pytest.fixture(autouse=True)
def _kernel_relay(require: Callable[[bool, str], None]) -> None:
    require(os.geteuid() == 0, "making socket hashes and an SK_SKB program needs CAP_BPF and CAP_NET_ADMIN")


class Capsule:
    """The caller's side: spare sockets made here, and ``connect`` for when none is left."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.connects = 0
        self.spares = 0

    async def connect(self) -> trio.socket.SocketType:
        self.connects += 1
        sock = trio.socket.socket()
        await sock.connect(("127.0.0.1", self.port))
        return sock

    async def make(self, count: int) -> list[socket.socket]:
        self.spares += count
        return [socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_NONBLOCK) for _ in range(count)]


@asynccontextmanager
async def kernel_forward(service: Upstream, entries: int = 64) -> AsyncIterator[tuple[PortForward, Capsule, Sockmap]]:
    capsule = Capsule(service.port)
    pool = Pool(capsule.make, await capsule.make(4), size=4)  # ready from the start, as ports.py makes it
    maps = Sockmap(*sockmap.make(entries))
    port = PortForward(capsule.connect, os.geteuid(), service.port, pool=pool, sockmap=maps)
    assert port.relay_path == "sockmap"
    async with trio.open_nursery() as nursery:
        await nursery.start(port.serve)
        yield port, capsule, maps
        await port.aclose()


async def joined(maps: Sockmap, count: int) -> None:
    """Until the kernel has taken ``count`` pairs (a client's EOF before its pair is joined
    would leave the connection to user space, rightly, and test nothing here)."""
    with trio.fail_after(10):
        while maps.joined < count:  # noqa: ASYNC110 (a counter of the forward's, no event to wait on)
            await trio.sleep(0.001)


async def tail_after_eof(stream: trio.SocketStream, state: Upstream) -> None:
    """Read to the client's EOF, then answer: bytes flow back after a half-close."""
    received = b""
    async for data in stream:
        received += data
    state.seen.append(received)
    await stream.send_all(b"got %d bytes" % len(received))


def test_half_close_passes_and_the_answer_follows_it() -> None:
    async def main() -> None:
        async with upstream(tail_after_eof) as service, kernel_forward(service) as (port, capsule, maps):
            for count in range(1, 4):  # each from the pool: none needs connect
                client = await trio.open_tcp_stream("127.0.0.1", port.host_port)
                await client.send_all(b"hello, ")
                await joined(maps, count)
                await client.send_all(b"capsule")
                await client.send_eof()
                assert await read_all(client) == b"got 14 bytes"
            assert service.seen == [b"hello, capsule"] * 3
            assert (port.accepted, port.refused, port.errors, capsule.connects) == (3, 0, 0, 0)

    trio.run(main)


def test_bytes_sent_before_the_pair_is_joined_arrive_in_order() -> None:
    async def main() -> None:
        async with upstream(shout) as service, kernel_forward(service) as (port, _, maps):
            client = socket.create_connection(("127.0.0.1", port.host_port))  # sends before any accept
            client.sendall(b"early " * 1000)
            client.setblocking(False)
            answer = b""
            with trio.fail_after(10):  # the echo comes only if the kernel moved the queued bytes
                while len(answer) < 6000:
                    await trio.lowlevel.wait_readable(client)
                    answer += client.recv(65536)
            assert (maps.joined, maps.read_here) == (1, 0)  # moved by the kernel, not read here
            client.shutdown(socket.SHUT_WR)
            with trio.fail_after(10):
                await trio.lowlevel.wait_readable(client)
                assert client.recv(4096) == b""
            client.close()
            assert answer == b"EARLY " * 1000
            assert service.seen == [b"early " * 1000]

    trio.run(main)


def test_megabytes_both_ways_at_once() -> None:
    payload = os.urandom(4 << 20)

    async def main() -> None:
        async with upstream(shout) as service, kernel_forward(service) as (port, _, maps):
            client = await trio.open_tcp_stream("127.0.0.1", port.host_port)
            echoed = await echo_both_ways(client, payload)
            assert maps.joined == 1
        assert bytes(echoed) == payload.upper()

    trio.run(main)


def test_an_upload_beyond_the_buffers_to_a_slow_reader_completes() -> None:
    size = 16 << 20

    async def main() -> None:
        async with upstream(slow_reader) as service, kernel_forward(service) as (port, _, maps):
            client = await trio.open_tcp_stream("127.0.0.1", port.host_port)
            with trio.fail_after(60):
                await client.send_all(bytes(size))
                await client.send_eof()
                assert await read_all(client, 60) == b"%d" % size
            assert maps.joined == 1

    trio.run(main)


def test_http_keep_alive_and_a_websocket_like_upgrade() -> None:
    page = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"

    async def main() -> None:
        async with upstream(http_responder(page)) as service, kernel_forward(service) as (port, _, maps):
            client = await trio.open_tcp_stream("127.0.0.1", port.host_port)
            await client.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert await read_all(client) == page
            assert maps.joined == 1
        async with upstream(shout) as service, kernel_forward(service) as (port, _, maps):
            client = await trio.open_tcp_stream("127.0.0.1", port.host_port)
            for frame in (b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\n\r\n", b"\x81\x05hello"):
                await client.send_all(frame)
                received = b""
                with trio.fail_after(10):
                    while len(received) < len(frame):
                        received += await client.receive_some()
                assert received == frame.upper()
            await client.aclose()

    trio.run(main)


def test_a_reset_ends_both_sides() -> None:
    async def resets(stream: trio.SocketStream, state: Upstream) -> None:
        await stream.receive_some()
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
        stream.socket.close()  # RST

    async def main() -> None:
        async with upstream(resets) as service, kernel_forward(service) as (port, _, maps):
            client = await trio.open_tcp_stream("127.0.0.1", port.host_port)
            await client.send_all(b"x")
            with trio.fail_after(10):
                assert await read_all(client) == b""
            assert maps.joined == 1

    trio.run(main)


def test_socket_hashes_that_refuse_a_pair_leave_it_to_user_space() -> None:
    async def main() -> None:
        async with upstream(tail_after_eof) as service, kernel_forward(service, entries=1) as (port, _, maps):
            client = await trio.open_tcp_stream("127.0.0.1", port.host_port)
            await client.send_all(b"two sockets, room for one")
            await client.send_eof()
            assert await read_all(client) == b"got 25 bytes"
            assert (port.accepted, port.errors, maps.joined) == (1, 0, 0)

    trio.run(main)


@pytest.mark.parametrize("setting, path", [(None, "user space"), ("kernel", "sockmap")])
def test_the_kernel_relay_is_the_persons_choice(tools: Any, tmp_path: Path, setting: str | None, path: str) -> None:
    """capsule_port relays in user space unless CCW_PORT_RELAY=kernel asks for the socket
    hashes (their queue for a slow reader is bounded by nothing: capsules/ports.py); either
    way a page is fetched through the port, and the port's event names the path taken."""
    import urllib.request

    from mcp_server.events import EventLog

    def fetch_text(url: str) -> str:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return str(answer.read().decode())

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "index.txt").write_text("served\n")
    (tmp_path / "relay-state").mkdir()
    runner = type(tools)(tmp_path / "relay-state", {"CCW_PORT_RELAY": setting} if setting else None)

    async def scenario(t: Any) -> tuple[str, list[str]]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("capsule_service_start", {"capsule_id": cap, "name": "web", "cmd": [
            "python3", "-m", "http.server", "8765", "--bind", "127.0.0.1"], "ready": {"port": 8765}})
        url = (await t.call("capsule_port", {"capsule_id": cap, "port": 8765}))["url"]
        page = await trio.to_thread.run_sync(fetch_text, url + "index.txt")
        opened = [event.data.get("relay") for event in EventLog(t.runtime.state).since(0, cap)
                  if event.kind == "port" and event.data.get("state") == "open"]
        await t.call("capsule_destroy", {"capsule_id": cap})
        return page, opened

    assert runner.run(scenario) == ("served\n", [path])
