"""The HTTP proxy over real loopback sockets: CONNECT, absolute-form, denials, bad input."""

from __future__ import annotations

import socket
import struct

import pytest
import trio

from mcp_server.egress.proxy import (
    BadRequest,
    forward_headers,
    rewrite_response_head,
    split_authority,
)
from tests.support.egress_harness import (  # noqa: F401  (relay_engine: a fixture)
    NoDns,
    egress,
    http_responder,
    network,
    read_all,
    read_head,
    relay_engine,
    shout,
    upstream,
)


def run(fn) -> None:  # type: ignore[no-untyped-def]
    trio.run(fn)


@pytest.mark.usefixtures("relay_engine")
def test_connect_relays_both_ways() -> None:
    async def main() -> None:
        async with upstream(shout) as up, egress(network(f"127.0.0.1:{up.port}")) as proxy:
            client = await proxy.http()
            # The first tunnel bytes ride in the same segment as the request.
            await client.send_all(f"CONNECT 127.0.0.1:{up.port} HTTP/1.1\r\nHost: x\r\n\r\nearly ".encode())
            received = b""
            while not received.endswith(b"EARLY "):
                received += await client.receive_some()
            assert received.startswith(b"HTTP/1.1 200 ")
            await client.send_all(b"hello")
            echo = b""
            while echo != b"HELLO":
                echo += await client.receive_some()
            await client.send_eof()
            assert await read_all(client) == b""
            await client.aclose()
            await trio.sleep(0.05)
            records = proxy.session.end_exec()
        assert up.seen == [b"early hello"]
        assert records == [
            {"host": "127.0.0.1", "port": up.port, "protocol": "https", "allowed": True,
             "rule": f"127.0.0.1:{up.port}", "reason": None, "address": "127.0.0.1",
             "bytes_out": 11, "bytes_in": 11, "cut": None, "rules": proxy.session.rules}
        ]
        assert proxy.session.notes() == []

    run(main)


@pytest.mark.usefixtures("relay_engine")
def test_absolute_form_is_forwarded_and_rewritten() -> None:
    reply = (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nKeep-Alive: timeout=5\r\n"
             b"Connection: keep-alive, X-Secret\r\nX-Secret: 1\r\nX-Kept: yes\r\n\r\nhello")

    async def main() -> None:
        async with upstream(http_responder(reply)) as up, egress(network(f"127.0.0.1:{up.port}")) as proxy:
            client = await proxy.http()
            await client.send_all(
                f"POST http://127.0.0.1:{up.port}/path/x?q=1 HTTP/1.1\r\nHost: wrong\r\n"
                "Proxy-Connection: keep-alive\r\nProxy-Authorization: Basic eA==\r\n"
                "Connection: keep-alive, X-Hop\r\nX-Hop: 1\r\nX-Keep: 2\r\n"
                "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n".encode()
            )
            answer = await read_all(client)
            records = proxy.session.end_exec()
        sent = up.seen[0]
        head, _, body = sent.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        assert lines[0] == b"POST /path/x?q=1 HTTP/1.1"
        assert sorted(lines[1:]) == sorted([f"host: 127.0.0.1:{up.port}".encode(), b"x-keep: 2",
                                            b"transfer-encoding: chunked", b"connection: close"])
        assert body == b"3\r\nabc\r\n0\r\n\r\n"
        answer_head, _, answer_body = answer.partition(b"\r\n\r\n")
        assert answer_head.split(b"\r\n") == [b"HTTP/1.1 200 OK", b"Content-Length: 5", b"X-Kept: yes",
                                              b"Connection: close"]
        assert answer_body == b"hello"
        [record] = records
        assert (record["protocol"], record["allowed"], record["bytes_out"], record["bytes_in"]) == (
            "http", True, len(sent), len(answer))

    run(main)


def test_denials_get_403_with_reason_and_no_dns() -> None:
    resolver = NoDns()

    async def main() -> None:
        async with upstream(shout) as up, egress(network(f"127.0.0.1:{up.port}", "*.allowed.example"),
                                                 resolver=resolver) as proxy:
            bodies = []
            for target in ("pypi.org:443", "10.1.2.3:443", f"127.0.0.1:{up.port + 1}", "[::1]:22"):
                client = await proxy.http()
                await client.send_all(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
                bodies.append(await read_all(client))
            client = await proxy.http()
            await client.send_all(b"GET http://denied.example/ HTTP/1.1\r\nHost: denied.example\r\n\r\n")
            bodies.append(await read_all(client))
            records = proxy.session.end_exec()
            notes = proxy.session.notes()
        assert resolver.calls == []
        for body in bodies:
            assert body.startswith(b"HTTP/1.1 403 Forbidden\r\n")
            assert b"; allowed: *.allowed.example, 127.0.0.1:" in body
            assert body.endswith(b"\n")  # what a terminal prints next starts on a line of its own
        assert b"ccw: no rule allows pypi.org:443 (" in bodies[0]
        assert b"ccw: no rule allows 10.1.2.3:443 (" in bodies[1]
        assert f"ccw: no rule allows 127.0.0.1:{up.port + 1} (".encode() in bodies[2]
        assert b"ccw: no rule allows [::1]:22 (" in bodies[3]
        assert [(r["host"], r["protocol"], r["allowed"], r["rule"]) for r in records] == [
            ("10.1.2.3", "https", False, None), ("127.0.0.1", "https", False, None),
            ("::1", "https", False, None), ("denied.example", "http", False, None),
            ("pypi.org", "https", False, None),
        ]
        # A plain miss says how to allow it: the agent's way, and the person's.
        assert notes[-1] == ("ccw network: denied https pypi.org:443: no rule allows pypi.org:443 (to allow it: "
                             'capsule_network {propose: ["pypi.org:443"], reason}, or ccw capsule net CAP allow '
                             "pypi.org:443)")
        assert any(note.startswith("ccw network: denied https [::1]:22: no rule allows [::1]:22 (to allow it: "
                                   'capsule_network {propose: ["[::1]:22"]') for note in notes)
        assert b'capsule_network {propose: ["pypi.org:443"], reason}' in bodies[0]

    run(main)


def test_rebinding_refused_but_exact_localhost_allowed() -> None:
    resolver = NoDns({"evil.allowed.example": ["127.0.0.1"], "localhost": ["127.0.0.1"]})

    async def main() -> None:
        async with upstream(shout) as up, egress(network(f"*.allowed.example:{up.port}", f"localhost:{up.port}"),
                                                 resolver=resolver) as proxy:
            client = await proxy.http()
            await client.send_all(f"CONNECT evil.allowed.example:{up.port} HTTP/1.1\r\nHost: e\r\n\r\n".encode())
            refused = await read_all(client)
            client = await proxy.http()
            await client.send_all(f"CONNECT localhost:{up.port} HTTP/1.1\r\nHost: l\r\n\r\n".encode())
            assert (await read_head(client)).startswith(b"HTTP/1.1 200 ")
            await client.send_all(b"ok")
            assert await client.receive_some() == b"OK"
            await client.aclose()
            await trio.sleep(0.05)
            records = proxy.session.end_exec()
        assert refused.startswith(b"HTTP/1.1 403 ")
        assert b"loopback: evil.allowed.example resolves to 127.0.0.1" in refused
        evil, local = records
        assert (evil["allowed"], evil["address"], evil["rule"]) == (False, "127.0.0.1", f"*.allowed.example:{up.port}")
        assert str(evil["reason"]).startswith("loopback: evil.allowed.example resolves to 127.0.0.1")
        assert (local["allowed"], local["address"], local["rule"]) == (True, "127.0.0.1", f"localhost:{up.port}")

    run(main)


def test_upstream_failures_are_502() -> None:
    async def main() -> None:
        async with upstream(shout) as up:
            closed = up.port
        async with egress(network(f"127.0.0.1:{closed}", "nowhere.example"), resolver=NoDns()) as proxy:
            answers = []
            for target in (f"127.0.0.1:{closed}", "nowhere.example:80"):
                client = await proxy.http()
                await client.send_all(f"CONNECT {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                answers.append(await read_all(client))
            records = proxy.session.end_exec()
        assert answers[0].startswith(b"HTTP/1.1 502 ") and b"cannot connect to 127.0.0.1" in answers[0]
        assert answers[1].startswith(b"HTTP/1.1 502 ") and b"cannot resolve nowhere.example" in answers[1]
        assert all(record["allowed"] for record in records)
        assert "refused" in str(records[0]["reason"]).lower()

    run(main)


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET http://x/ HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (70 * 1024) + b"\r\n\r\n", b"400"),
        (b"\x16\x03\x01\x02\x00garbage\r\n\r\n", b"400"),
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"400"),
        (b"GET https://x/ HTTP/1.1\r\nHost: x\r\n\r\n", b"400"),
        (b"CONNECT x HTTP/1.1\r\nHost: x\r\n\r\n", b"400"),
        (b"CONNECT [::1:80 HTTP/1.1\r\nHost: x\r\n\r\n", b"400"),
        (b"GET http://x:99999/ HTTP/1.1\r\nHost: x\r\n\r\n", b"400"),
        (b"GET http://127.0.0.1:1", b"408"),  # slowloris: the head never completes
        (b"GET http://x/ HTT", b"400"),  # early EOF inside the head
        (b"", b""),  # EOF before anything: closed without an answer
    ],
)
def test_malformed_requests_do_not_hurt_the_session(request_bytes: bytes, status: bytes) -> None:
    async def main() -> None:
        async with upstream(shout) as up, egress(network(f"127.0.0.1:{up.port}"), header_timeout=0.3) as proxy:
            client = await proxy.http()
            await client.send_all(request_bytes)
            if status != b"408":
                await client.send_eof()
            answer = await read_all(client)
            assert answer[9:12] == status, answer[:200]
            client = await proxy.http()
            await client.send_all(f"CONNECT 127.0.0.1:{up.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert (await read_head(client)).startswith(b"HTTP/1.1 200 ")
            await client.aclose()

    run(main)


def test_pure_helpers() -> None:
    assert split_authority("[::1]:8080", None) == ("::1", 8080)
    assert split_authority("pypi.org", 80) == ("pypi.org", 80)
    assert split_authority("Pypi.org:443", None) == ("Pypi.org", 443)
    for bad in ("pypi.org", "::1:80", "[::1]x", "x:0", "x:abc"):
        with pytest.raises(BadRequest, match=r"authority|port|brackets"):
            split_authority(bad, None)
    headers = [(b"host", b"a"), (b"connection", b"X-A, keep-alive"), (b"x-a", b"1"), (b"te", b"trailers"),
               (b"accept", b"*/*")]
    assert forward_headers(headers, b"h:1") == [(b"host", b"h:1"), (b"accept", b"*/*"), (b"connection", b"close")]
    head = b"HTTP/1.1 204 No Content\r\nUpgrade: h2\r\nDate: x\r\n\r\n"
    assert rewrite_response_head(head) == b"HTTP/1.1 204 No Content\r\nDate: x\r\nConnection: close\r\n\r\n"
    for bad in (b"SSH-2.0\r\n\r\n", b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", b"HTTP/1.1 200 OK\r\n x: y\r\n\r\n"):
        with pytest.raises(ValueError):
            rewrite_response_head(bad)


@pytest.mark.usefixtures("relay_engine")
def test_byte_cap_cuts_a_plain_response() -> None:
    body = b"y" * (2 << 20)
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body

    async def main() -> None:
        async with upstream(http_responder(reply)) as up, \
                egress(network(f"127.0.0.1:{up.port}", max_bytes=300_000)) as proxy:
            client = await proxy.http()
            await client.send_all(f"GET http://127.0.0.1:{up.port}/big HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            answer = await read_all(client)
            [record] = proxy.session.end_exec()
        assert record["cut"] == "byte cap (300000 bytes)"
        assert record["bytes_out"] + record["bytes_in"] == 300_000
        assert len(answer) == record["bytes_in"]
        assert answer.startswith(b"HTTP/1.1 200 OK\r\nContent-Length: 2097152\r\nConnection: close\r\n\r\nyyy")

    trio.run(main)


async def _reset_after_head(stream: trio.SocketStream, state: object) -> None:
    """Read the request's head, then reset the connection (as a TLS server sent plain HTTP does)."""
    received = b""
    while b"\r\n\r\n" not in received and (data := await stream.receive_some()):
        received += data
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    stream.socket.close()


@pytest.mark.usefixtures("relay_engine")
def test_an_upstream_reset_before_its_answer_is_a_502() -> None:
    """The jail got an empty close (curl: "Empty reply from server"), no reason anywhere, when the
    upstream reset the connection before answering: a plain request to a port that speaks TLS
    (``/route/NAME/`` to an https upstream on another port than 443) is the common case."""
    async def main() -> None:
        async with upstream(_reset_after_head) as up, egress(network(f"127.0.0.1:{up.port}")) as proxy:
            client = await proxy.http()
            await client.send_all(f"GET http://127.0.0.1:{up.port}/x HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            answer = await read_all(client)
            [record] = proxy.session.end_exec()
        assert answer.startswith(b"HTTP/1.1 502 ") and b"before its answer" in answer, answer
        assert "before its answer" in str(record["reason"])

    run(main)


def test_an_unreadable_header_is_refused_in_words() -> None:
    # h11 quoted the refused line as a Python repr (bytearray(b'...')), placeholder and all.
    async def main() -> bytes:
        async with upstream(shout) as up, egress(network(f"127.0.0.1:{up.port}")) as proxy:
            client = await proxy.http()
            await client.send_all(b"GET http://x/ HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ccwph\rX-In: 1\r\n\r\n")
            await client.send_eof()
            return await read_all(client)

    answer = trio.run(main)
    assert answer.startswith(b"HTTP/1.1 400 "), answer
    assert answer.endswith(b"\r\n\r\nccw: illegal header line: a bare CR or LF, or a byte HTTP does not allow there\n")
