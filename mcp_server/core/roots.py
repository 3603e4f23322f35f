"""MCP roots, the lexical rules: whether a path lies within a root, comparing whole
components, and placing a path in a capsule's view without resolving symlinks.

Resolving a path on the host (``realpath``) and choosing among the client's roots is
``mcp_server.fs.roots``, whose opening says why both sides are resolved first.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from sandbox.errors import CcwError


@dataclass(frozen=True)
class Located:
    """A path inside a root: the root (resolved) and the path relative to it (``""`` = root)."""

    root: str
    rel: str


def is_within(path: str, root: str) -> bool:
    """True when absolute ``path`` is ``root`` or beneath it, comparing whole components."""
    path_parts = _components(path)
    root_parts = _components(root)
    return path_parts[: len(root_parts)] == root_parts


def _components(path: str) -> list[str]:
    return [part for part in posixpath.normpath(path).split("/") if part]


def check_path_text(path: str) -> None:
    """INVALID_ARGUMENT for a path no file can have: one with a NUL byte or a lone surrogate."""
    if "\x00" in path:
        raise CcwError("INVALID_ARGUMENT", "path contains a NUL byte; give a plain file path.")
    try:
        path.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        # A lone surrogate from a JSON "\ud800" escape: no byte string, so no file, has it.
        raise CcwError("INVALID_ARGUMENT",
                       "path contains a lone UTF-16 surrogate; give the path as UTF-8 text.") from None


def locate_lexical(path: str, root: str) -> Located:
    """Like ``locate`` for a view that is not the host tree (a capsule): no symlinks resolved.

    The capsule's merged view stands for ``root`` (the workspace); its own symlinks are
    confined by the view's ``RESOLVE_BENEATH`` when the file is opened.
    """
    check_path_text(path)
    absolute = posixpath.normpath(path if posixpath.isabs(path) else posixpath.join(root, path))
    if not is_within(absolute, root):
        raise CcwError(
            "PERMISSION_DENIED",
            f"{path!r} is outside the capsule's workspace {root!r}; give a path inside it.",
            {"path": path, "root": root},
        )
    rel = posixpath.relpath(absolute, root)
    return Located(root, "" if rel == "." else rel)
