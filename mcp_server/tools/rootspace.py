"""RootSpace tools (seed 004): ``file_*`` (family ``file``), ``text_*`` (family ``text``), ``list://``.

Every path is root-relative (MCP-025..028, ``mcp_server/core/rootspace.py``): ``/`` is
the root, which is, with ``capsule_id``, the capsule's copy-on-write view of its
workspace; otherwise the first root the client declared (MCP roots), or the workspace
ccw-mcp was started for (``CCW_WORKSPACE``) when it declares none.  Every mutation takes the ``hash`` (sha256 hex of
the stored bytes) of a prior read and returns the new one (MCP-031..034); a write that
races another writer is rejected as in ``mcp_server/tools/hashline.py``.

Choices seed 004 leaves open: ``file.create`` refuses to overwrite (remove first, with
the hash), even a file that appears between its check and its write (the name is given
with ``link``), and creates missing parent directories; ``file.remove`` removes files and
symlinks, not directories; ``text.read`` takes an optional ``encoding`` so that a file
that is not UTF-8 can be read as base64, which is what its error suggests.
``list://{+path}`` returns ``{"path", "entries": [{"name", "kind"}]}`` with every
entry (dotfiles included) sorted by the bytes of the name.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from mcp_server.core import rootspace
from mcp_server.core.hashline import file_hash
from mcp_server.fs.roots import effective_roots
from mcp_server.fs.view import RootView
from mcp_server.tools.registry import ResourceSpec, ToolContext, ToolSpec, text_with_header
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
from sandbox.errors import CcwError, wrap_oserror

_REREAD = "Call text_read again and retry with the new hash."


async def rooted(ctx: ToolContext, path: str, capsule_id: str | None) -> Target:
    """Normalise a root-relative path and open the root it is relative to."""
    rel = rootspace.normalize_path(path)
    if capsule_id:
        view = await open_view(ctx, capsule_id=capsule_id)
    else:
        view = RootView.open(effective_roots(await ctx.roots(), ctx.workspace)[0])
    return Target(view, rel, rootspace.display_path(rel), capsule_id, ctx.state)


def _with_root(run: Callable[[Target, dict[str, Any]], dict[str, Any]]) -> Any:
    return with_view(rooted)(run)


def _read_state(found: Target) -> tuple[tuple[int, ...], rootspace.TextState]:
    before, data = _identity_and_bytes(found)
    return before, rootspace.TextState.parse(data, found.shown)


def _write(found: Target, before: tuple[int, ...], text: str) -> dict[str, Any]:
    data = text.encode("utf-8")
    write_checked(found, before, data, _REREAD)
    return {"path": found.shown, "hash": file_hash(data), "total_lines": rootspace.TextState.parse(data, found.shown).total_lines}


def _file_create(found: Target, args: dict[str, Any]) -> dict[str, Any]:
    """MCP-010: create a new file; returns its hash."""
    data = rootspace.decode_content(args["content"], args.get("encoding", "utf-8"))
    if found.rel == "":
        raise CcwError("INVALID_ARGUMENT", "'/' is the root directory; give a file path such as '/notes.txt'.")
    exists = CcwError(
        "CONFLICT",
        f"{found.shown} already exists; to change it use text_replace/text_insert/text_append "
        "with the hash from text_read, or file_remove it (with its hash) first.",
        {"path": found.shown},
    )
    if found.view.exists(found.rel):
        raise exists
    parent, _, name = found.rel.rpartition("/")
    if parent:
        found.view.makedirs(parent)
    create_new(found.view, parent, name, data, exists)
    found.record("write", data)
    return {"path": found.shown, "hash": file_hash(data), "size": len(data)}


def create_new(view: RootView, parent: str, name: str, data: bytes, exists: CcwError) -> None:
    """Create ``parent/name`` whole, or not at all if anything appeared there meanwhile.

    The content goes to a temp file first; ``link`` then gives it its name, which fails
    with EEXIST rather than replace a file another writer created since our check.
    """
    parent_fd = view.open_fd(parent, os.O_RDONLY | os.O_DIRECTORY, write=True, what="create")
    tmp = f".{name}.ccw-{secrets.token_hex(6)}.tmp"
    try:
        with wrap_oserror("create", f"{parent}/{name}".lstrip("/")):
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=parent_fd)
            try:
                rest = memoryview(data)
                while rest:
                    rest = rest[os.write(fd, rest) :]
                os.fchmod(fd, 0o644)  # as RootView.write_bytes gives new files
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd, follow_symlinks=False)
            except FileExistsError:
                raise exists from None
            finally:
                os.unlink(tmp, dir_fd=parent_fd)
            os.fsync(parent_fd)
    finally:
        os.close(parent_fd)


def _file_remove(found: Target, args: dict[str, Any]) -> dict[str, Any]:
    """MCP-011: remove a file whose current hash is ``hash``."""
    before, data = _identity_and_bytes(found)
    rootspace.check_hash(args["hash"], file_hash(data), found.shown)
    if file_identity(found.view, found.rel) != before:
        raise CcwError("CONFLICT", f"{found.shown} changed while being removed; nothing was removed. {_REREAD}", {"path": found.shown})
    found.view.unlink(found.rel)
    found.record("delete")
    return {"path": found.shown, "removed": True}


def _identity_and_bytes(found: Target) -> tuple[tuple[int, ...], bytes]:
    with missing_means(found.shown, f"{found.shown} does not exist; read list:// of its directory to see what exists."):
        before = file_identity(found.view, found.rel) if found.rel else ()
    return before, read_file(found.view, found.rel, found.shown, "read list:// of its directory")


def _text_read(found: Target, args: dict[str, Any]) -> dict[str, Any]:
    """MCP-012: content (all, or ``lines``), the whole file's hash, and total_lines."""
    if args.get("encoding", "utf-8") == "base64":
        if "lines" in args:
            raise CcwError("INVALID_ARGUMENT", "lines cannot be combined with encoding='base64'; omit lines to read the whole file.")
        _, data = _identity_and_bytes(found)
        lines = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
        return {
            "path": found.shown,
            "content": base64.b64encode(data).decode("ascii"),
            "encoding": "base64",
            "hash": file_hash(data),
            "total_lines": lines,
        }
    _, state = _read_state(found)
    content = rootspace.read_range(state, args.get("lines"))
    if len(content) > MAX_READ_CHARS:
        raise CcwError(
            "TOO_LARGE",
            f"{found.shown}: the requested text is {len(content)} characters, more than one answer "
            f"carries ({MAX_READ_CHARS}); read it in parts with lines=[start, end] "
            f"(the file has {state.total_lines} lines).",
            {"path": found.shown, "total_lines": state.total_lines, "hash": state.hash},
        )
    return {
        "path": found.shown,
        "content": content,
        "encoding": "utf-8",
        "hash": state.hash,
        "total_lines": state.total_lines,
    }


def _text_replace(found: Target, args: dict[str, Any]) -> dict[str, Any]:
    """MCP-013: replace whole lines equal to ``old`` within ``lines`` by ``new``."""
    before, state = _read_state(found)
    rootspace.check_hash(args["hash"], state.hash, found.shown)
    return _write(found, before, rootspace.replace(state, args["lines"], args["old"], args["new"], found.shown))


def _text_insert(found: Target, args: dict[str, Any]) -> dict[str, Any]:
    """MCP-014: insert ``content`` before line ``line``, whose full content is ``anchor``."""
    before, state = _read_state(found)
    rootspace.check_hash(args["hash"], state.hash, found.shown)
    return _write(found, before, rootspace.insert(state, args["line"], args["anchor"], args["content"], found.shown))


def _text_append(found: Target, args: dict[str, Any]) -> dict[str, Any]:
    """MCP-015: append ``content`` as new lines at the end."""
    before, state = _read_state(found)
    rootspace.check_hash(args["hash"], state.hash, found.shown)
    return _write(found, before, rootspace.append(state, args["content"]))


async def list_resource(ctx: ToolContext, uri: str) -> tuple[str, str]:
    """MCP-020/021: ``list://{+path}`` → the immediate children of a directory."""
    raw = unquote(uri.removeprefix("list://"))
    found = await rooted(ctx, raw or "/", None)
    try:
        with missing_means(
            found.shown,
            f"{found.shown} is not a directory that exists; read list:/// (the root) and follow "
            "the entries of kind 'dir'.",
        ):
            entries = found.view.listdir(found.rel)
    finally:
        found.view.close()
    body = {"path": found.shown, "entries": [{"name": name, "kind": kind} for name, kind in entries]}
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
_HASH = {"type": "string", "pattern": "^(sha256:)?[0-9a-fA-F]{64}$", "description": "sha256 hex from the last read (text_read)."}
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
        description="Create a new file (parents made as needed) with content in utf-8 or base64; returns its hash. Refuses to overwrite.",
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
        output_schema=_output({"content": {"type": "string"}, "encoding": _ENCODING, "hash": _HEX, "total_lines": _COUNT}),
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
        description="Replace the consecutive whole lines equal to old, found once within lines, by new (new='' deletes them).",
        input_schema=_input({"hash": _HASH, "lines": _LINES, "old": _TEXT, "new": _TEXT}, ["hash", "lines", "old", "new"]),
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
            {"hash": _HASH, "line": {"type": "integer", "description": "1-indexed; negative counts from the end."}, "anchor": _TEXT, "content": _TEXT},
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
        description="Immediate children of a directory in the root (dotfiles included, sorted): {path, entries: [{name, kind}]}.",
        family="file",
        handler=list_resource,
        scope="read",
    )
]
