"""MCP roots: which directory a file tool's path falls in, and whether it may.

Some facts about checking a path against a root:

- A string prefix is not containment: ``/a/allowed_evil`` starts with ``/a/allowed``.
  Only whole path components count, so both sides are split into components first.
- A path can point elsewhere through a symlink (``/a/allowed/link -> /etc``), and so can
  a root (``/tmp`` on some systems).  Both are resolved with ``realpath`` before the
  comparison; a path that does not exist yet is resolved as far as it exists, which is
  what a file about to be created needs.
- A check and a later open race with a symlink swapped in between.  This module is the
  policy (which root, and is it allowed); the enforcement is the open itself, done
  beneath the root's descriptor with ``openat2(RESOLVE_BENEATH)``
  (``mcp_server/fs/view.py``), so a swapped link fails there rather than escaping.

Roots come from the client (``roots/list``; the server refreshes them on
``notifications/roots/list_changed``) or, when it does not declare the roots capability,
the workspace the server was started for.  A client that declares the capability but
lists no roots allows nothing (it said so; the workspace does not stand in).  A relative
path is taken relative to the first root.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from urllib.parse import unquote, urlparse

from mcp_server.core.roots import Located, check_path_text, is_within
from sandbox.errors import CcwError


def root_dir(root: str) -> str:
    """An absolute root directory from a root as given (a path or a ``file://`` URI), resolved."""
    if root.startswith("file://"):
        root = unquote(urlparse(root).path)
    if not os.path.isabs(root):
        raise CcwError("INVALID_ARGUMENT", f"root {root!r} is not an absolute path or file:// URI", {"root": root})
    return os.path.realpath(root)


def effective_roots(roots: Sequence[str] | None, workspace: str) -> list[str]:
    """The client's roots when it declared the capability (even none), else the workspace."""
    if roots is not None:
        if not roots:
            raise CcwError(
                "PERMISSION_DENIED",
                "the client declared the roots capability but lists no roots, so no path is "
                "allowed; add the project directory as a root in the client.",
            )
        return [root_dir(r) for r in roots]
    if not workspace:
        raise CcwError(
            "UNAVAILABLE",
            "no roots: the client declared none and the server has no workspace; start ccw-mcp "
            "with CCW_WORKSPACE set, or declare roots in the client.",
        )
    return [root_dir(workspace)]


def locate(path: str, roots: Sequence[str] | None, workspace: str) -> Located:
    """Resolve ``path`` (absolute, or relative to the first root) and find the root holding it."""
    allowed = effective_roots(roots, workspace)
    check_path_text(path)
    absolute = path if os.path.isabs(path) else os.path.join(allowed[0], path)
    resolved = os.path.realpath(absolute)
    # The most specific root wins when roots nest, so the result does not depend on order.
    holders = sorted((r for r in allowed if is_within(resolved, r)), key=len, reverse=True)
    if not holders:
        raise CcwError(
            "PERMISSION_DENIED",
            f"{path!r} resolves to {resolved!r}, which is outside the allowed roots "
            f"{allowed}; give a path inside one of them (a relative path is taken from "
            f"{allowed[0]!r}).",
            {"path": path, "resolved": resolved, "roots": allowed},
        )
    root = holders[0]
    rel = os.path.relpath(resolved, root)
    return Located(root, "" if rel == "." else rel)
