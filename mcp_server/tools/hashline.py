"""The ``text`` family's hashline tools (seed 002): ``read_text_file`` and ``edit_text_file``.

Paths are host paths, as an agent using a filesystem server writes them: absolute, or
relative to the first root.  They must lie in a root the client declared (MCP roots,
refreshed on ``notifications/roots/list_changed``), or, when it declared none, in the
workspace ccw-mcp was started for (``CCW_WORKSPACE``).  With ``capsule_id`` the same
path names the file in that capsule's copy-on-write view of its workspace.

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

What the RootSpace tools (``mcp_server/tools/rootspace.py``) share with these (the open
file, its reads and checked writes) is ``mcp_server/tools/textfiles.py``.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from mcp_server.core import hashline
from mcp_server.core.roots import locate_lexical
from mcp_server.fs.roots import locate
from mcp_server.fs.view import RootView
from mcp_server.journal import Journal
from mcp_server.tools.registry import ToolContext, ToolSpec, text_with_header
from mcp_server.tools.targets import CAPSULE_ID, open_view
from mcp_server.tools.textfiles import (
    MAX_READ_CHARS,
    Target,
    file_identity,
    missing_means,
    read_file,
    with_view,
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


async def target(ctx: ToolContext, path: str, capsule_id: str | None) -> Target:
    """Find the root holding a host ``path`` (or the capsule's view) and open it."""
    if capsule_id:
        record = Journal(ctx.state).live_capsule(
            capsule_id,
            f"capsule {capsule_id} not found; call capsule_list for live capsules, or omit "
            "capsule_id to act on the workspace.",
        )
        located = locate_lexical(path, record.workspace)
        view = await open_view(ctx, capsule_id=capsule_id)
        return Target(view, located.rel, os.path.join(record.workspace, located.rel), capsule_id, ctx.state)
    located = locate(path, await ctx.roots(), ctx.workspace)
    return Target(RootView.open(located.root), located.rel, os.path.join(located.root, located.rel))


def _with_target(run: Callable[[Target, dict[str, Any]], dict[str, Any]]) -> Any:
    return with_view(target)(run)


def _read_text_file(found: Target, args: dict[str, Any]) -> dict[str, Any]:
    """Tagged lines ``n:hh|content``, the sha256 ``file_hash`` and ``total_lines``."""
    data = read_file(found.view, found.rel, found.shown, "list its directory to see what exists")
    text = hashline.decode_text(data, found.shown)
    doc = hashline.split_text(text)
    total = len(doc.lines)
    offset = int(args.get("offset", 1))
    limit = args.get("limit")
    if offset > max(total, 1):
        raise CcwError(
            "INVALID_ARGUMENT",
            f"offset {offset} is past the end of {found.shown} ({total} lines); use an offset "
            f"between 1 and {max(total, 1)}.",
            {"path": found.shown, "total_lines": total},
        )
    stop = total if limit is None else min(total, offset - 1 + int(limit))
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


def _edit_text_file(found: Target, args: dict[str, Any]) -> dict[str, Any]:
    """Apply hash-anchored ops atomically; returns the new file_hash and the fresh tags."""
    reread = "Call read_text_file again and retry with the new tags and file_hash."
    before = file_identity_or_missing(found)
    data = read_file(found.view, found.rel, found.shown, "edit_text_file edits existing files; create it first")
    known = _tag_cache.get(hashline.file_hash(data))
    result = hashline.edit(data, args["file_hash"], args["ops"], found.shown, known)
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
        "applied": len(args["ops"]),
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


read_text_file = _with_target(_read_text_file)
edit_text_file = _with_target(_edit_text_file)

_PATH = {
    "type": "string",
    "minLength": 1,
    "maxLength": 4096,
    "description": "File path: absolute inside a root, or relative to the first root.",
}
_FILE_HASH = {
    "type": "string",
    "pattern": "^(sha256:)?[0-9a-fA-F]{64}$",
    "description": "sha256 hex of the file as read (from read_text_file).",
}
_OP_OBJECT = {
    "type": "object",
    "properties": {
        "op": {"type": "string", "enum": list(hashline.OPS)},
        "anchor": {
            "type": "string",
            "maxLength": 256,
            "description": "LINE:HASH from read_text_file (e.g. '12:af'); a range is '12:af..15:0c'; "
            "insert_after '0' inserts at the top.",
        },
        "content": {"type": "string", "description": "New line(s), separated by \\n (replace/insert ops)."},
    },
    "required": ["op", "anchor"],
    "additionalProperties": False,
}
_OP_TEXT = {
    "type": "string",
    "maxLength": 1_000_000,
    "description": "Seed 002 text form, e.g. \"replace 2:f1 with 'x'\" or 'delete_range 1:a3..3:0e'.",
}

READ_INPUT: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "path": _PATH,
        "offset": {"type": "integer", "minimum": 1, "description": "First line to show (1-indexed)."},
        "limit": {"type": "integer", "minimum": 1, "description": "Most lines to show."},
        "capsule_id": CAPSULE_ID,
    },
    "required": ["path"],
    "additionalProperties": False,
}
READ_OUTPUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "content": {"type": "string", "description": "Lines as '{n}:{hh}|{content}', joined by \\n."},
        "file_hash": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
        "total_lines": {"type": "integer", "minimum": 0},
        "start_line": {"type": "integer", "minimum": 0},
        "end_line": {"type": "integer", "minimum": 0},
        "next_offset": {"type": "integer", "minimum": 1},
    },
    "required": ["path", "content", "file_hash", "total_lines", "start_line", "end_line"],
    "additionalProperties": False,
}
EDIT_INPUT: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "path": _PATH,
        "file_hash": _FILE_HASH,
        "ops": {"type": "array", "minItems": 1, "maxItems": 1000, "items": {"anyOf": [_OP_OBJECT, _OP_TEXT]}},
        "capsule_id": CAPSULE_ID,
    },
    "required": ["path", "file_hash", "ops"],
    "additionalProperties": False,
}
EDIT_OUTPUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "file_hash": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
        "total_lines": {"type": "integer", "minimum": 0},
        "applied": {"type": "integer", "minimum": 1},
        "moved": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"op_index": {"type": "integer"}, "from": {"type": "integer"}, "to": {"type": "integer"}},
                "required": ["op_index", "from", "to"],
                "additionalProperties": False,
            },
        },
        "context": {
            "type": "array",
            "items": {"type": "string"},
            "description": "Fresh '{n}:{hh}|{content}' of the edited lines and one line either side.",
        },
    },
    "required": ["path", "file_hash", "total_lines", "applied", "moved", "context"],
    "additionalProperties": False,
}

TOOLS = [
    ToolSpec(
        name="read_text_file",
        family="text",
        title="Read a text file with line tags",
        description=(
            "Read a UTF-8 text file as lines tagged '{n}:{hh}|{line}', with file_hash and total_lines; "
            "the tags are edit_text_file's anchors. offset/limit page through large files."
        ),
        input_schema=READ_INPUT,
        output_schema=READ_OUTPUT,
        handler=read_text_file,
        scope="read",
        read_only=True,
        idempotent=True,
        text=text_with_header("content"),
    ),
    ToolSpec(
        name="edit_text_file",
        family="text",
        title="Edit a text file by line tags",
        description=(
            "Edit a text file by 'LINE:HASH' anchors from read_text_file. The ops apply together to "
            "the file as read (file_hash); a stale hash or anchor rejects the whole edit and returns "
            "the current tags."
        ),
        input_schema=EDIT_INPUT,
        output_schema=EDIT_OUTPUT,
        handler=edit_text_file,
        scope="write",
        destructive=True,
    ),
]
