"""egress/maskedbody.py, sans-IO: the request head that asks for no coding, the response heads
a masker cannot read, and chunked bodies read out of their framing across every split."""

from __future__ import annotations

import random

import pytest

from mcp_server.egress.maskedbody import LAST_CHUNK, MAX_SIZE_LINE, Dechunker, chunk, chunked, identity_head, unreadable

BODY = b"you sent Bearer tok-S3cr3tS3cr3tS3cr3t and more"
FRAMED = (b"9;name=value\r\nyou sent \r\n11\r\nBearer tok-S3cr3t\r\n15\r\nS3cr3tS3cr3t and more\r\n"
          b"0\r\nX-Trailer: tok-S3cr3t\r\n\r\nafter the end")


def test_identity_head_replaces_every_accepted_coding_and_drops_te() -> None:
    head = (b"GET / HTTP/1.1\r\nhost: h\r\naccept-encoding: gzip, br\r\nAccept-Encoding: zstd\r\n"
            b"TE: trailers, gzip\r\nx-te: kept\r\n\r\n")
    assert identity_head(head) == b"GET / HTTP/1.1\r\nhost: h\r\nx-te: kept\r\naccept-encoding: identity\r\n\r\n"
    assert identity_head(b"GET / HTTP/1.1\r\n\r\n") == b"GET / HTTP/1.1\r\naccept-encoding: identity\r\n\r\n"


@pytest.mark.parametrize(("fields", "why"), [
    (b"Content-Encoding: gzip", "Content-Encoding: gzip"),
    (b"content-encoding: identity, br", "Content-Encoding: br"),
    (b"Content-Encoding: identity\r\nContent-Encoding: deflate", "Content-Encoding: deflate"),
    (b"Transfer-Encoding: gzip, chunked", "Transfer-Encoding: gzip, chunked"),
    (b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked", "Transfer-Encoding: chunked, chunked"),
    (b"Content-Encoding: identity", None),
    (b"Transfer-Encoding: Chunked", None),
    (b"Content-Length: 3\r\nX-Content-Encoding: gzip", None),
])
def test_unreadable_names_the_coding(fields: bytes, why: str | None) -> None:
    reason = unreadable(b"HTTP/1.1 200 OK\r\n" + fields + b"\r\n\r\n")
    assert reason is None if why is None else (why in str(reason) and "nothing of it passed" in str(reason))


def test_chunked_and_chunk() -> None:
    assert chunked(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    assert not chunked(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n")
    assert chunk(b"abc") == b"3\r\nabc\r\n" and chunk(b"") == b""
    assert chunk(b"x" * 26) == b"1a\r\n" + b"x" * 26 + b"\r\n"


def test_dechunker_across_every_split_ignores_extensions_trailers_and_what_follows() -> None:
    for cut in range(len(FRAMED) + 1):
        body = Dechunker()
        out = body.feed(FRAMED[:cut]) + body.feed(FRAMED[cut:])
        assert (out, body.done) == (BODY, True)
    body = Dechunker()
    assert b"".join(body.feed(FRAMED[at:at + 1]) for at in range(len(FRAMED))) == BODY and body.done
    assert body.feed(b"5\r\nlater\r\n") == b""


def test_dechunker_not_done_until_the_trailers_end() -> None:
    body = Dechunker()
    assert body.feed(b"3\r\nabc\r\n0\r\nX-T: 1\r\n") == b"abc" and not body.done
    assert body.feed(b"\r\n") == b"" and body.done


def test_dechunker_random_framings_of_random_bodies() -> None:
    rng = random.Random(38)
    for _ in range(200):
        data = rng.randbytes(rng.randrange(0, 300))
        framed, at = b"", 0
        while at < len(data):
            size = rng.randrange(1, 40)
            framed += chunk(data[at:at + size])
            at += size
        framed += LAST_CHUNK
        body, out, at = Dechunker(), b"", 0
        while at < len(framed):
            step = rng.randrange(1, 20)
            out += body.feed(framed[at:at + step])
            at += step
        assert (out, body.done) == (data, True)


@pytest.mark.parametrize("framed", [
    b"3\r\nabcd\r\n",  # data past its size
    b"x\r\n",  # not hex
    b"-3\r\nabc\r\n",
    b"\r\n",  # no size
    b"1" * 17 + b"\r\n",  # a size no body has
    b"3" * (MAX_SIZE_LINE + 2),  # a size line that never ends
])
def test_dechunker_bad_framing_is_a_value_error(framed: bytes) -> None:
    with pytest.raises(ValueError, match="chunk"):
        Dechunker().feed(framed)
