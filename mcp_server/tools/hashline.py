"""The ``text`` family's hashline tools (seed 002): ``read_text_file`` and ``edit_text_file``.

Adapters over the substrate service (``mcp_server/substrate/hashline.py``, which tells how
an edit is checked and made, and keeps the tag cache): each handler finds the file,
calls the service in a worker thread, and answers what it returns.

Paths are host paths, as an agent using a filesystem server writes them: absolute, or
relative to the first root.  They must lie in a root the client declared (MCP roots,
refreshed on ``notifications/roots/list_changed``), or, when it declared none, in the
workspace ccw-mcp was started for (``CCW_WORKSPACE``).  With ``capsule_id`` the same
path names the file in that capsule's copy-on-write view of its workspace.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from mcp_server.capsules.notes import note_tool_changes
from mcp_server.core import hashline
from mcp_server.core.roots import locate_lexical
from mcp_server.fs.roots import locate
from mcp_server.fs.view import RootView
from mcp_server.journal import Journal
from mcp_server.substrate.hashline import edit_text, read_text
from mcp_server.substrate.textfiles import Target
from mcp_server.tools.registry import ToolContext, ToolSpec, text_with_header
from mcp_server.tools.targets import CAPSULE_ID, open_view
from mcp_server.tools.textfiles import with_view


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
        return Target(view, located.rel, os.path.join(record.workspace, located.rel), capsule_id, ctx.state,
                      note_tool_changes)
    located = locate(path, await ctx.roots(), ctx.workspace)
    return Target(RootView.open(located.root), located.rel, os.path.join(located.root, located.rel))


def _with_target(run: Callable[[Target, dict[str, Any]], dict[str, Any]]) -> Any:
    return with_view(target)(run)


def _read_text_file(found: Target, args: dict[str, Any]) -> dict[str, Any]:
    """Tagged lines ``n:hh|content``, the sha256 ``file_hash`` and ``total_lines``."""
    limit = args.get("limit")
    return read_text(found, int(args.get("offset", 1)), None if limit is None else int(limit))


def _edit_text_file(found: Target, args: dict[str, Any]) -> dict[str, Any]:
    """Apply hash-anchored ops atomically; returns the new file_hash and the fresh tags."""
    return edit_text(found, args["file_hash"], args["ops"])


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
