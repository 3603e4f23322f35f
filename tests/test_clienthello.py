"""core/clienthello.py on real ClientHellos (made by Python's ssl into memory) and on broken ones."""

from __future__ import annotations

import ssl

import pytest

from mcp_server.core import clienthello


def hello(name: str | None, alpn: list[str] | None = None) -> bytes:
    """The first flight of a client handshaking with ``name`` (None: no SNI)."""
    context = ssl.create_default_context()
    context.check_hostname = name is not None
    if alpn:
        context.set_alpn_protocols(alpn)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_names_and_protocols_read_from_real_hellos() -> None:
    assert clienthello.parse(hello("Git.Example.")) == clienthello.Hello("git.example", ())
    assert (clienthello.parse(hello("a.example", ["h2", "http/1.1"]))
            == clienthello.Hello("a.example", ("h2", "http/1.1")))
    assert clienthello.parse(hello(None)) == clienthello.Hello(None, ())
    assert clienthello.parse(hello("127.0.0.1")).server_name is None  # type: ignore[union-attr]  (no SNI for an address)


def test_partial_and_broken_hellos() -> None:
    data = hello("git.example")
    for cut in (0, 3, 5, len(data) - 1):
        assert clienthello.parse(data[:cut]) == clienthello.INCOMPLETE
    assert clienthello.parse(b"GET / HTTP/1.1\r\n").startswith("not a TLS handshake")  # type: ignore[union-attr]
    assert clienthello.parse(b"\x16\x03\x01\xff\xff") == "a TLS record longer than TLS allows"
    broken = data[:5] + b"\x01\x00\xff\xff" + data[9:]  # a handshake length past the record's end
    assert str(clienthello.parse(broken)).startswith("a malformed ClientHello")
    assert str(clienthello.parse(data[:5] + b"\x02" + data[6:])).endswith("is not a ClientHello)")
