"""One overlayfs superblock per capsule: mount it, unmount it (what changed: upperscan.py).

Some facts about overlayfs
--------------------------

* A mount stacks read-only *lower* layers under one writable *upper* dir.  The first
  write to a lower file copies it up whole into the upper dir; after that the upper
  copy is the file.  So the upper dir alone says everything the capsule changed, and
  scanning it costs the size of the change, never the size of the workspace.
* A deleted lower entry leaves a *whiteout* in the upper dir: a character device with
  device number 0:0 (unprivileged users may create exactly this device since 5.8).
  A directory that replaces a lower directory (``rm -rf d; mkdir d``) is *opaque*: the
  xattr ``trusted.overlay.opaque="y"`` (``user.overlay.opaque`` with ``userxattr``)
  hides everything below it.  Newer kernels also write ``opaque="x"``, which means
  "may hold xattr whiteouts" and is *not* opaque; those xattr whiteouts come from
  composefs tooling and the kernel never creates them in an upper dir, so we do not
  look for them.
* ``redirect_dir`` lets a renamed lower directory be recorded as an xattr pointing at
  its old lower path, and ``metacopy`` lets chmod/chown copy up metadata only, leaving
  the data in the lower layer.  Both make the upper dir no longer self-describing: a
  scan would see an empty dir or a sparse file where the lower holds the content.  We
  turn both off (explicitly, whatever the module parameters say): renaming a lower
  directory then fails with EXDEV, and ``mv``, git and Python fall back to copy+delete.
* ``index`` ties the upper dir to the exact lower inodes (origin file handles) and
  refuses a remount over a different lower, which would break fork stacking and crash
  recovery; it is off, and so is ``nfs_export`` (it needs index).  With index off, the
  kernel only *warns* when a dir is the upper of one mount and a lower of another,
  which is exactly what a fork does (see below).
* Upper and work dir must be on the same filesystem (the work dir is where a copy-up is
  prepared before it is renamed into place); both live under the capsule's state dir.
* ``lowerdir`` is ordered top first.  A fork mounts ``lowerdir = parent's upper :
  grandparent's upper : … : base``, so the child sees its parent's view; the child's
  own writes land in its own upper and never reach the parent.
* A fork with donors (a merge's other inputs, fork_layers.py) puts each donor's own
  uppers, those above the chain it shares with the parent, on top of that stack.  This
  is sound because an upper dir here is self-describing (no redirects, no metacopy):
  its entries, whiteouts and opaque dirs mean the same over any lower stack that holds
  the base it was made over, so each donor's changes show as they did in the donor.
  Where two inputs changed one path the higher layer simply hides the other (an opaque
  or deleted directory hides what a lower input added inside it); the front end
  therefore writes every path more than one input changed, in or under, into the
  child's own upper, which lies above them all.
* Changing a lower layer under a mounted overlay is "undefined behaviour" in the
  kernel's words (no crash, no deadlock).  Our lower is usually the *live* workspace,
  which the user keeps editing: files the capsule has copied up are pinned, files it
  has not are read through and show the host's current bytes, and cached directory
  lookups may briefly show a stale listing.  ccw therefore treats a live-workspace
  capsule as "the workspace as of each read" and records base hashes lazily so that
  promotion can detect that the live tree moved; a frozen base (a materialised
  snapshot passed as ``base``) gives a lower that never changes.  For the same reason
  a fork's parent must not change while the fork exists: the capsule manager makes the
  parent's mount read-only (kernel-enforced) and refuses exec on it until its forks
  are gone.
* ``userxattr`` (5.11+) stores overlay xattrs as ``user.overlay.*``.  A rootless helper
  mounts inside a user namespace, where ``trusted.*`` is out of reach, so it must use
  it.  userxattr forbids metacopy and any redirect_dir but ``nofollow`` (even ``off``
  is refused with EINVAL, measured on 6.18); ``nofollow`` neither creates nor follows
  redirects, which is what ``off`` means for us.
* ``volatile`` skips syncing the upper dir, and after a host crash the kernel refuses
  to remount it until the work dir's ``incompat/volatile`` is removed by hand.  Capsule
  data must survive a helper restart (and should survive a host crash), so we do not
  use it.
* Mount options: ``mount(2)`` passes them as one string of at most a page, with ``:``
  and ``,`` in paths to escape.  The new mount API (``fsopen``/``fsconfig``) takes each
  layer as its own ``lowerdir+`` parameter (6.8+): no length limit for deep fork
  stacks, no escaping of user-chosen workspace paths, and the kernel's own error text
  can be read back from the context fd.  We use it, and fall back to ``mount(2)`` on
  kernels without it.
* Before 6.5 overlayfs had no parameter parser of its own: ``fsopen("overlay")``
  works, but its context is the generic "legacy" one, which accepts *any* key and
  only joins them into a mount(2) string that ``FSCONFIG_CMD_CREATE`` then rejects
  with EINVAL ("unrecognized mount option lowerdir+").  So whether ``lowerdir+`` is
  understood is asked with a key no kernel knows: a parser refuses it (EINVAL), the
  legacy context takes it.  Debian 12's 6.1 kernel is such a kernel.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Sequence
from typing import Any

from sandbox import fanotify, syscalls
from sandbox.errors import CcwError, from_oserror
from sandbox.mountinfo import mounts_under

log = logging.getLogger("ccw.capsules")

OPAQUE_XATTRS = ("trusted.overlay.opaque", "user.overlay.opaque")
_MOUNT_DATA_MAX = 4095  # mount(2) copies at most one page of option data


# --- mount / unmount ----------------------------------------------------------------


def prepare(lowers: Sequence[str], upper: str, work: str, merged: str, userxattr: bool) -> None:
    """Mount one overlay at ``merged``: ``lowers`` top first, ``upper``/``work`` writable."""
    if not lowers:
        raise CcwError("INVALID_ARGUMENT", "an overlay needs at least one lower dir")
    try:
        _mount_fsconfig(lowers, upper, work, merged, userxattr)
    except _NoNewMountApi:
        _mount_legacy(lowers, upper, work, merged, userxattr)


class _NoNewMountApi(Exception):
    pass


def _common_options(userxattr: bool) -> list[tuple[str, str | None]]:
    options: list[tuple[str, str | None]] = [
        # userxattr refuses redirect_dir=off (EINVAL); nofollow neither creates nor follows.
        ("redirect_dir", "nofollow" if userxattr else "off"),
        ("metacopy", "off"),
        ("index", "off"),
        ("nfs_export", "off"),
    ]
    if userxattr:
        options.append(("userxattr", None))
    return options


def _mount_fsconfig(lowers: Sequence[str], upper: str, work: str, merged: str, userxattr: bool) -> None:
    try:
        fs_fd = syscalls.fsopen("overlay")
    except OSError as exc:
        if exc.errno == errno.ENOSYS:
            raise _NoNewMountApi from exc
        raise from_oserror(exc, "fsopen overlay", merged, "is the overlay module available?") from exc
    try:
        if not _parses_keys(fs_fd):
            raise _NoNewMountApi  # overlayfs < 6.5: see the module's facts
        try:
            syscalls.fsconfig(fs_fd, syscalls.FSCONFIG_SET_STRING, "source", "ccw")
            for index, lower in enumerate(lowers):
                try:
                    syscalls.fsconfig(fs_fd, syscalls.FSCONFIG_SET_STRING, "lowerdir+", lower)
                except OSError as exc:
                    if index == 0 and exc.errno == errno.EINVAL and "lowerdir+" in _kernel_log(fs_fd):
                        raise _NoNewMountApi from exc  # kernel < 6.8
                    raise
            syscalls.fsconfig(fs_fd, syscalls.FSCONFIG_SET_STRING, "upperdir", upper)
            syscalls.fsconfig(fs_fd, syscalls.FSCONFIG_SET_STRING, "workdir", work)
            for key, value in _common_options(userxattr):
                if value is None:
                    syscalls.fsconfig(fs_fd, syscalls.FSCONFIG_SET_FLAG, key)
                else:
                    syscalls.fsconfig(fs_fd, syscalls.FSCONFIG_SET_STRING, key, value)
            syscalls.fsconfig(fs_fd, syscalls.FSCONFIG_CMD_CREATE)
            mnt_fd = syscalls.fsmount(fs_fd)
        except OSError as exc:
            log = _kernel_log(fs_fd)
            raise _mount_error(exc, lowers, upper, merged, log) from exc
        try:
            syscalls.move_mount(mnt_fd, "", syscalls.AT_FDCWD, merged, syscalls.MOVE_MOUNT_F_EMPTY_PATH)
        except OSError as exc:
            raise _mount_error(exc, lowers, upper, merged, "") from exc
        finally:
            os.close(mnt_fd)
    finally:
        os.close(fs_fd)


def _parses_keys(fs_fd: int) -> bool:
    """Whether this overlay context checks its keys (6.5+), not the legacy pass-through."""
    try:
        syscalls.fsconfig(fs_fd, syscalls.FSCONFIG_SET_STRING, "ccw-no-such-key", "1")
    except OSError as exc:
        _kernel_log(fs_fd)  # drop the "Unknown parameter" message
        return exc.errno == errno.EINVAL
    return False


def _kernel_log(fs_fd: int) -> str:
    """The messages the kernel queued on a filesystem context fd ("e overlayfs: …")."""
    lines = []
    for _ in range(16):
        try:
            raw = os.read(fs_fd, 1024)
        except OSError:
            break
        if not raw:
            break
        lines.append(raw.decode(errors="replace").strip())
    return "; ".join(lines)


def _escape_option(path: str, chars: str) -> str:
    out = path.replace("\\", "\\\\")
    for char in chars:
        out = out.replace(char, "\\" + char)
    return out


def _mount_legacy(lowers: Sequence[str], upper: str, work: str, merged: str, userxattr: bool) -> None:
    parts = [
        "lowerdir=" + ":".join(_escape_option(lower, ":,") for lower in lowers),
        "upperdir=" + _escape_option(upper, ","),
        "workdir=" + _escape_option(work, ","),
    ]
    parts += [key if value is None else f"{key}={value}" for key, value in _common_options(userxattr)]
    data = ",".join(parts)
    if len(data.encode()) > _MOUNT_DATA_MAX:
        raise CcwError(
            "TOO_LARGE",
            f"overlay options for {merged!r} are {len(data.encode())} bytes, over mount(2)'s one page; "
            "this kernel lacks fsconfig lowerdir+ (6.8+): use a shorter state dir path or fewer nested forks",
            {"path": merged},
        )
    try:
        syscalls.mount("ccw", merged, "overlay", 0, data)
    except OSError as exc:
        raise _mount_error(exc, lowers, upper, merged, "") from exc


def _mount_error(exc: OSError, lowers: Sequence[str], upper: str, merged: str, log: str) -> CcwError:
    hint = "check that the lower dirs exist and that upper and work are on one filesystem"
    if log:
        hint = f"kernel says: {log}; {hint}"
    error = from_oserror(exc, "mount overlay", merged, hint)
    error.details.update({"lowers": list(lowers), "upper": upper})
    return error


def set_readonly(merged: str, readonly: bool) -> None:
    """Make the overlay's mount read-only or writable again (a per-mount flag).

    Fails with CONFLICT while a file is open for writing on it, which is what a fork
    needs: the kernel, not a promise, keeps the parent from changing.
    """
    flags = syscalls.MS_REMOUNT | syscalls.MS_BIND | (syscalls.MS_RDONLY if readonly else 0)
    try:
        syscalls.mount(None, merged, None, flags, None)
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            raise CcwError(
                "CONFLICT",
                f"cannot freeze {merged!r}: a file in it is open for writing; close it and retry",
                {"path": merged},
            ) from exc
        raise from_oserror(exc, "remount", merged) from exc


def teardown(merged: str) -> None:
    """Unmount ``merged``; lazily (MNT_DETACH) when busy.  Idempotent."""
    fanotify.close_group(merged)  # its capsule's group, if it has one: it watches only this overlay
    for flags in (0, syscalls.MNT_DETACH):
        try:
            syscalls.umount2(merged, flags | syscalls.UMOUNT_NOFOLLOW)
            return
        except OSError as exc:
            if exc.errno in (errno.EINVAL, errno.ENOENT):
                return  # not a mount point (any more)
            if exc.errno != errno.EBUSY:
                raise from_oserror(exc, "umount", merged) from exc


def write_back(point: str) -> None:
    """syncfs(2) the filesystem mounted at ``point``, a dead helper's stale mount, before it is
    unmounted.  A mount namespace made meanwhile (any jail being set up on this machine) holds
    copies of it, so the unmount may leave a disk's old filesystem alive, its dirty pages with
    it, while the registry mounts the same image again: the image must hold them first."""
    try:
        fd = os.open(point, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        log.warning("cannot open stale mount %s to write it back: %s", point, exc)
        return
    try:
        syscalls.syncfs(fd)
    except OSError as exc:
        log.warning("syncfs of stale mount %s: %s", point, exc)
    finally:
        os.close(fd)


def teardown_under(root: str) -> None:
    """Unmount everything mounted under a capsule dir ``root``: its overlays before its disk
    (``root/disk``), which holds their upper dirs."""
    disk_point = os.path.join(root, "disk")
    for point in sorted(mounts_under(root), key=lambda p: p == disk_point):
        teardown(point)


# --- reading the upper dir ----------------------------------------------------------


def is_whiteout(st: os.stat_result) -> bool:
    """A whiteout: a character device 0:0."""
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def is_opaque(path: str) -> bool:
    """Whether the upper dir ``path`` hides the lower dirs below it."""
    for name in OPAQUE_XATTRS:
        try:
            if os.getxattr(path, name, follow_symlinks=False) == b"y":
                return True
        except OSError as exc:
            if exc.errno not in (errno.ENODATA, errno.ENOTSUP, errno.EPERM, errno.EACCES):
                raise from_oserror(exc, f"getxattr {name}", path) from exc
    return False


def lower_lookup(lowers: Sequence[str], rel: str) -> tuple[str, os.stat_result] | None:
    """The entry at ``rel`` in a stack of lower dirs (top first), or None.

    Honours whiteouts and non-dir ancestors; the base of a capsule is a plain tree
    (workspace or materialised snapshot), so opaque ancestors are not searched for.
    """
    for lower in lowers:
        path = os.path.join(lower, rel) if rel else lower
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        except NotADirectoryError:
            return None
        except OSError as exc:
            raise from_oserror(exc, "lstat", path) from exc
        return None if is_whiteout(st) else (path, st)
    return None


def mechanisms() -> dict[str, Any]:
    """What hello reports: whether overlayfs is there and how capsules are mounted."""
    try:
        with open("/proc/filesystems", encoding="ascii") as file:
            available = any(line.split()[-1:] == ["overlay"] for line in file)
    except OSError:
        available = False
    mount_api = "mount(2)"
    try:
        fs_fd = syscalls.fsopen("overlay")
    except OSError:
        pass
    else:
        try:
            if _parses_keys(fs_fd):
                syscalls.fsconfig(fs_fd, syscalls.FSCONFIG_SET_STRING, "lowerdir+", "/")
                mount_api = "fsopen/fsconfig lowerdir+"
        except OSError:
            pass
        finally:
            os.close(fs_fd)
    options = ",".join(key if value is None else f"{key}={value}" for key, value in _common_options(False))
    return {"available": available, "mount_api": mount_api, "options": options}
