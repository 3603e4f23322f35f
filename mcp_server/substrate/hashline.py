"""Tagged reads and hash-anchored edits of a text file (seed 002; the ``text`` family's
``read_text_file`` and ``edit_text_file``).

An edit reads the file, checks ``file_hash`` and every anchor against that one read,
and replaces the file atomically (temp file + rename, beneath the root's descriptor).
A writer that changes the file between our read and our rename is detected by a second
``stat`` just before the rename (inode, size, mtime, ctime): the edit is then rejected
rather than clobbering the other write.  The window left is the few microseconds
between that ``stat`` and the rename.

Tags are a pure function of the file's bytes, so whole-file tag lists are kept for the
last few files, keyed by ``file_hash``: re-reading an unchanged file skips tagging, and an
edit of a file whose tags are kept splices the new tags in (kept lines keep theirs), so
the agent's usual read → edit → re-read tags each line once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from mcp_server.core import hashline
from mcp_server.substrate.textfiles import (
    MAX_READ_CHARS,
    Target,
    file_identity,
    missing_means,
    read_file,
    write_checked,
)
from sandbox.errors import CcwError

TAG_CACHE_FILES = 32  # whole-file tag lists kept, keyed by file_hash (most recent first out last)

# Agents re-read what they just read; the tags of an unchanged file are a pure function of
# its bytes, so whole-file tag lists are kept by sha256.  A tag list is small (the two-hex
# strings are shared objects), so 32 of them cost little even for large files.
_tag_cache: OrderedDict[str, list[str]] = OrderedDict()


def file_tags(digest: str, lines: list[str]) -> list[str]:
    """Tags of every line of the file whose sha256 is ``digest`` (cached by digest)."""
    cached = _tag_cache.get(digest)
    if cached is not None and len(cached) == len(lines):
        _tag_cache.move_to_end(digest)
        return cached
    computed = hashline.tags(lines)
    remember_tags(digest, computed)
    return computed


def remember_tags(digest: str, tag_list: list[str]) -> None:
    """Keep a file's tag list under its sha256, dropping the least recently used."""
    _tag_cache[digest] = tag_list
    _tag_cache.move_to_end(digest)
    while len(_tag_cache) > TAG_CACHE_FILES:
        _tag_cache.popitem(last=False)


# A read's rows are joined from shared pieces, "\n{n}:", "{hh}|" and the line itself, so no
# string is made per line: formatting 10,000 rows one by one cost more than reading,
# hashing and splitting the file together.  The "\n{n}:" pieces are made once per line
# number, up to ROW_PREFIX_LINES (about 4 MB at most); rows past it make their own.
ROW_PREFIX_LINES = 1 << 16
_row_prefixes: list[str] = ["\n0:"]
_row_prefixes_lock = threading.Lock()  # handlers run in worker threads
_TAG_BARS = {f"{x:02x}": f"{x:02x}|" for x in range(256)}


def render_rows(lines: list[str], tag_list: list[str], first: int) -> str:
    """Lines numbered from ``first`` as ``n:hh|content`` rows, joined by newlines."""
    count = len(lines)
    if count == 0:
        return ""
    stop = first + count
    if len(_row_prefixes) < min(stop, ROW_PREFIX_LINES):
        with _row_prefixes_lock:
            known = len(_row_prefixes)
            _row_prefixes.extend([f"\n{n}:" for n in range(known, max(known, min(stop, ROW_PREFIX_LINES)))])
    prefixes = _row_prefixes[first:stop]
    if len(prefixes) < count:
        prefixes += [f"\n{n}:" for n in range(first + len(prefixes), stop)]
    prefixes[0] = f"{first}:"  # no newline before the first row
    parts = [""] * (3 * count)
    parts[0::3] = prefixes
    parts[1::3] = map(_TAG_BARS.__getitem__, tag_list)
    parts[2::3] = lines
    return "".join(parts)


def read_text(found: Target, offset: int = 1, limit: int | None = None) -> dict[str, Any]:
    """Tagged lines ``n:hh|content`` from line ``offset`` (at most ``limit``), the sha256
    ``file_hash`` and ``total_lines``; ``next_offset`` when the answer stops short."""
    data = read_file(found.view, found.rel, found.shown, "list its directory to see what exists")
    text = hashline.decode_text(data, found.shown)
    doc = hashline.split_text(text)
    total = len(doc.lines)
    if offset > max(total, 1):
        raise CcwError(
            "INVALID_ARGUMENT",
            f"offset {offset} is past the end of {found.shown} ({total} lines); use an offset "
            f"between 1 and {max(total, 1)}.",
            {"path": found.shown, "total_lines": total},
        )
    stop = total if limit is None else min(total, offset - 1 + limit)
    lines = doc.lines[offset - 1 : stop]
    prefix_chars = (len(str(offset + len(lines))) + 5) * len(lines)  # at most, for "n:hh|" and "\n"
    # The whole text bounds the lines' length: count them only when that bound is too high.
    if len(text) + prefix_chars > MAX_READ_CHARS and sum(map(len, lines)) + prefix_chars > MAX_READ_CHARS:
        # Perhaps too much for one answer: stop at the line where the cap falls (at least
        # one line), counting each row exactly: "n:hh|" + content + "\n".
        size = 0
        for kept, line in enumerate(lines):
            size += len(line) + len(str(offset + kept)) + 5
            if size > MAX_READ_CHARS:
                lines = lines[: max(kept, 1)]
                break
    digest = hashline.file_hash(data)
    if len(lines) == total or digest in _tag_cache:
        tag_list = file_tags(digest, doc.lines)[offset - 1 : offset - 1 + len(lines)]
    else:  # a page of a file not seen whole: tag just the page
        tag_list = hashline.tags(lines)
    end_line = offset - 1 + len(lines)
    result: dict[str, Any] = {
        "path": found.shown,
        "content": render_rows(lines, tag_list, offset),
        "file_hash": digest,
        "total_lines": total,
        "start_line": offset if lines else 0,
        "end_line": end_line,
    }
    if end_line < total:
        result["next_offset"] = end_line + 1
    return result


def edit_text(found: Target, file_hash: str, ops: list[Any]) -> dict[str, Any]:
    """Apply hash-anchored ops (seed 002: objects or the text form) atomically to the file
    as read at ``file_hash``; returns the new file_hash and the fresh tags."""
    reread = "Call read_text_file again and retry with the new tags and file_hash."
    before = file_identity_or_missing(found)
    data = read_file(found.view, found.rel, found.shown, "edit_text_file edits existing files; create it first")
    known = _tag_cache.get(hashline.file_hash(data))
    result = hashline.edit(data, file_hash, ops, found.shown, known)
    new_data = result.text.encode("utf-8")
    new_digest = hashline.file_hash(new_data)
    if new_data != data:
        write_checked(found, before, new_data, reread)
    if result.tags is not None:
        remember_tags(new_digest, result.tags)  # the agent's next read of this file is cheap
    return {
        "path": found.shown,
        "file_hash": new_digest,
        "total_lines": len(result.doc.lines),
        "applied": len(ops),
        "moved": result.moved,
        "context": hashline.context_after(result),
    }


def file_identity_or_missing(found: Target) -> tuple[int, ...]:
    """``file_identity``, turning a missing file into an instructional NOT_FOUND."""
    with missing_means(
        found.shown,
        f"{found.shown} does not exist; edit_text_file edits existing files (create it "
        "with file_create, then read_text_file).",
    ):
        return file_identity(found.view, found.rel)
