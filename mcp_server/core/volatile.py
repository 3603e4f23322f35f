"""Volatile paths: files a run writes under a different name every time.

nyc names its coverage files at random (``.nyc_output/<uuid>.json``), so a witness of
``npm test`` could never replay with the same written set.  A capsule, a witness, a
replayer or a policy may name globs of such paths; replay leaves the paths they match out
of the written-set and change comparisons and reports them apart (core/replaydiff.py).

Globs are core/policy.glob_match's: ``*`` and ``?`` within a segment, ``**`` spanning
segments, paths relative to the workspace root.

When a written set differs only by names with a random-looking part, ``suggest`` proposes
the glob that would cover both sides, so the mismatch message says what to declare.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Sequence

from mcp_server.core.policy import glob_match
from sandbox.errors import CcwError

MAX_GLOBS = 64
MAX_GLOB_CHARS = 1024
SUGGEST_PAIRS = 64  # names per side looked at when suggesting: the heuristic is quadratic

GLOBS_SCHEMA: dict[str, object] = {
    "type": "array", "maxItems": MAX_GLOBS,
    "items": {"type": "string", "minLength": 1, "maxLength": MAX_GLOB_CHARS},
}

_SEPARATORS = "._-+"
_HEXISH = re.compile(r"[0-9a-fA-F]+(?:-[0-9a-fA-F]+)*\Z")
_ALNUM = re.compile(r"[0-9A-Za-z]+\Z")


def matches(path: str, globs: Sequence[str]) -> bool:
    """True if some glob of ``globs`` matches ``path``."""
    return any(glob_match(glob, path) for glob in globs)


def split(paths: Iterable[str], globs: Sequence[str]) -> tuple[set[str], set[str]]:
    """(the paths no glob matches, the volatile ones)."""
    kept: set[str] = set()
    volatile: set[str] = set()
    for path in paths:
        (volatile if globs and matches(path, globs) else kept).add(path)
    return kept, volatile


def check_globs(globs: object, where: str) -> list[str]:
    """The globs as a sorted list of distinct strings, or ValueError saying what is wrong.

    A glob is relative to the workspace root: no leading ``/``, no ``..`` segment, no NUL.
    """
    if not isinstance(globs, (list, tuple)) or not all(isinstance(g, str) for g in globs):
        raise ValueError(f"{where} must be a list of glob strings")
    if len(globs) > MAX_GLOBS:
        raise ValueError(f"{where} names {len(globs)} globs; at most {MAX_GLOBS}")
    for glob in globs:
        if not glob or len(glob) > MAX_GLOB_CHARS or "\0" in glob:
            raise ValueError(f"{where}: {glob[:80]!r} is not a glob (empty, too long or with NUL)")
        if glob.startswith("/") or ".." in glob.split("/"):
            raise ValueError(f"{where}: {glob!r} must be relative to the workspace root, like .nyc_output/*.json")
    return sorted(set(globs))


def globs_arg(value: object, where: str = "volatile") -> tuple[str, ...]:
    """A tool's or command line's volatile globs, checked (INVALID_ARGUMENT saying what is wrong)."""
    try:
        return tuple(check_globs(value or [], where))
    except ValueError as exc:
        raise CcwError("INVALID_ARGUMENT", f"{exc}; a volatile glob names paths relative to the workspace root "
                                           "(* within a directory, ** across)", {"field": where}) from None


def _escape(text: str) -> str:
    # A literal part of a suggested glob: * and ? matched as themselves; [ by ?, since
    # glob_match's classes cannot hold a [ (the regex would read a nested set).
    return "".join({"*": "[*]", "?": "[?]", "[": "?"}.get(ch, ch) for ch in text)


def literal(path: str) -> str:
    """The glob that matches ``path`` alone (a file whose bytes change on every run)."""
    return _escape(path)


def _random_part(left: str, right: str) -> bool:
    if left == right or not left or not right:
        return False
    if _HEXISH.match(left) and _HEXISH.match(right) and min(len(left), len(right)) >= 8:
        return True  # hashes, uuids, hex timestamps
    return len(left) == len(right) >= 4 and bool(_ALNUM.match(left)) and bool(_ALNUM.match(right))


def _affixes(left: str, right: str) -> tuple[str, str]:
    """The common prefix and suffix of two names, cut back to a separator so neither eats into the random part."""
    prefix = posixpath.commonprefix([left, right])
    cut = max((prefix.rfind(ch) for ch in _SEPARATORS), default=-1)
    prefix = prefix[: cut + 1]
    suffix = posixpath.commonprefix([left[len(prefix):][::-1], right[len(prefix):][::-1]])[::-1]
    cut = min((i for i, ch in enumerate(suffix) if ch in _SEPARATORS), default=len(suffix))
    return prefix, suffix[cut:]


def pair_glob(recorded: str, replayed: str) -> str | None:
    """The glob covering two paths that differ only by a random-looking part of their name, or None."""
    head, left = posixpath.split(recorded)
    other, right = posixpath.split(replayed)
    if head != other:
        return None
    prefix, suffix = _affixes(left, right)
    middle_left = left[len(prefix): len(left) - len(suffix)]
    middle_right = right[len(prefix): len(right) - len(suffix)]
    if not _random_part(middle_left, middle_right):
        return None
    name = _escape(prefix) + "*" + _escape(suffix)
    return f"{_escape(head)}/{name}" if head else name


def suggest(recorded_only: Sequence[str], replayed_only: Sequence[str]) -> list[str]:
    """Globs that would make these written-set differences volatile: one per pattern of random names."""
    out = set()
    for recorded in recorded_only[:SUGGEST_PAIRS]:
        for replayed in replayed_only[:SUGGEST_PAIRS]:
            glob = pair_glob(recorded, replayed)
            if glob is not None:
                out.add(glob)
    return sorted(out)
