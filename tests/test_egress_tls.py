"""TLS the proxy terminates (egress/tlsterm.py, issue 38) over real loopback sockets.

The upstream is a TLS server whose certificate a "public" test CA signed, which the
front end trusts through ``SSL_CERT_FILE`` (as a host trusts its system store); the
jail's side trusts the capsule's own name-constrained CA.  A CONNECT to a bound host is
decrypted, its request judged as a plain one is (the placeholder swapped, the echo
masked), and sent upstream over the proxy's verified TLS; a hello naming another host,
HTTP/2 prior knowledge and a request naming another host are refused and recorded.
A compressed echo never reaches the jail: the upstream is asked for none, and one that
compresses anyway is refused.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gzip
import ipaddress
import ssl
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import pytest
import trio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from mcp_server.core.placeholders import CapsuleSecrets
from mcp_server.core.secretbind import make_binding
from mcp_server.core.tlsca import make_authority
from mcp_server.egress import tlsterm
from mcp_server.egress.credentials import EXFILTRATION, Credentials
from mcp_server.fs.castore import ServerContexts, server_context
from tests.support.egress_harness import Upstream, egress, network, read_all, read_head, upstream

VALUE = b"tok-" + b"S3cr3t" * 6  # 40 bytes: its placeholder is as long
NOW = dt.datetime.now(dt.UTC)
PUBLIC = make_authority(["127.0.0.1"], NOW)  # stands for a public CA the host trusts
CAPSULE = make_authority(["127.0.0.1"], NOW)  # the capsule's own


def store() -> Callable[[str], bytes]:
    """Stands for fs/secretstore."""
    return lambda name: VALUE


def secrets_for(port: int) -> CapsuleSecrets:
    return CapsuleSecrets({"TOKEN": make_binding("TOKEN", [f"127.0.0.1:{port}"])}, {"TOKEN": len(VALUE)})


@pytest.fixture(autouse=True)
def host_trusts_public(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "public.pem").write_bytes(PUBLIC.cert_pem())
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "public.pem"))
    tlsterm.upstream_context.cache_clear()


async def tls_echo_auth(stream: trio.SocketStream, state: Upstream,
                        maximum: ssl.TLSVersion = ssl.TLSVersion.MAXIMUM_SUPPORTED, end: str = "close_notify") -> None:
    """A TLS server answering with the Authorization header it got, in a header and the body
    (``maximum``: the highest TLS version it speaks).  ``end``: how it ends, after its whole body
    with close_notify, after its whole body with a bare close ("bare", as Python's ssl servers
    close), or with a bare close halfway through the body ("short": a cut on its network)."""
    context = server_context(PUBLIC.leaf("127.0.0.1", NOW))
    context.maximum_version = maximum
    tls = trio.SSLStream(stream, context, server_side=True)
    received = b""
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        while b"\r\n\r\n" not in received and (data := await tls.receive_some()):
            received += data
        state.seen.append(received)
        auth = next((line.split(b": ", 1)[1] for line in received.split(b"\r\n")
                     if line.lower().startswith(b"authorization:")), b"none")
        body = b"you sent " + auth
        head = b"HTTP/1.1 200 OK\r\nX-Echo: " + auth + b"\r\nContent-Length: %d\r\n\r\n" % len(body)
        await tls.send_all(head + (body[: len(body) // 2] if end == "short" else body))
        await (tls.aclose() if end == "close_notify" else tls.transport_stream.aclose())


def client_context(alpn: list[str] | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=CAPSULE.cert_pem().decode())
    context.set_alpn_protocols(alpn or ["http/1.1"])
    return context


async def connected(proxy: object, port: int, name: str = "127.0.0.1",
                    context: ssl.SSLContext | None = None) -> trio.SSLStream[trio.SocketStream]:
    client = await proxy.http()  # type: ignore[attr-defined]
    await client.send_all(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    assert (await read_head(client)).startswith(b"HTTP/1.1 200 ")
    return trio.SSLStream(client, context or client_context(), server_hostname=name)


def bound(proxy: object, port: int) -> str:
    """The proxy's session given the capsule's secret TOKEN, bound to ``port`` and terminated there; its placeholder."""
    capsule = secrets_for(port)
    proxy.session.credentials = Credentials(capsule, store(), ServerContexts(CAPSULE))  # type: ignore[attr-defined]
    return capsule.env()["TOKEN"]


async def read_tls(stream: trio.SSLStream[trio.SocketStream]) -> bytes:
    """Everything until the end (the proxy's close_notify: a ragged end raises), then the stream closed."""
    received = b""
    while data := await stream.receive_some():
        received += data
    await stream.transport_stream.aclose()
    return received


def run_terminated(send: bytes, name: str = "127.0.0.1", alpn: list[str] | None = None,
                   check_hostname: bool = True, maximum: ssl.TLSVersion = ssl.TLSVersion.MAXIMUM_SUPPORTED,
                   ) -> tuple[bytes | str, list[dict[str, object]], Upstream, str]:
    """One CONNECT to the bound upstream, ``send`` inside it (``{port}``: the upstream's,
    ``PLACEHOLDER``: the capsule's); what came back (or the client's TLS error), the
    records, the upstream and the placeholder.  ``maximum``: the highest TLS version the
    client and the upstream speak."""

    async def main() -> tuple[bytes | str, list[dict[str, object]], Upstream, str]:
        async with upstream(partial(tls_echo_auth, maximum=maximum)) as up, \
                egress(network(f"127.0.0.1:{up.port}")) as proxy:
            placeholder = bound(proxy, up.port)
            context = client_context(alpn)
            context.check_hostname = check_hostname
            context.maximum_version = maximum
            tls = await connected(proxy, up.port, name, context)
            try:
                await tls.do_handshake()
            except trio.BrokenResourceError as exc:
                await tls.transport_stream.aclose()
                return f"{exc.__cause__}", proxy.session.end_exec(), up, placeholder
            await tls.send_all(send.replace(b"{port}", str(up.port).encode())
                               .replace(b"PLACEHOLDER", placeholder.encode()))
            answer = await read_tls(tls)
            return answer, proxy.session.end_exec(), up, placeholder

    return trio.run(main)


@pytest.mark.parametrize("maximum", [ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_2], ids=["TLSv1.3", "TLSv1.2"])
def test_a_bound_host_is_terminated_swapped_and_masked(maximum: ssl.TLSVersion) -> None:
    """TLS 1.2 too (client and upstream): its handshakes end with a flight of the server's (the
    proxy's Finished to the jail) that the proxy sends only when it next waits or writes."""
    answer, records, up, placeholder = run_terminated(
        b"GET /simple/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer PLACEHOLDER\r\n\r\n",
        maximum=maximum)
    assert isinstance(answer, bytes) and answer.startswith(b"HTTP/1.1 200 ")
    assert answer.endswith(b"you sent Bearer " + placeholder.encode()) and VALUE not in answer
    assert b"authorization: Bearer " + VALUE in up.seen[0] and placeholder.encode() not in up.seen[0]
    [record] = records
    assert record["protocol"] == "https" and record["tls"] == "terminated" and record["allowed"] is True


def test_a_hello_for_another_name_is_refused_and_nothing_signed() -> None:
    answer, records, up, _ = run_terminated(b"GET / HTTP/1.1\r\n\r\n", name="evil.example", check_hostname=False)
    assert isinstance(answer, str)  # the handshake failed: the proxy closed at the hello
    [record] = records
    assert record["allowed"] is False and "asks for 'evil.example', not 127.0.0.1" in str(record["reason"])
    assert "tls" not in record and up.seen == []


def test_http2_prior_knowledge_is_refused() -> None:
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    answer, records, up, _ = run_terminated(preface, alpn=["h2"])
    assert isinstance(answer, bytes) and answer.startswith(b"HTTP/1.1 403 ") and b"HTTP/2" in answer
    [record] = records
    assert record["allowed"] is False and "HTTP/2 (prior knowledge)" in str(record["reason"])
    assert up.seen == []


def test_a_placeholder_to_another_host_inside_the_tls_is_refused() -> None:
    answer, records, up, _ = run_terminated(
        b"GET / HTTP/1.1\r\nHost: collector.example\r\nAuthorization: Bearer PLACEHOLDER\r\n\r\n")
    assert isinstance(answer, bytes) and answer.startswith(b"HTTP/1.1 403 ") and b"collector.example" in answer
    [record] = records
    assert record["allowed"] is False and str(record["reason"]).startswith(f"{EXFILTRATION}? a request in the TLS")
    assert record["tls"] == "terminated" and up.seen == []


def test_a_placeholder_in_a_header_the_proxy_drops_inside_the_tls_is_refused() -> None:
    """The bound header named in ``Connection`` is dropped before the request goes on: the request
    would go without the value, the placeholder unswapped and unrecorded; refused and recorded."""
    answer, records, up, _ = run_terminated(b"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: authorization"
                                            b"\r\nAuthorization: Bearer PLACEHOLDER\r\n\r\n")
    assert isinstance(answer, bytes) and answer.startswith(b"HTTP/1.1 403 ") and b"does not send on" in answer
    [record] = records
    assert record["allowed"] is False and str(record["reason"]).startswith(
        f"{EXFILTRATION}: the placeholder of secret TOKEN in header authorization")
    assert record["tls"] == "terminated" and up.seen == []


@pytest.mark.parametrize("form", ["origin", "absolute"])
def test_a_reverse_route_reaches_an_https_upstream(form: str) -> None:
    async def main() -> tuple[bytes, Upstream, list[dict[str, object]]]:
        async with upstream(tls_echo_auth) as up, egress(network(f"127.0.0.1:{up.port}")) as proxy:
            proxy.session.credentials = Credentials(secrets_for(up.port), store())
            client = await proxy.http()
            base = "" if form == "origin" else f"http://127.0.0.1:{proxy.http_port}"
            await client.send_all(f"GET {base}/route/TOKEN+https/v1/x HTTP/1.1\r\nHost: p\r\n\r\n".encode())
            return await read_all(client), up, proxy.session.end_exec()

    answer, up, records = trio.run(main)
    assert answer.startswith(b"HTTP/1.1 200 ") and b"you sent Bearer ccwph_" in answer and VALUE not in answer
    assert up.seen[0].startswith(b"GET /v1/x HTTP/1.1\r\n") and b"authorization: Bearer " + VALUE in up.seen[0]
    assert [r["allowed"] for r in records] == [True]


def test_an_upstream_the_host_does_not_trust_is_a_502(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "other.pem").write_bytes(CAPSULE.cert_pem())  # not the upstream's CA
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "other.pem"))
    tlsterm.upstream_context.cache_clear()
    answer, records, _up, _ = run_terminated(b"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n")
    assert isinstance(answer, bytes) and answer.startswith(b"HTTP/1.1 502 ") and b"certificate verify failed" in answer
    assert "certificate verify failed" in str(records[0]["reason"])


def saying_ok(context: ssl.SSLContext, resumed: list[bool]) -> Callable[[trio.SocketStream, Upstream], Awaitable[None]]:
    """A TLS upstream answering ``ok`` to one request a connection, with ``context`` (one ticket key
    for all its connections); ``resumed`` gets whether each connection resumed a session."""

    async def serve(stream: trio.SocketStream, state: Upstream) -> None:
        tls = trio.SSLStream(stream, context, server_side=True)
        received = b""
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            while b"\r\n\r\n" not in received and (data := await tls.receive_some()):
                received += data
            resumed.append(tls.session_reused)
            await tls.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await tls.aclose()

    return serve


def test_a_second_connection_resumes_the_upstreams_session() -> None:
    """The proxy offers an upstream's last session at its next connection (tlsterm ``_SESSIONS``):
    the second handshake resumes it.  An upstream that does not know the ticket gets a full
    handshake, verified (the other tests here: their upstream has a context a connection)."""
    resumed: list[bool] = []
    serve = saying_ok(server_context(PUBLIC.leaf("127.0.0.1", NOW)), resumed)  # one ticket key for both

    async def main() -> list[bytes]:
        async with upstream(serve) as up, egress(network(f"127.0.0.1:{up.port}")) as proxy:
            proxy.session.credentials = Credentials(secrets_for(up.port), store(), ServerContexts(CAPSULE))
            answers = []
            for _ in range(2):
                tls = await connected(proxy, up.port)
                await tls.send_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % up.port)
                answers.append(await read_tls(tls))
            return answers

    answers = trio.run(main)
    assert all(answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"ok") for answer in answers)
    assert resumed == [False, True]


def _leaf_for_both(ca_key: ec.EllipticCurvePrivateKey, issuer: x509.Name, path: Path) -> None:
    """A server certificate (and key, in ``path``) valid for both localhost and 127.0.0.1."""
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (x509.CertificateBuilder().subject_name(x509.Name([])).issuer_name(issuer)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(NOW - dt.timedelta(minutes=5)).not_valid_after(NOW + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(names), critical=True)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256()))
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()) + cert.public_bytes(serialization.Encoding.PEM))


def test_an_upstream_session_is_offered_only_to_the_name_and_port_it_was_verified_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ports of one server (one ticket key, a certificate for both names), reached as 127.0.0.1 and
    as localhost: a session verified for one name and port is not offered to the other name, nor to
    the other port, though the server would take its ticket; it is offered to its own again."""
    public = make_authority(["127.0.0.1", "localhost"], NOW)
    (tmp_path / "trust.pem").write_bytes(public.cert_pem())
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "trust.pem"))
    tlsterm.upstream_context.cache_clear()
    monkeypatch.setattr(tlsterm, "_SESSIONS", {})
    _leaf_for_both(public.key, public.cert.subject, tmp_path / "server.pem")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "server.pem")
    server_saw: list[bool] = []
    serve = saying_ok(context, server_saw)

    async def one(port: int, name: str) -> bool:
        sock = trio.socket.socket()
        await sock.connect(("127.0.0.1", port))
        wire = await tlsterm.connect(sock, name)
        await wire.send(memoryview(b"GET / HTTP/1.1\r\nHost: %s\r\n\r\n" % name.encode()))
        answer = b""
        while data := await wire.recv(65536):
            answer += data
        assert answer.endswith(b"ok"), answer
        wire.close()  # keeps a new session for its name and port
        return wire.tls.session_reused

    async def main() -> tuple[list[bool], int, int]:
        async with upstream(serve) as first, upstream(serve) as second:
            return [await one(first.port, "127.0.0.1"), await one(first.port, "localhost"),
                    await one(second.port, "127.0.0.1"), await one(first.port, "127.0.0.1"),
                    await one(first.port, "localhost")], first.port, second.port

    reused, first, second = trio.run(main)
    assert reused == [False, False, False, True, True]
    assert server_saw == reused  # OpenSSL would offer a session to any name: the proxy's key is the guard
    assert set(tlsterm._SESSIONS) == {("127.0.0.1", first), ("localhost", first), ("127.0.0.1", second)}


def test_the_jails_client_resumes_its_session_at_its_next_connect() -> None:
    """The leaf's server context is one a host for as long as its leaf (fs/castore.py
    ``ServerContexts``), so the tickets it gives a client at one CONNECT resume at the next: the
    second handshake sends no certificate and signs nothing.  The request inside is judged as ever."""

    async def main() -> tuple[list[bool], list[bytes]]:
        async with upstream(saying_ok(server_context(PUBLIC.leaf("127.0.0.1", NOW)), [])) as up, \
                egress(network(f"127.0.0.1:{up.port}")) as proxy:
            proxy.session.credentials = Credentials(secrets_for(up.port), store(), ServerContexts(CAPSULE))
            reused, answers, session, context = [], [], None, client_context()
            for _ in range(2):
                client = await connected(proxy, up.port)
                stream = client.transport_stream
                assert isinstance(stream, trio.SocketStream)
                wire = await tlsterm.TlsWire.handshake(stream.socket, context, b"",
                                                       server_hostname="127.0.0.1", session=session)
                await wire.send(memoryview(b"GET / HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % up.port))
                answer = b""
                while data := await wire.recv(65536):
                    answer += data
                reused.append(wire.tls.session_reused)
                answers.append(answer)
                session = wire.tls.session
                await stream.aclose()
            return reused, answers

    reused, answers = trio.run(main)
    assert reused == [False, True]
    assert all(answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"ok") for answer in answers)


@pytest.mark.parametrize("end", ["bare", "short"])
def test_a_masked_body_ends_without_close_notify_only_when_the_upstream_cut_it(end: str) -> None:
    """A masked echo loses its Content-Length (a placeholder may be longer than the value), so
    the jail's client can tell a cut body only by how its TLS ends: a whole body still ends with
    close_notify after the upstream's bare close (strict clients, git's GnuTLS, need it), a body
    short of the upstream's length without, as the cut would end it end to end."""

    async def main() -> tuple[bytes, bool, str]:
        async with upstream(partial(tls_echo_auth, end=end)) as up, \
                egress(network(f"127.0.0.1:{up.port}")) as proxy:
            placeholder = bound(proxy, up.port)
            tls = await connected(proxy, up.port)
            await tls.send_all(f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{up.port}\r\n"
                               f"Authorization: Bearer {placeholder}\r\n\r\n".encode())
            received, ragged = b"", False
            try:
                while data := await tls.receive_some():
                    received += data
            except trio.BrokenResourceError:
                ragged = True
            await tls.transport_stream.aclose()
            proxy.session.end_exec()
            return received, ragged, placeholder

    received, ragged, placeholder = trio.run(main)
    head, _, body = received.partition(b"\r\n\r\n")
    whole = b"you sent Bearer " + placeholder.encode()
    assert head.startswith(b"HTTP/1.1 200 ") and b"content-length" not in head.lower()
    if end == "bare":
        assert body == whole and not ragged
    else:
        assert body == whole[: len(body)] and len(body) < len(whole) and ragged


async def tls_echo_gzip(stream: trio.SocketStream, state: Upstream, always: bool) -> None:
    """A TLS server answering with the request head it got, gzip-encoded when the request accepts
    gzip, or whatever it accepts (``always``)."""
    tls = trio.SSLStream(stream, server_context(PUBLIC.leaf("127.0.0.1", NOW)), server_side=True)
    received = b""
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        while b"\r\n\r\n" not in received and (data := await tls.receive_some()):
            received += data
        state.seen.append(received)
        if always or b"gzip" in received.lower():
            body = gzip.compress(received)
            head = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(body)
        else:
            body, head = received, b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(received)
        await tls.send_all(head + body)
        await tls.aclose()


@pytest.mark.parametrize("always", [False, True], ids=["asked", "always"])
def test_a_compressed_echo_through_termination_never_reaches_the_jail(always: bool) -> None:
    """curl --compressed inside the jail: the upstream is asked for no coding, and one that
    compresses anyway is refused with a 502, recorded and told; the value never comes back."""
    told: list[object] = []

    async def main() -> tuple[bytes, list[dict[str, object]], list[bytes], str]:
        async with upstream(partial(tls_echo_gzip, always=always)) as up, \
                egress(network(f"127.0.0.1:{up.port}"), observe=told.append) as proxy:
            placeholder = bound(proxy, up.port)
            tls = await connected(proxy, up.port)
            await tls.send_all(f"GET /echogz HTTP/1.1\r\nHost: 127.0.0.1:{up.port}\r\nAuthorization: Bearer "
                               f"{placeholder}\r\nAccept-Encoding: deflate, gzip, br, zstd\r\n\r\n".encode())
            answer = await read_tls(tls)
            return answer, proxy.session.end_exec(), up.seen, placeholder

    answer, records, seen, placeholder = trio.run(main)
    assert b"authorization: Bearer " + VALUE in seen[0] and b"accept-encoding: identity\r\n" in seen[0]
    assert b"gzip" not in seen[0]
    assert VALUE not in answer
    [record] = records
    if always:
        assert answer.startswith(b"HTTP/1.1 502 ") and b"compressed" in answer and b"nothing of it passed" in answer
        assert record["allowed"] is False and "Content-Encoding: gzip" in str(record["reason"])
        assert any(getattr(attempt, "reason", None) == record["reason"] for attempt in told)
    else:
        assert answer.startswith(b"HTTP/1.1 200 ") and b"content-encoding" not in answer.lower()
        assert b"authorization: Bearer " + placeholder.encode() + b"\r\n" in answer
