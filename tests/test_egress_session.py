"""EgressSession over real loopback sockets: SOCKS5, caps, records, parallelism, aclose."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
import struct

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcp_server.core import netrules
from mcp_server.core.netspace import HostSpace
from mcp_server.egress import session as session_module
from mcp_server.egress import splice
from mcp_server.egress.relay import Attempt
from tests.support.egress_harness import (
    NoDns,
    Running,
    egress,
    network,
    read_all,
    read_head,
    relay_engine,  # noqa: F401  (a fixture)
    shout,
    upstream,
)


def socks_request(host: str, port: int, command: int = 1) -> bytes:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        target = bytes([3, len(host)]) + host.encode()
    else:
        target = bytes([1 if address.version == 4 else 4]) + address.packed
    return b"\x05\x01\x00" + bytes([5, command, 0]) + target + struct.pack("!H", port)


async def socks_connect(stream: trio.SocketStream, host: str, port: int, command: int = 1) -> int:
    """Send greeting + request at once; the reply code (after checking the greeting)."""
    await stream.send_all(socks_request(host, port, command))
    received = b""
    with trio.fail_after(10):
        while len(received) < 12:
            data = await stream.receive_some()
            if not data:
                break
            received += data
    assert received[:2] == b"\x05\x00", received
    return received[3]


@pytest.mark.usefixtures("relay_engine")
def test_socks_domain_v4_v6_allowed_and_denied() -> None:
    async def main() -> None:
        async with upstream(shout) as up4, upstream(shout, "::1") as up6:
            rules = network(f"localhost:{up4.port}", f"127.0.0.1:{up4.port}", f"[::1]:{up6.port}")
            resolver = NoDns({"localhost": ["127.0.0.1"]})
            async with egress(rules, resolver=resolver) as proxy:
                for host, port in (("localhost", up4.port), ("127.0.0.1", up4.port), ("::1", up6.port)):
                    client = await proxy.socks()
                    assert await socks_connect(client, host, port) == 0
                    await client.send_all(b"abc")
                    assert await client.receive_some() == b"ABC"
                    await client.aclose()
                codes = []
                for host, port, command in (("pypi.org", 443, 1), ("10.0.0.1", 80, 1), ("::2", 80, 1),
                                            ("127.0.0.1", up4.port, 2), ("127.0.0.1", up4.port, 3)):
                    client = await proxy.socks()
                    codes.append(await socks_connect(client, host, port, command))
                    await client.aclose()
                await trio.sleep(0.05)
                records = proxy.session.end_exec()
        assert codes == [2, 2, 2, 7, 7]
        assert resolver.calls == ["localhost"]
        assert [(r["host"], r["protocol"], r["allowed"], r["bytes_out"], r["bytes_in"]) for r in records] == [
            ("10.0.0.1", "socks5", False, 0, 0),
            ("127.0.0.1", "socks5", True, 3, 3),
            ("::1", "socks5", True, 3, 3),
            ("::2", "socks5", False, 0, 0),
            ("localhost", "socks5", True, 3, 3),
            ("pypi.org", "socks5", False, 0, 0),
        ]

    trio.run(main)


def test_socks_bad_handshakes() -> None:
    async def main() -> None:
        async with egress(network("127.0.0.1"), header_timeout=0.3) as proxy:
            client = await proxy.socks()
            await client.send_all(b"\x05\x01\x02")  # username/password only
            assert await read_all(client) == b"\x05\xff"
            client = await proxy.socks()
            await client.send_all(b"\x04\x01\x00\x50\x7f\x00\x00\x01\x00")  # SOCKS4
            assert await read_all(client) == b""
            client = await proxy.socks()
            await client.send_all(b"\x05\x01\x00\x05\x01\x00\x09")  # address type 9
            assert (await read_all(client))[:4] == b"\x05\x00\x05\x08"
            client = await proxy.socks()
            await client.send_all(b"\x05\x01")  # then nothing: the handshake deadline
            assert await read_all(client) == b""
            assert proxy.session.end_exec() == []

    trio.run(main)


def test_connection_cap_refuses_with_reason() -> None:
    async def main() -> None:
        async with upstream(shout) as up, egress(network(f"127.0.0.1:{up.port}", max_connections=2)) as proxy:
            opened = []
            for _ in range(2):
                client = await proxy.http()
                await client.send_all(f"CONNECT 127.0.0.1:{up.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                assert (await read_head(client)).startswith(b"HTTP/1.1 200 ")
                opened.append(client)
            for _ in range(3):
                client = await proxy.http()
                await client.send_all(f"CONNECT 127.0.0.1:{up.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                answer = await read_all(client)
                assert answer.startswith(b"HTTP/1.1 403 ") and b"ccw: connection cap (2) reached" in answer
            client = await proxy.socks()
            assert await socks_connect(client, "127.0.0.1", up.port) == 2
            await client.aclose()
            records = proxy.session.end_exec()
            proxy.session.begin_exec()  # a new exec has the full cap again
            client = await proxy.http()
            await client.send_all(f"CONNECT 127.0.0.1:{up.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert (await read_head(client)).startswith(b"HTTP/1.1 200 ")
            for stream in [*opened, client]:
                await stream.aclose()
        reasons = [(r["protocol"], r["allowed"], r["reason"]) for r in records]
        assert reasons == [("https", True, None), ("https", True, None),
                           ("https", False, "connection cap (2) reached"),
                           ("socks5", False, "connection cap (2) reached")]

    trio.run(main)


@pytest.mark.usefixtures("relay_engine")
def test_byte_cap_cuts_the_relay() -> None:
    payload = b"x" * (4 << 20)

    async def flood(stream: trio.SocketStream, state: object) -> None:
        await stream.receive_some()
        try:
            await stream.send_all(payload)
        except trio.BrokenResourceError:
            pass

    async def main() -> None:
        async with upstream(flood) as up, egress(network(f"127.0.0.1:{up.port}", max_bytes=100_000)) as proxy:
            client = await proxy.http()
            await client.send_all(f"CONNECT 127.0.0.1:{up.port} HTTP/1.1\r\nHost: x\r\n\r\ngo".encode())
            received = await read_all(client)
            records = proxy.session.end_exec()
            notes = proxy.session.notes()
        [record] = records
        assert record["cut"] == "byte cap (100000 bytes)"
        assert notes == [f"ccw network: cut https 127.0.0.1:{up.port} after 100000 bytes: byte cap (100000 bytes)"]
        assert record["bytes_out"] == 2
        assert record["bytes_in"] == 100_000 - 2
        assert len(received) == len(b"HTTP/1.1 200 Connection established\r\n\r\n") + 100_000 - 2

    trio.run(main)


def test_records_sorted_and_between_execs_kept() -> None:
    async def main() -> None:
        async with upstream(shout) as up, egress(network(f"127.0.0.1:{up.port}"), resolver=NoDns()) as proxy:
            session = proxy.session
            for target in ("zeta.example:1", f"127.0.0.1:{up.port}", "alpha.example:2", "alpha.example:1"):
                client = await proxy.http()
                await client.send_all(f"CONNECT {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                if target.startswith("127."):
                    await read_head(client)
                    await client.send_all(b"hi")
                    assert await client.receive_some() == b"HI"
                    await client.aclose()
                else:
                    await read_all(client)
            await trio.sleep(0.05)
            first = session.end_exec()
            client = await proxy.http()  # between execs: goes to the next exec
            await client.send_all(b"CONNECT late.example:9 HTTP/1.1\r\nHost: x\r\n\r\n")
            await read_all(client)
            session.begin_exec()
            second = session.end_exec()
            assert session.notes() == ["ccw network: denied https late.example:9: no rule allows late.example:9 ("
                                       + netrules.allow_hint("late.example:9") + ")"]
            assert session.end_exec() == []
        assert [(r["host"], r["port"]) for r in first] == [
            ("127.0.0.1", up.port), ("alpha.example", 1), ("alpha.example", 2), ("zeta.example", 1)]
        assert (first[0]["bytes_out"], first[0]["bytes_in"]) == (2, 2)
        assert [r["host"] for r in second] == ["late.example"]

    trio.run(main)


@pytest.mark.usefixtures("relay_engine")
def test_fifty_parallel_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    # With 8 splice threads, the other 42 tunnels take the trio relay.
    monkeypatch.setattr(splice, "THREADS", trio.CapacityLimiter(8))

    async def main() -> None:
        async with upstream(shout) as up, egress(network(f"127.0.0.1:{up.port}")) as proxy:

            async def one(index: int) -> None:
                client = await (proxy.http() if index % 2 else proxy.socks())
                if index % 2:
                    await client.send_all(f"CONNECT 127.0.0.1:{up.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                    await read_head(client)
                else:
                    assert await socks_connect(client, "127.0.0.1", up.port) == 0
                message = f"conn-{index:02d}-".encode() * 1000
                await client.send_all(message)
                await client.send_eof()
                assert await read_all(client) == message.upper()

            async with trio.open_nursery() as nursery:
                for index in range(50):
                    nursery.start_soon(one, index)
            records = proxy.session.end_exec()
        assert len(records) == 50
        assert all(r["allowed"] and r["bytes_out"] == r["bytes_in"] == 8000 for r in records)
        assert sorted(up.seen) == sorted(f"conn-{i:02d}-".encode() * 1000 for i in range(50))

    trio.run(main)


@pytest.mark.usefixtures("relay_engine")
def test_aclose_cancels_open_relays() -> None:
    async def main() -> None:
        async with upstream(shout) as up:
            async with egress(network(f"127.0.0.1:{up.port}")) as proxy:
                client = await proxy.http()
                await client.send_all(f"CONNECT 127.0.0.1:{up.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                await read_head(client)
                with trio.fail_after(5):
                    await proxy.session.aclose()
                assert await read_all(client) == b""
                port = proxy.http_port
            with socket.socket() as probe:
                assert probe.connect_ex(("127.0.0.1", port)) != 0  # the listener is closed

    trio.run(main)


def _syn(src: str, dst: str, port: int, flags: int = 0x02) -> bytes:
    tcp = struct.pack("!HHIIBBHHH", 40000, port, 0, 0, 5 << 4, flags, 65535, 0, 0)
    header = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0, 64, 6, 0,
                         socket.inet_aton(src), socket.inet_aton(dst))
    return header + tcp


def _udp6(src: str, dst: str, port: int) -> bytes:
    udp = struct.pack("!HHHH", 5353, port, 8, 0)
    return struct.pack("!IHBB16s16s", 6 << 28, len(udp), 17, 64, socket.inet_pton(socket.AF_INET6, src),
                       socket.inet_pton(socket.AF_INET6, dst)) + udp


def test_sniffer_records_direct_attempts_once() -> None:
    async def main() -> None:
        async with egress(network("127.0.0.1")) as proxy:
            peer = proxy.sniff_peer
            peer.send(_syn("10.99.0.2", "1.2.3.4", 443))
            peer.send(_syn("10.99.0.2", "1.2.3.4", 443))  # the same attempt looping: one record
            peer.send(_syn("10.99.0.2", "127.0.0.1", proxy.http_port))  # the proxy at work
            peer.send(_syn("10.99.0.2", "1.2.3.4", 80, flags=0x12))  # SYN-ACK: not an attempt
            peer.send(_syn("10.99.0.1", "10.99.0.2", 5555))  # toward the jail
            peer.send(_udp6("fd63:6377::2", "2001:4860:4860::8888", 53))
            peer.send(b"\x00garbage")
            await trio.sleep(0.1)
            records = proxy.session.end_exec()
            notes = proxy.session.notes()
        reason = "direct connection outside ccw's proxy (use HTTP_PROXY/ALL_PROXY)"
        assert records == [
            {"host": "1.2.3.4", "port": 443, "protocol": "tcp", "allowed": False, "rule": None,
             "reason": reason, "address": "1.2.3.4", "bytes_out": 0, "bytes_in": 0, "cut": None,
             "rules": proxy.session.rules},
            {"host": "2001:4860:4860::8888", "port": 53, "protocol": "udp", "allowed": False, "rule": None,
             "reason": reason, "address": "2001:4860:4860::8888", "bytes_out": 0, "bytes_in": 0, "cut": None,
             "rules": proxy.session.rules},
        ]
        assert notes == [f"ccw network: denied tcp 1.2.3.4:443: {reason}",
                         f"ccw network: denied udp [2001:4860:4860::8888]:53: {reason}"]

    trio.run(main)


def test_an_exec_ends_with_the_direct_attempts_its_sniffer_has_queued() -> None:
    """The sniffer's task reads a packet a turn; what is queued when the exec ends is read
    then (vm-tests/test_network_e2e.py once lost an exec's last four), and only once."""
    async def main() -> None:
        async with egress(network("127.0.0.1")) as proxy:
            await trio.testing.wait_all_tasks_blocked()  # the sniffer's task waits on its socket
            for port in (22, 80, 443, 5353):
                proxy.sniff_peer.send(_syn("10.99.0.2", "1.2.3.4", port))
            proxy.sniff_peer.send(_udp6("fd63:6377::2", "fe80::1", 53))
            ended = proxy.session.end_exec()  # no checkpoint since the sends: the task has read none
            proxy.session.begin_exec()
            await trio.testing.wait_all_tasks_blocked()
            later = proxy.session.end_exec()
        assert [(r["host"], r["port"], r["protocol"]) for r in ended] == [
            ("1.2.3.4", 22, "tcp"), ("1.2.3.4", 80, "tcp"), ("1.2.3.4", 443, "tcp"), ("1.2.3.4", 5353, "tcp"),
            ("fe80::1", 53, "udp")]
        assert later == []

    trio.run(main)


def test_no_direct_attempt_waits_outside_the_queue_while_an_exec_ends() -> None:
    """The sniffer's task hands on each packet it takes off the queue before it lets another
    task run: an exec ending right after a packet was taken has it (trio's recvfrom once
    kept a packet across its closing checkpoint, half the time, and the exec lost it)."""
    told: list[trio.Event] = []

    def observe(attempt: Attempt) -> None:
        if attempt.port % 2:  # the first of a pair: the second arrives as it is recorded
            running.sniff_peer.send(_syn("10.99.0.2", "1.2.3.4", attempt.port + 1))
            told[-1].set()

    async def main() -> None:
        nonlocal running
        async with egress(network("127.0.0.1"), observe=observe) as running:
            for port in range(1, 41, 2):
                running.session.begin_exec()
                told.append(trio.Event())
                running.sniff_peer.send(_syn("10.99.0.2", "1.2.3.4", port))
                await told[-1].wait()
                ended = running.session.end_exec()
                assert [r["port"] for r in ended] == [port, port + 1]

    running: Running
    trio.run(main)


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


_PREFIXES = [b"", b"\x05\x01\x00", b"\x05\x01\x00\x05\x01\x00\x03", b"\x05\x01\x00\x05\x01\x00\x01",
             b"CONNECT ", b"GET http://", b"GET http://127.0.0.1:1/ HTTP/1.1\r\n"]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(_PREFIXES), st.binary(max_size=200), st.booleans()),
                min_size=1, max_size=6))
def test_random_bytes_never_hurt_the_session(payloads: list[tuple[bytes, bytes, bool]]) -> None:
    errors = _Errors()
    logging.getLogger("ccw.egress").addHandler(errors)

    async def main() -> None:
        async with upstream(shout) as up, egress(network(f"127.0.0.1:{up.port}"), header_timeout=0.2) as proxy:
            for prefix, junk, socks in payloads:
                client = await (proxy.socks() if socks else proxy.http())
                with contextlib.suppress(trio.BrokenResourceError):
                    await client.send_all(prefix + junk)
                    await client.send_eof()
                await read_all(client)
            client = await proxy.http()
            await client.send_all(f"CONNECT 127.0.0.1:{up.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert (await read_head(client)).startswith(b"HTTP/1.1 200 ")
            await client.aclose()

    try:
        trio.run(main)
    finally:
        logging.getLogger("ccw.egress").removeHandler(errors)
    assert errors.messages == []


def test_the_host_and_private_space_are_refused_on_the_address_connected_to() -> None:
    host = HostSpace(addresses=frozenset({ipaddress.ip_address("198.18.0.1")}),
                     resolvers=frozenset({ipaddress.ip_address("198.18.0.53")}))
    reads: list[HostSpace] = []

    def space() -> HostSpace:
        reads.append(host)
        return host

    resolver = NoDns({"host.example": ["198.18.0.1"], "lan.example": ["10.1.2.3"],
                      "mixed.example": ["10.1.2.3", "127.0.0.1"]})

    async def main() -> None:
        async with upstream(shout) as up:
            p = up.port
            rules = network(f"*.example:{p}", f"0.0.0.0/0:{p}", f"[::/0]:{p}", f"127.0.0.1:{p}")
            async with egress(rules, resolver=resolver, space=space) as proxy:
                answers = []
                for target in (f"host.example:{p}", f"10.1.2.3:{p}", f"[::ffff:10.1.2.3]:{p}"):
                    client = await proxy.http()
                    await client.send_all(f"CONNECT {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                    answers.append(await read_all(client))
                client = await proxy.http()
                await client.send_all(f"GET http://lan.example:{p}/ HTTP/1.1\r\nHost: lan.example\r\n\r\n".encode())
                answers.append(await read_all(client))
                client = await proxy.socks()
                socks = await socks_connect(client, "198.18.0.53", p)
                await client.aclose()
                client = await proxy.http()  # one address refused, the next (named exactly) taken
                await client.send_all(f"CONNECT mixed.example:{p} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                assert (await read_head(client)).startswith(b"HTTP/1.1 200 ")
                await client.send_all(b"hi")
                assert await client.receive_some() == b"HI"
                await client.aclose()
                await trio.sleep(0.05)
                records = {(r["host"], r["protocol"]): r for r in proxy.session.end_exec()}
        assert all(answer.startswith(b"HTTP/1.1 403 ") for answer in answers) and socks == 2
        mapped = str(ipaddress.ip_address("::ffff:10.1.2.3"))
        verdicts = {key: (r["allowed"], r["address"], str(r["reason"]).split(":")[0]) for key, r in records.items()}
        assert verdicts == {
            ("host.example", "https"): (False, "198.18.0.1", "host address"),
            ("10.1.2.3", "https"): (False, "10.1.2.3", "private"),
            (mapped, "https"): (False, mapped, "private"),
            ("lan.example", "http"): (False, "10.1.2.3", "private"),
            ("198.18.0.53", "socks5"): (False, "198.18.0.53", "resolver"),
            ("mixed.example", "https"): (True, "127.0.0.1", "None"),
        }
        assert b"ccw: host address: host.example resolves to 198.18.0.1, an address of this host;" in answers[0]
        assert len(reads) == 6  # read again for every connection

    trio.run(main)


def test_each_attempt_is_told_once_with_its_final_verdict_while_the_exec_runs() -> None:
    """What a watcher sees live: denied by the rules at once, refused on the address it
    resolved to, connected; each once, and before the exec's records are taken."""
    told: list[tuple[str, bool, str]] = []
    resolver = NoDns({"lan.example": ["10.1.2.3"], "ok.example": ["127.0.0.1"]})

    async def main() -> None:
        async with upstream(shout) as up:
            p = up.port
            rules = network(f"*.example:{p}", f"127.0.0.1:{p}")
            observe = lambda a: told.append((a.host, a.allowed, str(a.reason).split(":")[0]))  # noqa: E731
            async with egress(rules, resolver=resolver, observe=observe) as proxy:
                for target in ("denied.test:443", f"lan.example:{p}", f"ok.example:{p}"):
                    client = await proxy.http()
                    await client.send_all(f"CONNECT {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                    if target.startswith("ok."):
                        assert (await read_head(client)).startswith(b"HTTP/1.1 200 ")
                    else:
                        assert (await read_all(client)).startswith(b"HTTP/1.1 403 ")
                    await client.aclose()
                assert told == [("denied.test", False, "no rule allows denied.test"),
                                ("lan.example", False, "private"), ("ok.example", True, "None")]
                await trio.sleep(0.05)
                assert len(proxy.session.end_exec()) == 3

    trio.run(main)
    assert len(told) == 3


def test_an_exec_tells_of_at_most_max_told_attempts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each telling is a database row: a jail making new records past the caps (new hosts)
    must not make rows without bound."""
    monkeypatch.setattr(session_module, "MAX_TOLD", 2)
    told: list[str] = []

    async def deny(proxy: Running, host: str) -> None:
        client = await proxy.http()
        await client.send_all(f"CONNECT {host}:443 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert (await read_all(client)).startswith(b"HTTP/1.1 403 ")
        await client.aclose()

    async def main() -> None:
        async with egress(network("127.0.0.1:9"), observe=lambda a: told.append(a.host)) as proxy:
            for host in ("a.test", "b.test", "c.test"):
                await deny(proxy, host)
            assert told == ["a.test", "b.test"]
            proxy.session.end_exec()
            proxy.session.begin_exec()  # the next exec is told again
            await deny(proxy, "d.test")
            assert told == ["a.test", "b.test", "d.test"]

    trio.run(main)
