"""Git's index file and tree objects, read as bytes a capsule wrote (capsules/gitindex.py judges them).

The index (``.git/index``) is what the next ``git commit`` commits: an entry per path
naming the blob it stages.  A capsule that promotes an index can therefore stage content
that is in no file the promotion writes, and the person's next commit carries it unseen.
Reading it takes the format as git writes it (Documentation/gitformat-index): a 12-byte
header (``DIRC``, version 2, 3 or 4, the entry count), the entries, extensions, and a
trailing checksum of the hash's size.  Each entry holds ten 32-bit stat fields (the mode
among them), the object id, 16 bits of flags (the stage in bits 12-13, the name's length in
the low 12, 0xFFF meaning longer) and, in version 3 and up, 16 more flags where the flags
say so (bit 14); then the path: in versions 2 and 3 NUL-terminated and padded with NULs
to a multiple of 8 bytes from the entry's start, in version 4 the number of bytes to drop
from the previous path's end (a varint, ``offset_decode``'s) and the rest, NUL-terminated.

The hash's size is not in the file: a SHA-256 repository writes 32-byte ids and a
32-byte checksum.  It is found from the checksum (the one that matches), or, where
``index.skipHash`` wrote zeros, from the size whose entries and extensions end exactly
at the checksum's start (both, if both do: hostile bytes can be laid out to read as
either).  Everything here is hostile bytes: each read is bounded, and anything malformed
raises ``ValueError`` with what was wrong, never an ``IndexError`` or a huge allocation.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from dataclasses import dataclass

MAX_ENTRIES = 4_000_000  # more than the largest repositories' indexes; past it the file is garbage
_STAT = struct.Struct(">10I")  # ctime s, ns, mtime s, ns, dev, ino, mode, uid, gid, size
_EXTENDED = 0x4000
_STAGE_SHIFT = 12


@dataclass(frozen=True)
class IndexEntry:
    """One staged path: its mode (0o100644, 0o100755, 0o120000, 0o160000, 0o040000 in a sparse
    index), the object it names (hex) and its merge stage (0 unless a merge left it unmerged)."""

    path: str
    mode: int
    oid: str
    stage: int


def parse_index(data: bytes) -> list[IndexEntry]:
    """The entries of an index file's bytes, in the file's order; ValueError if malformed."""
    if len(data) < 12 or data[:4] != b"DIRC":
        raise ValueError("not a git index (no DIRC signature)")
    version, count = struct.unpack_from(">II", data, 4)
    if version not in (2, 3, 4):
        raise ValueError(f"index version {version} is none git writes (2, 3, 4)")
    if count > MAX_ENTRIES:
        raise ValueError(f"the index claims {count} entries")
    errors, read = [], []
    for size, digest in ((20, hashlib.sha1), (32, hashlib.sha256)):
        body, checksum = data[:-size], data[-size:]
        if len(data) > 12 + size and checksum == digest(body).digest():
            return _entries(body, version, count, size)[0]
        if len(data) > 12 + size and not any(checksum):
            try:
                entries, at = _entries(body, version, count, size)
                _extensions(body, at)
            except ValueError as exc:
                errors.append(str(exc))
            else:
                read.extend(entries)
    # With no checksum to say, both sizes may read to the end as git would lay them out; each reading is
    # judged then, as git reads the one its repository's hash names.
    if read:
        return read
    raise ValueError(errors[0] if errors else "the index's checksum matches neither SHA-1 nor SHA-256")


def _extensions(body: bytes, at: int) -> None:
    """Walk the extensions from ``at`` (a 4-byte signature, a 32-bit size, the data, each), which must end
    where the checksum starts; ValueError if they do not."""
    while at < len(body):
        if at + 8 > len(body):
            raise ValueError("the index ends inside an extension's header")
        (length,) = struct.unpack_from(">I", body, at + 4)
        at += 8 + length
    if at != len(body):
        raise ValueError("an extension runs past the index's checksum")


def _entries(body: bytes, version: int, count: int, size: int) -> tuple[list[IndexEntry], int]:
    """The entries and the offset where they end (the extensions' start)."""
    entries: list[IndexEntry] = []
    at, previous = 12, b""
    for _ in range(count):
        start = at
        if at + _STAT.size + size + 2 > len(body):
            raise ValueError("the index ends inside an entry")
        mode = _STAT.unpack_from(body, at)[6]
        at += _STAT.size
        oid = body[at:at + size].hex()
        at += size
        (flags,) = struct.unpack_from(">H", body, at)
        at += 2
        if flags & _EXTENDED:
            if version < 3:
                raise ValueError("an extended entry in a version 2 index")
            at += 2
        if version == 4:
            drop, at = _varint(body, at)
            if drop > len(previous):
                raise ValueError("a version 4 entry drops more of the previous path than it has")
            end = body.find(b"\0", at)
            if end < 0:
                raise ValueError("an unterminated path")
            name = previous[:len(previous) - drop] + body[at:end]
            at = end + 1
        else:
            end = body.find(b"\0", at)
            if end < 0:
                raise ValueError("an unterminated path")
            name = body[at:end]
            at = start + ((end - start) // 8 + 1) * 8  # 1 to 8 NULs: the entry's length is a multiple of 8
            if at > len(body):
                raise ValueError("the index ends inside an entry's padding")
        if not name:
            raise ValueError("an entry with an empty path")
        previous = name
        entries.append(IndexEntry(name.decode("utf-8", "surrogateescape"), mode, oid, (flags >> _STAGE_SHIFT) & 3))
    return entries, at


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """Git's offset varint (each continuation adds one before shifting); the value and the next offset."""
    if at >= len(data):
        raise ValueError("the index ends inside a varint")
    byte = data[at]
    value = byte & 0x7F
    at += 1
    while byte & 0x80:
        if at >= len(data) or value > 1 << 32:
            raise ValueError("a malformed varint")
        byte = data[at]
        value = ((value + 1) << 7) | (byte & 0x7F)
        at += 1
    return value, at


def object_id(kind: str, body: bytes, size: int) -> str:
    """The id git gives an object of ``kind`` holding ``body`` (``size``: 20 for SHA-1, 32 for SHA-256)."""
    digest = hashlib.sha1() if size == 20 else hashlib.sha256()
    digest.update(f"{kind} {len(body)}\0".encode())
    digest.update(body)
    return digest.hexdigest()


def loose_body(data: bytes, kind: str, most: int) -> bytes | None:
    """The body of a loose object's file (zlib of ``KIND SIZE\\0BODY``) if it is a ``kind`` of at most
    ``most`` bytes, else None."""
    inflate = zlib.decompressobj()
    try:
        raw = inflate.decompress(data, most + 64)
    except zlib.error:
        return None
    head, nul, body = raw.partition(b"\0")
    want = kind.encode() + b" "
    if not nul or not head.startswith(want) or not head[len(want):].isdigit():
        return None
    return body if int(head[len(want):]) == len(body) else None


def tree_entry(body: bytes, name: bytes, size: int) -> tuple[int, str] | None:
    """The (mode, oid) ``name`` has in a tree object's body (``MODE NAME\\0ID`` each), or None."""
    at = 0
    while at < len(body):
        space = body.find(b" ", at)
        nul = body.find(b"\0", space + 1) if space >= 0 else -1
        if space < 0 or nul < 0 or nul + 1 + size > len(body):
            return None
        if body[space + 1:nul] == name:
            try:
                return int(body[at:space], 8), body[nul + 1:nul + 1 + size].hex()
            except ValueError:
                return None
        at = nul + 1 + size
    return None


def commit_tree(body: bytes) -> str | None:
    """The tree a commit object's body names (its first header), or None."""
    first = body.split(b"\n", 1)[0]
    key, _, value = first.partition(b" ")
    return value.decode("ascii", "replace") if key == b"tree" else None
