"""Searching file contents for snapshot_grep: binary sniffing and match positions.

- A file is binary when a NUL byte occurs in its first 8000 bytes (git's test, the one
  ``git grep`` and ``git diff`` use); binary files are not grep candidates at all.
- Lines are split on ``\\n``; a match reports its 1-based line, its 1-based column
  counted in Unicode code points of the line (invalid UTF-8 bytes count one each), and
  the line's text without its line ending.  Matches come in (line, col) order; a line
  with several matches reports each.
- A literal search first asks ``bytes.find`` whether the pattern occurs at all, so a
  file without a match costs one scan at memchr speed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sandbox.errors import CcwError

BINARY_SNIFF = 8000
MAX_LINE_TEXT = 400


def is_binary(data: bytes) -> bool:
    """git's heuristic: a NUL in the first 8000 bytes."""
    return b"\0" in data[:BINARY_SNIFF]


@dataclass(frozen=True)
class Matcher:
    """A compiled search: a literal (fast path) or a regular expression, over bytes."""

    literal: bytes | None
    regex: re.Pattern[bytes] | None

    @classmethod
    def build(cls, pattern: str, *, regex: bool = False, ignore_case: bool = False) -> Matcher:
        """Compile ``pattern``; invalid regular expressions raise ``re.error``."""
        try:
            raw = pattern.encode("utf-8")
        except UnicodeEncodeError:
            # JSON's "\ud800" decodes to a lone surrogate, which no UTF-8 file can contain.
            raise CcwError(
                "INVALID_ARGUMENT", "pattern holds a lone surrogate, which is not UTF-8 text; search for valid text"
            ) from None
        if not regex and not ignore_case:
            return cls(raw, None)
        source = raw if regex else re.escape(raw)
        return cls(None, re.compile(source, re.IGNORECASE if ignore_case else 0))

    def offsets(self, data: bytes) -> list[tuple[int, int]]:
        """Byte (start, end) of every non-overlapping match."""
        if self.literal is not None:
            pat = self.literal
            if not pat:
                return []
            out = []
            at = data.find(pat)
            while at >= 0:
                out.append((at, at + len(pat)))
                at = data.find(pat, at + len(pat))
            return out
        assert self.regex is not None
        return [(m.start(), m.end()) for m in self.regex.finditer(data) if m.end() > m.start()]

    def search(self, data: bytes, limit: int) -> list[dict[str, object]]:
        """Up to ``limit`` matches as ``{line, col, text}`` in (line, col) order."""
        matches: list[dict[str, object]] = []
        line_no = 1
        scanned = 0
        for start, _end in self.offsets(data):
            if len(matches) >= limit:
                break
            line_no += data.count(b"\n", scanned, start)
            scanned = start
            line_start = data.rfind(b"\n", 0, start) + 1
            line_end = data.find(b"\n", start)
            if line_end < 0:
                line_end = len(data)
            line = data[line_start:line_end].rstrip(b"\r")
            col = len(data[line_start:start].decode("utf-8", "replace")) + 1
            text = line.decode("utf-8", "replace")
            if len(text) > MAX_LINE_TEXT:
                text = text[:MAX_LINE_TEXT]
            matches.append({"line": line_no, "col": col, "text": text})
        return matches
