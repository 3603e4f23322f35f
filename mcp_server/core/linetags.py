"""Hashline tags: the low byte of FNV-1a (32-bit) over a line, as two hex digits.

Seed 002 tags each line with ``hh`` = FNV-1a over the line's UTF-8 bytes with trailing
whitespace removed, lowest byte, lowercase hex.  ``line_tag`` does one line; ``tags``
does a whole file at once; ``LazyTags`` defers the whole file until it is needed.

Some facts about the tag that make it cheap: multiplication and XOR modulo 2**32 never
carry information downwards, so the low byte of FNV-1a depends only on the low bytes of
the offset basis (0xc5) and the prime (0x93).  The tag is therefore an 8-bit recurrence,
``h = ((h ^ byte) * 0x93) & 0xff``, and many lines can be hashed at once: right-align the
lines in a matrix, padded with the one byte that leaves the initial state unchanged,
and run the recurrence column by column on one big integer that holds every line's state
in a 16-bit lane: XOR the column in, multiply by 0x93 (a byte times 0x93 is below 2**16,
so nothing carries into the next lane), mask each lane back to its low byte.  Python
then loops over columns, not bytes, three integer operations each, which keeps 100,000
lines in tens of milliseconds (the C module ``_fnvtags``, when built, does the plain
byte loop in a fraction of that).  When the text is ASCII (most source files), the matrix
is built from the str lines directly, with no per-line encoding.  ``fnv1a32`` is the
plain 32-bit function, kept for the published test vectors.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from typing import Any, AnyStr

try:  # the same tags in C (_fnvtags.c), ~60x faster; optional at install time
    from mcp_server.core import _fnvtags
except ImportError:  # pragma: no cover - exercised where no compiler was present
    _fnvtags = None  # type: ignore[assignment]

FNV32_OFFSET = 0x811C9DC5
FNV32_PRIME = 0x01000193


def fnv1a32(data: bytes) -> int:
    """FNV-1a, 32-bit, over ``data``."""
    h = FNV32_OFFSET
    for byte in data:
        h = ((h ^ byte) * FNV32_PRIME) & 0xFFFFFFFF
    return h


# The 8-bit recurrence: h' = ((h ^ b) * 0x93) & 0xff.  _MUL maps x to x * 0x93 mod 256.
_LOW_PRIME = FNV32_PRIME & 0xFF
_LOW_OFFSET = FNV32_OFFSET & 0xFF
_MUL = bytes((x * _LOW_PRIME) & 0xFF for x in range(256))
# A byte that leaves the initial state unchanged: (0xc5 ^ p) * 0x93 == 0xc5 (mod 256).
_PAD = next(p for p in range(256) if _MUL[_LOW_OFFSET ^ p] == _LOW_OFFSET)
_PAD_CHAR = chr(_PAD)  # the pad as a character of a str matrix row
_HEX = [f"{x:02x}" for x in range(256)]
_VECTOR_MIN_LINES = 16  # below this many lines, the plain loop beats column passes
_PAD_TABLE_MAX = 1024  # widest matrix padded from a table of every pad (width**2 / 2 bytes)


def _tag_byte(data: bytes) -> int:
    h = _LOW_OFFSET
    for byte in data:
        h = _MUL[h ^ byte]
    return h


def line_tag(line: str) -> str:
    """The two hex digits of a line's tag: FNV-1a low byte over the right-stripped line."""
    return _HEX[_tag_byte(line.rstrip().encode("utf-8"))]


def tags(lines: Sequence[str]) -> list[str]:
    """Tags of many lines at once (same result as ``line_tag`` on each)."""
    if not lines:
        return []
    stripped = list(map(str.rstrip, lines))
    joined = "\n".join(stripped)
    if _fnvtags is not None:
        tagged = _fnvtags.tags(joined.encode("utf-8"))
        if len(tagged) == len(lines):  # else a line held a "\n" itself; never from split_text
            return list(map(_HEX.__getitem__, tagged))
        return [line_tag(line) for line in lines]
    return _tags_python(stripped, joined, lines)


def _tags_python(stripped: list[str], joined: str, lines: Sequence[str]) -> list[str]:
    """``tags`` without the C module: the column-by-column recurrence described above."""
    if joined.isascii() and len(stripped) >= _VECTOR_MIN_LINES:
        # Most source files: a character is a byte, so the padded matrix is built from the
        # str lines directly, without encoding and splitting each line.
        lens = list(map(len, stripped))
        width = max(lens)
        if _fits_one_matrix(lens, width):
            matrix = _right_aligned(stripped, lens, width, _PAD_CHAR)
            return list(map(_HEX.__getitem__, _matrix_tags(matrix, width, len(stripped))))
    encoded = joined.encode("utf-8").split(b"\n")
    count = len(encoded)
    if count != len(lines):  # a line held a "\n" itself; never from split_text
        return [line_tag(line) for line in lines]
    if count < _VECTOR_MIN_LINES:
        return [_HEX[_tag_byte(data)] for data in encoded]
    lens = list(map(len, encoded))
    width = max(lens)
    if _fits_one_matrix(lens, width):
        return list(map(_HEX.__getitem__, _tag_columns(encoded, width)))
    # Very uneven lengths: hash groups of similar length (sorted), so padding at most
    # doubles the work, then put the tags back in line order.
    order = sorted(range(count), key=lens.__getitem__)
    sorted_lens = [lens[i] for i in order]
    by_rank = bytearray(count)
    first = 0
    while first < count:
        stop = bisect.bisect_right(sorted_lens, max(2 * sorted_lens[first], 16), lo=first)
        group = [encoded[i] for i in order[first:stop]]
        if len(group) < _VECTOR_MIN_LINES:
            by_rank[first:stop] = bytes(_tag_byte(data) for data in group)
        else:
            by_rank[first:stop] = _tag_columns(group, sorted_lens[stop - 1])
        first = stop
    result = [""] * count
    for rank, index in enumerate(order):
        result[index] = _HEX[by_rank[rank]]
    return result


def _fits_one_matrix(lens: list[int], width: int) -> bool:
    """Lengths are close enough that one padded matrix wastes little."""
    return width * len(lens) <= 4 * sum(lens) + 32 * len(lens)


def _tag_columns(group: Sequence[bytes], width: int) -> bytes:
    """The tag byte of every line in ``group`` (each at most ``width`` bytes), column by column."""
    # Right-align each line in a row of ``width`` bytes, padding with the byte that keeps
    # the state at its initial value.
    padded = _right_aligned(group, list(map(len, group)), width, bytes([_PAD]))
    return _matrix_tags(padded.decode("latin-1"), width, len(group))  # one char per byte


def _right_aligned(rows: Sequence[AnyStr], lens: list[int], width: int, pad: AnyStr) -> AnyStr:
    """The rows (of lengths ``lens``) right-aligned in ``width`` with ``pad``, concatenated."""
    empty = pad[:0]
    if width > _PAD_TABLE_MAX:
        return empty.join([row.rjust(width, pad) for row in rows])
    # One shared pad string per length, interleaved with the rows: no string per row.
    pads = [pad * n for n in range(width + 1)]
    parts = [empty] * (2 * len(rows))
    parts[0::2] = map(pads.__getitem__, map(width.__sub__, lens))
    parts[1::2] = rows
    return empty.join(parts)


def _matrix_tags(matrix: str, width: int, count: int) -> bytes:
    """The tag byte of each ``width``-character row of ``matrix`` (characters below 256,
    each standing for one byte); column k is matrix[k::width]."""
    # UTF-16-LE puts each character below 256 in a 16-bit lane: its byte, then zero.
    low_bytes = int.from_bytes(b"\xff\x00" * count, "little")
    state = int.from_bytes(bytes([_LOW_OFFSET, 0]) * count, "little")
    for k in range(width):
        column = int.from_bytes(matrix[k::width].encode("utf-16-le"), "little")
        state = ((state ^ column) * _LOW_PRIME) & low_bytes
    return state.to_bytes(2 * count, "little")[0::2]


class LazyTags(Sequence[str]):
    """Tags of a document's lines, computed one at a time until all are needed.

    An edit whose anchors all match exactly needs only the anchored lines' tags; the
    whole list is computed (once) only to find a moved line or to explain a failure.
    """

    def __init__(self, lines: Sequence[str], known: list[str] | None = None) -> None:
        self._lines = lines
        # ``known``: the tags already computed for exactly these lines (e.g. cached by hash).
        self._all: list[str] | None = known if known is not None and len(known) == len(lines) else None

    @property
    def complete(self) -> list[str] | None:
        """Every tag, if they are already known; None otherwise (nothing is computed)."""
        return self._all

    def __len__(self) -> int:
        return len(self._lines)

    def __getitem__(self, index: Any) -> Any:
        if self._all is None and isinstance(index, int):
            return line_tag(self._lines[index])
        return self.all()[index]

    def __iter__(self) -> Iterator[str]:
        return iter(self.all())

    def all(self) -> list[str]:
        """Every tag, computed on first use."""
        if self._all is None:
            self._all = tags(self._lines)
        return self._all
