"""What a masked response must be for its mask to work (egress/exchange.py ``Exchange._masked``).

Sans-IO, as core/placeholders.py's ``ResponseMasker`` is: the masker replaces each value
that went into a request by its placeholder wherever the value's bytes appear in the
response stream.  Some facts about HTTP decide what that stream may be:

- **A content coding hides the value's bytes.**  curl --compressed, pip, git, requests
  and node's clients send ``Accept-Encoding: gzip`` by default, and a server that echoes
  the request's headers then answers in gzip: the value is in the jail's bytes, deflated,
  and the masker sees none of it.  So every request to a bound host asks for no coding
  (``identity_head``), a value in it or not: a bound host may hand back a stored value in
  any answer.  A server that codes its answer anyway (``unreadable``) is refused with a
  502 and nothing of its response passes.  Decoding in the proxy instead would be a zlib
  object per response, a new hole at each coding a server adopts (br, zstd: other
  libraries), a decoder's bugs and its bombs in the front end, and a re-encoded or
  decoded answer the client did not ask for; servers honour ``identity``, so the refusal
  costs almost nothing and fails closed.
- **A range is a slice of the echo.**  ``Range: bytes=N-M`` of a response echoing the request
  hands back a piece of the value that no mask matches (the masker finds whole values).  So
  a request a value went into asks for no range (``identity_head``): the answer is whole, a
  200 where a 206 was asked, which clients take.  Other requests to a bound host keep theirs.
- **``TE`` asks for a transfer coding.**  It is hop-by-hop, and the proxy already drops
  it with the others (egress/proxy.py ``forward_headers``); ``identity_head`` drops it
  again, so a coded transfer is never asked for.  A ``Transfer-Encoding`` other than
  ``chunked`` is refused as a content coding is.
- **Chunked framing splits the value.**  The upstream chooses its chunk sizes, so chunk
  size lines may fall inside a value (``ab\\r\\n5\\r\\ncdefg``): the client joins them
  and the masker, reading the framed bytes, would find nothing.  A chunked body is read
  out of its framing (``Dechunker``), masked, and framed again (``chunk``) for the jail;
  its trailers, which could hold a value too, are dropped.  Its end stays its framing's:
  the jail's client tells a cut body from a whole one as it would end to end.
"""

from __future__ import annotations

ACCEPT_ENCODING = b"accept-encoding"
IDENTITY = b"identity"
MAX_SIZE_LINE = 1024  # a chunk's size line with its extensions: h11 allows less
MAX_TRAILERS = 64 * 1024  # as egress/exchange.py's MAX_HEAD
LAST_CHUNK = b"0\r\n\r\n"
UNREADABLE = ("the upstream {coded} a response ccw must check for the credential it was sent ({header}); "
              "nothing of it passed")


def identity_head(head: bytes, valued: bool = False) -> bytes:
    """A request head (through its blank line) asking for no coding: ``Accept-Encoding:
    identity`` for whatever it accepted, and no ``TE``; ``valued`` (a value went into it):
    no ``Range`` or ``If-Range`` either, the whole answer or none."""
    dropped = (ACCEPT_ENCODING, b"te", *((b"range", b"if-range") if valued else ()))
    lines = head[:-4].split(b"\r\n")
    kept = [line for line in lines[1:] if line.partition(b":")[0].strip().lower() not in dropped]
    return b"\r\n".join([lines[0], *kept, ACCEPT_ENCODING + b": " + IDENTITY, b"", b""])


def _values(head: bytes, name: bytes) -> list[bytes]:
    """The comma-separated tokens of every ``name`` header in a response head, lower-cased."""
    tokens: list[bytes] = []
    for line in head.split(b"\r\n")[1:]:
        field, _, value = line.partition(b":")
        if field.strip().lower() == name:
            tokens.extend(token.strip().lower() for token in value.split(b","))
    return [token for token in tokens if token]


def unreadable(head: bytes) -> str | None:
    """Why the masker cannot read the body after a response ``head`` (a content coding, a
    transfer coding other than chunked), or None."""
    coded = [token for token in _values(head, b"content-encoding") if token != IDENTITY]
    if coded:
        return UNREADABLE.format(coded="compressed", header="Content-Encoding: " + b", ".join(coded).decode(
            "ascii", "replace"))
    transfer = _values(head, b"transfer-encoding")
    if transfer and transfer != [b"chunked"]:
        return UNREADABLE.format(coded="transfer-coded", header="Transfer-Encoding: " + b", ".join(transfer).decode(
            "ascii", "replace"))
    return None


def chunked(head: bytes) -> bool:
    """Whether a response ``head`` frames its body in chunks."""
    return _values(head, b"transfer-encoding") == [b"chunked"]


def chunk(data: bytes) -> bytes:
    """``data`` framed as one chunk; nothing for nothing (an empty chunk would end the body)."""
    return b"%x\r\n%s\r\n" % (len(data), data) if data else b""


class Dechunker:
    """A chunked body's data out of its framing, across reads.

    ``feed`` returns the data the bytes so far complete; ``done`` turns true at the last
    chunk's trailers' end, after which the rest is ignored.  Bad framing, or a size line or
    trailers over their limits, is a ValueError."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._left = -1  # data bytes left of the current chunk; -1: a size line is next
        self._trailers = False  # past the last chunk: its trailers until a blank line
        self.done = False

    def feed(self, data: bytes) -> bytes:
        """The data ``data`` completes."""
        if self.done:
            return b""
        self._buffer += data
        out = bytearray()
        while not self.done and self._step(out):
            pass
        return bytes(out)

    def _step(self, out: bytearray) -> bool:
        """One piece of framing or data taken from the buffer; False when it needs more bytes."""
        if self._left > 0:
            taken = self._buffer[: self._left]
            del self._buffer[: len(taken)]
            self._left -= len(taken)
            out += taken
            return bool(taken)
        if self._left == 0:  # the CRLF after a chunk's data
            if len(self._buffer) < 2:
                return False
            if self._buffer[:2] != b"\r\n":
                raise ValueError("a chunk's data runs past its size")
            del self._buffer[:2]
            self._left = -1
            return True
        end = self._buffer.find(b"\r\n")
        limit = MAX_TRAILERS if self._trailers else MAX_SIZE_LINE
        if end == -1 or end > limit:
            if len(self._buffer) > limit:
                raise ValueError("chunk size line or trailers too long")
            return False
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 2]
        if self._trailers:
            self.done = not line
            return True
        size = line.split(b";", 1)[0].strip()
        if not size or size.strip(b"0123456789abcdefABCDEF") or len(size) > 16:
            raise ValueError(f"bad chunk size line {line[:40]!r}")
        number = int(size, 16)
        self._trailers = number == 0
        self._left = -1 if self._trailers else number
        return True
