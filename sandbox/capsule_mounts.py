"""A capsule's mounts: made at create and fork, made again on first use after a restart,
made read-only while the capsule has forks, and taken down with its directory.

CapsuleManager (manager.py) decides when; this module does it, with the manager's lock
held where it says so.

Some facts about a capsule's mounts
-----------------------------------
* **Creation is O(1)** in the workspace's size: a handful of mkdirs, one small JSON
  file, one rename and one mount (capsule_dirs.py).  Nothing walks or copies the workspace.
* **Half-made states are named**: a capsule is built as ``.new-<id>`` and renamed into
  place (capsule_dirs.py), removed by renaming to ``.dead-<id>`` before its files go
  (``remove``), so recovery (recovery.py) knows what to delete after a crash.
* **A fork stacks** the child on ``parent upper : parent lowers``.  A lower layer must
  not change under a mount, so while a capsule has forks it is *frozen* (``set_frozen``):
  its mount is made read-only by the kernel (writes through open_root descriptors fail
  with EROFS; freezing fails with CONFLICT while a file is open for writing).
* **Git dirs outside the workspace** (a worktree's, a submodule's) get overlays of their
  own beside the capsule's, made, stacked, frozen and remounted with it (gitdirs.py).
* **After a restart** a capsule is mounted again on first use (``ensure_mounted``): its
  disk first, and the disks of the capsules whose uppers are its lower layers (its
  ancestors', and the donors' stacked into it or into an ancestor, fork_layers.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Mapping
from typing import Any

from sandbox import access, capsule_dirs, disk, gitdirs, overlay, services
from sandbox.errors import from_oserror
from sandbox.meta import Capsule
from sandbox.spec import CapsuleSpec


def materialise(capsules_dir: str, meta: dict[str, Any], spec: CapsuleSpec, root_st: os.stat_result,
                mount_lowers: list[str], gitdir_mounts: list[tuple[os.stat_result, list[str]]],
                disks: disk.Disks | None, rootless: bool) -> Capsule:
    """Build ``.new-<id>`` (``meta`` names the id), rename it into place and mount it (and its
    git dirs', from ``gitdir_mounts``: each host git dir's attributes and the lowers to mount).
    O(1) in the workspace; on failure nothing of it is left."""
    final = capsule_dirs.build(capsules_dir, meta, spec, root_st, [st for st, _ in gitdir_mounts], disks, rootless)
    capsule = Capsule(meta["capsule_id"], final, meta, spec, disk_ready=meta["disk_mb"] is not None)
    try:
        overlay.prepare(mount_lowers, capsule.path("upper"), capsule.path("work"), capsule.path("merged"), rootless)
        gitdirs.mount_all(capsule, rootless, [stack for _, stack in gitdir_mounts])
    except BaseException:
        overlay.teardown_under(final)
        shutil.rmtree(final, ignore_errors=True)
        raise
    capsule.mounted = True
    return capsule


def set_frozen(capsule: Capsule, frozen: bool) -> None:
    """Make a capsule's overlays (its git dirs' too) read-only while it has forks, or writable again;
    its running services are frozen meanwhile (services.py)."""
    overlay.set_readonly(capsule.path("merged"), frozen)
    gitdirs.set_frozen(capsule, frozen)
    services.apply(capsule)


def ensure_mounted(capsule: Capsule, capsules: Mapping[str, Capsule], rootless: bool) -> None:
    """Mount a capsule recovered from disk (its ancestors' disks first); call with the
    manager's lock held.  ``capsules``: every capsule of the helper, by id."""
    if capsule.mounted:
        return
    ensure_disks(capsule, capsules, rootless)
    # Git dirs first (each skipped once mounted): a failure leaves nothing to mount twice on retry.
    gitdirs.mount_all(capsule, rootless)
    overlay.prepare(capsule.lowers, capsule.path("upper"), capsule.path("work"), capsule.path("merged"), rootless)
    capsule.mounted = True
    if capsule.children:
        set_frozen(capsule, True)


def ensure_disks(capsule: Capsule, capsules: Mapping[str, Capsule], rootless: bool) -> None:
    """Mount the disks of a capsule and of every capsule whose upper is one of its lowers (its
    ancestors', its donors', theirs): each such lower lies in its own capsule's directory."""
    home = os.path.dirname(capsule.root) + "/"
    held = [lower[len(home):].split("/", 1)[0] for lower in capsule.lowers[: capsule.layers_above_base]
            if lower.startswith(home)]
    for one in (capsule, *(capsules[name] for name in held if name in capsules)):
        if one.disk_ready or one.disk_mb is None:
            continue
        target = one.path("disk")
        if not os.path.ismount(target):
            mount_fd = disk.mount_image(one.path("disk.img"))
            try:
                disk.attach(mount_fd, target)
            finally:
                os.close(mount_fd)
        access.make_private_dirs(target, one.meta["owner_uid"], one.meta["owner_gid"], exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(one.path("work"), 0o700)
        gitdirs.make_dirs(target, len(gitdirs.layers(one)), (), rootless)
        one.disk_ready = True


def remove(capsules_dir: str, root: str, capsule_id: str) -> None:
    """Unmount everything under a capsule's directory, rename it ``.dead-<id>`` and delete it."""
    overlay.teardown_under(root)
    dead = os.path.join(capsules_dir, f".dead-{capsule_id}")
    try:
        os.rename(root, dead)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise from_oserror(exc, "rename capsule dir", root) from exc
    shutil.rmtree(dead)
