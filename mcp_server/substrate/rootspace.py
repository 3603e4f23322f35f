"""Root-relative file and text operations (seed 004: ``file_*``, ``text_*``, ``list://``).

Every mutation takes the ``hash`` (sha256 hex of the stored bytes) of a prior read and
returns the new one (MCP-031..034); a write that races another writer is rejected as in
``mcp_server/substrate/hashline.py``.  ``file_create`` refuses to overwrite, even a file
that appears between its check and its write (the name is given with ``link``), and
creates missing parent directories; ``file_remove`` removes files and symlinks, not
directories.
"""

from __future__ import annotations

import base64
import os
import secrets
from typing import Any

from mcp_server.core import rootspace
from mcp_server.core.hashline import file_hash
from mcp_server.fs.view import RootView
from mcp_server.substrate.textfiles import (
    MAX_READ_CHARS,
    Target,
    file_identity,
    missing_means,
    read_file,
    write_checked,
)
from sandbox.errors import CcwError, wrap_oserror

_REREAD = "Call text_read again and retry with the new hash."


def _read_state(found: Target) -> tuple[tuple[int, ...], rootspace.TextState]:
    before, data = _identity_and_bytes(found)
    return before, rootspace.TextState.parse(data, found.shown)


def _write(found: Target, before: tuple[int, ...], text: str) -> dict[str, Any]:
    data = text.encode("utf-8")
    write_checked(found, before, data, _REREAD)
    return {"path": found.shown, "hash": file_hash(data),
            "total_lines": rootspace.TextState.parse(data, found.shown).total_lines}


def file_create(found: Target, data: bytes) -> dict[str, Any]:
    """MCP-010: create a new file holding ``data``; returns its hash."""
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
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                         dir_fd=parent_fd)
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


def file_remove(found: Target, expected_hash: str) -> dict[str, Any]:
    """MCP-011: remove a file whose current hash is ``expected_hash``."""
    before, data = _identity_and_bytes(found)
    rootspace.check_hash(expected_hash, file_hash(data), found.shown)
    if file_identity(found.view, found.rel) != before:
        raise CcwError("CONFLICT", f"{found.shown} changed while being removed; nothing was removed. {_REREAD}",
                       {"path": found.shown})
    found.view.unlink(found.rel)
    found.record("delete")
    return {"path": found.shown, "removed": True}


def _identity_and_bytes(found: Target) -> tuple[tuple[int, ...], bytes]:
    with missing_means(found.shown, f"{found.shown} does not exist; read list:// of its directory to see what exists."):
        before = file_identity(found.view, found.rel) if found.rel else ()
    return before, read_file(found.view, found.rel, found.shown, "read list:// of its directory")


def text_read(found: Target, lines: list[int] | None, encoding: str = "utf-8") -> dict[str, Any]:
    """MCP-012: content (all, or ``lines``), the whole file's hash, and total_lines."""
    if encoding == "base64":
        if lines is not None:
            raise CcwError("INVALID_ARGUMENT",
                           "lines cannot be combined with encoding='base64'; omit lines to read the whole file.")
        _, data = _identity_and_bytes(found)
        count = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
        return {
            "path": found.shown,
            "content": base64.b64encode(data).decode("ascii"),
            "encoding": "base64",
            "hash": file_hash(data),
            "total_lines": count,
        }
    _, state = _read_state(found)
    content = rootspace.read_range(state, lines)
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


def text_replace(found: Target, expected_hash: str, lines: list[int], old: str, new: str) -> dict[str, Any]:
    """MCP-013: replace whole lines equal to ``old`` within ``lines`` by ``new``."""
    before, state = _read_state(found)
    rootspace.check_hash(expected_hash, state.hash, found.shown)
    return _write(found, before, rootspace.replace(state, lines, old, new, found.shown))


def text_insert(found: Target, expected_hash: str, line: int, anchor: str, content: str) -> dict[str, Any]:
    """MCP-014: insert ``content`` before line ``line``, whose full content is ``anchor``."""
    before, state = _read_state(found)
    rootspace.check_hash(expected_hash, state.hash, found.shown)
    return _write(found, before, rootspace.insert(state, line, anchor, content, found.shown))


def text_append(found: Target, expected_hash: str, content: str) -> dict[str, Any]:
    """MCP-015: append ``content`` as new lines at the end."""
    before, state = _read_state(found)
    rootspace.check_hash(expected_hash, state.hash, found.shown)
    return _write(found, before, rootspace.append(state, content))


def list_entries(found: Target) -> dict[str, Any]:
    """MCP-020/021: the immediate children of a directory, as ``{path, entries}``."""
    with missing_means(
        found.shown,
        f"{found.shown} is not a directory that exists; read list:/// (the root) and follow "
        "the entries of kind 'dir'.",
    ):
        entries = found.view.listdir(found.rel)
    return {"path": found.shown, "entries": [{"name": name, "kind": kind} for name, kind in entries]}
