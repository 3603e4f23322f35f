"""From the helper's change list to per-path before/after states, diffs and promotion ops.

The helper reports changes the way overlayfs records them (see sandbox/overlay.py): a
deleted directory is one entry, an opaque directory hides every base entry below it, a
type change names only the new type.  Diffs, witnesses and promotion all need the same
thing instead: for every path that differs, what the base has there and what the capsule
has there.  ``expand`` computes exactly that, by reading both views (``RootView``s, so
nothing is followed out of either tree):

- every path the helper names;
- every base entry below a directory that was deleted, made opaque, or replaced by
  another type, since those are gone (or replaced) in the capsule.

Then each path's (old, new) pair decides everything, uniformly, whatever overlayfs
recorded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import blake3

from mcp_server.core import unidiff
from mcp_server.core.canonical import canonical_text
from mcp_server.fs.promote import Op
from mcp_server.fs.view import DirFds, RootView, Side, lstat
from sandbox.errors import CcwError
from sandbox.replies import Change


@dataclass(frozen=True)
class Entry:
    """A path whose base and capsule states differ (``None``: absent on that side)."""

    path: str
    old: Side | None
    new: Side | None
    modified: bool  # for files present on both sides: the bytes differ


def _descendants(view: RootView, path: str) -> Iterable[str]:
    """Every entry below a directory of ``view`` (directories included), depth first."""
    try:
        entries = view.listdir(path)
    except CcwError as exc:
        if exc.code in ("NOT_FOUND", "INVALID_ARGUMENT"):
            return
        raise
    for name, kind in entries:
        child = f"{path}/{name}"
        yield child
        if kind == "dir":
            yield from _descendants(view, child)


def expand(changes: Sequence[Change], base: RootView, capsule: RootView,
           base_infos: dict[str, os.stat_result] | None = None) -> list[Entry]:
    """Per-path (old, new) states for the helper's change list, sorted by path bytes; with
    ``base_infos``, the ``lstat`` of each regular file of the base is kept there too (a
    merge's stat cache keys on it: capsules/merge_plan.py), so none is stat'ed twice."""
    kinds = {c.path: c.kind for c in changes}
    paths = set(kinds)
    kept = {} if base_infos is None else base_infos
    olds: dict[str, Side | None] = {}
    # Changed paths crowd into few directories: each is resolved once per side, and each
    # base entry stat'ed once (a deleted directory's is looked at before its descendants).
    with DirFds(base) as base_dirs, DirFds(capsule) as capsule_dirs:
        for change in changes:
            if change.kind in ("deleted", "opaque", "type_changed"):
                old = olds[change.path] = _base_lstat(base_dirs, change.path, kept)
                if old is not None and old.kind == "dir":
                    paths.update(_descendants(base, change.path))
        out = []
        for path in sorted(paths, key=lambda p: p.encode("utf-8", "surrogateescape")):
            old = olds[path] if path in olds else _base_lstat(base_dirs, path, kept)
            new = capsule_dirs.lstat(path)
            if old is None and new is None:
                continue
            modified = kinds.get(path) in ("modified", "added", "type_changed", "opaque")
            if old is not None and new is not None and old == new and not modified:
                continue
            out.append(Entry(path, old, new, modified))
    return out


def _base_lstat(dirs: DirFds, path: str, infos: dict[str, os.stat_result]) -> Side | None:
    """``dirs.lstat(path)``, keeping a regular file's stat result in ``infos``."""
    side, info = dirs.lstat_info(path)
    if side is not None and side.kind == "file" and info is not None:
        infos[path] = info
    return side


def _git_mode(side: Side | None) -> int | None:
    if side is None:
        return None
    if side.kind == "symlink":
        return 0o120000
    return 0o100755 if side.mode & 0o111 else 0o100644


def _content(view: RootView, path: str, side: Side | None) -> bytes | None:
    if side is None:
        return None
    if side.kind == "symlink":
        return os.fsencode(side.target or "")
    if side.kind == "file":
        return view.read_bytes(path)
    return None


def _utf8(data: bytes | None) -> bool:
    if data is None:
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def file_changes(entries: list[Entry], base: RootView, capsule: RootView) -> list[unidiff.FileChange]:
    """The files and symlinks among ``entries`` with their bytes, for diffs and witnesses.

    Text that is not UTF-8 is marked binary, so a diff carried in JSON still applies.
    """
    out = []
    for entry in entries:
        old_is = entry.old is not None and entry.old.kind in ("file", "symlink")
        new_is = entry.new is not None and entry.new.kind in ("file", "symlink")
        if not (old_is or new_is):
            continue
        old = _content(base, entry.path, entry.old) if old_is else None
        new = _content(capsule, entry.path, entry.new) if new_is else None
        old_mode = _git_mode(entry.old) if old_is else None
        new_mode = _git_mode(entry.new) if new_is else None
        if old == new and old_mode == new_mode:
            continue
        binary = None if (_utf8(old) and _utf8(new)) else True
        out.append(unidiff.FileChange(entry.path, old, new, old_mode, new_mode, binary))
    return out


def promote_ops(entries: list[Entry]) -> list[Op]:
    """The operations that make the workspace's paths equal the capsule's."""
    ops: list[Op] = []
    for entry in entries:
        old, new = entry.old, entry.new
        if new is None:
            ops.append(Op("delete", entry.path))
            continue
        if new.kind == "other":
            raise CcwError(
                "UNSUPPORTED",
                f"{entry.path!r} is a device, socket or fifo in the capsule; such files are not "
                "promoted. Remove it in the capsule (capsule_exec rm) and promote again",
                {"path": entry.path},
            )
        if old is not None and old.kind != new.kind:
            ops.append(Op("delete", entry.path))
            old = None
        if new.kind == "dir":
            if old is None:
                ops.append(Op("mkdir", entry.path, new.mode))
            elif old.mode != new.mode:
                ops.append(Op("chmod", entry.path, new.mode))
        elif new.kind == "symlink":
            if old is None or old.target != new.target:
                ops.append(Op("symlink", entry.path, target=new.target))
        elif old is None or entry.modified:
            ops.append(Op("write", entry.path, new.mode))
        elif old.mode != new.mode:
            ops.append(Op("chmod", entry.path, new.mode))
    return ops


def summary(entries: list[Entry]) -> dict[str, int]:
    """Counts of added, deleted and modified files and symlinks (directories aside)."""
    counts = {"added": 0, "deleted": 0, "modified": 0}
    for entry in entries:
        old_is = entry.old is not None and entry.old.kind != "dir"
        new_is = entry.new is not None and entry.new.kind != "dir"
        if old_is and new_is:
            counts["modified"] += 1
        elif new_is:
            counts["added"] += 1
        elif old_is:
            counts["deleted"] += 1
    return counts


def base_state(view: RootView, path: str, dirs: DirFds | None = None) -> str:
    """A path's state as canonical JSON text (kind, mode, blake3 or link target), or "absent";
    for a path ending in "/", the state of the whole tree below that directory (``tree_key``).

    ``dirs``: a descriptor cache of ``view`` for many paths in a row (see ``DirFds``).
    """
    if path.endswith("/"):
        return _tree_state(view, path[:-1])
    side = lstat(view, path) if dirs is None else dirs.lstat(path)
    data = None
    if side is not None and side.kind == "file":
        data = view.read_bytes(path) if dirs is None else dirs.read_regular(path, missing_ok=False)
    return state_text(side, data)


def tree_key(path: str) -> str:
    """The key a directory's whole tree is recorded under, beside the directory's own state.

    A directory's own state (kind and mode) says nothing of what lies below it, and a
    capsule that deletes a directory, replaces it, or makes it opaque (``rm -rf d; mkdir
    d``) changes only that one path in its change list: its promotion then deletes the
    live directory with whatever is in it now.  So where such a directory's base state is
    recorded, the state of its tree is recorded too, under this key, and promotion finds
    an edit or a new file made below it meanwhile (REPO_CHANGED), as it does for a file."""
    return f"{path}/"


def keyed_path(key: str) -> str:
    """The path a recorded key is about: itself, or the directory of a ``tree_key``."""
    return key[:-1] if key.endswith("/") else key


def shown_state(state: str) -> Any:
    """``base_state``'s text as a refusal's details show it: its JSON object, not that object's
    text quoted inside the details' JSON; "absent" as it is."""
    return state if state == "absent" else json.loads(state)


def is_dir_state(state: str) -> bool:
    """Whether ``state`` (``base_state``'s text) is a directory's (canonical text: "kind" comes first)."""
    return state.startswith('{"kind":"dir",')


def _tree_state(view: RootView, path: str) -> str:
    """The state of every entry below ``path`` (their paths and ``base_state``s, digested), or
    the path's own state where it is no directory."""
    side = lstat(view, path)
    if side is None or side.kind != "dir":
        return base_state(view, path)
    digest, count = blake3.blake3(), 0
    with DirFds(view) as dirs:
        for child in sorted(_descendants(view, path), key=lambda p: p.encode("utf-8", "surrogateescape")):
            digest.update(f"{child}\0{base_state(view, child, dirs)}\n".encode("utf-8", "surrogateescape"))
            count += 1
    return canonical_text({"kind": "tree", "entries": count, "blake3": digest.hexdigest()})


def state_text(side: Side | None, data: bytes | None = None, digest: str | None = None) -> str:
    """``base_state``'s text of a state already read (``data``: a file's bytes, or ``digest``: their blake3)."""
    if side is None:
        return "absent"
    if side.kind == "file":
        assert data is not None or digest is not None
        if data is not None:
            digest = blake3.blake3(data).hexdigest()
        if digest is not None and digest.isascii() and digest.isalnum():
            # canonical_text's own text for these three keys (a hex digest needs no escape), written
            # out: a merge's live check takes 2,000, 19 against 4 ms on this VM.
            return f'{{"blake3":"{digest}","kind":"file","mode":{int(side.mode)}}}'
    state: dict[str, Any] = {"kind": side.kind, "mode": side.mode}
    if side.kind == "symlink":
        state["target"] = side.target
    elif side.kind == "file":
        state["blake3"] = digest
    return canonical_text(state)
