"""Method/path rules at the proxy (egress/ruled.py, core/httprules.py) over real loopback sockets:
a GET on a read-only host passes, a POST gets a 403 naming the rule it missed, the record
keeps the request line and no header value or body; tunnels (CONNECT, SOCKS) to the host are
refused; a change of rules counts from the next request; and a secret's placeholder is
still judged after the rule allowed the request."""

from __future__ import annotations

import struct

import pytest
import trio

from mcp_server.core import netrules
from mcp_server.core.placeholders import CapsuleSecrets
from mcp_server.core.secretbind import make_binding
from mcp_server.egress import ruled
from mcp_server.egress.credentials import Credentials
from tests.support.egress_harness import (  # noqa: F401  (relay_engine: a fixture)
    egress,
    http_responder,
    network,
    read_all,
    relay_engine,
    shout,
    upstream,
)

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
TOKEN = b"tok-" + b"V4lue" * 8


def request(method: str, port: int, path: str, headers: str = "", body: bytes = b"") -> bytes:
    length = f"Content-Length: {len(body)}\r\n" if body or method == "POST" else ""
    return (f"{method} http://127.0.0.1:{port}{path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{headers}{length}\r\n"
            ).encode() + body


@pytest.mark.usefixtures("relay_engine")
def test_read_only_host_passes_get_and_refuses_post_naming_the_rule() -> None:
    async def main() -> tuple[list[bytes], list[bytes], list[dict[str, object]]]:
        async with upstream(http_responder(OK)) as up, egress(network(f"READ http://127.0.0.1:{up.port}/simple/**",
                                                                    "pypi.org")) as proxy:
            answers = []
            for method, path, body in [("GET", "/simple/x/?token=q", b""), ("POST", "/simple/x/", b"secret-body"),
                                       ("GET", "/admin", b""), ("GET", "/simple/%2e%2e/admin", b""),
                                       ("HEAD", "/simple/", b"")]:
                client = await proxy.http()
                await client.send_all(request(method, up.port, path, "X-Api-Key: hdr-value\r\n", body))
                answers.append(await read_all(client))
            return answers, up.seen, proxy.session.end_exec()

    answers, seen, records = trio.run(main)
    rule = f"GET,HEAD,OPTIONS http://127.0.0.1:{records[0]['port']}/simple/**"
    assert answers[0].endswith(b"ok") and answers[4].startswith(b"HTTP/1.1 200 ")
    for refused in answers[1:4]:
        assert refused.startswith(b"HTTP/1.1 403 ") and rule.encode() in refused
    assert b"dot segment" in answers[3]
    assert len(seen) == 2  # the refused ones never reached the upstream
    assert [(r["allowed"], r["request"]) for r in records] == [
        (True, "GET /simple/x/"), (False, "POST /simple/x/"), (False, "GET /admin"),
        (False, "GET /simple/%2e%2e/admin"), (True, "HEAD /simple/")]
    assert records[0]["rule"] == rule and rule in str(records[1]["reason"])
    text = repr(records)
    assert "hdr-value" not in text and "secret-body" not in text and "token=q" not in text


def _socks(host: str, port: int) -> bytes:
    name = host.encode()
    return b"\x05\x01\x00" + b"\x05\x01\x00\x03" + bytes([len(name)]) + name + struct.pack("!H", port)


@pytest.mark.usefixtures("relay_engine")
def test_tunnels_to_a_ruled_host_are_refused_and_others_pass() -> None:
    async def main() -> tuple[bytes, bytes, bytes, list[dict[str, object]]]:
        async with upstream(shout) as up, egress(network(f"GET http://127.0.0.1:{up.port}/**")) as proxy:
            client = await proxy.http()
            await client.send_all(f"CONNECT 127.0.0.1:{up.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            connect = await read_all(client)
            assert isinstance(proxy.session, ruled.Ruled) and proxy.session.requests.hosts() == {("127.0.0.1", up.port)}
            client = await proxy.socks()
            await client.send_all(_socks("127.0.0.1", up.port))
            socks = await read_all(client)
            # Another rule for the same address without method/path: still a tunnel (a port of its own).
            proxy.session.set_rules(netrules.changed(proxy.session.spec, allow=[f"127.0.0.1:{up.port}"]))
            client = await proxy.http()
            await client.send_all(f"CONNECT 127.0.0.1:{up.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            narrowed = await read_all(client)
            return connect, socks, narrowed, proxy.session.end_exec()

    connect, socks, narrowed, records = trio.run(main)
    assert connect.startswith(b"HTTP/1.1 403 ") and b"has method/path rules" in connect
    assert socks[:2] == b"\x05\x00" and socks[3] == 2  # SOCKS: not allowed by the ruleset
    assert narrowed.startswith(b"HTTP/1.1 403 ")  # a host rule beside the method/path rule does not reopen the tunnel
    assert [(r["protocol"], r["allowed"]) for r in records] == [("https", False), ("https", False), ("socks5", False)]
    assert all("unread" in str(r["reason"]) for r in records)


@pytest.mark.usefixtures("relay_engine")
def test_rules_changed_live_count_from_the_next_request_and_secrets_still_judged() -> None:
    capsule = CapsuleSecrets({"TOKEN": make_binding("TOKEN", ["127.0.0.1:1"], None, None)}, {"TOKEN": len(TOKEN)})

    async def main() -> tuple[list[bytes], list[dict[str, object]]]:
        async with upstream(http_responder(OK)) as up, egress(network(f"READ http://127.0.0.1:{up.port}/**")) as proxy:
            proxy.session.credentials = Credentials(capsule, lambda name: TOKEN)
            answers = []
            for rules, method, headers in [
                (None, "POST", ""),
                ([f"POST http://127.0.0.1:{up.port}/v1/**"], "POST", ""),
                # the rule allows it, the secret's binding does not
                (None, "POST", f"Authorization: Bearer {capsule.env()['TOKEN']}\r\n"),
            ]:
                if rules is not None:
                    proxy.session.set_rules(netrules.changed(proxy.session.spec, allow=rules))
                client = await proxy.http()
                await client.send_all(request(method, up.port, "/v1/jobs", headers))
                answers.append(await read_all(client))
            return answers, proxy.session.end_exec()

    answers, records = trio.run(main)
    assert answers[0].startswith(b"HTTP/1.1 403 ") and answers[1].endswith(b"ok")
    assert answers[2].startswith(b"HTTP/1.1 403 ") and b"exfiltration attempt" in answers[2]
    assert [r["request"] for r in records] == ["POST /v1/jobs"] * 3
    assert records[0]["rules"] != records[1]["rules"]  # each decided by the rules then in force
    assert TOKEN.decode() not in repr(records)


@pytest.mark.usefixtures("relay_engine")
def test_a_request_framed_by_both_length_and_chunks_never_reaches_the_upstream() -> None:
    """h11 reads such a body by its chunks and sent the length on beside them: an upstream that
    reads the length took the chunks' bytes as a second request, a DELETE the GET rule never saw."""
    smuggled = b"DELETE /admin HTTP/1.1\r\nHost: x\r\n\r\n"

    async def main() -> tuple[list[bytes], list[bytes], list[dict[str, object]]]:
        async with upstream(http_responder(OK)) as up, egress(network(f"GET http://127.0.0.1:{up.port}/simple/*")) \
                as proxy:
            answers = []
            for framing in ("Content-Length: 4\r\nTransfer-Encoding: chunked\r\n",
                            "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n"):
                client = await proxy.http()
                await client.send_all(request("GET", up.port, "/simple/x", framing)
                                      + b"%x\r\n%s\r\n0\r\n\r\n" % (len(smuggled), smuggled))
                answers.append(await read_all(client))
            client = await proxy.http()  # the chunks alone pass, as ever
            await client.send_all(request("GET", up.port, "/simple/x", "Transfer-Encoding: chunked\r\n")
                                  + b"2\r\nhi\r\n0\r\n\r\n")
            answers.append(await read_all(client))
            return answers, up.seen, proxy.session.end_exec()

    answers, seen, records = trio.run(main)
    for refused in answers[:2]:
        assert refused.startswith(b"HTTP/1.1 400 ") and b"both Content-Length and Transfer-Encoding" in refused
    assert answers[2].endswith(b"ok")
    assert len(seen) == 1 and b"content-length" not in seen[0].lower() and b"DELETE" not in seen[0]
    assert [r["request"] for r in records] == ["GET /simple/x"]
