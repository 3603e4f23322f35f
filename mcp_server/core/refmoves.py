"""Which ref changes in a git directory of the workspace are ``git_control`` (core/hazards.py).

Refs are git's data, and a commit made in a capsule moves one: ``git commit`` moves the
checked-out branch forward, ``git branch`` and ``git tag`` make new ones.  But a ref also
says which commit a name means, so a capsule that moves an existing one changes what the
host checks out, builds or undoes to, where the promoted diff shows nothing: ``git tag -f
v1.0 EVIL`` has whoever builds v1.0 build another commit; ``git reset --hard HEAD~3`` or
``git branch -f main X`` drops the branch's commits; ``refs/remotes/*`` say what the remote
holds, and ``git pull --rebase`` or ``git reset --hard origin/main`` take it at its word.
So a new ref, and a branch moved to a descendant of its commit (a fast-forward), are
plain; a moved tag, a branch moved elsewhere, a deleted ref and any change under
``refs/remotes/`` are hazards.  ``FETCH_HEAD`` set, and ``ORIG_HEAD`` set to a commit outside
the history the person has once promoted (the new HEAD's or the old one's: ``git stash``, a
fast-forward merge and ``git reset --soft HEAD~1`` set it inside), would be too; a promotion
leaves them behind instead (``left_behind``), as it does REBASE_HEAD.  ``git commit
--amend`` of a commit the capsule made still fast-forwards; of one the workspace has, it
rewrites that branch's history and is a hazard, as a rebase is.  Deleting ``ORIG_HEAD``
or ``FETCH_HEAD`` undoes nothing to what git would run or check out.  ``MERGE_HEAD``,
``CHERRY_PICK_HEAD`` or ``REVERT_HEAD`` set is an unfinished merge, cherry-pick or revert
(``STOPPED_HEADS``): the person's next plain ``git commit`` takes that commit as a parent, or
its author, where the promoted diff shows neither; a hazard, as a rebase stopped midway is
(its directory is no git data).  Pure logic: the
caller (capsules/gitrefs.py) reads the values and asks git whether a branch descends,
and whether ORIG_HEAD's commit is in that history.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from mcp_server.core import hazards

_HEX = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
# Written by git reset, merge, rebase and pull; what git's usual undo and merge of a fetch take.
UNDO_HEADS = {"ORIG_HEAD": "git reset --hard ORIG_HEAD, the usual undo of a merge, rebase or reset, goes to it",
              "FETCH_HEAD": "git merge FETCH_HEAD and git pull take it as what the remote holds"}
# Pseudorefs a promotion leaves behind rather than refuse: an undo head ``reason`` would refuse;
# REBASE_HEAD, which git 2.39 leaves after a finished ``rebase -i`` that squashed (the commit it
# last stopped at); AUTO_MERGE, the tree a merge or cherry-pick with conflicts wrote, left after it
# (``git diff AUTO_MERGE`` reads it).  Only git's own undo, continue and that diff read them, and
# the host's stay as they were: a person's ``git reset --hard ORIG_HEAD`` then never reaches a
# commit the promotion did not show.  Squashing its own commits before promotion is an agent's
# habit; each was a refusal.
# Written by a merge, cherry-pick or revert that stopped before its commit; the next git commit reads them.
STOPPED_HEADS = {"MERGE_HEAD": "the person's next git commit makes a merge with it as a parent",
                 "CHERRY_PICK_HEAD": "the person's next git commit takes its author and message",
                 "REVERT_HEAD": "the person's next git commit concludes a revert of it"}
LEFT_BEHIND = "pseudoref"  # the reason a promotion gives for skipping one
ALWAYS_LEFT = ("REBASE_HEAD", "AUTO_MERGE")


@dataclass(frozen=True)
class RefChange:
    """A ref whose value a promotion would change in a git directory of the workspace."""

    path: str  # the changed path that carries it: the loose ref's file, packed-refs, ORIG_HEAD
    ref: str  # as git names it: refs/tags/v1.0, ORIG_HEAD
    old: str | None  # its value in the workspace (an object id, or "ref: NAME"); None: absent
    new: str | None  # its value once promoted; None: absent
    descends: bool = False  # both are commits and new descends from old; ORIG_HEAD: new is in the promoted history


def reasons(refs: Iterable[RefChange]) -> dict[str, str]:
    """The hazard's reason for each changed path that carries a ref changed as ``reason`` refuses."""
    found: dict[str, list[str]] = {}
    for ref in refs:
        why = reason(ref)
        if why is not None:
            found.setdefault(ref.path, []).append(why)
    return {path: "; ".join(whys) for path, whys in found.items()}


def left_behind(refs: Iterable[RefChange], paths: Iterable[str], bare_gitdirs: Collection[str] = ()) -> set[str]:
    """Which changed ``paths`` a promotion leaves behind (``LEFT_BEHIND``): those of the undo heads in
    ``refs`` that ``reason`` would refuse, and any ``ALWAYS_LEFT`` of a git directory."""
    found = {ref.path for ref in refs if ref.ref in UNDO_HEADS and reason(ref) is not None}
    for path in paths:
        inside = hazards.in_gitdir(path, bare_gitdirs)
        if inside is not None and inside[1].upper() in ALWAYS_LEFT:
            found.add(path)
    return found


def is_oid(value: str) -> bool:
    """Whether ``value`` is an object id (SHA-1 or SHA-256, as git writes them)."""
    return _HEX.fullmatch(value) is not None


def _shown(value: str | None) -> str:
    return "nothing" if value is None else value[:12] if _HEX.fullmatch(value) else repr(value[:80])


def reason(ref: RefChange) -> str | None:
    """Why changing ``ref`` so is ``git_control``, or None (a new ref, a branch moved forward)."""
    old, new = _shown(ref.old), _shown(ref.new)
    if ref.ref in UNDO_HEADS:
        plain = ref.new is None or ref.new == ref.old or (ref.ref == "ORIG_HEAD" and ref.descends)
        return None if plain else f"{ref.ref} set to {new}: {UNDO_HEADS[ref.ref]}"
    if ref.old == ref.new:
        return None
    if ref.ref in STOPPED_HEADS:
        return None if ref.new is None else (
            f"{ref.ref} set to {new}, an unfinished merge, cherry-pick or revert: {STOPPED_HEADS[ref.ref]}, which "
            "the promoted diff does not show; finish it (git commit) or abort it in the capsule")
    space, _, name = ref.ref.removeprefix("refs/").partition("/")
    what = {"heads": "branch", "tags": "tag", "remotes": "remote-tracking ref"}.get(space) if name else None
    shown = f"{what} {name}" if what else f"ref {ref.ref}"
    if what == "remote-tracking ref":
        happened = "made" if ref.old is None else "deleted" if ref.new is None else f"moved from {old}"
        return (f"{shown} {happened}{'' if ref.new is None else f' at {new}'}: it says what the remote holds, and "
                "git pull, rebase and reset onto it take its commit")
    if ref.old is None:
        return None
    if ref.new is None:
        return f"{shown} deleted (it named {old}): the commits only it names would drop out of the repository"
    if what == "branch":
        return None if ref.descends else (
            f"{shown} moved from {old} to {new}, which does not descend from it (a rewind, reset, rebase or amend of "
            "a commit the workspace has): its commits would drop out of the branch")
    if what == "tag":
        return f"{shown} moved from {old} to {new}: who checks out, builds or verifies {name} gets another commit"
    return f"{shown} moved from {old} to {new}: git would take that name for another commit"


def commit_parents(data: bytes) -> list[str] | None:
    """The parents named by a loose object's bytes (zlib of ``commit SIZE\\0BODY``), or None if no commit."""
    try:
        raw = zlib.decompress(data)
    except zlib.error:
        return None
    head, nul, body = raw.partition(b"\0")
    if not nul or not head.startswith(b"commit "):
        return None
    parents = []
    for line in body.split(b"\n"):
        if not line:
            break  # the headers end at the first blank line
        key, _, value = line.partition(b" ")
        if key == b"parent":
            parents.append(value.decode("ascii", "replace"))
    return parents
