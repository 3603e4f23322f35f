"""A terminated connection's response body relayed in a worker thread (egress/tlsbody.py
``copy_to_eof``), and by the trio relay when no thread is to be had (``relay_engine``), over real
loopback sockets: a body of several MiB arrives whole and in order, the exec's byte cap cuts it
at the cap, and a body the upstream stops sending in the middle ends when the session closes
(the thread is woken, not left waiting)."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import ssl
from pathlib import Path
from typing import Any, cast

import pytest
import trio

from mcp_server.core.placeholders import CapsuleSecrets
from mcp_server.core.secretbind import make_binding
from mcp_server.core.tlsca import make_authority
from mcp_server.egress import splice, tlsbody, tlsterm
from mcp_server.egress.credentials import Credentials
from mcp_server.fs.castore import ServerContexts, server_context
from tests.support.egress_harness import (  # noqa: F401  (relay_engine: a fixture)
    Running,
    Serve,
    Upstream,
    egress,
    network,
    read_head,
    relay_engine,
    upstream,
)

BODY = os.urandom(1 << 20) * 3 + os.urandom(12345)  # records and chunks of every size on the way
NOW = dt.datetime.now(dt.UTC)
PUBLIC = make_authority(["127.0.0.1"], NOW)  # stands for a public CA the host trusts
CAPSULE = make_authority(["127.0.0.1"], NOW)  # the capsule's own


def bound(port: int) -> Credentials:
    """A secret bound to the upstream (so its CONNECT is terminated), with the capsule's CA."""
    secrets = CapsuleSecrets({"TOKEN": make_binding("TOKEN", [f"127.0.0.1:{port}"])}, {"TOKEN": 8})
    return Credentials(secrets, lambda name: b"t0ken-12", ServerContexts(CAPSULE))


async def connected(proxy: Running, port: int) -> trio.SSLStream[trio.SocketStream]:
    client = await proxy.http()
    await client.send_all(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    assert (await read_head(client)).startswith(b"HTTP/1.1 200 ")
    context = ssl.create_default_context(cadata=CAPSULE.cert_pem().decode())
    return trio.SSLStream(client, context, server_hostname="127.0.0.1")


@pytest.fixture(autouse=True)
def host_trusts_public(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "public.pem").write_bytes(PUBLIC.cert_pem())
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "public.pem"))
    tlsterm.upstream_context.cache_clear()


def serving(body: bytes, stall: bool = False, ragged: bool = False) -> Serve:
    """A TLS upstream answering any request with ``body`` (its whole length announced, unless
    ``ragged``: then the close delimits it, and comes without close_notify, as a cut on the
    network would end it); ``stall``: half of it, then nothing more until the proxy closes."""

    async def serve(stream: trio.SocketStream, state: Upstream) -> None:
        tls = trio.SSLStream(stream, server_context(PUBLIC.leaf("127.0.0.1", NOW)), server_side=True)
        received = b""
        try:
            while b"\r\n\r\n" not in received and (data := await tls.receive_some()):
                received += data
            state.seen.append(received)
            framing = b"Connection: close" if ragged else b"Content-Length: %d" % len(body)
            await tls.send_all(b"HTTP/1.1 200 OK\r\n%s\r\n\r\n" % framing)
            await tls.send_all(body[: len(body) // 2] if stall else body)
            if stall:
                await tls.receive_some()  # until the proxy goes
            await (tls.transport_stream.aclose() if ragged else tls.aclose())
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    return serve


async def download(max_bytes: int | None = None, stall: bool = False, body: bytes = BODY,
                   ragged: bool = False) -> tuple[bytes, list[dict[str, object]], bool]:
    """One GET through a terminated CONNECT: what the client read (head and body), the records, and
    whether the client gave up waiting (a relay that never ended, or one that ended without
    close_notify: the client's reads raise)."""
    async with upstream(serving(body, stall, ragged)) as up, \
            egress(network(f"127.0.0.1:{up.port}", max_bytes=max_bytes)) as proxy:
        proxy.session.credentials = bound(up.port)
        tls = await connected(proxy, up.port)
        await tls.send_all(f"GET /big HTTP/1.1\r\nHost: 127.0.0.1:{up.port}\r\n\r\n".encode())
        received = bytearray()
        with trio.move_on_after(30) as guard:  # against a hang, not a measure
            try:
                while data := await tls.receive_some():
                    received += data
                    if stall and len(received) > len(BODY) // 2:
                        await proxy.session.aclose()  # the exec's end: the relay must let go
            except trio.BrokenResourceError:
                ragged = True  # a cut connection ends without close_notify
            else:
                ragged = False
        await tls.transport_stream.aclose()
        return bytes(received), proxy.session.end_exec(), guard.cancelled_caught or (ragged and not stall)


@pytest.mark.usefixtures("relay_engine")
def test_a_large_body_arrives_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    copies: list[str] = []
    threaded = tlsbody._copy

    def counted(*args: Any) -> bool:
        copies.append("thread")
        return threaded(*args)

    monkeypatch.setattr(tlsbody, "_copy", counted)
    received, [record], hung = trio.run(download)
    assert not hung
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"Connection: close" in head
    assert hashlib.sha256(body).digest() == hashlib.sha256(BODY).digest()
    assert record["tls"] == "terminated" and record["cut"] is None
    assert copies == (["thread"] if splice.ENABLED else [])  # no thread when none may be used


@pytest.mark.usefixtures("relay_engine")
def test_the_byte_cap_cuts_a_threaded_body() -> None:
    cap = 1 << 20
    received, [record], ended_badly = trio.run(download, cap)
    assert ended_badly  # no close_notify after a cut body: the client can tell it from a whole one
    assert record["cut"] is not None and "byte cap" in str(record["cut"])
    assert 0 < len(received) <= cap and cast(int, record["bytes_in"]) <= cap
    assert received.partition(b"\r\n\r\n")[2] == BODY[: len(received.partition(b"\r\n\r\n")[2])]


@pytest.mark.usefixtures("relay_engine")
def test_a_stalled_body_ends_when_the_session_closes() -> None:
    received, records, hung = trio.run(download, None, True)
    assert not hung  # the session's close ended the relay waiting on the upstream
    body = received.partition(b"\r\n\r\n")[2]
    assert len(body) < len(BODY) and body == BODY[: len(body)]
    assert [record["tls"] for record in records] == ["terminated"]


SHORT = os.urandom(50_000)  # a few records: less than what ``copy_to_eof`` relays before it takes a thread


@pytest.mark.usefixtures("relay_engine")
def test_a_short_body_is_relayed_in_trio_and_ends_with_close_notify(monkeypatch: pytest.MonkeyPatch) -> None:
    threaded: list[str] = []
    monkeypatch.setattr(tlsbody, "_copy", lambda *args: threaded.append("thread"))
    received, [record], ended_badly = trio.run(download, None, False, SHORT)
    assert not ended_badly  # the client saw close_notify after the last byte
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and body == SHORT
    assert record["tls"] == "terminated" and record["cut"] is None
    assert threaded == []


@pytest.mark.usefixtures("relay_engine")
def test_the_byte_cap_cuts_a_short_body_before_any_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    threaded: list[str] = []
    monkeypatch.setattr(tlsbody, "_copy", lambda *args: threaded.append("thread"))
    cap = 20_000
    received, [record], ended_badly = trio.run(download, cap, False, SHORT)
    assert ended_badly
    assert record["cut"] is not None and "byte cap" in str(record["cut"])
    assert 0 < len(received) <= cap and cast(int, record["bytes_in"]) <= cap
    body = received.partition(b"\r\n\r\n")[2]
    assert body == SHORT[: len(body)] and len(body) < len(SHORT)
    assert threaded == []


@pytest.mark.usefixtures("relay_engine")
@pytest.mark.parametrize("body", [SHORT, BODY], ids=["in-trio", "threaded"])
def test_an_upstream_end_without_close_notify_reaches_the_jail_without_one(body: bytes) -> None:
    """A body the close delimits, ended by a bare TCP close (a truncation on the upstream's
    network looks the same): end to end, the client would see the ragged end and know the body
    may be cut; through the proxy it must too, not a close_notify that vouches for it."""
    received, [record], ended_badly = trio.run(download, None, False, body, True)
    assert received.partition(b"\r\n\r\n")[2] == body  # every byte the upstream sent, then no close_notify
    assert ended_badly and record["tls"] == "terminated"
