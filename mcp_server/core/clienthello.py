"""The name a TLS ClientHello asks for (SNI) and the protocols it offers (ALPN), read before any handshake.

Pure logic (no I/O).  The egress proxy terminates a jail's TLS only toward the host the
jail's ``CONNECT`` named (egress/tlsterm.py); it reads the ClientHello first so that a
hello asking for another name is refused, with that name recorded, before anything is
signed or any handshake begins.  What the bytes are (RFC 8446 4.1.2, RFC 6066 3, RFC 7301):

- A TLS record: type 22 (handshake), a 2-byte version, a 2-byte length (at most 2^14
  plus a little).  A ClientHello may span records; clients send it in one, and the
  proxy refuses one it cannot read from the first record (``INCOMPLETE`` only while the
  record itself has not all arrived).  Then the handshake: type 1, a 3-byte length,
  the legacy version, 32 random bytes, a session id (1-byte length), cipher suites
  (2-byte length), compression methods (1-byte length), extensions (2-byte length).
- ``server_name`` (extension 0) holds a list of names; only type 0 (host_name) exists.
  A client connecting to an IP address sends none (RFC 6066 forbids an address there).
- ``application_layer_protocol_negotiation`` (extension 16) holds 1-byte-length strings.
- Names are compared as DNS names are, case-blind and without a final dot.
"""

from __future__ import annotations

from dataclasses import dataclass

INCOMPLETE = "incomplete"
MAX_RECORD = (1 << 14) + 2048
SERVER_NAME = 0
ALPN = 16


@dataclass(frozen=True)
class Hello:
    """What a ClientHello asks for: the name (None: no SNI) and the ALPN protocols offered."""

    server_name: str | None
    alpn: tuple[str, ...]


class _Reader:
    """Bounded reads over one buffer; ``ValueError`` past its end."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, size: int) -> bytes:
        if self.at + size > len(self.data):
            raise ValueError("a length runs past the hello's end")
        out = self.data[self.at:self.at + size]
        self.at += size
        return out

    def number(self, size: int) -> int:
        return int.from_bytes(self.take(size), "big")

    def vector(self, size: int) -> _Reader:
        return _Reader(self.take(self.number(size)))

    def done(self) -> bool:
        return self.at >= len(self.data)


def record_size(data: bytes) -> int | None:
    """The length of the first TLS record in ``data`` (header included), once its header has arrived."""
    return None if len(data) < 5 else 5 + int.from_bytes(data[3:5], "big")


def parse(data: bytes) -> Hello | str:
    """The ClientHello at the start of ``data``; ``INCOMPLETE`` while its first record has not
    all arrived, or why these bytes are not a ClientHello the proxy can read."""
    if data[:1] and data[0] != 22:
        return f"not a TLS handshake (the first byte is {data[0]:#04x}; 0x16 was expected)"
    size = record_size(data)
    if size is None or len(data) < size:
        return INCOMPLETE if size is None or size <= MAX_RECORD else "a TLS record longer than TLS allows"
    try:
        return _hello(_Reader(data[5:size]))
    except ValueError as exc:
        return f"a malformed ClientHello ({exc})"


def _hello(record: _Reader) -> Hello:
    if record.number(1) != 1:
        raise ValueError("the first handshake message is not a ClientHello")
    body = record.vector(3)
    body.take(2 + 32)  # legacy version, random
    body.vector(1)  # session id
    body.vector(2)  # cipher suites
    body.vector(1)  # compression methods
    name: str | None = None
    alpn: tuple[str, ...] = ()
    extensions = body.vector(2) if not body.done() else _Reader(b"")
    while not extensions.done():
        kind, content = extensions.number(2), extensions.vector(2)
        if kind == SERVER_NAME:
            name = _server_name(content)
        elif kind == ALPN:
            alpn = _alpn(content)
    return Hello(name, alpn)


def _server_name(content: _Reader) -> str:
    names = content.vector(2)
    found = []
    while not names.done():
        kind, name = names.number(1), names.vector(2)
        if kind == 0:
            found.append(name.take(len(name.data)))
    if len(found) != 1:
        raise ValueError(f"server_name holds {len(found)} host names; exactly one was expected")
    try:
        return found[0].decode("ascii").rstrip(".").lower()
    except UnicodeDecodeError:
        raise ValueError("a server name that is not ASCII") from None


def _alpn(content: _Reader) -> tuple[str, ...]:
    names = content.vector(2)
    offered = []
    while not names.done():
        offered.append(names.vector(1).data.decode("ascii", "replace"))
    return tuple(offered)
