"""A capsule's change as promotion would carry it: what capsule_diff, ``ccw capsule diff`` and a race show.

The diff an agent reads is the change it is about to promote, so it is cut the way
promotion cuts it (capsules/promote.py, ``_scoped`` with fs/gitignore.Scope): what the
live workspace's git ignores (``__pycache__/``, a built ``.so``) and a directory the
capsule made that declares itself a cache (``.pytest_cache/``) are left out and named
(``notes``), never shown.  Shown in full, one pytest run's ``.pyc`` made a one-line
edit's diff 63 KB of base85; ``Scope.include_ignored`` shows them, as it promotes them.

Two more things the answer says, since the diff alone would mislead:

- **The workspace moved** (``Carried.moved``, a note): the capsule's base is the live tree, so where the
  host edited a path the capsule also changed, the diff shows the host's edit reverted,
  and promotion refuses with REPO_CHANGED.  Judged as promotion judges it (promote's
  ``_conflicts``: the base state the journal recorded against the live one), at the
  paths shown only, so it costs one stat (and a hash) for each of them.
- **A name that is not UTF-8** (a note): the helper leaves such a change out of the list
  it sends a diff (sandbox/rawnames.py: no wire carries the name), and the note names it
  escaped (``\\xNN``) with what promote does: refuse the whole promotion until it is
  renamed.  A deleted directory's such files, which are walked here, are shown in git's
  quoting, and promote refuses them too, to be renamed in the workspace (the same note).
- **A long diff is cut** (a note) at a file's end once it passes ``MAX_CHARS``, so that
  what is shown still applies with ``git apply``; the files left out are named, to be
  asked for by ``paths`` (globs, as promote's).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

import trio

from mcp_server.capsules.promote import _conflicts, _parents, _scoped
from mcp_server.capsules.service import CapsuleService, Diff
from mcp_server.core import unidiff
from mcp_server.fs import changeset
from mcp_server.fs.gitignore import Scope
from mcp_server.fs.view import RootView
from mcp_server.journal_records import CapsuleRecord
from sandbox import rawnames
from sandbox.replies import NotCarried

# Characters of unified diff in one answer: an MCP client keeps about 25,000 tokens of a
# tool's answer (Claude Code's default), and the answer carries its text twice (content
# and structuredContent).
MAX_CHARS = 32_000
NAMED = 20  # ignored or left-out paths named in an answer; the rest are counted


@dataclass(frozen=True)
class Carried:
    """The change promotion would carry, and what was left out of it."""

    diff: Diff  # its entries and file changes: those in scope only
    ignored: list[str] = field(default_factory=list)  # top-most paths left out as ignored (a directory ends in /)
    ignored_files: int = 0  # the files among them and below them
    moved: list[str] = field(default_factory=list)  # shown paths the workspace changed since the capsule did
    not_utf8: NotCarried | None = None  # the capsule's changes left out, naming something that is not UTF-8


async def carried(service: CapsuleService, capsule_id: str, scope: Scope | None = None) -> Carried:
    """The capsule's change in ``scope`` (default: promotion's, without what the workspace ignores)."""
    scope = scope or Scope()
    scoped: list[tuple[list[changeset.Entry], list[dict[str, str]]]] = []

    def in_scope(record: CapsuleRecord, entries: list[changeset.Entry], capsule: RootView) -> list[changeset.Entry]:
        # Cut before any bytes are read: a reinstalled node_modules/ is hundreds of MB left out.
        kept, skipped, _note = _scoped(entries, record.workspace, scope, capsule)  # made caches' markers read there
        scoped.append((kept, skipped))
        return kept

    diff = await service.diff(capsule_id, in_scope)
    record = diff.record
    (entries, skipped), = scoped

    def judge() -> Carried:
        moved = [conflict["path"] for conflict in _conflicts(service.journal, record, entries, {})]
        left = [one["path"] for one in skipped if one["reason"] == "ignored"]
        return Carried(replace(diff, entries=entries), *ignored_paths(diff.entries, left), moved, diff.not_utf8)

    return await trio.to_thread.run_sync(judge)


def ignored_paths(entries: list[changeset.Entry], left: list[str]) -> tuple[list[str], int]:
    """The top-most of the ``left`` paths (a directory once, ending in /) and how many files they hold."""
    dirs = {e.path for e in entries if any(side is not None and side.kind == "dir" for side in (e.old, e.new))}
    left_dirs = dirs.intersection(left)
    top = [p + "/" if p in dirs else p for p in left
           if not any(parent in left_dirs for parent in _parents(p))]
    return top, sum(1 for p in left if p not in dirs)


def named(paths: list[str]) -> str:
    """Up to ``NAMED`` paths, comma separated, and how many more."""
    more = len(paths) - NAMED
    return ", ".join(paths[:NAMED]) + (f", and {more} more" if more > 0 else "")


def notes(found: Carried) -> list[str]:
    """The answer's ``notes``: names that are not UTF-8, what is left out as ignored, and whether the
    workspace moved."""
    walked = rawnames.listed(entry.path for entry in found.diff.entries)
    left_out = (found.not_utf8.count, found.not_utf8.names) if found.not_utf8 else (0, ())
    return (not_utf8_notes(left_out, walked) + special_notes(found.diff.entries)
            + ignored_notes(found.ignored, found.ignored_files) + moved_notes(found.moved))


MAX_SPECIAL_NAMED = 5


def special_notes(entries: list[changeset.Entry]) -> list[str]:
    """A note naming the devices, sockets and FIFOs the capsule made, which no diff can show
    (git has no such file) and promotion refuses (changeset.promote_ops); none without."""
    special = [entry.path for entry in entries if entry.new is not None and entry.new.kind == "other"]
    if not special:
        return []
    named = ", ".join(special[:MAX_SPECIAL_NAMED]) + (" ..." if len(special) > MAX_SPECIAL_NAMED else "")
    return [f"not shown: {len(special)} device(s), socket(s) or FIFO(s) the capsule made, {named}; git shows no "
            "such file, and capsule_promote refuses the whole promotion while the capsule holds them: remove "
            "them in the capsule (capsule_exec rm)"]


def not_utf8_notes(left_out: tuple[int, tuple[str, ...]], walked: tuple[int, tuple[str, ...]]) -> list[str]:
    """Notes naming (how many, the first few escaped, as ``rawnames.listed``) the capsule's changes
    left out as not UTF-8 and the shown paths that are not (a deleted directory's files), each
    with what promotion does; none when there are none."""
    out = []
    if left_out[0]:
        way = rawnames.way_out(os.fsdecode(rawnames.name_bytes(left_out[1][0])))
        out.append(f"not UTF-8, not shown: {left_out[0]} name(s) the capsule changed, {_escaped(*left_out)}; "
                   f"capsule_promote refuses the whole promotion while the capsule holds them: {way}")
    if walked[0]:
        out.append(f"not UTF-8, shown in git's quoting: {walked[0]} path(s) of a directory the capsule deleted, "
                   f"{_escaped(*walked)}; capsule_promote refuses the whole promotion: {rawnames.IN_WORKSPACE}")
    return out


def _escaped(count: int, shown: tuple[str, ...]) -> str:
    return f"{', '.join(shown)}{' ...' if count > len(shown) else ''} (each byte that is not UTF-8 shown as \\xNN)"


def ignored_notes(ignored: list[str], files: int) -> list[str]:
    """A note naming what is left out as ignored (none when nothing is)."""
    if not ignored:
        return []
    return [f"ignored, not shown: {files} files in {named(ignored)} (git-ignored, or a cache the capsule made: "
            "promotion leaves them behind; ignored: true, or ccw capsule diff --ignored, shows them)"]


def moved_notes(moved: list[str]) -> list[str]:
    """A warning when the workspace changed at paths the capsule changed (none when it did not)."""
    if not moved:
        return []
    return [f"workspace moved: it changed at {len(moved)} path(s) since the capsule changed them ({named(moved)}): "
            "the diff shows those workspace edits reverted, and capsule_promote will refuse with REPO_CHANGED"]


def unified(changes: list[unidiff.FileChange], max_chars: int | None) -> tuple[str, list[str]]:
    """The unified diff of ``changes``, whole files only, cut once it would pass ``max_chars``
    (None: never); and the paths left out, in the diff's order."""
    ordered = sorted(changes, key=lambda c: c.path.encode("utf-8", "surrogateescape"))
    parts: list[str] = []
    size = 0
    for i, change in enumerate(ordered):
        text = unidiff.render(change).decode("utf-8")
        if max_chars is not None and size + len(text) > max_chars:
            return "".join(parts), [c.path for c in ordered[i:]]
        parts.append(text)
        size += len(text)
    return "".join(parts), []


def cut_note(left_out: list[str], shown: int) -> str:
    """The note on a cut diff: which files it leaves out, and how to ask for them."""
    return (f"cut at {shown} chars: {len(left_out)} file(s) not shown ({named(left_out)}); ask for them with "
            "paths: [globs], or max_chars: null for all")
