"""Hashline tags: the low byte of FNV-1a (32-bit) over a line, as two hex digits.

Seed 002 tags each line with ``hh`` = FNV-1a over the line's UTF-8 bytes with trailing
whitespace removed, lowest byte, lowercase hex.  ``line_tag`` does one line; ``tags``
does a whole file at once; ``LazyTags`` defers the whole file until it is needed.

Some facts about the tag that make it cheap: multiplication and XOR modulo 2**32 never
carry information downwards, so the low byte of FNV-1a depends only on the low bytes of
the offset basis (0xc5) and the prime (0x93).  The tag is therefore an 8-bit recurrence,
``h = ((h ^ byte) * 0x93) & 0xff``, and many lines can be hashed at once: right-align the
lines in a matrix, padded with the one byte that leaves the initial state unchanged,
and run the recurrence column by column with big-integer XOR and ``bytes.translate``.
Python then loops over columns, not bytes, which keeps 100,000 lines in tens of
milliseconds.  ``fnv1a32`` is the plain 32-bit function, kept for the published test
vectors.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from typing import Any

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
_HEX = [f"{x:02x}" for x in range(256)]
_VECTOR_MIN_LINES = 16  # below this many lines, the plain loop beats column passes


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
    encoded = "\n".join(line.rstrip() for line in lines).encode("utf-8").split(b"\n")
    count = len(encoded)
    if count != len(lines):  # a line held a "\n" itself; never from split_text
        return [line_tag(line) for line in lines]
    if count < _VECTOR_MIN_LINES:
        return [_HEX[_tag_byte(data)] for data in encoded]
    lens = list(map(len, encoded))
    width = max(lens)
    if width * count <= 4 * sum(lens) + 32 * count:
        # Lengths are close enough that one padded matrix wastes little.
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


def _tag_columns(group: Sequence[bytes], width: int) -> bytes:
    """The tag byte of every line in ``group`` (each at most ``width`` bytes), column by column."""
    count = len(group)
    # Right-align each line in a row of ``width`` bytes, padding with the byte that keeps
    # the state at its initial value; column k is then matrix[k::width].
    pad = bytes([_PAD])
    matrix = b"".join([data.rjust(width, pad) for data in group])
    state = int.from_bytes(bytes([_LOW_OFFSET]) * count, "big")
    for k in range(width):
        column = int.from_bytes(matrix[k::width], "big")
        state = int.from_bytes((state ^ column).to_bytes(count, "big").translate(_MUL), "big")
    return state.to_bytes(count, "big")


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
