"""A capsule's git dirs outside its workspace: a worktree's common dir, a submodule's gitdir (issue 25).

A git worktree's ``.git`` is a file naming ``/repo/.git/worktrees/NAME``, and a
submodule's names ``/super/.git/modules/sub``: without that directory git in the jail
says "not a git repository".  The front end reads the ``.git`` file and puts the
directory to show in ``CapsuleSpec.gitdirs`` (mcp_server/capsules/gitdirs.py); this module
is the helper's side.

* **Copy-on-write, like the workspace.**  Each git dir gets its own overlay: the host
  dir is the lower layer, ``gitdir-<i>-upper`` and ``gitdir-<i>-work`` sit beside the
  capsule's own upper (on its disk, when it has one, so the disk limit covers what git
  writes), the merged view is ``gitdir-<i>-merged`` in the capsule dir, and the jail
  shows it read-write at the git dir's own path.  A commit made in the capsule (objects,
  refs, the worktree's index and admin dir) lands in that upper dir; the host repository
  does not change.
* **Checked again here.**  The ``.git`` file is content an agent may have written, so the
  spec's paths are hostile: each is pinned by a descriptor, must be named by its resolved
  path (the jail shows it there, nowhere a link would put it), be a git dir (``HEAD``,
  ``objects/``, ``refs/``), pass ``hostdirs.check_expose_dir`` under every path it is mounted
  at (never a system dir or a home's secrets), lie outside the workspace and the state
  dir (and hold neither), and be readable and searchable by the caller (access.py).
* **Meta.**  ``meta.json``'s ``gitdirs`` holds each overlay's lower stack, top first, as
  ``lowers`` does for the workspace: ``[host dir]`` for a capsule, ``[parent's
  gitdir-<i>-upper, *parent's stack]`` for a fork, so forks and crash recovery stack and
  remount them the same way.  A fork freezes the parent's git dir overlays with its main one.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator, Sequence
from typing import Any

from sandbox import access, mounts, overlay, upperscan
from sandbox.errors import CcwError, from_oserror
from sandbox.hostdirs import inside
from sandbox.meta import Capsule
from sandbox.replies import GitdirChanges

MARKS = (("HEAD", stat.S_ISREG), ("objects", stat.S_ISDIR), ("refs", stat.S_ISDIR))


def not_a_gitdir(dir_fd: int) -> str | None:
    """Why the directory ``dir_fd`` is not a git dir (no HEAD file, objects/ or refs/ dir); None if it is."""
    for name, is_kind in MARKS:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            return f"it has no {name}"
        if not is_kind(st.st_mode):
            return f"its {name} is not a {'file' if name == 'HEAD' else 'directory'}"
    return None


def name(index: int, part: str) -> str:
    """A capsule dir of git dir ``index``: part is upper, work (on the capsule's disk) or merged."""
    return f"gitdir-{index}-{part}"


def layers(capsule: Capsule) -> list[list[str]]:
    """Each git dir overlay's lower stack, top first (meta.json's ``gitdirs``)."""
    return [list(stack) for stack in capsule.meta.get("gitdirs") or []]


def fork_mounts(parent: Capsule) -> list[tuple[os.stat_result, list[str]]]:
    """A fork's git dir overlays: the parent's merged root's attributes, and the lower stack
    (the parent's upper above the parent's stack)."""
    return [(os.stat(parent.path(name(i, "merged"))), [parent.path(name(i, "upper")), *stack])
            for i, stack in enumerate(layers(parent))]


def binds(capsule: Capsule) -> tuple[mounts.Bind, ...]:
    """The jail's read-write binds of the capsule's git dir overlays, each at its host path."""
    return tuple(mounts.Bind(capsule.path(name(i, "merged")), target, writable=True)
                 for i, target in enumerate(capsule.spec.gitdirs))


@contextlib.contextmanager
def pinned(gitdirs: Sequence[str], workspace: str, lower: str, uid: int, gid: int,
           state_dir: str) -> Iterator[list[tuple[int, str]]]:
    """Each of the spec's git dirs checked and pinned: (O_PATH descriptor, resolved path); closed after."""
    held: list[tuple[int, str]] = []
    try:
        for path in gitdirs:
            try:
                fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError as exc:
                raise from_oserror(exc, "open gitdir", path, "the git dir must be an existing directory") from exc
            held.append((fd, os.readlink(f"/proc/self/fd/{fd}")))
            _check(fd, path, held[-1][1], (workspace, lower, state_dir), uid, gid)
        yield held
    finally:
        for fd, _ in held:
            os.close(fd)


def _check(fd: int, given: str, real: str, others: tuple[str, ...], uid: int, gid: int) -> None:
    if real != given:  # the jail shows it at this path: where it really is, nowhere a link would put it
        raise CcwError("INVALID_ARGUMENT", f"gitdir {given!r} leads to {real}: name git dirs by their resolved path",
                       {"argument": "gitdir", "path": real})
    for other in others:
        if inside(real, other) or inside(other, real):
            raise CcwError("PERMISSION_DENIED", f"gitdir {given!r} (the directory {real}) overlaps {other!r}: "
                           "a git dir to show must lie outside the workspace and the helper's state dir",
                           {"argument": "gitdir", "path": real})
    access.check_shown_dir("gitdir", fd, given, uid, gid)
    why = not_a_gitdir(fd)
    if why is not None:
        raise CcwError("INVALID_ARGUMENT", f"gitdir {given!r} is not a git dir: {why}",
                       {"argument": "gitdir", "path": real})


def make_dirs(data: str, count: int, roots: Sequence[os.stat_result], rootless: bool) -> None:
    """Each git dir overlay's upper and work dirs in ``data`` (the capsule's disk or dir).

    The upper root takes the host git dir's owner and mode, as the workspace's does.
    """
    for i in range(count):
        upper, work = os.path.join(data, name(i, "upper")), os.path.join(data, name(i, "work"))
        for path in (upper, work):
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, 0o700)
        if i < len(roots):
            with contextlib.suppress(OSError) if rootless else contextlib.nullcontext():
                os.chown(upper, roots[i].st_uid, roots[i].st_gid)
            os.chmod(upper, stat.S_IMODE(roots[i].st_mode))


def mount_all(capsule: Capsule, rootless: bool, stacks: list[list[str]] | None = None) -> None:
    """Mount each git dir overlay (``stacks``: the lowers to mount from, default the meta's)."""
    for i, stack in enumerate(stacks if stacks is not None else layers(capsule)):
        merged = capsule.path(name(i, "merged"))
        with contextlib.suppress(FileExistsError):
            os.mkdir(merged, 0o755)
        if os.path.ismount(merged):
            continue
        try:
            overlay.prepare(stack, capsule.path(name(i, "upper")), capsule.path(name(i, "work")), merged, rootless)
        except OSError as exc:
            raise from_oserror(exc, "mount git dir overlay", merged) from exc


def set_frozen(capsule: Capsule, frozen: bool) -> None:
    """Make the git dir overlays read-only (a fork stacks on their uppers) or writable again."""
    for i in range(len(layers(capsule))):
        overlay.set_readonly(capsule.path(name(i, "merged")), frozen)


def changes(capsule: Capsule) -> tuple[GitdirChanges, ...]:
    """Each git dir's changes against the host's (a fork's include its ancestors'), as ``changes`` lists them."""
    depth = len(capsule.ancestors)
    return tuple(GitdirChanges(path, tuple(upperscan.collect_changes([capsule.path(name(i, "upper")), *stack[:depth]],
                                                                   stack[depth:])))
                 for i, (path, stack) in enumerate(zip(capsule.spec.gitdirs, layers(capsule), strict=True)))


def describe(capsule: Capsule) -> list[dict[str, Any]]:
    """The git dirs shown, for the reply's isolation: where, and that it is copy-on-write."""
    return [{"path": path, "copy_on_write": True} for path in capsule.spec.gitdirs]
