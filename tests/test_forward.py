"""mcp_server/egress/forward.py and its program, ccw-forward, over real loopback sockets: a
loopback server stands for the capsule's service; TCP both ways with half-close, HTTP,
an upgrade, refusals, failed connects, the port's bounds, its errors and its spares."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx2
import pytest
import trio

from mcp_server.egress import forward, peer
from mcp_server.egress.forward import Client, Connect, Counts, PortForward
from mcp_server.egress.relay import CONNECT_TIMEOUT
from sandbox.errors import CcwError
from sandbox.ops import MAX_SPARES
from tests.support.egress_harness import (
    Told,
    Upstream,
    echo_both_ways,
    http_responder,
    read_all,
    shout,
    slow_reader,
    upstream,
)

ME = os.geteuid()  # who owns the sockets this test makes


class Capsule:
    """The caller's side: ``connect`` into a loopback port, counting its calls."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.calls = 0

    async def connect(self) -> trio.socket.SocketType:
        self.calls += 1
        sock = trio.socket.socket()
        try:
            await sock.connect(("127.0.0.1", self.port))
        except BaseException:
            sock.close()
            raise
        return sock


@asynccontextmanager
async def forwarding(connect: Connect, owner_uid: int = ME, told: Told | None = None,
                     connect_timeout: float = CONNECT_TIMEOUT) -> AsyncIterator[PortForward]:
    """A forward serving for the block, closed after it."""
    told = told or Told()
    port = PortForward(connect, owner_uid, 8000, on_refused=told.on_refused, on_error=told.on_error,
                       connect_timeout=connect_timeout)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(port.serve)
            yield port
            await port.aclose()
    finally:
        await port.aclose()


async def dial(port: PortForward) -> trio.SocketStream:
    return await trio.open_tcp_stream("127.0.0.1", port.host_port)


async def tail_after_eof(stream: trio.SocketStream, state: Upstream) -> None:
    """Read to the client's EOF, then answer: bytes flow back after a half-close."""
    received = b""
    async for data in stream:
        received += data
    state.seen.append(received)
    await stream.send_all(b"got %d bytes" % len(received))


def test_tcp_both_ways_with_half_close() -> None:
    async def main() -> None:
        async with upstream(tail_after_eof) as service, forwarding(Capsule(service.port).connect) as port:
            client = await dial(port)
            await client.send_all(b"hello, ")
            await client.send_all(b"capsule")
            await client.send_eof()  # the capsule sees EOF, and may still answer
            assert await read_all(client) == b"got 14 bytes"
            assert service.seen == [b"hello, capsule"]
            assert await port.counts() == Counts(accepted=1, refused=0, errors=0, open=0, dropped=0)

    trio.run(main)


def test_megabytes_both_ways_at_once() -> None:
    payload = os.urandom(4 << 20)

    async def main() -> None:
        async with upstream(shout) as service, forwarding(Capsule(service.port).connect) as port:
            client = await dial(port)
            echoed = await echo_both_ways(client, payload)
        assert bytes(echoed) == payload.upper()

    trio.run(main)


def test_an_http_request_through_the_url() -> None:
    page = (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 18\r\nConnection: close\r\n\r\n"
            b"from the capsule\r\n")

    async def main() -> None:
        async with upstream(http_responder(page)) as service, forwarding(Capsule(service.port).connect) as port:
            assert port.url == f"http://127.0.0.1:{port.host_port}/"
            assert port.capsule_port == 8000
            async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
                response = await http.get(port.url + "index.html")
            assert (response.status_code, response.text) == (200, "from the capsule\r\n")
            assert service.seen[0].startswith(b"GET /index.html HTTP/1.1\r\n")
            assert f"host: 127.0.0.1:{port.host_port}".encode() in service.seen[0].lower()

    trio.run(main)


def test_an_upload_beyond_the_buffers_to_a_slow_reader_completes() -> None:
    # The pattern that stalls splice.tunnel (see forward.py): one way waits to write the
    # capsule's socket while the other waits to read it.
    size = 16 << 20

    async def main() -> None:
        async with upstream(slow_reader) as service, forwarding(Capsule(service.port).connect) as port:
            client = await dial(port)
            with trio.fail_after(60):
                await client.send_all(bytes(size))
                await client.send_eof()
                assert await read_all(client) == b"%d" % size

    trio.run(main)


async def websocket_like(stream: trio.SocketStream, state: Upstream) -> None:
    """Answer an upgrade with 101, then speak first and echo raw frames, reversed."""
    head = b""
    while b"\r\n\r\n" not in head:
        head += await stream.receive_some()
    state.seen.append(head)
    await stream.send_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
    await stream.send_all(b"\x81\x05hello")  # the server speaks first
    async for frame in stream:
        await stream.send_all(frame[::-1])


async def receive_exactly(stream: trio.SocketStream, size: int, received: bytes = b"") -> bytes:
    with trio.fail_after(10):
        while len(received) < size:
            data = await stream.receive_some()
            assert data, f"closed after {received!r}"
            received += data
    assert len(received) == size, received
    return received


def test_a_websocket_like_upgrade_carries_raw_bytes_after_the_101() -> None:
    answer = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"

    async def main() -> None:
        async with upstream(websocket_like) as service, forwarding(Capsule(service.port).connect) as port:
            client = await dial(port)
            await client.send_all(b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
            assert await receive_exactly(client, len(answer) + 7) == answer + b"\x81\x05hello"
            for frame in (b"\x82\x03\x00\xff\x10", b"\x88\x00"):
                await client.send_all(frame)
                assert await receive_exactly(client, len(frame)) == frame[::-1]
            await client.aclose()

    trio.run(main)


def test_another_users_connection_is_closed_unread_and_told() -> None:
    async def main() -> None:
        told = Told()
        async with upstream(shout) as service:
            capsule = Capsule(service.port)
            async with forwarding(capsule.connect, owner_uid=ME + 1, told=told) as port:
                client = await dial(port)
                client_port = client.socket.getsockname()[1]
                await client.send_all(b"secret")
                assert await read_all(client) == b""  # closed (or reset: it had sent bytes)
                await told.until(refused=1)
                assert told.refused == [Client("127.0.0.1", client_port, ME)]
                counts = await port.counts()
                assert (counts.accepted, counts.refused, counts.errors, port.refused) == (0, 1, 0, 1)
            assert capsule.calls == 0 and service.seen == []  # no helper call, no byte through

    trio.run(main)


def test_a_client_gone_before_the_lookup_is_refused_as_nobody() -> None:
    async def main() -> None:
        told = Told()
        async with forwarding(Capsule(1).connect, told=told) as port:
            # ccw-forward stopped meanwhile: both wait in the backlog until they have gone.
            assert port.program_pid is not None
            os.kill(port.program_pid, signal.SIGSTOP)
            closed = socket.create_connection(("127.0.0.1", port.host_port))
            closed_port = closed.getsockname()[1]
            closed.close()
            reset = socket.create_connection(("127.0.0.1", port.host_port))
            reset_port = reset.getsockname()[1]
            reset.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
            reset.close()
            os.kill(port.program_pid, signal.SIGCONT)
            await told.until(refused=2)
            # Closed: what is left of it says uid 0 (peer.py's essay), read as nobody; reset: gone.
            assert told.refused == [Client("127.0.0.1", closed_port, None), Client("127.0.0.1", reset_port, None)]
            counts = await port.counts()
            assert (counts.accepted, counts.refused, counts.errors) == (0, 2, 0)

    trio.run(main)


def test_a_capsule_port_not_listening_closes_the_client_and_a_retry_passes() -> None:
    with socket.socket() as placeholder:  # a port nothing listens on, until it does
        placeholder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        placeholder.bind(("127.0.0.1", 0))
        capsule = Capsule(placeholder.getsockname()[1])

        async def main() -> None:
            told = Told()
            async with forwarding(capsule.connect, told=told) as port:
                client = await dial(port)
                client_port = client.socket.getsockname()[1]
                assert await read_all(client) == b""
                await told.until(errors=1)
                [(who, error)] = told.errors
                assert who == Client("127.0.0.1", client_port, ME)
                assert isinstance(error, ConnectionRefusedError)
                assert (port.refused, port.errors) == (0, 1)
                placeholder.listen(1)  # the service has started
                client = await dial(port)
                await client.send_all(b"ping")
                with trio.fail_after(10):
                    served, _ = await trio.socket.from_stdlib_socket(placeholder).accept()
                with served:
                    assert await served.recv(4) == b"ping"
                    await served.send(b"pong")
                    assert await client.receive_some() == b"pong"
                await client.aclose()
                counts = await port.counts()
                assert (counts.accepted, counts.errors, capsule.calls) == (1, 1, 2)

        trio.run(main)


def test_a_connect_that_hangs_times_out() -> None:
    async def hangs() -> trio.socket.SocketType:
        await trio.sleep_forever()
        raise AssertionError("not reached")

    async def main() -> None:
        told = Told()
        async with forwarding(hangs, told=told, connect_timeout=0.2) as port:
            assert await read_all(await dial(port)) == b""
            await told.until(errors=1)
            [(_who, error)] = told.errors
            assert isinstance(error, CcwError) and error.code == "TIMEOUT"
            assert "port 8000 in the capsule did not answer within 0.2 s" in error.message

    trio.run(main)


def test_past_max_open_a_connection_is_closed_as_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forward, "MAX_OPEN", 1)

    async def main() -> None:
        told = Told()
        async with upstream(shout) as service, forwarding(Capsule(service.port).connect, told=told) as port:
            first = await dial(port)
            await first.send_all(b"a")
            assert await first.receive_some() == b"A"  # relaying: one open
            assert await read_all(await dial(port)) == b""
            await told.until(errors=1)
            [(_who, error)] = told.errors
            assert isinstance(error, CcwError) and error.code == "UNAVAILABLE"
            await first.send_all(b"b")
            assert await first.receive_some() == b"B"  # the first goes on
            await first.aclose()

    trio.run(main)


def test_aclose_ends_open_relays_and_frees_the_port() -> None:
    async def main() -> None:
        async with upstream(shout) as service:
            async with trio.open_nursery() as nursery:
                port = PortForward(Capsule(service.port).connect, ME, 8000)
                await nursery.start(port.serve)
                client = await dial(port)
                await client.send_all(b"x")
                assert await client.receive_some() == b"X"
                await port.aclose()
                assert await read_all(client) == b""
            with pytest.raises(RuntimeError, match="closed"):
                await port.serve()
            again = PortForward(Capsule(service.port).connect, ME, 8000, host_port=port.host_port)
            await again.aclose()

    trio.run(main)


def test_an_observer_that_raises_does_not_end_the_port() -> None:
    told = Told()

    def bad(who: Client) -> None:
        told.on_refused(who)
        raise RuntimeError("watcher bug")

    async def main() -> None:
        async with upstream(shout) as service, trio.open_nursery() as nursery:
            port = PortForward(Capsule(service.port).connect, ME + 1, 8000, on_refused=bad)
            try:
                await nursery.start(port.serve)
                for _ in range(2):
                    assert await read_all(await dial(port)) == b""
                await told.until(refused=2)  # told after the client saw its end
                assert port.refused == 2
            finally:
                await port.aclose()

    trio.run(main)


def test_a_port_in_use_is_a_conflict_that_says_how_to_recover() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        number = taken.getsockname()[1]
        with pytest.raises(CcwError) as raised:
            PortForward(Capsule(1).connect, ME, 8000, host_port=number)
    assert raised.value.code == "CONFLICT"
    assert f"host port {number} on 127.0.0.1 is in use by another program" in raised.value.message
    assert "or to 0 for any free one" in raised.value.message


def _bind_v6(port: int) -> socket.socket:
    """A socket on ``[::1]:port`` as another user's server would take it (SO_REUSEADDR, v6 only)."""
    sock = socket.socket(socket.AF_INET6)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    try:
        sock.bind(("::1", port))
    except OSError:
        sock.close()
        raise
    return sock


def test_localhost_at_ipv6_is_held_while_the_port_is_forwarded_and_refuses() -> None:
    """Another user's program listening on [::1]:PORT would get what a browser sends to
    http://localhost:PORT/ (it tries ::1 first), which the owner meant for the forward."""
    port = PortForward(Capsule(1).connect, ME, 8000)
    with pytest.raises(OSError) as taken:
        _bind_v6(port.host_port).close()
    assert taken.value.errno == errno.EADDRINUSE
    with pytest.raises(ConnectionRefusedError):  # refused, so a client goes on to 127.0.0.1
        socket.create_connection(("::1", port.host_port), timeout=5).close()
    trio.run(port.aclose)
    _bind_v6(port.host_port).close()  # given back with the port


def test_a_port_whose_ipv6_loopback_is_taken_is_a_conflict_and_frees_the_port() -> None:
    for _ in range(20):  # the number [::1] gave may be some other socket's on 127.0.0.1 (a busy CI host)
        with contextlib.closing(_bind_v6(0)) as squatter:
            squatter.listen(1)
            number = squatter.getsockname()[1]
            with pytest.raises(CcwError) as raised:
                PortForward(Capsule(1).connect, ME, 8000, host_port=number)
        if "on 127.0.0.1 is in use" not in raised.value.message:
            break
    assert raised.value.code == "CONFLICT" and raised.value.details["host_port"] == number
    assert f"[::1]:{number} is in use" in raised.value.message and "http://localhost:" in raised.value.message
    with socket.socket() as again:  # the 127.0.0.1 listener was closed
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", number))


def test_a_kernel_without_tcp_lookups_is_unsupported_and_frees_the_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peer, "socket_uid", lambda local, remote, scope_id=0: None)
    with pytest.raises(CcwError) as raised:
        PortForward(Capsule(1).connect, ME, 8000)
    assert raised.value.code == "UNSUPPORTED" and "modprobe tcp_diag" in raised.value.message
    with socket.socket() as again:  # the listener was closed
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", raised.value.details["host_port"]))
    monkeypatch.setattr(peer, "socket_uid", lambda local, remote, scope_id=0: (_ for _ in ()).throw(
        OSError(93, "Protocol not supported")))
    with pytest.raises(CcwError, match="Protocol not supported") as raised:
        PortForward(Capsule(1).connect, ME, 8000)
    assert raised.value.code == "UNSUPPORTED"


def test_the_port_asked_for_is_the_port_served() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    port = PortForward(Capsule(1).connect, ME, 8000, host_port=free)
    with contextlib.closing(socket.create_connection(("127.0.0.1", free))):
        assert (port.host_port, port.url) == (free, f"http://127.0.0.1:{free}/")
    trio.run(port.aclose)


class Spares:
    """Unconnected sockets of this namespace, as the helper's ``net_connect`` with ``spares`` gives them."""

    def __init__(self) -> None:
        self.asked: list[int] = []
        self.families: list[int] = []
        self.made: list[socket.socket] = []

    async def make(self, count: int, v6: bool = False) -> list[socket.socket]:
        self.asked.append(count)
        self.families.append(6 if v6 else 4)
        family = socket.AF_INET6 if v6 else socket.AF_INET
        made = [socket.socket(family, socket.SOCK_STREAM | socket.SOCK_NONBLOCK) for _ in range(count)]
        self.made.extend(made)
        return made


def test_connections_use_spares_from_the_pool_which_refills_and_closes_with_the_port() -> None:
    async def main() -> None:
        spares = Spares()
        async with upstream(tail_after_eof) as service:
            capsule = Capsule(service.port)
            port = PortForward(capsule.connect, ME, service.port, spares=spares.make,
                               ready=await spares.make(4), pool_size=4)
            async with trio.open_nursery() as nursery:
                await nursery.start(port.serve)
                for _ in range(6):  # more than the first four: refills came between
                    client = await dial(port)
                    await client.send_all(b"spare")
                    await client.send_eof()
                    assert await read_all(client) == b"got 5 bytes"
                assert (await port.counts()).accepted == 6
                await port.aclose()
        # Spares connected by ccw-forward, but for at most one while a refill was on its way
        # (the refill is asked at half, and these connections follow each other at once).
        assert capsule.calls <= 1
        assert len(spares.asked) >= 2 and all(count <= 4 for count in spares.asked)
        assert all(sock.fileno() == -1 for sock in spares.made)  # passed to ccw-forward, and closed here

    trio.run(main)


def test_the_default_pool_is_refilled_a_whole_helper_call_at_a_time() -> None:
    # A refill is a round trip through this process and the helper, milliseconds of CPU
    # whatever its size: the default pool asks for MAX_SPARES at a time, so a run of fresh
    # connections through a port costs one refill per MAX_SPARES of them, not per few.
    async def main() -> None:
        spares = Spares()
        async with upstream(tail_after_eof) as service:
            capsule = Capsule(service.port)
            port = PortForward(capsule.connect, ME, service.port, spares=spares.make,
                               ready=await spares.make(MAX_SPARES))  # as ports.py opens one
            async with trio.open_nursery() as nursery:
                await nursery.start(port.serve)
                for _ in range(forward.POOL_SIZE - MAX_SPARES + 16):  # past the half: one refill
                    client = await dial(port)
                    await client.send_all(b"spare")
                    await client.send_eof()
                    assert await read_all(client) == b"got 5 bytes"
                await port.aclose()
        assert capsule.calls == 0  # the first spares were there before the program's first accept
        # The first batch; the program's first ask, for the room it left (not for a whole
        # pool on top of it); the ask at half.
        assert spares.asked == [MAX_SPARES] * 3

    trio.run(main)


def test_a_spare_refused_in_the_capsule_leaves_the_connection_to_connect() -> None:
    # The pool is IPv4; a service on ::1 only refuses it, and ``connect`` (the helper's,
    # which tries ::1 too) is asked instead.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        nothing = probe.getsockname()[1]

    async def main() -> None:
        spares = Spares()
        async with upstream(tail_after_eof) as service:
            capsule = Capsule(service.port)
            port = PortForward(capsule.connect, ME, nothing, spares=spares.make, ready=await spares.make(2))
            async with trio.open_nursery() as nursery:
                await nursery.start(port.serve)
                client = await dial(port)
                await client.send_eof()
                assert await read_all(client) == b"got 0 bytes"
                counts = await port.counts()
                await port.aclose()
        assert (capsule.calls, counts.accepted, counts.errors) == (1, 1, 0)

    trio.run(main)


def test_a_client_that_stops_reading_stops_the_service_writing() -> None:
    # Back-pressure: what waits for the client is at most the sockets' buffers and the
    # program's one pipe, so the service's writes stall long before its 64 MiB are taken.
    # (The removed kernel path took 96 MiB in 0.1 s this way.)
    total = 64 << 20
    taken: list[int] = []
    stalled = trio.Event()

    async def firehose(stream: trio.SocketStream, state: object) -> None:
        chunk = bytes(1 << 16)
        sent = 0
        with trio.move_on_after(3):
            while sent < total:
                await stream.send_all(chunk)
                sent += len(chunk)
        taken.append(sent)
        stalled.set()

    async def main() -> None:
        async with upstream(firehose) as service, forwarding(Capsule(service.port).connect) as port:
            client = await dial(port)  # and never read
            with trio.fail_after(30):
                await stalled.wait()
            assert taken and taken[0] < total // 2, f"the service wrote {taken} bytes to a client that reads none"
            received = 0
            with trio.move_on_after(5):
                while received < taken[0]:  # what was taken is delivered, once read
                    received += len(await client.receive_some(1 << 20))
            assert received >= taken[0] - (1 << 16), (received, taken)
            await client.aclose()

    trio.run(main)


def test_a_server_on_ipv6_alone_turns_the_pool_to_ipv6_after_one_connection() -> None:
    # `localhost` resolved to ::1 (Node's dev servers): the IPv4 spares are refused, the
    # helper's connect (v4, then v6) reaches it, and the pool follows that socket's family.
    async def connect_v6(port: int) -> trio.socket.SocketType:
        sock = trio.socket.socket(socket.AF_INET6)
        await sock.connect(("::1", port))
        return sock

    async def main() -> None:
        spares = Spares()
        calls: list[int] = []
        async with upstream(tail_after_eof, host="::1") as service:
            async def connect() -> trio.socket.SocketType:
                calls.append(1)
                return await connect_v6(service.port)

            port = PortForward(connect, ME, service.port, spares=spares.make, ready=await spares.make(4), pool_size=4)
            async with trio.open_nursery() as nursery:
                await nursery.start(port.serve)
                for _ in range(12):
                    client = await dial(port)
                    await client.send_all(b"six")
                    await client.send_eof()
                    assert await read_all(client) == b"got 3 bytes"
                    await trio.sleep(0.02)
                counts = await port.counts()
                await port.aclose()
        # The helper's way for the first IPv4 spare refused (and for a connection that came
        # before the first spares, or before the IPv6 ones, had reached the program); IPv6
        # spares for the rest.
        assert 1 <= len(calls) <= 3, calls
        assert (counts.accepted, counts.errors) == (12, 0)
        first_v6 = spares.families.index(6)  # asked for once the family was known, and only those after
        assert spares.families[0] == 4 and set(spares.families[first_v6:]) == {6}

    trio.run(main)


_UNDER_A_LIMIT = """
import os, socket, sys, trio
from mcp_server.egress.forward import PortForward
from tests.support.egress_harness import shout, upstream

def clients(port):
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(12)]
    answered = []
    for sock in held:
        sock.sendall(b"x")
        sock.settimeout(5)
        try:
            answered.append(sock.recv(10) == b"X")
        except OSError:
            answered.append(False)
    return answered

async def main():
    async with upstream(shout) as service:
        async def spares(count, v6=False):
            return [socket.socket() for _ in range(count)]
        port = PortForward(None, os.geteuid(), service.port, spares=spares, pool_size=28,
                           ready=[socket.socket() for _ in range(28)])
        async with trio.open_nursery() as nursery:
            await nursery.start(port.serve)
            answered = await trio.to_thread.run_sync(clients, port.host_port)
            counts = await port.counts()  # exact: the program counts before it closes
            print(answered.count(True), answered.count(False), counts.errors)
            await port.aclose()

trio.run(main)
"""


def test_under_a_low_descriptor_limit_connections_past_it_are_refused_as_full() -> None:
    # ccw-forward keeps reserved_fds for itself, its pool, a message and its idle pipes;
    # past them, room for six connections of fds_per_connection: the next six are closed
    # as full, told as errors, never accepted and then cut for want of a pipe.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    most = forward.limit("reserved_fds") + 6 * forward.limit("fds_per_connection")
    done = subprocess.run(["prlimit", f"--nofile={most}:{most}", sys.executable, "-c", _UNDER_A_LIMIT],
                          capture_output=True, text=True, timeout=120, cwd=root)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["6", "6", "6"], (done.stdout, done.stderr)


def _connected_tcp_sockets(pid: int) -> list[socket.socket]:
    """Copies of the connected TCP sockets that process ``pid`` holds (pidfd_getfd(2): this
    test's own child, so no more than its parent's permission is needed)."""
    libc = ctypes.CDLL(None, use_errno=True)
    found = []
    pidfd = os.pidfd_open(pid)
    try:
        for name in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if not os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:"):
                    continue
            copy = libc.syscall(438, pidfd, int(name), 0)  # SYS_pidfd_getfd
            if copy < 0:
                continue  # closed meanwhile
            sock = socket.socket(fileno=copy)
            try:
                connected = sock.type == socket.SOCK_STREAM and sock.family == socket.AF_INET and sock.getpeername()
            except OSError:
                connected = False
            if connected:
                found.append(sock)
            else:
                sock.close()
    finally:
        os.close(pidfd)
    return found


@pytest.mark.parametrize("capsule_side", ["spare", "connected by the front end"])
def test_both_sides_of_a_relayed_connection_send_without_delay(capsule_side: str) -> None:
    # A relay with Nagle on would hold a server's second small write (a header, then its
    # body) until the first was acknowledged.  The client's side has it from the listener;
    # the capsule's side is set by ccw-forward, for a spare and for one the front end connected.
    async def main() -> None:
        spares = Spares()
        async with upstream(shout) as service:
            capsule = Capsule(service.port)
            if capsule_side == "spare":
                port = PortForward(capsule.connect, ME, service.port, spares=spares.make,
                                   ready=await spares.make(1), pool_size=1)
            else:
                port = PortForward(capsule.connect, ME, service.port)
            async with trio.open_nursery() as nursery:
                await nursery.start(port.serve)
                client = await dial(port)
                await client.send_all(b"nagle")
                assert await receive_exactly(client, 5) == b"NAGLE"  # relayed: ccw-forward holds both sides
                assert port.program_pid is not None
                held = _connected_tcp_sockets(port.program_pid)
                try:
                    assert sorted(sock.getpeername()[1] for sock in held) == sorted(
                        [client.socket.getsockname()[1], service.port])
                    assert [sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for sock in held] == [1, 1]
                finally:
                    for sock in held:
                        sock.close()
                await client.send_eof()
                assert await read_all(client) == b""
                await port.aclose()
        assert capsule.calls == (0 if capsule_side == "spare" else 1)

    trio.run(main)


def test_a_refill_cancelled_between_two_helper_calls_closes_the_first_calls_sockets() -> None:
    # A refill of more than MAX_SPARES is two helper calls; the forward closing (a destroy)
    # cancelled it in the second, and the first call's sockets were left to the garbage
    # collector (ResourceWarning: unclosed IPv6 sockets, in vm-tests/test_kernel_ports.py).
    made: list[socket.socket] = []
    second = trio.Event()

    async def spares(count: int, v6: bool) -> list[socket.socket]:
        if made:
            second.set()
            await trio.sleep_forever()
        made.extend(socket.socket(socket.AF_INET6 if v6 else socket.AF_INET) for _ in range(count))
        return list(made)

    async def main() -> None:
        port = PortForward(Capsule(1).connect, ME, 1, spares=spares)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(port._refill, MAX_SPARES + 1, True)
                await second.wait()
                nursery.cancel_scope.cancel()
        finally:
            await port.aclose()

    trio.run(main)
    assert len(made) == MAX_SPARES and all(sock.fileno() == -1 for sock in made)
