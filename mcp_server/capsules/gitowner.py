"""Root writing into a git dir another uid owns: what its git made there goes to that owner.

Root's git (``as_branch``'s plumbing, capsules/branch.py; promotion's fetch and ref moves
of a worktree capsule's commits, capsules/gitpromote.py) writes loose objects, refs and
reflogs as root.  A directory git makes for them (``objects/ab``, ``refs/heads/ccw`` for
``ccw/fix``) then belongs to root, mode 0755, and the owner's own git can no longer add
an object there ("insufficient permission for adding an object to repository database")
nor a ref beside it.  Promotion keeps a replaced file's owner for the same reason.  So
the directories made during the write (``objects``, ``refs`` and ``logs`` are compared
before and after), everything in them, and the ref's own files are given to the owner of
the git dir.

Never through a link: each entry is opened beneath the git dir (RootView, no symlink
followed), checked and chowned through that one descriptor, and only a directory or a
regular file with one link that root owns is given; a directory's contents go before the
directory, while its owner cannot yet change them.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from mcp_server.fs.fingerprint import run_git
from mcp_server.fs.view import RootView
from sandbox.errors import CcwError

AREAS = ("objects", "refs", "logs")
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY


@dataclass(frozen=True)
class Before:
    """The git dir another uid owns, its owner, and the directories it held before root's git wrote."""

    common: str
    uid: int
    gid: int
    dirs: frozenset[str]


def before(workspace: str) -> Before | None:
    """What ``give_back`` compares with; None when there is nothing to give (not root, or root's repository)."""
    if os.geteuid() != 0:
        return None
    found = run_git(workspace, "rev-parse", "--path-format=absolute", "--git-common-dir", check=False)
    common = os.fsdecode(found.stdout.strip())
    if found.returncode != 0 or not common:
        return None
    st = os.stat(common)
    if st.st_uid == os.geteuid():
        return None
    with RootView.open(common) as view:
        return Before(common, st.st_uid, st.st_gid, frozenset(_dirs(view)))


def give_back(was: Before | None, files: Iterable[str] = ()) -> None:
    """Give the owner each directory made since ``was`` with what is in it, and ``files`` (paths in the
    git dir, such as the ref a branch was made at and its reflog)."""
    if was is None:
        return
    with RootView.open(was.common) as view:
        made = [path for path in _dirs(view) if path not in was.dirs]
        for path in sorted(made, key=lambda p: p.count("/"), reverse=True):  # the deepest first
            for name, kind in _listed(view, path) or ():
                if kind != "dir":
                    _give(view, f"{path}/{name}", was)
            _give(view, path, was)
        for path in files:
            _give(view, path, was)


def _dirs(view: RootView) -> Iterator[str]:
    pending = list(AREAS)
    while pending:
        path = pending.pop()
        entries = _listed(view, path)
        if entries is None:
            continue
        yield path
        pending += [f"{path}/{name}" for name, kind in entries if kind == "dir"]


def _listed(view: RootView, path: str) -> list[tuple[str, str]] | None:
    try:
        return view.listdir(path)
    except CcwError:
        return None  # gone, or not a directory: nothing of it to give


def _give(view: RootView, path: str, was: Before) -> None:
    try:
        fd = view.open_fd(path, _OPEN, write=True, what="chown")
    except CcwError:
        return  # gone meanwhile, or a link: never followed
    try:
        st = os.fstat(fd)
        plain = stat.S_ISDIR(st.st_mode) or (stat.S_ISREG(st.st_mode) and st.st_nlink == 1)
        if plain and st.st_uid == os.geteuid():
            os.fchown(fd, was.uid, was.gid)
    finally:
        os.close(fd)
