"""RootSpace (seed 004): root-relative paths, line ranges, and hash-checked text ops.

Pure functions over bytes and strings; the tools in ``mcp_server/tools/rootspace.py`` do
the file I/O.  The choices where seed 004 is silent:

Paths (MCP-025..028).  Every path is POSIX and relative to the root, whether or not it
starts with ``/``.  ``//`` collapses, ``.`` disappears, ``..`` pops a segment; a ``..``
that would climb above the root rejects the whole path (it is never clamped).  ``\\`` is
rejected anywhere (it is a separator on Windows and almost never a real file name here),
as are drive forms (``C:``, ``C:\\x``, ``C:/x``) and NUL.  The root itself is ``""``.

Ranges (MCP-040..042).  ``[start, end]``: 1-indexed, ``end`` exclusive.  A negative index
counts from the end (``-1`` is the last line), so ``[-3, 0]`` is the last three lines and
``[1, -1]`` all but the last.  ``0`` leaves that side open: ``[0, 0]`` is the whole file.
An ``end`` past the file clamps to it (reading "the first 200 lines" of a shorter file
works) and so does a negative ``start`` past the top; a ``start`` past the end, or a
range that runs backwards, is an error that states the file's length.

Lines.  Content is split on LF only, as in ``mcp_server/core/hashline.py`` (one
splitter for both families): each line keeps its own ending, new lines take the file's
dominant one, and the final-newline state is preserved.  New text given to
``replace``/``insert``/``append`` is lines: one trailing newline is dropped and ``""``
means no lines at all (so ``text.replace`` with ``new=""`` deletes the matched lines).
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass

from mcp_server.core.hashline import TextDoc, content_lines, decode_text, file_hash, split_text
from sandbox.errors import CcwError

ENCODINGS = ("utf-8", "base64")
_DRIVE = re.compile(r"^[A-Za-z]:(?:$|[\\/])")


def normalize_path(path: str) -> str:
    """Root-relative, normalised form of an agent's path; ``""`` is the root itself."""
    if not isinstance(path, str) or "\x00" in path:
        raise CcwError("INVALID_ARGUMENT", "path must be a string without NUL bytes; give a path like '/src/main.py'.")
    try:
        path.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        # A lone surrogate from a JSON "\ud800" escape: no byte string, so no file, has it.
        raise CcwError(
            "INVALID_ARGUMENT", f"path {path[:200]!r} contains a lone UTF-16 surrogate; give the path as UTF-8 text.",
        ) from None
    if _DRIVE.match(path) or "\\" in path:
        raise CcwError(
            "INVALID_ARGUMENT",
            f"path {path!r} uses Windows syntax; paths are POSIX and relative to the root: "
            "use '/' as the separator and no drive letter, e.g. '/src/main.py'.",
            {"path": path},
        )
    parts: list[str] = []
    for segment in path.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if not parts:
                raise CcwError(
                    "PERMISSION_DENIED",
                    f"path {path!r} climbs above the root with '..'; give a path inside the "
                    "root, e.g. '/' for the root itself.",
                    {"path": path},
                )
            parts.pop()
            continue
        parts.append(segment)
    return "/".join(parts)


def display_path(rel: str) -> str:
    """The form shown back to agents: ``/`` + root-relative path."""
    return "/" + rel


def decode_content(content: str, encoding: str) -> bytes:
    """Bytes to store for ``content`` in ``encoding`` (MCP-030, MCP-031)."""
    if encoding == "utf-8":
        try:
            return content.encode("utf-8")
        except UnicodeEncodeError:
            raise CcwError(
                "INVALID_ARGUMENT",
                "content holds a lone surrogate, which is not UTF-8 text; send valid Unicode text, "
                "or the bytes with encoding='base64'.",
            ) from None
    if encoding == "base64":
        try:
            return base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError):
            raise CcwError(
                "INVALID_ARGUMENT",
                "content is not valid base64; encode the bytes with standard base64 (A-Z a-z 0-9 + /, "
                "'=' padding) or send text with encoding='utf-8'.",
            ) from None
    raise CcwError("INVALID_ARGUMENT", f"encoding {encoding!r} is not supported; use 'utf-8' or 'base64'.")


# --- ranges --------------------------------------------------------------------------


def resolve_range(lines: list[int] | None, total: int) -> tuple[int, int]:
    """``[start, end]`` (MCP-040..042) → 0-based half-open ``(lo, hi)`` over ``total`` lines."""
    if lines is None:
        return 0, total
    if len(lines) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in lines):
        raise CcwError(
            "INVALID_ARGUMENT",
            f"lines must be two integers [start, end]; got {lines!r}. "
            "Example: [1, 11] is lines 1-10, [-5, 0] the last five.",
        )
    start, end = lines
    # 1-indexed position p (1..total+1) for an index; 0 means open.
    lo = 1 if start == 0 else (start if start > 0 else max(total + 1 + start, 1))
    hi = total + 1 if end == 0 else (min(end, total + 1) if end > 0 else total + 1 + end)
    if lo > total + 1:
        raise CcwError(
            "INVALID_ARGUMENT",
            f"lines {lines!r}: start {start} is past the end of the file ({total} lines). "
            f"Use a start between 1 and {total + 1}, or a negative index from the end.",
            {"total_lines": total},
        )
    if hi < lo:
        raise CcwError(
            "INVALID_ARGUMENT",
            f"lines {lines!r} resolve to lines {lo}..{hi - 1} of {total}, which is backwards. "
            "Give [start, end] with end exclusive and after start, or 0 for 'to the end'.",
            {"total_lines": total},
        )
    return lo - 1, hi - 1


# --- text ops ------------------------------------------------------------------------


@dataclass
class TextState:
    """A file as read: its bytes, its hash, and its lines."""

    data: bytes
    hash: str
    doc: TextDoc

    @classmethod
    def parse(cls, data: bytes, path: str) -> TextState:
        """Decode (UTF-8 only) and split a file's bytes."""
        return cls(data, file_hash(data), split_text(decode_text(data, path)))

    @property
    def total_lines(self) -> int:
        """Number of lines (a final newline does not start another)."""
        return len(self.doc.lines)


def check_hash(expected: str, actual: str, path: str) -> None:
    """MCP-032..034: a mutation needs the hash of the current content."""
    if expected.strip().lower().removeprefix("sha256:") != actual:
        raise CcwError(
            "CONFLICT",
            f"{path} changed since you read it (hash {expected[:12]}… is stale; it is now "
            f"{actual[:12]}…); nothing was written. Call text_read on {path} again and retry "
            "with the new hash.",
            {"path": path, "reason": "stale_hash", "hash": actual},
        )


def read_range(state: TextState, lines: list[int] | None) -> str:
    """The exact text of a range, each line with its own ending."""
    lo, hi = resolve_range(lines, state.total_lines)
    doc = state.doc
    return "".join(doc.lines[i] + doc.endings[i] for i in range(lo, hi))


def _new_lines(text: str) -> list[str]:
    return [] if text == "" else content_lines(text)


def _rebuild(doc: TextDoc, lo: int, hi: int, new: list[str]) -> str:
    """Replace lines [lo, hi) with ``new``, keeping endings and the final-newline state."""
    lines = doc.lines[:lo] + new + doc.lines[hi:]
    endings = doc.endings[:lo] + [doc.eol] * len(new) + doc.endings[hi:]
    endings = [e or doc.eol for e in endings]
    if endings:
        endings[-1] = endings[-1] if (doc.final_newline or not doc.lines) else ""
    return "".join(line + end for line, end in zip(lines, endings, strict=True))


def replace(state: TextState, lines: list[int], old: str, new: str, path: str) -> str:
    """MCP-013/045: replace the unique run of whole lines equal to ``old`` within ``lines``."""
    lo, hi = resolve_range(lines, state.total_lines)
    old_lines = _new_lines(old)
    if not old_lines:
        raise CcwError(
            "INVALID_ARGUMENT",
            "old is empty; give the full content of the line(s) to replace. "
            "To add lines use text_insert or text_append.",
            {"path": path},
        )
    window = state.doc.lines[lo:hi]
    width = len(old_lines)
    hits = [lo + i for i in range(len(window) - width + 1) if window[i : i + width] == old_lines]
    if len(hits) != 1:
        shown = [f"{n}|{line}" for n, line in enumerate(state.doc.lines[lo : min(hi, lo + 40)], lo + 1)]
        if hits:
            where = ", ".join(str(h + 1) for h in hits[:10])
            message = (
                f"old matches {len(hits)} places in lines {lines!r} of {path} (starting at lines "
                f"{where}); nothing was written. Narrow lines to one of them and retry text_replace."
            )
        else:
            message = (
                f"old is not the full content of consecutive lines within lines {lines!r} of {path} "
                "(it must match whole lines exactly, including indentation); nothing was written. "
                "See details.current_lines, or call text_read, then retry text_replace."
            )
        raise CcwError(
            "INVALID_ARGUMENT",
            message,
            {"path": path, "lines": list(lines), "matches": [h + 1 for h in hits], "current_lines": shown},
        )
    start = hits[0]
    return _rebuild(state.doc, start, start + width, _new_lines(new))


def insert(state: TextState, line: int, anchor: str, content: str, path: str) -> str:
    """MCP-014/046: insert ``content`` as new lines before line ``line``, whose content is ``anchor``."""
    total = state.total_lines
    index = line - 1 if line > 0 else total + line
    if line == 0 or not 0 <= index < total:
        raise CcwError(
            "INVALID_ARGUMENT",
            f"line {line} is not a line of {path} ({total} lines); give 1..{total} or a negative "
            "index from the end. To add after the last line use text_append.",
            {"path": path, "total_lines": total},
        )
    anchor_text = anchor[:-1] if anchor.endswith("\n") else anchor
    anchor_text = anchor_text[:-1] if anchor_text.endswith("\r") else anchor_text
    actual = state.doc.lines[index]
    if actual != anchor_text:
        elsewhere = [n for n, text in enumerate(state.doc.lines, 1) if text == anchor_text]
        hint = f" That text is at line(s) {elsewhere[:10]}." if elsewhere else ""
        raise CcwError(
            "INVALID_ARGUMENT",
            f"anchor does not match line {index + 1} of {path}, which is {actual[:120]!r}; nothing "
            f"was written.{hint} Retry text_insert with the line number and its full content.",
            {"path": path, "line": index + 1, "actual": actual, "anchor_found_at": elsewhere[:10]},
        )
    new = _new_lines(content)
    if not new:
        raise CcwError("INVALID_ARGUMENT", "content is empty; give the line(s) to insert.", {"path": path})
    return _rebuild(state.doc, index, index, new)


def append(state: TextState, content: str) -> str:
    """MCP-015: ``content`` as new lines after the last line (final-newline state kept)."""
    new = _new_lines(content)
    if not state.doc.lines:
        # Nothing to preserve: write the content as given.
        return content
    total = state.total_lines
    return _rebuild(state.doc, total, total, new)
