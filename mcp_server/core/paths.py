"""Repo-relative paths (seed 000 §1.2): one normal form, one order.

- A path is POSIX style, relative to the workspace root: ``src/a.py``.  ``src``,
  ``src/``, ``./src`` and ``src//`` all normalise to ``src``; ``.`` (or ``""``) is the root.
- Refused with PERMISSION_DENIED, because each would leave the root: a ``..``
  component anywhere (even ``a/../b``, which a naive join would accept), an absolute
  path, and a component starting with ``~`` (shell home expansion).  ``foo~`` backup
  files are ordinary names.
- Refused with INVALID_ARGUMENT: NUL bytes, lone surrogates (which no file name can hold),
  and paths over ``MAX_PATH_BYTES``.
- Returned paths are sorted by their UTF-8 bytes (``sort_paths``), never by locale.
"""

from __future__ import annotations

from collections.abc import Iterable

from sandbox.errors import CcwError

ROOT = "."
MAX_PATH_BYTES = 4096


def encoded(path: str, what: str = "path") -> bytes:
    """The bytes a file name ``path`` stands for; CcwError when no file can have it.

    Refused: NUL bytes, lone surrogates (a JSON "\\ud800" escape has no byte form), and
    more than MAX_PATH_BYTES.  ``what`` names the argument in the message.
    """
    if not isinstance(path, str):
        raise CcwError("INVALID_ARGUMENT", f"{what} must be a string, got {type(path).__name__}")
    if "\x00" in path:
        raise CcwError("INVALID_ARGUMENT", f"{what} {path!r} contains a NUL byte", {"path": path})
    try:
        data = path.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise CcwError(
            "INVALID_ARGUMENT", f"{what} {path!r} contains a lone UTF-16 surrogate; give the path as UTF-8 text",
            {"path": path[:200]},
        ) from None
    if len(data) > MAX_PATH_BYTES:
        raise CcwError("INVALID_ARGUMENT", f"{what} is longer than {MAX_PATH_BYTES} bytes", {"path": path[:200]})
    return data


def normalize(path: str) -> str:
    """The normal form of a repo-relative path; raises CcwError for unsafe paths."""
    encoded(path)
    if path.startswith("/"):
        raise CcwError(
            "PERMISSION_DENIED",
            f"path {path!r} is absolute; give a path relative to the workspace root",
            {"path": path},
        )
    parts = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            raise CcwError(
                "PERMISSION_DENIED",
                f"path {path!r} contains '..'; give a path inside the workspace root without '..'",
                {"path": path},
            )
        if part.startswith("~"):
            raise CcwError(
                "PERMISSION_DENIED",
                f"path {path!r} has a component starting with '~'; home-relative paths are not allowed",
                {"path": path},
            )
        parts.append(part)
    return "/".join(parts) if parts else ROOT


def path_key(path: str) -> bytes:
    """Sort key: the path's UTF-8 bytes (byte order, §1.3)."""
    return path.encode("utf-8", "surrogateescape")


def sort_paths(paths: Iterable[str]) -> list[str]:
    """Distinct paths in byte order."""
    return sorted(set(paths), key=path_key)


def is_within(path: str, prefix: str) -> bool:
    """True when normalised ``path`` is ``prefix`` or beneath it (``.`` contains everything)."""
    return prefix == ROOT or path == prefix or path.startswith(prefix + "/")


def parents(path: str) -> list[str]:
    """The implicit parent directories of a path, outermost first (``a/b/c`` → ``a``, ``a/b``)."""
    parts = path.split("/")[:-1] if path != ROOT else []
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def join(base: str, name: str) -> str:
    """``base/name`` in normal form (``.`` as base gives ``name``)."""
    return name if base == ROOT else f"{base}/{name}"
