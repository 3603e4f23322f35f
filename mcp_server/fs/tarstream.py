"""A bounded, streaming reader of the tar archives witnesses are (ustar, optionally zstd).

A witness is untrusted input, and a tar reader is where it first costs memory: a
header declares a size, and zstd turns a few kilobytes into gigabytes of zeros (one
compressed GiB of zeros is 34 KB).  So this reader, not tarfile, does the reading:

- Every byte that comes out of the decompressor is counted before it is used, against
  a total (``max_total``) and, once past ``RATIO_FLOOR``, against the compressed bytes
  read so far (``max_ratio``, when the caller sets one).  A member's declared size is
  checked against ``max_member`` before any of it is read.  Each limit, when hit, is
  INVALID_ARGUMENT naming the member and the limit.
- Members are read in ``CHUNK``-sized pieces, so the caller can hash while reading and
  keep only what proved good; nothing is read whole behind its back.  tarfile, by
  contrast, reads a pax or GNU long-name header whole (its declared size, unbounded)
  and keeps every member's TarInfo for the archive's life.
- Only what ccw writes is understood: ustar headers (GNU tar's "ustar  " magic too) of
  regular files, sizes in octal.  Any other member (directories, links, pax and GNU
  extension headers) is reported as such and its bytes skipped, still counted.
- A zstd frame that needs a window over ``MAX_WINDOW_BYTES`` is refused by the
  decompressor before it allocates one.
- The first all-zero block ends the archive, as it does for GNU tar; end of input at a
  header boundary does too (tarfile's leniency, kept for archives cut after the end
  marker).  End of input inside a header or member is "truncated".
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

import zstandard

from sandbox.errors import CcwError

BLOCK = 512
CHUNK = 1 << 20  # bytes per read: small next to any limit, large enough that hashing stays fast
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# ccw writes level 3 (a 2 MiB window); zstd -19 uses 8 MiB.  ``zstd --long`` archives
# (128 MiB and more) are refused rather than letting a witness choose our allocation.
MAX_WINDOW_BYTES = 1 << 25
# The ratio is checked only past this many expanded bytes: small archives of repetitive
# text compress far beyond any sane ratio, and this much costs nothing to expand.
RATIO_FLOOR = 64 << 20
_REGULAR = (b"0", b"\0")


@dataclass(frozen=True)
class Member:
    """One archive member's header."""

    name: str
    size: int
    regular: bool  # a regular file; anything else is only skipped


@dataclass(frozen=True)
class Limits:
    """What reading one archive may cost."""

    max_member: int  # declared bytes of one member
    max_total: int  # expanded bytes of the whole archive, headers included
    max_ratio: int | None = None  # expanded / compressed bytes past RATIO_FLOOR (None: unchecked)


def _too_much(what: str, limit: str, details: dict[str, object]) -> CcwError:
    return CcwError("INVALID_ARGUMENT", f"the witness archive is refused: {what} ({limit}), as a possible "
                    "decompression bomb; if you trust it, ask its maker for a smaller one (carry 'used', "
                    "max_base_mb) or one made with compress 'none'", details)


def _truncated(where: str) -> CcwError:
    return CcwError("INVALID_ARGUMENT", f"the witness archive is truncated ({where}); copy it again or make it again")


class _Counted:
    """The compressed input, counting what the decompressor has read."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.count += len(data)
        return data


class TarStream:
    """Members of a tar (or tar.zst) archive, read within ``limits``."""

    def __init__(self, data: IO[bytes], limits: Limits) -> None:
        head = data.read(4)
        data.seek(0)
        self.limits = limits
        self.expanded = 0
        self.compressed: _Counted | None = None
        self._stream: IO[bytes] = data
        if head == ZSTD_MAGIC:
            self.compressed = _Counted(data)
            decompressor = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW_BYTES)
            self._stream = decompressor.stream_reader(self.compressed, closefd=False)  # type: ignore[arg-type]

    def _read(self, size: int, member: str) -> bytes:
        data = self._stream.read(size)
        self.expanded += len(data)
        limits = self.limits
        if self.expanded > limits.max_total:
            raise _too_much(f"more than {limits.max_total} bytes come out of it, at member {member!r}",
                            f"MAX_TOTAL_BYTES {limits.max_total}", {"member": member, "limit": limits.max_total})
        ratio = limits.max_ratio
        if (ratio is not None and self.compressed is not None and self.expanded > RATIO_FLOOR
                and self.expanded > ratio * self.compressed.count):
            raise _too_much(f"{self.expanded} bytes came out of {self.compressed.count} compressed, at member "
                            f"{member!r}", f"past {RATIO_FLOOR} bytes an untrusted witness may expand at most "
                            f"{ratio}:1", {"member": member, "limit": ratio})  # fmt: skip
        return data

    def _exactly(self, size: int, member: str) -> bytes:
        parts = []
        while size:
            data = self._read(min(size, CHUNK), member)
            if not data:
                raise _truncated(f"in member {member!r}")
            parts.append(data)
            size -= len(data)
        return b"".join(parts)

    def next(self) -> Member | None:
        """The next member's header, or None at the end of the archive."""
        first = self._read(BLOCK, "(header)")
        if not first:
            return None
        block = first if len(first) == BLOCK else first + self._exactly(BLOCK - len(first), "(header)")
        if block == bytes(BLOCK):
            return None
        member = parse_header(block)
        if member.size > self.limits.max_member:
            raise _too_much(f"member {member.name!r} declares {member.size} bytes",
                            f"MAX_MEMBER_BYTES {self.limits.max_member}",
                            {"member": member.name, "limit": self.limits.max_member})
        return member

    def chunks(self, member: Member) -> Iterator[bytes]:
        """The member's bytes in pieces of at most CHUNK, then past its padding."""
        left = member.size
        while left:
            data = self._read(min(left, CHUNK), member.name)
            if not data:
                raise _truncated(f"in member {member.name!r}")
            left -= len(data)
            yield data
        self._exactly(-member.size % BLOCK, member.name)

    def whole(self, member: Member, limit: int, why: str) -> bytes:
        """A small member's bytes, refused past ``limit`` (``why`` names the limit)."""
        if member.size > limit:
            raise _too_much(f"member {member.name!r} is {member.size} bytes", f"{why} {limit}",
                            {"member": member.name, "limit": limit})
        return b"".join(self.chunks(member))

    def skip(self, member: Member) -> None:
        """Read past a member, counting its bytes."""
        for _ in self.chunks(member):
            pass


def parse_header(block: bytes) -> Member:
    """A ustar header block's member; INVALID_ARGUMENT when it is not one."""
    try:
        stored = int(block[148:156].replace(b"\0", b" ").strip() or b"-1", 8)
    except ValueError:
        stored = -1
    unsigned = sum(block[:148]) + 8 * 32 + sum(block[156:])
    # Old tars summed signed bytes: each byte over 127 counts 256 less.
    if stored != unsigned and stored != unsigned - 256 * sum(1 for b in block[:148] + block[156:] if b > 127):
        raise CcwError("INVALID_ARGUMENT", "not a witness archive: a tar header's checksum does not match "
                                           "(a damaged file, or not a tar); check the path or copy it again")
    name = block[:100].split(b"\0", 1)[0]
    if block[257:265] == b"ustar\x0000" and block[345] != 0:  # POSIX ustar's prefix (GNU's holds times there)
        name = block[345:500].split(b"\0", 1)[0] + b"/" + name
    text = name.decode("utf-8", "replace")
    field = block[124:136].replace(b"\0", b" ").strip()
    if not field or not all(48 <= b <= 55 for b in field):  # base-256 sizes (past 8 GiB) are never ccw's
        raise CcwError("INVALID_ARGUMENT", f"not a witness archive: member {text!r} has a size that is not "
                                           "octal; make the witness again", {"member": text})
    return Member(text, int(field, 8), block[156:157] in _REGULAR)
