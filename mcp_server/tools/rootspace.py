"""RootSpace tools (seed 004): ``file_*`` (family ``file``), ``text_*`` (family ``text``), ``list://``.

Adapters over the substrate service (``mcp_server/substrate/rootspace.py``): each handler
opens the root, calls the service in a worker thread, and answers what it returns.

Every path is root-relative (MCP-025..028, ``mcp_server/core/rootspace.py``): ``/`` is
the root, which is, with ``capsule_id``, the capsule's copy-on-write view of its
workspace; otherwise the first root the client declared (MCP roots), or the workspace
ccw-mcp was started for (``CCW_WORKSPACE``) when it declares none.  Every mutation takes the ``hash`` (sha256 hex of
the stored bytes) of a prior read and returns the new one (MCP-031..034); a write that
races another writer is rejected as in ``mcp_server/substrate/hashline.py``.

Choices seed 004 leaves open: ``file.create`` refuses to overwrite (remove first, with
the hash), even a file that appears between its check and its write (the name is given
with ``link``), and creates missing parent directories; ``file.remove`` removes files and
symlinks, not directories; ``text.read`` takes an optional ``encoding`` so that a file
that is not UTF-8 can be read as base64, which is what its error suggests.
``list://{+path}`` returns ``{"path", "entries": [{"name", "kind"}]}`` with every
entry (dotfiles included) sorted by the bytes of the name.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from mcp_server.capsules.notes import note_tool_changes
from mcp_server.core import rootspace
from mcp_server.fs.roots import effective_roots
from mcp_server.fs.view import RootView
from mcp_server.substrate import rootspace as service
from mcp_server.substrate.textfiles import Target
from mcp_server.tools.registry import ResourceSpec, ToolContext, ToolSpec, text_with_header
from mcp_server.tools.targets import CAPSULE_ID, open_view
from mcp_server.tools.textfiles import with_view


async def rooted(ctx: ToolContext, path: str, capsule_id: str | None) -> Target:
    """Normalise a root-relative path and open the root it is relative to."""
    rel = rootspace.normalize_path(path)
    if capsule_id:
        view = await open_view(ctx, capsule_id=capsule_id)
    else:
        view = RootView.open(effective_roots(await ctx.roots(), ctx.workspace)[0])
    return Target(view, rel, rootspace.display_path(rel), capsule_id, ctx.state, note_tool_changes)


def _with_root(run: Callable[[Target, dict[str, Any]], dict[str, Any]]) -> Any:
    return with_view(rooted)(run)


def _file_create(found: Target, args: dict[str, Any]) -> dict[str, Any]:
    """MCP-010: create a new file; returns its hash."""
    return service.file_create(found, rootspace.decode_content(args["content"], args.get("encoding", "utf-8")))


def _file_remove(found: Target, args: dict[str, Any]) -> dict[str, Any]:
    """MCP-011: remove a file whose current hash is ``hash``."""
    return service.file_remove(found, args["hash"])


def _text_read(found: Target, args: dict[str, Any]) -> dict[str, Any]:
    """MCP-012: content (all, or ``lines``), the whole file's hash, and total_lines."""
    return service.text_read(found, args.get("lines"), args.get("encoding", "utf-8"))


def _text_replace(found: Target, args: dict[str, Any]) -> dict[str, Any]:
    """MCP-013: replace whole lines equal to ``old`` within ``lines`` by ``new``."""
    return service.text_replace(found, args["hash"], args["lines"], args["old"], args["new"])


def _text_insert(found: Target, args: dict[str, Any]) -> dict[str, Any]:
    """MCP-014: insert ``content`` before line ``line``, whose full content is ``anchor``."""
    return service.text_insert(found, args["hash"], args["line"], args["anchor"], args["content"])


def _text_append(found: Target, args: dict[str, Any]) -> dict[str, Any]:
    """MCP-015: append ``content`` as new lines at the end."""
    return service.text_append(found, args["hash"], args["content"])


async def list_resource(ctx: ToolContext, uri: str) -> tuple[str, str]:
    """MCP-020/021: ``list://{+path}`` → the immediate children of a directory."""
    raw = unquote(uri.removeprefix("list://"))
    found = await rooted(ctx, raw or "/", None)
    try:
        body = service.list_entries(found)
    finally:
        found.view.close()
    return "application/json", json.dumps(body, ensure_ascii=False, separators=(",", ":"))


file_create = _with_root(_file_create)
file_remove = _with_root(_file_remove)
text_read = _with_root(_text_read)
text_replace = _with_root(_text_replace)
text_insert = _with_root(_text_insert)
text_append = _with_root(_text_append)

_SCHEMA = "https://json-schema.org/draft/2020-12/schema"
_PATH = {
    "type": "string",
    "minLength": 1,
    "maxLength": 4096,
    "description": "POSIX path inside the root; a leading '/' is the root, not the host's '/'.",
}
_HASH = {"type": "string", "pattern": "^(sha256:)?[0-9a-fA-F]{64}$",
         "description": "sha256 hex from the last read (text_read)."}
_ENCODING = {"type": "string", "enum": list(rootspace.ENCODINGS), "default": "utf-8"}
_LINES = {
    "type": "array",
    "items": {"type": "integer"},
    "minItems": 2,
    "maxItems": 2,
    "description": "[start, end]: 1-indexed, end exclusive; negative counts from the end; 0 is open-ended.",
}
_TEXT = {"type": "string", "maxLength": 64 * 1024 * 1024}


def _input(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "$schema": _SCHEMA,
        "type": "object",
        "properties": {"path": _PATH, **properties, "capsule_id": CAPSULE_ID},
        "required": ["path", *required],
        "additionalProperties": False,
    }


def _output(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"path": {"type": "string"}, **properties},
        "required": ["path", *properties],
        "additionalProperties": False,
    }


_HEX = {"type": "string", "pattern": "^[0-9a-f]{64}$"}
_COUNT = {"type": "integer", "minimum": 0}
_MUTATION_OUT = _output({"hash": _HEX, "total_lines": _COUNT})

TOOLS = [
    ToolSpec(
        name="file_create",
        family="file",
        title="Create a file",
        description=("Create a new file (parents made as needed) with content in utf-8 or base64; returns its hash. "
                     "Refuses to overwrite."),
        input_schema=_input({"content": _TEXT, "encoding": _ENCODING}, ["content"]),
        output_schema=_output({"hash": _HEX, "size": _COUNT}),
        handler=file_create,
        scope="write",
        aliases=("file.create",),
    ),
    ToolSpec(
        name="file_remove",
        family="file",
        title="Remove a file",
        description="Remove a file; hash must be the sha256 of its current content (from text_read).",
        input_schema=_input({"hash": _HASH}, ["hash"]),
        output_schema=_output({"removed": {"const": True}}),
        handler=file_remove,
        scope="write",
        aliases=("file.remove",),
        destructive=True,
    ),
    ToolSpec(
        name="text_read",
        family="text",
        title="Read text",
        description=(
            "Read a file's text (all, or lines=[start, end]) with the file's hash and total_lines; "
            "encoding='base64' reads any file whole."
        ),
        input_schema=_input({"lines": _LINES, "encoding": _ENCODING}, []),
        output_schema=_output({"content": {"type": "string"}, "encoding": _ENCODING, "hash": _HEX,
                               "total_lines": _COUNT}),
        handler=text_read,
        scope="read",
        aliases=("text.read",),
        read_only=True,
        idempotent=True,
        text=text_with_header("content"),
    ),
    ToolSpec(
        name="text_replace",
        family="text",
        title="Replace lines",
        description=("Replace the consecutive whole lines equal to old, found once within lines, by new "
                     "(new='' deletes them)."),
        input_schema=_input({"hash": _HASH, "lines": _LINES, "old": _TEXT, "new": _TEXT},
                            ["hash", "lines", "old", "new"]),
        output_schema=_MUTATION_OUT,
        handler=text_replace,
        scope="write",
        aliases=("text.replace",),
        destructive=True,
    ),
    ToolSpec(
        name="text_insert",
        family="text",
        title="Insert lines",
        description="Insert content as new lines before line `line`, whose full content must equal anchor.",
        input_schema=_input(
            {"hash": _HASH, "line": {"type": "integer", "description": "1-indexed; negative counts from the end."},
             "anchor": _TEXT, "content": _TEXT},
            ["hash", "line", "anchor", "content"],
        ),
        output_schema=_MUTATION_OUT,
        handler=text_insert,
        scope="write",
        aliases=("text.insert",),
    ),
    ToolSpec(
        name="text_append",
        family="text",
        title="Append lines",
        description="Append content as new lines at the end of the file.",
        input_schema=_input({"hash": _HASH, "content": _TEXT}, ["hash", "content"]),
        output_schema=_MUTATION_OUT,
        handler=text_append,
        scope="write",
        aliases=("text.append",),
    ),
]

RESOURCES = [
    ResourceSpec(
        uri_template="list://{+path}",
        name="list",
        description=("Immediate children of a directory in the root (dotfiles included, sorted): "
                     "{path, entries: [{name, kind}]}."),
        family="file",
        handler=list_resource,
        scope="read",
    )
]
