"""The git dir a workspace needs from outside it: a worktree's common dir, a submodule's gitdir (issue 25).

A workspace made by ``git worktree add`` has a ``.git`` *file*, ``gitdir:
/repo/.git/worktrees/NAME``; that admin dir's ``commondir`` file (``../..``) leads to the
repository's own ``.git``, which holds the objects and refs.  A submodule checked out as
the workspace has ``gitdir: ../.git/modules/sub`` and no commondir.  The directory the
jail must show is the common dir (which contains the worktree's admin dir) or, for a
submodule, the gitdir itself; the helper shows it copy-on-write (sandbox/gitdirs.py).

The ``.git`` file is content an agent may have written in an earlier capsule, so it is
read as hostile: bounded reads of regular files only (never a FIFO, a device or a
symlink at the last step), and the directory it leads to must be a git dir (``HEAD``,
``objects/``, ``refs/``), lie outside the workspace, be readable by the caller and pass
``check_expose_dir`` (never a system dir, a home or a home's secrets).  A refusal is not
an error: the capsule is made without the git dir and ``find`` says why git will not
work in it.

What the capsule's git changed there is listed apart by capsule_diff and capsule_promote
(``listing``); promotion carries the branches and tags it moved (capsules/gitpromote.py)
and refuses a ref it cannot carry (``left_behind``), never copying the git dir itself.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sandbox.errors import CcwError
from sandbox.homes import Home
from sandbox.hostdirs import check_expose_dir, inside
from sandbox.replies import GitdirChanges

MAX_FILE = 4096  # git's own .git files and commondir are one short line
MAX_LISTED = 100  # paths of a git dir's change a promotion result lists (a `git add` of a tree makes thousands)
# What moves a branch, a tag or HEAD, in a common dir (a worktree's own under worktrees/NAME/).
_REF_RE = re.compile(r"(?:worktrees/[^/]+/)?(?:HEAD|packed-refs|refs/.+)")
PROMOTABLE_RE = re.compile(r"refs/(?:heads|tags)/[^\0\s:]+")  # what promotion carries (git check-ref-format too)


@dataclass(frozen=True)
class Found:
    """What a workspace's ``.git`` file leads to: the dir to show, or why git will not work (both None
    when the workspace has no ``.git`` file: a plain repository, or none)."""

    gitdir: str | None = None
    note: str | None = None


def parse_gitfile(data: bytes, base: str, what: str) -> str:
    """The path a ``.git`` file (``gitdir: PATH``) or a ``commondir`` file (``PATH``) names, absolute
    and normalised, relative paths taken from ``base``; ValueError saying why when it names none."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{what} is not UTF-8 text") from None
    if what == ".git":
        if not text.startswith("gitdir: "):
            raise ValueError(".git is a file that does not start with 'gitdir: '")
        text = text[len("gitdir: "):]
    path = text.rstrip("\r\n\t ")  # git strips the trailing newline and spaces
    if not path or "\0" in path or "\n" in path:
        raise ValueError(f"{what} names no path")
    return os.path.normpath(os.path.join(base, path))


def read_small(path: str) -> bytes | None:
    """A regular file's bytes (at most MAX_FILE), never following a final symlink nor opening
    anything else (a FIFO would block, a device could answer forever); None if absent."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError(f"{path} is a symlink") from None
        raise ValueError(f"{path} cannot be read: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path} is not a regular file")
        if st.st_size > MAX_FILE:
            raise ValueError(f"{path} is larger than {MAX_FILE} bytes")
        data = os.read(fd, MAX_FILE + 1)
        if len(data) > MAX_FILE:
            raise ValueError(f"{path} is larger than {MAX_FILE} bytes")
        return data
    finally:
        os.close(fd)


def find(workspace: str, caller_uid: int, homes: tuple[Home, ...]) -> Found:
    """The git dir to show for ``workspace`` (absolute, resolved), or why git will not work in it."""
    try:
        st = os.lstat(os.path.join(workspace, ".git"))
    except OSError:
        return Found()
    if stat.S_ISDIR(st.st_mode):
        return Found()  # a plain repository: its .git/ is in the workspace
    try:
        return Found(gitdir=_common_dir(workspace, caller_uid, homes))
    except (ValueError, CcwError) as exc:
        # check_expose_dir's advice is about toolchains; what is refused is the point here.
        why = exc.message.split("; expose")[0] if isinstance(exc, CcwError) else str(exc)
        return Found(note=f"git will not work in this capsule: {why}")


def _common_dir(workspace: str, caller_uid: int, homes: tuple[Home, ...]) -> str:
    data = read_small(os.path.join(workspace, ".git"))
    assert data is not None  # lstat found it
    gitdir = os.path.realpath(parse_gitfile(data, workspace, ".git"))
    check_expose_dir("gitdir", gitdir, caller_uid, homes)  # before anything in it is read
    if not os.path.isdir(gitdir):
        raise ValueError(f".git names {gitdir}, which is not a directory")
    common = read_small(os.path.join(gitdir, "commondir"))
    real = gitdir if common is None else os.path.realpath(parse_gitfile(common, gitdir, "commondir"))
    check_expose_dir("gitdir", real, caller_uid, homes)
    if not inside(gitdir, real):
        raise ValueError(f"the worktree's git dir {gitdir} lies outside its common dir {real}")
    if inside(real, workspace) or inside(workspace, real):
        raise ValueError(f"the git dir {real} and the workspace overlap")
    if not os.access(real, os.R_OK | os.X_OK):
        raise ValueError(f"you may not read the git dir {real}")
    # The helper checks again, without following links (sandbox/gitdirs.py); this is for the note.
    if not all(check(os.path.join(real, name)) for name, check in
               (("HEAD", os.path.isfile), ("objects", os.path.isdir), ("refs", os.path.isdir))):
        raise ValueError(f"{real} is not a git dir: it needs HEAD, objects/ and refs/")
    return real


def ref_paths(paths: Iterable[str]) -> list[str]:
    """The paths among a git dir's changed files (relative to it) that are refs: HEAD, packed-refs,
    refs/** (a worktree's own too), sorted.  A commit, a branch or a tag changes one."""
    return sorted(path for path in paths if _REF_RE.fullmatch(path))


def left_behind(found: Sequence[GitdirChanges] | None) -> list[dict[str, Any]]:
    """What a promotion does with the capsule's git dirs: [{gitdir, count, paths, refs}], ``refs`` the
    branches and tags it carries to the host (capsules/gitpromote.py), ``paths`` (files only, the
    first MAX_LISTED) what changed there; the rest of a git dir (objects the refs do not need, the
    index, logs, config, hooks) stays in the capsule.  UNSUPPORTED, before anything is written, when
    the capsule's git moved a ref promotion cannot carry: dropping it would silently lose commits.
    """
    deleted = {(one.path, change.path) for one in found or () for change in one.changes if change.kind == "deleted"}
    out = listing(found)
    for one in out:
        bad = [ref for ref in one["refs"] if not PROMOTABLE_RE.fullmatch(ref) or (one["gitdir"], ref) in deleted]
        if bad:
            raise CcwError(
                "UNSUPPORTED",
                f"the capsule's git moved {', '.join(bad[:5])}{', …' if len(bad) > 5 else ''} in {one['gitdir']}: "
                "promotion carries new and fast-forwarded branches and tags (refs/heads/*, refs/tags/*), nothing "
                "else of a git dir; nothing was written. Move those back in the capsule (git checkout the branch, "
                "git reset --soft to where it was) and redo them on the host after promoting",
                {"gitdir": one["gitdir"], "refs": bad},
            )
    return out


def listing(found: Sequence[GitdirChanges] | None) -> list[dict[str, Any]]:
    """Each changed git dir: {gitdir, count, paths (the first MAX_LISTED files), refs (those moved)}."""
    out: list[dict[str, Any]] = []
    for one in found or ():
        paths = [change.path for change in one.changes if change.type != "dir"]
        if paths:
            out.append({"gitdir": one.path, "count": len(paths), "paths": paths[:MAX_LISTED], "refs": ref_paths(paths)})
    return out
