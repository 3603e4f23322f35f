"""The refs a promotion would change in a git directory inside the workspace, for core/refmoves.py to judge.

A ref's old value is the live workspace's (promotion's conflict check holds every changed
path to it); its new value is the capsule's at a changed path and the workspace's
elsewhere, a loose ref's file read over ``packed-refs`` as git reads them.  Whether a
branch moved forward: the loose commits the capsule wrote, whose bytes hash to their
names (``checked_data``), are walked here back to the first commits it did not write,
and the workspace's own git says whether the old commit is an ancestor of those (hooks
and fsmonitor off, no inherited ``GIT_*``).  An ordinary commit's parent is the branch's
old commit, so no git runs for it.  The capsule's git directory is never run on the host:
its config could name programs (a promisor remote's lazy fetch runs its transport).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable
from typing import Protocol

from mcp_server.core import hazards, refmoves
from mcp_server.core.refmoves import RefChange
from mcp_server.fs.changeset import Entry
from mcp_server.fs.fingerprint import NO_HOOKS, git_env, run_git
from mcp_server.fs.view import DirFds, RootView
from sandbox.errors import CcwError

MAX_WALK = 10_000  # new commits walked for one branch; past that it counts as not moved forward
MAX_REF_FILE = 1 << 16  # a loose ref is one line (FETCH_HEAD a few): larger reads as garbage
TIMEOUT_S = 60
_HARDENED = ("-c", "safe.directory=*", *NO_HOOKS)


def changes(capsule: RootView, workspace: str, entries: Iterable[Entry], bare_gitdirs: Collection[str],
            checked_data: Collection[str]) -> list[RefChange]:
    """Every ref whose value promoting ``entries`` would change, in every git directory they are in."""
    by_gitdir: dict[str, dict[str, str]] = {}  # git dir -> its changed ref paths, relative -> workspace path
    for entry in entries:
        inside = hazards.in_gitdir(entry.path, bare_gitdirs)
        if inside is not None and _ref_name(inside[1]) is not None:
            by_gitdir.setdefault(inside[0], {})[inside[1]] = entry.path
    if not by_gitdir:
        return []
    out: list[RefChange] = []
    with RootView.open(workspace) as live_view, DirFds(live_view) as live, DirFds(capsule) as new:
        for gitdir, rels in by_gitdir.items():
            out.extend(_changes(live, new, workspace, gitdir, rels, checked_data))
    return out


def _ref_name(rel: str) -> str | None:
    """The ref a path of a git directory holds (``packed-refs``: "", several), or None."""
    folded = rel.casefold()
    if folded.startswith("refs/"):
        return "refs/" + rel[5:]
    if folded == "packed-refs":
        return ""
    return rel.upper() if rel.upper() in refmoves.UNDO_HEADS.keys() | refmoves.STOPPED_HEADS.keys() else None


def _changes(live: DirFds, capsule: DirFds, workspace: str, gitdir: str, rels: dict[str, str],
             checked_data: Collection[str]) -> list[RefChange]:
    prefix = f"{gitdir}/" if gitdir else ""
    packed_path = next((path for rel, path in rels.items() if _ref_name(rel) == ""), None)
    old_packed = _packed(_read(live, f"{prefix}packed-refs"))
    new_packed = old_packed if packed_path is None else _packed(_read(capsule, packed_path))
    carried: dict[str, tuple[str, str]] = {}  # ref -> (its loose file, the changed path that carries it)
    for rel, path in rels.items():
        name = _ref_name(rel)
        if name:
            carried[name] = (path, path)
    for name in old_packed.keys() | new_packed.keys():
        if old_packed.get(name) != new_packed.get(name) and packed_path is not None:
            carried.setdefault(name, (prefix + name, packed_path))
    changed = set(rels.values())
    out = []
    for name, (loose, path) in sorted(carried.items()):
        old = _loose(live, loose) or old_packed.get(name)
        new = _loose(capsule if loose in changed else live, loose) or new_packed.get(name)
        if old == new:
            continue
        host = os.path.join(workspace, gitdir)
        if name == "ORIG_HEAD":
            forward = new is not None and _in_history(new, live, capsule, prefix, new_packed, old_packed, checked_data,
                                                      host)
        else:
            forward = (name.startswith("refs/heads/") and old is not None and new is not None
                       and _descends(old, new, capsule, prefix, checked_data, host))
        out.append(RefChange(path, name, old, new, forward))
    return out


class Reads(Protocol):
    """A tree whose regular files can be read by path (``DirFds``, or capsules/gitindex.py's view of
    the workspace as promotion leaves it)."""

    def read_regular(self, path: str) -> bytes | None: ...


def head_commit(view: Reads, prefix: str, packed: dict[str, str] | None = None) -> str | None:
    """The commit HEAD names in the git directory at ``prefix`` of ``view`` (through the branch it names:
    its loose file, else ``packed``, read from the view's ``packed-refs`` when not given)."""
    text = _loose(view, f"{prefix}HEAD") or ""
    if refmoves.is_oid(text):
        return text
    name = text[5:].strip() if text.startswith("ref: ") else ""
    if not name.startswith("refs/") or ".." in name.split("/"):
        return None
    found = _loose(view, prefix + name)
    if found is not None:
        return found if refmoves.is_oid(found) else None
    return (packed if packed is not None else _packed(_read(view, f"{prefix}packed-refs"))).get(name)


def _in_history(oid: str, live: DirFds, capsule: DirFds, prefix: str, new_packed: dict[str, str],
                old_packed: dict[str, str], checked_data: Collection[str], gitdir: str) -> bool:
    """Whether commit ``oid`` is in the history the person has once promoted: the new HEAD's (through the
    capsule's verified commits, then the host's git) or the old HEAD's (the host's).  ``git stash``, a
    fast-forward ``git merge`` and ``git reset --soft HEAD~1`` set ORIG_HEAD to such a commit, and
    ``git reset --hard ORIG_HEAD`` then goes nowhere the person's own history does not."""
    if not refmoves.is_oid(oid):
        return False
    new_head, old_head = head_commit(capsule, prefix, new_packed), head_commit(live, prefix, old_packed)
    if oid in (new_head, old_head):
        return True
    return ((new_head is not None and _descends(oid, new_head, capsule, prefix, checked_data, gitdir))
            or (old_head is not None and refmoves.is_oid(old_head) and _host_ancestor(gitdir, oid, old_head)))


def _read(view: Reads, path: str) -> bytes | None:
    try:
        return view.read_regular(path)
    except CcwError:
        return None  # a directory on the way is a file there: no such ref


def _loose(view: Reads, path: str) -> str | None:
    data = _read(view, path)
    if data is None:
        return None
    return data.decode("utf-8", "replace").strip() if len(data) <= MAX_REF_FILE else "(a file too large for a ref)"


def _packed(data: bytes | None) -> dict[str, str]:
    """A ``packed-refs`` file's refs (its peeled ``^`` lines, which follow their tag, aside)."""
    out = {}
    for line in (data or b"").decode("utf-8", "replace").splitlines():
        oid, _, name = line.partition(" ")
        if name and not line.startswith(("#", "^")):
            out[name.strip()] = oid
    return out


def _descends(old: str, new: str, capsule: DirFds, prefix: str, checked_data: Collection[str], gitdir: str) -> bool:
    """Whether commit ``new`` descends from ``old``: through the capsule's new loose commits, then the host's git."""
    seen: set[str] = set()
    todo, boundary = [new], []
    while todo:
        oid = todo.pop()
        if oid == old:
            return True
        if oid in seen or not refmoves.is_oid(oid):
            continue
        seen.add(oid)
        if len(seen) > MAX_WALK:
            return False
        path = f"{prefix}objects/{oid[:2]}/{oid[2:]}"
        data = _read(capsule, path) if path in checked_data else None
        parents = None if data is None else refmoves.commit_parents(data)
        if parents is None:
            boundary.append(oid)
        else:
            todo.extend(parents)
    return refmoves.is_oid(old) and any(_host_ancestor(gitdir, old, oid) for oid in boundary)


def _host_ancestor(gitdir: str, old: str, new: str) -> bool:
    proc = run_git(gitdir, *_HARDENED, "merge-base", "--is-ancestor", old, new, env=git_env({"GIT_DIR": gitdir}),
                   check=False, timeout_s=TIMEOUT_S)
    return proc.returncode == 0
