"""Hashline (seed 002): lines tagged with a short content hash, and edits anchored on them.

A read shows every line as ``{n}:{hh}|{content}``: ``n`` is 1-indexed, ``hh`` is the low
byte of FNV-1a (32-bit) over the line's UTF-8 bytes with trailing whitespace removed,
as two lowercase hex digits.  An edit names lines by those tags (``2:f1``) instead of
reproducing their text, and is resolved exactly as seed 002 says:

1. ``file_hash`` (sha256 hex of the file's bytes) must match the current file, else the
   whole edit is stale and rejected; the error carries the fresh ``file_hash`` and the
   current tags around every anchor, so the agent can retry without a full re-read.
2. Each anchor ``n:hh`` must match exactly: line ``n`` still has tag ``hh``.
3. Otherwise, if exactly one other line has tag ``hh``, the anchor counts as moved there
   (the agent miscounted; the content it meant is unambiguous).
4. No line, or several, with that tag: the whole edit is rejected, nothing is written, and
   the error carries the current tags of the lines around the anchor.

All ops of one call resolve against the same original text and apply together; ops that
touch a common line, or insert at the same place, are rejected as overlapping.  Line
endings are kept per line (so LF, CRLF and even mixed files survive); new lines take the
file's dominant ending; the file's final-newline state is preserved.  An empty file has no
state to preserve: text written into it gets LF and a final newline.

Ops are JSON objects ``{"op", "anchor", "content"?}`` where ``anchor`` is ``n:hh`` or a
range ``n:hh..m:hh`` (inclusive), or seed 002's text form (``replace 2:f1 with '...'``,
``delete_range 1:a3..3:0e``), parsed with shell quoting.  ``insert_after`` also accepts
the anchor ``0`` (``0:``) meaning "before the first line", the only way to write into an
empty file.  ``content`` is split on ``\\n``; one trailing newline is dropped, so
``"x"`` and ``"x\\n"`` are both the single line ``x`` and ``""`` is one empty line.

The tags themselves are computed in ``mcp_server/core/linetags.py``.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mcp_server.core.linetags import LazyTags, fnv1a32, line_tag, tags
from sandbox.errors import CcwError

__all__ = ["OPS", "EditResult", "TextDoc", "edit", "file_hash", "fnv1a32", "line_tag", "split_text", "tags"]

OPS = ("replace", "replace_range", "insert_after", "insert_before", "delete", "delete_range")
CONTEXT_LINES = 3  # lines either side of an anchor shown in an error
MAX_CONTEXT_CHARS = 200  # a line's content in an error is cut to this many characters


def file_hash(data: bytes) -> str:
    """sha256 hex of a file's bytes (seed 002's ``file_hash``, seed 004's ``hash``)."""
    return hashlib.sha256(data).hexdigest()


@dataclass
class TextDoc:
    """A text file as lines (without terminators), each line's own ending, and the default."""

    lines: list[str]
    endings: list[str]  # "\n", "\r\n", or "" (only the last line, with no final newline)
    eol: str = "\n"  # ending given to new lines: the file's dominant one

    @property
    def final_newline(self) -> bool:
        """Whether the file ends with a line terminator (False for an empty file)."""
        return bool(self.endings) and self.endings[-1] != ""

    def render(self) -> str:
        """The text again, byte for byte what ``split_text`` was given if nothing changed."""
        if not self.lines:
            return ""
        last = self.endings[-1]
        same = self.endings.count(self.eol)
        if same == len(self.endings) or (same == len(self.endings) - 1 and last == ""):
            return self.eol.join(self.lines) + last  # every ending is the same one
        return "".join(line + end for line, end in zip(self.lines, self.endings, strict=True))


def split_text(text: str) -> TextDoc:
    """Split on LF only (never on other Unicode line breaks); a CR before LF is the ending."""
    if text == "":
        return TextDoc([], [])
    final = text.endswith("\n")
    body = text[:-1] if final else text
    if "\r" not in text:  # the common case, without a per-line loop
        lines = body.split("\n")
        endings = ["\n"] * len(lines)
        if not final:
            endings[-1] = ""
        return TextDoc(lines, endings, "\n")
    if final and body.endswith("\r") and text.count("\r") == text.count("\r\n") == text.count("\n"):
        lines = body[:-1].split("\r\n")  # uniformly CRLF
        return TextDoc(lines, ["\r\n"] * len(lines), "\r\n")
    pieces = body.split("\n")
    lines = []
    endings = []
    crlf = 0
    for piece in pieces:
        if piece.endswith("\r"):
            lines.append(piece[:-1])
            endings.append("\r\n")
            crlf += 1
        else:
            lines.append(piece)
            endings.append("\n")
    if not final:
        # The last piece had no LF after it; a trailing CR there is content, not an ending.
        if endings[-1] == "\r\n":
            lines[-1] += "\r"
            crlf -= 1
        endings[-1] = ""
    eol = "\r\n" if crlf * 2 > len(lines) else "\n"
    return TextDoc(lines, endings, eol)


def decode_text(data: bytes, path: str) -> str:
    """UTF-8 text of a file, or an instructional error when it is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CcwError(
            "INVALID_ARGUMENT",
            f"{path!r} is not UTF-8 text (invalid byte at offset {exc.start}); it cannot be "
            "shown as tagged lines. Read it as bytes instead, e.g. text_read with "
            "encoding='base64', and replace it whole with file_remove + file_create.",
            {"path": path, "offset": exc.start},
        ) from None


def tagged(doc: TextDoc, tag_list: Sequence[str], start: int = 1, stop: int | None = None) -> list[str]:
    """``n:hh|content`` for lines ``start``..``stop`` (1-indexed, inclusive)."""
    stop = len(doc.lines) if stop is None else min(stop, len(doc.lines))
    return [f"{n}:{tag_list[n - 1]}|{doc.lines[n - 1]}" for n in range(max(start, 1), stop + 1)]


# --- ops -----------------------------------------------------------------------------

_ANCHOR = re.compile(r"^\s*(\d+):([0-9A-Fa-f]{2})(?:\|.*)?\s*$", re.DOTALL)
_TOP = re.compile(r"^\s*0:?\s*$")


@dataclass(frozen=True)
class Anchor:
    """``line:hash`` as the agent wrote it."""

    line: int
    tag: str

    def __str__(self) -> str:
        return f"{self.line}:{self.tag}"


@dataclass(frozen=True)
class Op:
    """One parsed edit op; ``end`` is set for ranges, ``anchor`` is None for the top of file."""

    kind: str
    anchor: Anchor | None
    end: Anchor | None = None
    content: list[str] | None = None
    index: int = 0  # position in the call, for error messages


def parse_anchor(text: str, index: int) -> Anchor:
    """``"12:af"`` (tolerating a pasted ``|content`` tail) → Anchor."""
    match = _ANCHOR.match(text)
    if not match or int(match.group(1)) < 1:
        raise CcwError(
            "INVALID_ARGUMENT",
            f"op {index}: anchor {text[:40]!r} is not LINE:HASH; copy it from read_text_file "
            "output, e.g. '12:af' (a range is '12:af..15:0c').",
            {"op_index": index, "anchor": text[:200]},
        )
    return Anchor(int(match.group(1)), match.group(2).lower())


def content_lines(content: str) -> list[str]:
    """New content as lines: split on LF (CRLF accepted), one trailing newline dropped."""
    try:
        content.encode("utf-8")
    except UnicodeEncodeError as exc:
        # JSON can carry "\ud800" or a surrogate-escaped byte; neither is text we can write.
        raise CcwError(
            "INVALID_ARGUMENT",
            f"content holds {content[exc.start]!r} at {exc.start}, a surrogate that is not UTF-8 text; "
            "send valid Unicode text (write raw bytes with file_create encoding='base64').",
        ) from None
    if content.endswith("\n"):
        content = content[:-1]
    return [line[:-1] if line.endswith("\r") else line for line in content.split("\n")]


def parse_op(raw: dict[str, Any] | str, index: int) -> Op:
    """Parse one op, given as a JSON object or in seed 002's text form."""
    if isinstance(raw, str):
        raw = _parse_text_op(raw, index)
    kind = raw.get("op")
    if kind not in OPS:
        raise CcwError(
            "INVALID_ARGUMENT",
            f"op {index}: unknown op {kind!r}; use one of {', '.join(OPS)}.",
            {"op_index": index},
        )
    anchor_text = raw.get("anchor")
    if not isinstance(anchor_text, str):
        raise CcwError("INVALID_ARGUMENT", f"op {index} ({kind}): give 'anchor' as LINE:HASH.", {"op_index": index})
    content = raw.get("content")
    needs_content = kind in ("replace", "replace_range", "insert_after", "insert_before")
    if needs_content and not isinstance(content, str):
        raise CcwError(
            "INVALID_ARGUMENT",
            f"op {index} ({kind}): give the new lines as 'content' (a string; lines separated by \\n).",
            {"op_index": index},
        )
    if not needs_content and content is not None:
        raise CcwError(
            "INVALID_ARGUMENT",
            f"op {index} ({kind}): a delete takes no 'content'; use replace to change lines.",
            {"op_index": index},
        )
    lines = content_lines(content) if isinstance(content, str) else None
    if kind == "insert_after" and _TOP.match(anchor_text):
        return Op(kind, None, None, lines, index)
    start_text, sep, end_text = anchor_text.partition("..")
    start = parse_anchor(start_text, index)
    end = parse_anchor(end_text, index) if sep else None
    if kind in ("replace_range", "delete_range") and end is None:
        raise CcwError(
            "INVALID_ARGUMENT",
            f"op {index} ({kind}): the anchor must be a range FIRST..LAST, e.g. '3:1a..7:c0'.",
            {"op_index": index},
        )
    if kind in ("insert_after", "insert_before") and end is not None:
        raise CcwError(
            "INVALID_ARGUMENT",
            f"op {index} ({kind}): insert at one line, not a range; give a single LINE:HASH.",
            {"op_index": index},
        )
    return Op(kind, start, end, lines, index)


def _parse_text_op(text: str, index: int) -> dict[str, Any]:
    """``replace 2:f1 with 'x'``, ``insert_after 2:f1 'x'``, ``delete 1:a3..3:0e``."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise CcwError(
            "INVALID_ARGUMENT",
            f"op {index}: cannot parse {text[:60]!r} ({exc}); quote content with '...' or send "
            'the op as an object {"op", "anchor", "content"}.',
            {"op_index": index},
        ) from None
    if len(words) >= 3 and words[2] == "with":
        del words[2]
    if len(words) < 2 or len(words) > 3:
        raise CcwError(
            "INVALID_ARGUMENT",
            f"op {index}: {text[:60]!r} is not 'OP ANCHOR [CONTENT]', e.g. \"replace 2:f1 with 'x'\".",
            {"op_index": index},
        )
    op: dict[str, Any] = {"op": words[0], "anchor": words[1]}
    if len(words) == 3:
        op["content"] = words[2]
    return op


@dataclass
class Change:
    """A resolved op on the original: replace lines [first, last] (1-indexed) or insert at a gap."""

    op: Op
    first: int = 0  # replaced lines first..last; unused for inserts
    last: int = 0
    gap: int = -1  # insert before original line gap+1 (0 = top), -1 for non-inserts
    moved: list[dict[str, int]] = field(default_factory=list)


@dataclass
class EditResult:
    """The new text and what happened."""

    text: str
    doc: TextDoc
    moved: list[dict[str, Any]]
    regions: list[tuple[int, int]]  # where the changes landed: 0-based half-open line spans
    tags: list[str] | None = None  # every tag of the new text, when the old tags were known


def _context(doc: TextDoc, tag_list: Sequence[str], line: int) -> list[str]:
    rows = tagged(doc, tag_list, line - CONTEXT_LINES, line + CONTEXT_LINES)
    return [row if len(row) <= MAX_CONTEXT_CHARS else row[:MAX_CONTEXT_CHARS] + "…" for row in rows]


def anchor_context(doc: TextDoc, tag_list: Sequence[str], anchors: Sequence[Anchor]) -> dict[str, Any]:
    """For each anchor: current tags around its line, and the lines now carrying its hash."""
    out: dict[str, Any] = {}
    for anchor in anchors:
        holders = [n for n, t in enumerate(tag_list, 1) if t == anchor.tag]
        out[str(anchor)] = {
            "around": _context(doc, tag_list, anchor.line),
            "lines_with_hash": holders[:10],
        }
    return out


def _resolve(anchor: Anchor, doc: TextDoc, tag_list: Sequence[str], op: Op) -> tuple[int, dict[str, int] | None]:
    n = anchor.line
    if n <= len(tag_list) and tag_list[n - 1] == anchor.tag:
        return n, None
    holders = [i for i, t in enumerate(tag_list, 1) if t == anchor.tag]
    if len(holders) == 1:
        return holders[0], {"op_index": op.index, "from": n, "to": holders[0]}
    problem = "no line has" if not holders else f"{len(holders)} lines have"
    raise CcwError(
        "CONFLICT",
        f"op {op.index} ({op.kind}): anchor {anchor} does not match line {n}, and {problem} hash "
        f"{anchor.tag!r}; nothing was written. Use the current tags in details.context "
        "(or read_text_file again) and retry edit_text_file with corrected anchors.",
        {
            "op_index": op.index,
            "anchor": str(anchor),
            "reason": "anchor_not_found" if not holders else "anchor_ambiguous",
            "total_lines": len(doc.lines),
            "context": anchor_context(doc, tag_list, [anchor]),
        },
    )


def resolve_ops(ops: Sequence[Op], doc: TextDoc, tag_list: Sequence[str]) -> list[Change]:
    """Resolve every anchor against the original and reject overlapping ops."""
    changes: list[Change] = []
    for op in ops:
        change = Change(op)
        if op.anchor is None:  # insert_after 0: the top of the file
            change.gap = 0
            changes.append(change)
            continue
        first, moved = _resolve(op.anchor, doc, tag_list, op)
        if moved:
            change.moved.append(moved)
        last = first
        if op.end is not None:
            last, moved = _resolve(op.end, doc, tag_list, op)
            if moved:
                change.moved.append(moved)
            if last < first:
                raise CcwError(
                    "INVALID_ARGUMENT",
                    f"op {op.index} ({op.kind}): range {op.anchor}..{op.end} resolves to lines "
                    f"{first}..{last}, which run backwards; give FIRST..LAST in file order.",
                    {"op_index": op.index, "context": anchor_context(doc, tag_list, [op.anchor, op.end])},
                )
        if op.kind == "insert_after":
            change.gap = first
        elif op.kind == "insert_before":
            change.gap = first - 1
        else:
            change.first, change.last = first, last
        change.first = change.first or first  # inserts remember their anchor line too
        change.last = change.last or first
        changes.append(change)
    _reject_overlaps(changes)
    return changes


def _reject_overlaps(changes: Sequence[Change]) -> None:
    spans = sorted((c for c in changes if c.gap < 0), key=lambda c: c.first)
    for a, b in itertools.pairwise(spans):
        if b.first <= a.last:
            _overlap(a, b, f"lines {a.first}..{a.last} and {b.first}..{b.last} overlap")
    gaps: dict[int, Change] = {}
    for c in changes:
        if c.gap < 0:
            continue
        if c.gap in gaps:
            _overlap(gaps[c.gap], c, f"both insert at the same place (after line {c.gap})")
        gaps[c.gap] = c
        for s in spans:
            if c.op.anchor is not None and s.first <= c.first <= s.last:
                _overlap(s, c, f"the insert's anchor line {c.first} is changed by the other op")


def _overlap(a: Change, b: Change, why: str) -> None:
    raise CcwError(
        "INVALID_ARGUMENT",
        f"ops {a.op.index} ({a.op.kind}) and {b.op.index} ({b.op.kind}) overlap: {why}; nothing "
        "was written. Merge them into one op (e.g. a single replace_range whose content "
        "includes the inserted lines) and retry.",
        {"op_indices": [a.op.index, b.op.index]},
    )


def apply_changes(
    doc: TextDoc, changes: Sequence[Change], old_tags: list[str] | None = None
) -> tuple[TextDoc, list[tuple[int, int]], list[str] | None]:
    """Build the new document from resolved, non-overlapping changes.

    Also returns where each change landed in the new document (0-based half-open line
    spans, empty for a delete, in file order) and, when the old document's tags are given,
    the new document's tags: the old ones for kept lines, fresh ones for new lines.
    """
    # (position in the original, order at that position, lines to put, original lines to skip)
    edits: list[tuple[int, int, list[str], int]] = []
    for c in changes:
        if c.gap >= 0:
            edits.append((c.gap, 0, c.op.content or [], 0))
        else:
            new = (c.op.content or []) if c.op.kind in ("replace", "replace_range") else []
            edits.append((c.first - 1, 1, new, c.last - c.first + 1))
    edits.sort(key=lambda e: (e[0], e[1]))
    eol = doc.eol
    old_endings = doc.endings
    if old_endings and old_endings[-1] == "":
        old_endings = [*old_endings[:-1], eol]  # the last line may stop being last
    lines: list[str] = []
    endings: list[str] = []
    regions: list[tuple[int, int]] = []
    new_tags: list[str] | None = [] if old_tags is not None else None
    pos = 0
    for at, _, new, skip in edits:
        lines += doc.lines[pos:at]
        endings += old_endings[pos:at]
        regions.append((len(lines), len(lines) + len(new)))
        lines += new
        endings += [eol] * len(new)
        if new_tags is not None and old_tags is not None:
            new_tags += old_tags[pos:at]
            new_tags += tags(new)
        pos = at + skip
    lines += doc.lines[pos:]
    endings += old_endings[pos:]
    if new_tags is not None and old_tags is not None:
        new_tags += old_tags[pos:]
    if endings:
        # Keep the file's final-newline state; an empty file gets one (nothing to keep).
        endings[-1] = endings[-1] if (doc.final_newline or not doc.lines) else ""
    return TextDoc(lines, endings, eol), regions, new_tags


def check_file_hash(expected: str, data: bytes, doc: TextDoc, tag_list: Sequence[str], ops: Sequence[Op],
                    path: str) -> None:
    """Step 1 of resolution: reject a stale read, handing back the current tags."""
    current = file_hash(data)
    wanted = expected.strip().lower().removeprefix("sha256:")
    if wanted == current:
        return
    anchors = [a for op in ops for a in (op.anchor, op.end) if a is not None]
    raise CcwError(
        "CONFLICT",
        f"{path!r} changed since it was read (file_hash {wanted[:12]}… is stale, the file is now "
        f"{current[:12]}…); nothing was written. Check the current tags in details.context, "
        "then retry edit_text_file with details.file_hash and corrected anchors, or "
        "read_text_file again.",
        {
            "path": path,
            "reason": "stale_file_hash",
            "file_hash": current,
            "total_lines": len(doc.lines),
            "context": anchor_context(doc, tag_list, anchors),
        },
    )


def edit(
    data: bytes,
    expected_hash: str,
    raw_ops: Sequence[dict[str, Any] | str],
    path: str,
    known_tags: list[str] | None = None,
) -> EditResult:
    """Apply a hashline edit to a file's bytes; every check happens before any change.

    ``known_tags``: the tags of ``data``'s lines if the caller has them (a cache keyed by
    the file's hash); then the result carries the new text's tags too, at little cost.
    """
    if not raw_ops:
        raise CcwError("INVALID_ARGUMENT", "ops is empty; give at least one op.", {"path": path})
    ops = [parse_op(raw, i) for i, raw in enumerate(raw_ops)]
    doc = split_text(decode_text(data, path))
    tag_list = LazyTags(doc.lines, known_tags)
    check_file_hash(expected_hash, data, doc, tag_list, ops, path)
    changes = resolve_ops(ops, doc, tag_list)
    new_doc, regions, new_tags = apply_changes(doc, changes, tag_list.complete)
    moved = [m for c in changes for m in c.moved]
    return EditResult(new_doc.render(), new_doc, moved, regions, new_tags)


def context_after(result: EditResult, around: int = 1, limit: int = 200) -> list[str]:
    """Fresh ``n:hh|content`` of the edited regions (and ``around`` lines either side)."""
    doc = result.doc
    wanted: set[int] = set()
    for lo, hi in result.regions:
        wanted.update(range(max(lo - around, 0), min(hi + around, len(doc.lines))))
    picked = sorted(wanted)[:limit]
    picked_tags = tags([doc.lines[i] for i in picked])
    return [f"{i + 1}:{t}|{doc.lines[i]}" for i, t in zip(picked, picked_tags, strict=True)]
