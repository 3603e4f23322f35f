"""Credentials at the proxy (egress/credentials.py, issue 38) over real loopback sockets: a
placeholder swapped for its value only toward its bound host, echoes masked, a placeholder
anywhere else refused with a 403 and recorded as an exfiltration attempt, CONNECT left
alone, and reverse routes adding the value for a client that only takes a base URL.  An
echo gzip'd or split across chunks never brings the value back (egress/maskedbody.py)."""

from __future__ import annotations

import base64
import contextlib
import gzip

import h11
import pytest
import trio

from mcp_server.core.placeholders import CapsuleSecrets
from mcp_server.core.secretbind import binding_from_json, make_binding
from mcp_server.egress.credentials import EXFILTRATION, Credentials
from mcp_server.egress.relay import Attempt
from tests.support.egress_harness import (  # noqa: F401  (relay_engine: a fixture)
    Serve,
    Upstream,
    egress,
    http_responder,
    network,
    read_all,
    relay_engine,
    shout,
    upstream,
)

VALUE = b"tok-" + b"S3cr3t" * 6  # 40 bytes: its placeholder is as long


class Store:
    """Stands for fs/secretstore: counts how often a value is fetched."""

    def __init__(self) -> None:
        self.fetched: list[str] = []

    def __call__(self, name: str) -> bytes:
        self.fetched.append(name)
        return VALUE


def secrets_for(port: int, fmt: str | None = None, header: str | None = None) -> CapsuleSecrets:
    return CapsuleSecrets({"TOKEN": make_binding("TOKEN", [f"127.0.0.1:{port}"], header, fmt)}, {"TOKEN": len(VALUE)})


async def echo_auth(stream: trio.SocketStream, state: Upstream) -> None:
    """Answer with the Authorization header it was sent, in a header and in the body."""
    received = b""
    while b"\r\n\r\n" not in received and (data := await stream.receive_some()):
        received += data
    state.seen.append(received)
    auth = next((line.split(b": ", 1)[1] for line in received.split(b"\r\n")
                 if line.lower().startswith(b"authorization:")), b"none")
    body = b"you sent " + auth
    with contextlib.suppress(trio.BrokenResourceError):
        await stream.send_all(b"HTTP/1.1 200 OK\r\nX-Echo: " + auth
                              + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    await stream.aclose()


def request(port: int, headers: str = "", body: bytes = b"", path: str = "/simple/") -> bytes:
    length = f"Content-Length: {len(body)}\r\n" if body else ""
    return (f"GET http://127.0.0.1:{port}{path} HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{port}\r\n{headers}{length}\r\n").encode() + body


@pytest.mark.usefixtures("relay_engine")
def test_placeholder_swapped_for_the_bound_host_and_echo_masked() -> None:
    store = Store()

    async def main() -> None:
        async with upstream(echo_auth) as up, egress(network(f"127.0.0.1:{up.port}")) as proxy:
            capsule = secrets_for(up.port)
            proxy.session.credentials = Credentials(capsule, store)
            placeholder = capsule.env()["TOKEN"]
            client = await proxy.http()
            await client.send_all(request(up.port, f"Authorization: Bearer {placeholder}\r\n"))
            answer = await read_all(client)
            records = proxy.session.end_exec()
        assert b"authorization: Bearer " + VALUE in up.seen[0]
        assert placeholder.encode() not in up.seen[0]
        assert VALUE not in answer  # the echo comes back as the placeholder
        assert b"X-Echo: Bearer " + placeholder.encode() in answer
        assert answer.endswith(b"you sent Bearer " + placeholder.encode())
        assert b"content-length" not in answer.lower()  # a masked body is ended by the close
        assert store.fetched == ["TOKEN"]
        [record] = records
        assert (record["allowed"], record["reason"]) == (True, None)

    trio.run(main)


@pytest.mark.usefixtures("relay_engine")
def test_no_placeholder_fetches_nothing_and_passes_untouched() -> None:
    store = Store()

    async def main() -> None:
        async with upstream(echo_auth) as up, egress(network(f"127.0.0.1:{up.port}")) as proxy:
            proxy.session.credentials = Credentials(secrets_for(up.port), store)
            client = await proxy.http()
            await client.send_all(request(up.port, "Authorization: Bearer mine\r\n"))
            answer = await read_all(client)
        assert b"authorization: Bearer mine" in up.seen[0]
        assert answer.endswith(b"you sent Bearer mine")
        assert b"Content-Length: 20" in answer
        assert store.fetched == []

    trio.run(main)


@pytest.mark.usefixtures("relay_engine")
@pytest.mark.parametrize("where", ["other host", "other header", "body", "trailers", "proxy-authorization",
                                   "named in connection", "bound header named in connection"])
def test_placeholder_where_it_may_not_go_is_refused_and_told(where: str) -> None:
    store, told = Store(), []

    async def main() -> None:
        async with upstream(echo_auth) as bound, upstream(echo_auth) as other, \
                egress(network(f"127.0.0.1:{bound.port}", f"127.0.0.1:{other.port}"), observe=told.append) as proxy:
            capsule = secrets_for(bound.port)
            proxy.session.credentials = Credentials(capsule, store)
            placeholder = capsule.env()["TOKEN"]
            sent = {"other host": request(other.port, f"Authorization: Bearer {placeholder}\r\n"),
                    "other header": request(bound.port, f"X-Leak: {placeholder}\r\n"),
                    "body": request(bound.port, body=b"token=" + placeholder.encode(), path="/upload"),
                    # a chunked body's trailer: h11 sent it on after the body, unread
                    "trailers": request(bound.port, "Transfer-Encoding: chunked\r\n", path="/upload")
                    + b"2\r\nok\r\n0\r\nX-Leak: " + placeholder.encode() + b"\r\n\r\n",
                    # headers the proxy drops before the request goes on: the placeholder would
                    # vanish there, unswapped (the bound one: the request would go without it)
                    "proxy-authorization": request(bound.port, "Proxy-Authorization: Basic " + base64.b64encode(
                        f"__token__:{placeholder}".encode()).decode() + "\r\n"),
                    "named in connection": request(bound.port, f"Connection: X-Leak\r\nX-Leak: {placeholder}\r\n"),
                    "bound header named in connection": request(bound.port, "Connection: keep-alive, Authorization"
                                                                f"\r\nAuthorization: Bearer {placeholder}\r\n"),
                    }[where]
            client = await proxy.http()
            await client.send_all(sent)
            answer = await read_all(client)
            records = proxy.session.end_exec()
            return answer, records, bound, other

    answer, records, bound, other = trio.run(main)
    assert answer.startswith(b"HTTP/1.1 403 ")
    assert b"the placeholder of secret TOKEN" in answer and VALUE not in answer
    [record] = records
    assert record["allowed"] is False and str(record["reason"]).startswith(EXFILTRATION)
    assert VALUE not in repr(records).encode()
    assert any(attempt.reason == record["reason"] for attempt in told)  # told live
    assert bound.seen == [] and other.seen == []  # refused before connecting (the body's first bytes too)
    assert where != "other host" or "a host it is not bound to" in str(record["reason"])
    assert ("connection" not in where and where != "proxy-authorization") \
        or "which the proxy does not send on" in str(record["reason"])


@pytest.mark.usefixtures("relay_engine")
@pytest.mark.parametrize("bound", [True, False])
def test_basic_auth_placeholder_swapped_or_refused(bound: bool) -> None:
    store = Store()

    async def main() -> tuple[bytes, list[bytes], str]:
        async with upstream(echo_auth) as up, upstream(echo_auth) as other, \
                egress(network(f"127.0.0.1:{up.port}", f"127.0.0.1:{other.port}")) as proxy:
            capsule = secrets_for(up.port, "basic-password")
            proxy.session.credentials = Credentials(capsule, store)
            placeholder = capsule.env()["TOKEN"]
            basic = base64.b64encode(b"__token__:" + placeholder.encode()).decode()
            client = await proxy.http()
            await client.send_all(request(up.port if bound else other.port, f"Authorization: Basic {basic}\r\n"))
            return await read_all(client), up.seen + other.seen, placeholder

    answer, seen, placeholder = trio.run(main)
    if bound:
        assert seen[0].count(b"authorization: Basic " + base64.b64encode(b"__token__:" + VALUE)) == 1
        assert answer.endswith(b"you sent Basic " + base64.b64encode(b"__token__:" + placeholder.encode()))
    else:
        assert seen == [] and answer.startswith(b"HTTP/1.1 403 ") and b"secret TOKEN" in answer
        assert answer.endswith(b"\n")


@pytest.mark.usefixtures("relay_engine")
def test_connect_to_a_bound_host_stays_a_tunnel() -> None:
    store = Store()

    async def main() -> None:
        async with upstream(shout) as up, egress(network(f"127.0.0.1:{up.port}")) as proxy:
            capsule = secrets_for(up.port)
            proxy.session.credentials = Credentials(capsule, store)
            client = await proxy.http()
            line = f"CONNECT 127.0.0.1:{up.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
            await client.send_all(line + capsule.env()["TOKEN"].encode())
            await client.send_eof()
            answer = await read_all(client)
            return answer, capsule.env()["TOKEN"]

    answer, placeholder = trio.run(main)
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(placeholder.upper().encode())
    assert store.fetched == []


@pytest.mark.usefixtures("relay_engine")
def test_a_placeholder_in_a_connects_own_headers_is_refused_and_recorded() -> None:
    """A CONNECT's headers stay at the proxy: a placeholder there (a proxy URL's userinfo) would
    vanish unswapped, so it is refused as one in any header no value goes into."""
    told: list[Attempt] = []

    async def main() -> tuple[bytes, list[dict[str, object]], list[bytes]]:
        async with upstream(shout) as up, egress(network(f"127.0.0.1:{up.port}"), observe=told.append) as proxy:
            capsule = secrets_for(up.port)
            proxy.session.credentials = Credentials(capsule, Store())
            basic = base64.b64encode(f"me:{capsule.env()['TOKEN']}".encode()).decode()
            client = await proxy.http()
            await client.send_all(f"CONNECT 127.0.0.1:{up.port} HTTP/1.1\r\nHost: x\r\n"
                                  f"Proxy-Authorization: Basic {basic}\r\n\r\n".encode())
            return await read_all(client), proxy.session.end_exec(), up.seen

    answer, records, seen = trio.run(main)
    assert answer.startswith(b"HTTP/1.1 403 ") and b"header proxy-authorization" in answer
    [record] = records
    assert record["allowed"] is False and str(record["reason"]).startswith(EXFILTRATION + ": the placeholder of "
                                                                           "secret TOKEN in header proxy-authorization")
    assert [attempt.reason for attempt in told] == [record["reason"]] and seen == []


@pytest.mark.usefixtures("relay_engine")
@pytest.mark.parametrize("form", ["origin", "absolute"])
@pytest.mark.parametrize(("fmt", "header", "expect"), [
    (None, None, b"authorization: Bearer " + VALUE),
    ("{}", "X-Api-Key", b"x-api-key: " + VALUE),
    ("query:key", None, b"?q=1&key=" + VALUE + b" HTTP/1.1"),
    ("basic-password", None, b"authorization: Basic " + base64.b64encode(b":" + VALUE)),
])
def test_reverse_route_adds_the_value(fmt: str | None, header: str | None, expect: bytes, form: str) -> None:
    store = Store()

    async def main() -> tuple[bytes, list[bytes], list[dict[str, object]]]:
        async with upstream(echo_auth) as up, egress(network(f"127.0.0.1:{up.port}")) as proxy:
            proxy.session.credentials = Credentials(secrets_for(up.port, fmt, header), store)
            client = await proxy.http()
            own = f"http://127.0.0.1:{proxy.http_port}" if form == "absolute" else ""  # a client honouring HTTP_PROXY
            await client.send_all(f"POST {own}/route/TOKEN/v1/messages?q=1 HTTP/1.1\r\n"
                                  "Host: 10.99.0.1:3128\r\n".encode() +
                                  b"Authorization: Bearer dummy\r\nContent-Length: 2\r\n\r\n{}")
            answer = await read_all(client)
            return answer, up.seen, proxy.session.end_exec()

    answer, seen, records = trio.run(main)
    assert expect in seen[0]
    assert seen[0].startswith(b"POST /v1/messages?q=1")
    assert b"dummy" not in seen[0] or header is not None or fmt is not None
    assert VALUE not in answer and answer.startswith(b"HTTP/1.1 200 ")
    assert [record["allowed"] for record in records] == [True]


@pytest.mark.usefixtures("relay_engine")
@pytest.mark.parametrize(("user", "sent"), [(b"__token__", b"__token__:" + VALUE), (None, b":" + VALUE)],
                         ids=["own-user", "no-header"])
def test_a_route_keeps_the_clients_basic_user_beside_the_placeholder(user: bytes | None, sent: bytes) -> None:
    """A basic-password route to a PyPI-style index: the client's own ``__token__:$TOKEN`` is kept
    and swapped (the route made ``:VALUE`` of it, which such an index refuses); without a Basic
    header carrying the placeholder, the route adds its own ``:VALUE`` as before."""
    async def main() -> tuple[bytes, list[bytes], str]:
        async with upstream(echo_auth) as up, egress(network(f"127.0.0.1:{up.port}")) as proxy:
            capsule = secrets_for(up.port, "basic-password")
            proxy.session.credentials = Credentials(capsule, Store())
            placeholder = capsule.env()["TOKEN"]
            client = await proxy.http()
            auth = b"" if user is None else b"Authorization: Basic " + base64.b64encode(
                user + b":" + placeholder.encode()) + b"\r\n"
            await client.send_all(b"GET /route/TOKEN/simple/pkg/ HTTP/1.1\r\nHost: 10.99.0.1:3128\r\n" + auth
                                  + b"\r\n")
            return await read_all(client), up.seen, placeholder

    answer, seen, placeholder = trio.run(main)
    assert seen[0].startswith(b"GET /simple/pkg/ ")
    assert seen[0].count(b"authorization: Basic " + base64.b64encode(sent) + b"\r\n") == 1, seen[0]
    assert answer.startswith(b"HTTP/1.1 200 ") and VALUE not in answer
    assert base64.b64encode(sent) not in answer and placeholder.encode() not in seen[0]


@pytest.mark.usefixtures("relay_engine")
@pytest.mark.parametrize("form", ["origin", "absolute"])
def test_a_route_is_only_for_the_capsules_secrets(form: str) -> None:
    """Another name's route is a 400 that names this capsule's routes, sent to the proxy in
    origin form or, by a client honouring HTTP_PROXY, in absolute form to its own address (that
    one was a 403 "no rule allows" the proxy's address, with a rule to add for it)."""
    async def main() -> bytes:
        reply = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
        async with upstream(http_responder(reply)) as up, egress(network(f"127.0.0.1:{up.port}")) as proxy:
            proxy.session.credentials = Credentials(secrets_for(up.port), Store())
            client = await proxy.http()
            own = f"127.0.0.1:{proxy.http_port}"  # the proxy's address as the jail reached it
            target = "/route/OTHER/x" if form == "origin" else f"http://{own}/route/OTHER/x"
            await client.send_all(f"GET {target} HTTP/1.1\r\nHost: 10.99.0.1:3128\r\n\r\n".encode())
            return await read_all(client)

    answer = trio.run(main)
    assert answer.startswith(b"HTTP/1.1 400 ") and b"no route 'OTHER'" in answer
    assert b"/route/TOKEN/" in answer


def test_body_attempt_and_route_parsing() -> None:
    capsule = secrets_for(8080)
    creds = Credentials(capsule, Store())
    placeholder = capsule.env()["TOKEN"].encode()
    assert creds.body_attempt(b"nothing here") is None
    assert "secret TOKEN in the body" in str(creds.body_attempt(b'{"k": "' + placeholder + b'"}'))
    assert "a ccwph_ placeholder" in str(creds.body_attempt(b"x=ccwph_Zz"))
    assert creds.route(b"/route/TOKEN/a/b?c") == ("TOKEN", "127.0.0.1", 8080, b"/a/b?c", "http")
    assert creds.route(b"/route/TOKEN") == ("TOKEN", "127.0.0.1", 8080, b"/", "http")
    assert creds.route(b"/route/TOKEN+https/a") == ("TOKEN", "127.0.0.1", 8080, b"/a", "https")
    assert creds.route(b"/route/TOKEN+ftp/a") is None
    assert Credentials(secrets_for(443), Store()).route(b"/route/TOKEN/") == ("TOKEN", "127.0.0.1", 443, b"/", "https")
    assert creds.route(b"/route/NOPE/a") is None and creds.route(b"/other") is None
    assert isinstance(Attempt, type)


CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
EARLY_HINTS = b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n"


def echo_encoded(coding: str, interim: bytes = b"") -> Serve:
    """An upstream that answers with the request head it got as its body: gzip-encoded when the
    request accepts gzip ("asked"), gzip-encoded whatever it accepts ("always"), or in chunks of
    7 bytes, so that the framing splits every value in it ("chunks"); after ``interim``, 1xx
    responses (``100 Continue``, as servers answer ``Expect: 100-continue``)."""

    async def serve(stream: trio.SocketStream, state: Upstream) -> None:
        received = b""
        while b"\r\n\r\n" not in received and (data := await stream.receive_some()):
            received += data
        state.seen.append(received)
        accepts = b"gzip" in b"".join(line for line in received.lower().split(b"\r\n")
                                      if line.startswith(b"accept-encoding:"))
        if coding == "chunks":
            pieces = [received[at:at + 7] for at in range(0, len(received), 7)]
            body = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"
            head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        elif coding == "always" or accepts:
            body = gzip.compress(received)
            head = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(body)
        else:
            body = received
            head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
        with contextlib.suppress(trio.BrokenResourceError):
            await stream.send_all(interim + head + body)
        await stream.aclose()

    return serve


def decoded_body(answer: bytes) -> bytes:
    """The body a client makes of ``answer``: de-chunked by h11, then gunzipped if it says gzip."""
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
    client.send(h11.EndOfMessage())
    client.receive_data(answer)
    client.receive_data(b"")
    body, gzipped = b"", False
    while not isinstance(event := client.next_event(), h11.EndOfMessage | h11.ConnectionClosed):
        if isinstance(event, h11.Response):  # the final one: h11 passes 1xx as InformationalResponse
            gzipped = (b"content-encoding", b"gzip") in list(event.headers)
        elif isinstance(event, h11.Data):
            body += event.data
    return gzip.decompress(body) if gzipped else body


@pytest.mark.usefixtures("relay_engine")
@pytest.mark.parametrize("interim", [b"", CONTINUE, CONTINUE + EARLY_HINTS], ids=["final", "continue", "hints"])
@pytest.mark.parametrize("route", [False, True], ids=["proxied", "routed"])
@pytest.mark.parametrize("coding", ["asked", "always", "chunks"])
def test_an_encoded_echo_of_the_value_never_reaches_the_jail(coding: str, route: bool, interim: bytes) -> None:
    """A client that accepts gzip (curl --compressed, pip, requests) and an upstream that echoes
    the request's headers: the upstream is asked for no coding, one that compresses anyway is
    refused with a 502 and recorded, and a chunked echo is masked across its chunks.  After a
    1xx (``interim``) too: the masker judged the first head only, so a final answer behind a
    ``100 Continue`` passed gzip'd or with its chunks splitting the value."""
    store, told = Store(), []

    async def main() -> tuple[bytes, list[dict[str, object]], list[bytes], str]:
        async with upstream(echo_encoded(coding, interim)) as up, \
                egress(network(f"127.0.0.1:{up.port}"), observe=told.append) as proxy:
            capsule = secrets_for(up.port)
            proxy.session.credentials = Credentials(capsule, store)
            placeholder = capsule.env()["TOKEN"]
            client = await proxy.http()
            line = (b"GET /route/TOKEN/echo HTTP/1.1\r\nHost: 10.99.0.1:3128\r\n" if route
                    else request(up.port, path="/echo")[:-2])
            await client.send_all(line + f"Authorization: Bearer {placeholder}\r\n".encode()
                                  + b"Accept-Encoding: gzip, deflate, br\r\nTE: gzip, trailers\r\n"
                                  + b"Range: bytes=40-50\r\nIf-Range: \"x\"\r\n\r\n")
            return await read_all(client), proxy.session.end_exec(), up.seen, placeholder

    answer, records, seen, placeholder = trio.run(main)
    for _ in range(interim.count(b"HTTP/1.1 1")):  # each interim head passes, a head of its own
        assert answer.startswith(b"HTTP/1.1 1")
        answer = answer.split(b"\r\n\r\n", 1)[1]
    assert b"authorization: Bearer " + VALUE in seen[0]  # the value went upstream
    assert b"accept-encoding: identity\r\n" in seen[0] and b"gzip" not in seen[0] and b"te:" not in seen[0]
    assert b"range:" not in seen[0]  # a slice of the echo would be a piece of the value, which no mask matches
    assert VALUE not in answer and VALUE not in decoded_body(answer)  # as a client reads it
    [record] = records
    if coding == "always":
        assert answer.startswith(b"HTTP/1.1 502 ") and b"Content-Encoding: gzip" in answer and answer.endswith(b"\n")
        assert b"compressed" in answer and b"nothing of it passed" in answer
        assert record["allowed"] is False and "Content-Encoding: gzip" in str(record["reason"])
        assert any(attempt.reason == record["reason"] for attempt in told)  # told live
        return
    assert answer.startswith(b"HTTP/1.1 200 ") and record["allowed"] is True
    body = decoded_body(answer)
    assert VALUE not in body and b"authorization: Bearer " + placeholder.encode() in body


@pytest.mark.usefixtures("relay_engine")
def test_every_request_to_a_bound_host_asks_for_no_coding() -> None:
    """Not only one a value went into: the responses of a bound host stay readable."""

    async def main() -> list[bytes]:
        async with upstream(echo_encoded("asked")) as up, upstream(echo_encoded("asked")) as other, \
                egress(network(f"127.0.0.1:{up.port}", f"127.0.0.1:{other.port}")) as proxy:
            proxy.session.credentials = Credentials(secrets_for(up.port), Store())
            for port in (up.port, other.port):
                client = await proxy.http()
                await client.send_all(request(port, "Accept-Encoding: gzip\r\nRange: bytes=0-9\r\n"))
                await read_all(client)
            return up.seen + other.seen

    bound, other = trio.run(main)
    assert b"accept-encoding: identity\r\n" in bound and b"gzip" not in bound
    assert b"accept-encoding: gzip\r\n" in other  # an unbound host's requests are left as they are
    assert b"range: bytes=0-9\r\n" in bound and b"range: bytes=0-9\r\n" in other  # no value went in: kept


@pytest.mark.usefixtures("relay_engine")
def test_a_bodiless_coded_answer_passes() -> None:
    """A 304 names the coding its entity would have and carries no body: nothing to read, no refusal."""

    async def main() -> tuple[bytes, list[dict[str, object]]]:
        reply = b"HTTP/1.1 304 Not Modified\r\nContent-Encoding: gzip\r\nETag: \"e\"\r\n\r\n"
        async with upstream(http_responder(reply)) as up, egress(network(f"127.0.0.1:{up.port}")) as proxy:
            capsule = secrets_for(up.port)
            proxy.session.credentials = Credentials(capsule, Store())
            client = await proxy.http()
            await client.send_all(request(up.port, f"Authorization: Bearer {capsule.env()['TOKEN']}\r\n"))
            return await read_all(client), proxy.session.end_exec()

    answer, records = trio.run(main)
    assert answer.startswith(b"HTTP/1.1 304 ") and b"Content-Encoding: gzip" in answer
    assert [record["allowed"] for record in records] == [True]


def lingering(tail: bytes) -> Serve:
    """An upstream that answers with the Authorization it was sent, framed by Content-Length,
    then ``tail`` past that length, and keeps its connection open, ignoring ``Connection: close``."""

    async def serve(stream: trio.SocketStream, state: Upstream) -> None:
        received = b""
        while b"\r\n\r\n" not in received and (data := await stream.receive_some()):
            received += data
        state.seen.append(received)
        auth = next(line.split(b": ", 1)[1] for line in received.split(b"\r\n") if line.startswith(b"authorization:"))
        body = b"" if received.startswith(b"GET /empty") else b"you sent " + auth
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s%s" % (len(body), body, tail))
        await trio.sleep_forever()

    return serve


@pytest.mark.usefixtures("relay_engine")
@pytest.mark.parametrize("tail", [b"", b"HTTP/1.1 200 OK\r\n\r\nnot this answer's"])
@pytest.mark.parametrize("method", ["GET", "HEAD", "GET /empty"])
def test_a_masked_body_ends_at_its_length_though_the_upstream_keeps_its_connection(method: str, tail: bytes) -> None:
    """The jail's masked head has no Content-Length (a mask may change the length), so its close
    ends the body: once the upstream's length has come, the proxy closes, without waiting for
    an upstream that does not (bytes past the length are no part of the answer)."""

    async def main() -> tuple[bytes, str]:
        async with upstream(lingering(tail)) as up, egress(network(f"127.0.0.1:{up.port}")) as proxy:
            capsule = secrets_for(up.port)
            proxy.session.credentials = Credentials(capsule, Store())
            verb, _, path = method.partition(" ")
            client = await proxy.http()
            await client.send_all(request(up.port, f"Authorization: Bearer {capsule.env()['TOKEN']}\r\n",
                                          path=path or "/").replace(b"GET", verb.encode(), 1))
            return await read_all(client, limit=3), capsule.env()["TOKEN"]

    answer, placeholder = trio.run(main)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"content-length" not in head.lower()
    assert body == (b"you sent Bearer " + placeholder.encode() if method == "GET" else b"")


@pytest.mark.usefixtures("relay_engine")
def test_a_chunked_echo_cut_inside_the_value_gives_none_of_it_and_no_last_chunk() -> None:
    async def main() -> tuple[bytes, str]:
        cut = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n40\r\nBearer " + VALUE[:20]
        async with upstream(http_responder(cut)) as up, egress(network(f"127.0.0.1:{up.port}")) as proxy:
            capsule = secrets_for(up.port)
            proxy.session.credentials = Credentials(capsule, Store())
            client = await proxy.http()
            await client.send_all(request(up.port, f"Authorization: Bearer {capsule.env()['TOKEN']}\r\n"))
            return await read_all(client), capsule.env()["TOKEN"]

    answer, placeholder = trio.run(main)
    assert answer.startswith(b"HTTP/1.1 200 ") and VALUE[:20] not in answer
    assert answer.endswith(b"\r\nBearer " + placeholder[:20].encode() + b"\r\n")  # a chunk, and no last one


@pytest.mark.usefixtures("relay_engine")
@pytest.mark.parametrize("form", ["absolute", "route"])
def test_a_value_bound_to_a_tls_port_never_goes_in_cleartext(form: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A secret bound to a host written ``https://HOST:PORT`` (port 443 is so whether written or
    not), asked for over plain ``http://HOST:PORT/`` (or a route the jail asks for plain) is refused
    before any value is fetched or any connection made: in cleartext it would reach whatever the
    name resolves to, no certificate checked.  The route form is that downgrade as the proxy
    would make it if ``route`` chose http for such a binding (monkeypatched here, as a route to it
    goes over TLS: ``test_a_route_to_a_binding_written_https_goes_over_tls``)."""
    store, told = Store(), list[Attempt]()

    async def main() -> tuple[bytes, list[dict[str, object]], list[bytes]]:
        async with upstream(echo_auth) as up, \
                egress(network(f"127.0.0.1:{up.port}"), observe=told.append) as proxy:
            capsule = CapsuleSecrets({"TOKEN": make_binding("TOKEN", [f"https://127.0.0.1:{up.port}"])},
                                     {"TOKEN": len(VALUE)})
            credentials = Credentials(capsule, store)
            plain = credentials.route
            monkeypatch.setattr(credentials, "route", lambda target: (r := plain(target)) and (*r[:4], "http"))
            proxy.session.credentials = credentials
            placeholder = capsule.env()["TOKEN"]
            sent = {"absolute": request(up.port, f"Authorization: Bearer {placeholder}\r\n"),
                    "route": b"GET /route/TOKEN/simple/ HTTP/1.1\r\nHost: 10.99.0.1:3128\r\n\r\n"}[form]
            client = await proxy.http()
            await client.send_all(sent)
            answer = await read_all(client)
            return answer, proxy.session.end_exec(), up.seen

    answer, records, seen = trio.run(main)
    assert answer.startswith(b"HTTP/1.1 403 ") and b"cleartext" in answer and b"secret TOKEN" in answer
    assert seen == [] and store.fetched == []
    [record] = records
    assert record["allowed"] is False and str(record["reason"]).startswith(EXFILTRATION)
    assert any(attempt.reason == record["reason"] for attempt in told)


def test_a_route_to_a_binding_written_https_goes_over_tls() -> None:
    """A plain ``/route/NAME/`` goes over TLS where the binding keeps its value inside TLS (443, or
    ``https://`` on another port), plain http elsewhere; and the written form round-trips."""
    bindings = {"WRITTEN": make_binding("WRITTEN", ["https://reg.example:8443"]),
                "PORT": make_binding("PORT", ["reg.example"]),
                "PLAIN": make_binding("PLAIN", ["reg.example:8080"])}
    credentials = Credentials(CapsuleSecrets(bindings, dict.fromkeys(bindings, 8)), Store())
    schemes = {name: credentials.route(f"/route/{name}/x".encode()) for name in bindings}
    assert {name: route and route[4] for name, route in schemes.items()} == \
        {"WRITTEN": "https", "PORT": "https", "PLAIN": "http"}
    assert bindings["WRITTEN"].host_texts() == ["https://reg.example:8443"]
    assert bindings["PORT"].host_texts() == ["reg.example:443"]
    assert binding_from_json(bindings["WRITTEN"].to_json()) == bindings["WRITTEN"]
