"""Detached mount trees: the new mount API's pieces, each a descriptor until it is attached.

``mounts.build_root`` puts the jail's root tree together from these (its essay says why
the tree is built attached nowhere, ahead of time) on the helper's thread; ccw-jail
binds the terminal with the same calls (``mounts``: the "console" step) and, where no
tree could be built ahead, builds it in place (sandbox/jail/steps.c).

Some facts about the new mount API, as the jail uses it:

- ``fsopen``/``fsconfig``/``fsmount`` give a fresh filesystem as a mount attached
  nowhere; ``open_tree(OPEN_TREE_CLONE)`` gives a bind of a path (or, with
  ``AT_EMPTY_PATH``, of a descriptor's file), and ``move_mount`` puts either onto a path.
- A bind's source must be a mount of the caller's own mount namespace (or a detached
  tree): ``open_tree`` of a descriptor opened in another namespace, and ``mount(MS_BIND)``
  of its ``/proc/self/fd/N``, are refused (EINVAL, measured on 6.18).  The pty slave a
  caller sends was opened in the caller's namespace, so the jail's init (in a namespace
  of its own) binds it by the path its copy of the host's mounts gives it,
  ``/.oldroot/dev/pts/N``, after checking that path leads to descriptor 0's own inode;
  with the launch namespace (mounts.py) the helper clones that path in its own
  namespace instead, and the init checks the clone the same way.
- Overlayfs takes each layer by path and keeps a private clone of it.  A detached
  tmpfs is a layer on 6.15+ (named ``/proc/self/fd/N``), but one moved into a detached
  tree is refused (EINVAL, measured on 6.18); a root tree built attached in the jail's
  namespace (kernels before 6.15, or no spare: ccw-jail, steps.c) parks the mask on its empty /.oldroot
  and unmounts it once the overlay holds it.  Either way one mount sits at /etc.  The
  layers go to ``fsconfig`` as one ``lowerdir=mask:/etc`` string, which overlayfs's own
  parser (6.5+) and the legacy pass-through before it (sandbox/overlay.py) both take.
  A rootless helper mounts it in its user namespace like the rest.  An idmapped lower
  layer (a root caller's jail: sandbox/idmap.py) is a detached clone named the same way.
"""

from __future__ import annotations

import os
import stat

from sandbox import syscalls

_CLONE = syscalls.OPEN_TREE_CLONE | syscalls.OPEN_TREE_CLOEXEC | syscalls.AT_RECURSIVE
_MASK_ATTRS = syscalls.MOUNT_ATTR_NOSUID | syscalls.MOUNT_ATTR_NODEV
_ETC_MASK_DATA = "mode=0755,size=4k,nr_inodes=16"


def new_mount(fstype: str, data: str, attrs: int, strings: tuple[tuple[str, str], ...] = ()) -> int:
    """A fresh filesystem as a detached mount; ``data`` as for mount(2): ``key=value,flag``.

    ``strings`` are parameters set as they are (a value may hold ``,``).  Overlayfs before
    6.5 has a "legacy" context that joins them into a mount(2) string: ``lowerdir=a:b``
    means the same to both parsers.
    """
    context = syscalls.fsopen(fstype)
    try:
        for key, value in strings:
            syscalls.fsconfig(context, syscalls.FSCONFIG_SET_STRING, key, value)
        for option in data.split(","):
            key, has_value, value = option.partition("=")
            if has_value:
                syscalls.fsconfig(context, syscalls.FSCONFIG_SET_STRING, key, value)
            elif key:
                syscalls.fsconfig(context, syscalls.FSCONFIG_SET_FLAG, key)
        syscalls.fsconfig(context, syscalls.FSCONFIG_CMD_CREATE)
        return syscalls.fsmount(context, syscalls.FSMOUNT_CLOEXEC, attrs)
    finally:
        os.close(context)


def clone(source: str, attrs: int, dirfd: int = syscalls.AT_FDCWD, idmap: int | None = None) -> int:
    """A detached recursive bind of a path (``source`` "": of ``dirfd``'s file), ``attrs`` set on all of it.

    ``idmap``: a user namespace to show its owners through (sandbox/idmap.py), in the same call.
    """
    tree = syscalls.open_tree(dirfd, source, _CLONE | (0 if source else syscalls.AT_EMPTY_PATH))
    try:
        if idmap is not None:
            syscalls.mount_setattr("", attrs | syscalls.MOUNT_ATTR_IDMAP, flags=syscalls.AT_EMPTY_PATH
                                   | syscalls.AT_RECURSIVE, dirfd=tree, userns_fd=idmap)
        elif attrs:
            syscalls.mount_setattr("", attrs, flags=syscalls.AT_EMPTY_PATH | syscalls.AT_RECURSIVE, dirfd=tree)
    except BaseException:
        os.close(tree)
        raise
    return tree


def attach(tree: int, root: int, rel: str) -> None:
    """Move a detached mount onto ``rel`` under ``root`` (a tree, or AT_FDCWD); the descriptor is closed either way."""
    try:
        syscalls.move_mount(tree, "", root, rel, syscalls.MOVE_MOUNT_F_EMPTY_PATH)
    finally:
        os.close(tree)


def mountpoint_at(root: int, rel: str, is_file: bool = False) -> None:
    """A new mount point in the root tree (its parent is always made first)."""
    if is_file:
        os.mknod(rel, 0o644 | stat.S_IFREG, dir_fd=root)
    else:
        os.mkdir(rel, 0o755, dir_fd=root)
    # Built in the helper, whose umask (0077 as a service) must not make it 0700 root's;
    # umask is per process, so it is corrected here rather than changed meanwhile.
    os.chmod(rel, 0o644 if is_file else 0o755, dir_fd=root)


def _etc_mask(hidden: tuple[str, ...], hosts: str) -> int:
    """The overlay's top layer for /etc: a tiny tmpfs with an empty mode-0000 file per ``hidden``
    name, and ``hosts`` as the jail's hosts file."""
    mask = new_mount("tmpfs", _ETC_MASK_DATA, _MASK_ATTRS)  # unreachable: under the overlay
    try:
        for name in hidden:
            os.mknod(name, stat.S_IFREG, dir_fd=mask)  # mode 0: not even the owner reads it
        fd = os.open("hosts", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644, dir_fd=mask)
        try:
            os.write(fd, hosts.encode())  # a tmpfs takes a few hundred bytes whole
        finally:
            os.close(fd)
    except BaseException:
        os.close(mask)
        raise
    return mask


def etc_overlay(source: str, attrs: int, hidden: tuple[str, ...], hosts: str, idmap: int | None = None) -> int:
    """The jail's /etc: a read-only overlay of a mask hiding ``hidden`` names and holding ``hosts``
    as its hosts file, over the host's ``source``.

    The detached mask is named by its descriptor (see the essay on overlayfs layers); with
    ``idmap``, so is the lower layer, an idmapped clone of ``source`` (sandbox/idmap.py).
    """
    mask = _etc_mask(hidden, hosts)
    lower = None
    try:
        if idmap is not None:
            lower = clone(source, 0, idmap=idmap)
        layers = f"/proc/self/fd/{mask}:" + (source if lower is None else f"/proc/self/fd/{lower}")
        return new_mount("overlay", "", attrs, (("source", "ccw-etc"), ("lowerdir", layers)))
    finally:
        for fd in (mask, lower):
            if fd is not None:
                os.close(fd)
