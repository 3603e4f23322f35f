"""Capsule disks: a size limit on what a capsule writes, from a loop-mounted ext4 image.

overlayfs has no size limit of its own: copy-ups and new files land on whatever
filesystem holds the upper dir, so without a limit one ``dd`` in a capsule fills the
host's disk.  The kernel quirks that shape this module:

* **No project quotas here.**  The natural tool is a project quota on the upper dir
  (docker's overlay2 on xfs ``pquota``), but ext4 quotas need ``CONFIG_QFMT_V2`` and
  xfs ones ``CONFIG_XFS_QUOTA``, and either needs the host filesystem mounted with
  ``prjquota``; neither is true on the machines ccw runs on.  tmpfs ``size=`` keeps the
  data in RAM and charges its pages to the memory cgroup of whichever process wrote
  them.  So each capsule gets its own ext4 filesystem in a sparse image file in the
  state dir: the limit is the filesystem's size, a write past it gets ENOSPC inside
  the capsule, and the host only ever gives the image the blocks actually written.
* **Formatting is slow, mounting is not free.**  ``mkfs.ext4`` takes ~10 ms and attach
  plus mount 3-10 ms, while creating a capsule takes about 1 ms.  So one *template*
  image per size is formatted once (sparse: ~200 KiB of metadata, the rest holes) and
  copied hole by hole (SEEK_DATA/SEEK_HOLE + copy_file_range); and a small pool of
  ready disks of the default size is kept by a background thread as *detached* mounts
  (fsmount(2)), which a new capsule attaches with one move_mount(2).  A detached mount
  lives only as long as its fd: a killed helper leaks no pool mount.
* **Loop devices** are bound with ``LOOP_CONFIGURE`` (5.8): backing fd, flags and
  ``LO_FLAGS_AUTOCLEAR`` in one ioctl, so the device unbinds itself when the last
  mount of it goes.  ``LOOP_CTL_GET_FREE`` only names a free device; another process
  may bind it first (EBUSY), so binding retries with a fresh one.
* **ext4's lazy inode-table init** (the ``ext4lazyinit`` thread) would write zeros over
  every inode table after mount, turning hundreds of MiB of holes into real blocks per
  capsule.  The holes already read as zeros, so disks are mounted ``noinit_itable``.
* Every disk carries the template's UUID.  ext4 does not mind duplicates (xfs would).
* **The first writes to a fresh ext4 are slow**: a mkdir in a new block group reads
  and initialises its bitmaps through the loop device, ~0.5 ms each.  The pool makes
  a disk's directories (``LAYOUT``) while it fills, off the create path.
* The disk is mounted nosuid,nodev: the jail already runs with no_new_privs and
  only its own /dev, and the disk holds nothing that should need either.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import struct
import subprocess
import threading
from typing import Any

from sandbox import overlay, syscalls
from sandbox.checks import DISK_MB_MAX as MAX_MB
from sandbox.checks import DISK_MB_MIN as MIN_MB
from sandbox.errors import CcwError, from_oserror

log = logging.getLogger("ccw.disk")

LOOP_CTL_GET_FREE = 0x4C82
LOOP_CONFIGURE = 0x4C0A
LO_FLAGS_AUTOCLEAR = 4
DEFAULT_MB = 8192
TEMPLATE_VERSION = 2  # bump when the mkfs options change, so old templates are not reused
POOL_KEEP = 2
# What every disk holds at its root, with its mode: the overlay's upper and work dirs
# and the jail's /tmp (sticky, like the host's) and $HOME (chowned to the capsule's
# owner when the disk is handed out).
LAYOUT = (("upper", 0o700), ("work", 0o700), ("tmp", 0o1777), ("home", 0o700))
MKFS = ("mkfs.ext4", "/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4")
# struct loop_info64: 5 u64 (device, inode, rdevice, offset, sizelimit), 4 u32 (number,
# encrypt_type, encrypt_key_size, flags), file name[64], crypt name[64], key[32], init[2].
_LOOP_INFO64 = "=QQQQQIIII64s64s32sQQ"
_LOOP_CONFIG_RESERVED = 64  # struct loop_config ends in __u64 __reserved[8]


def _mkfs_binary() -> str | None:
    for name in MKFS:
        found = shutil.which(name)
        if found:
            return found
    return None


def unavailable_reason() -> str | None:
    """Why capsule disks cannot be used here, or None when they can."""
    if os.geteuid() != 0:
        return "capsule disk limits need a privileged helper (loop devices and mounts)"
    if not os.path.exists("/dev/loop-control"):
        return "no /dev/loop-control: the kernel has no loop device support (CONFIG_BLK_DEV_LOOP)"
    try:
        with open("/proc/filesystems", encoding="ascii") as file:
            if not any(line.split()[-1:] == ["ext4"] for line in file):
                return "the kernel has no ext4 support"
    except OSError as exc:
        return f"cannot read /proc/filesystems: {exc}"
    if _mkfs_binary() is None:
        return "mkfs.ext4 is missing; install e2fsprogs"
    return None


def check_size(name: str, size_mb: Any) -> int:
    if not isinstance(size_mb, int) or isinstance(size_mb, bool) or not MIN_MB <= size_mb <= MAX_MB:
        raise CcwError("INVALID_ARGUMENT",
                       f"{name} must be an integer in [{MIN_MB}, {MAX_MB}] (MiB), got {size_mb!r:.40}")
    return size_mb


# --- images -----------------------------------------------------------------------------


def format_image(path: str, size_mb: int) -> None:
    """A fresh sparse ext4 image of ``size_mb`` MiB at ``path`` (written via a temp name)."""
    mkfs = _mkfs_binary()
    if mkfs is None:
        raise CcwError("UNSUPPORTED", "mkfs.ext4 is missing; install e2fsprogs for capsule disk limits")
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    try:
        with open(tmp, "wb") as file:
            file.truncate(size_mb << 20)
        # -m 0: no blocks reserved for root (the capsule's limit is the whole size);
        # no resize_inode: its reserved descriptor blocks are written out (4 MiB of an 8 GiB
        # image, 196 KiB without), and a capsule disk never grows;
        # lazy init: the image is sparse, its holes already read as zeros;
        # nodiscard: discarding a fresh sparse file is wasted work;
        # a 16 MiB journal on big disks (64 MiB by default), as each journal block written
        # once stays allocated in the image.
        command = [mkfs, "-q", "-F", "-m", "0", "-O", "^resize_inode",
                   "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard"]
        if size_mb >= 1024:
            command += ["-J", "size=16"]
        command.append(tmp)
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise CcwError("INTERNAL", f"mkfs.ext4 failed ({done.returncode}): {done.stderr.strip()[-400:]}")
        os.rename(tmp, path)
    except OSError as exc:
        raise from_oserror(exc, "format capsule disk image", path, "check the state dir's space") from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def copy_sparse(src: str, dst: str) -> None:
    """Copy ``src`` to a new file ``dst`` extent by extent, keeping its holes."""
    src_fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    try:
        dst_fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            size = os.fstat(src_fd).st_size
            os.ftruncate(dst_fd, size)
            offset = 0
            while offset < size:
                try:
                    offset = os.lseek(src_fd, offset, os.SEEK_DATA)
                except OSError as exc:
                    if exc.errno == errno.ENXIO:
                        break  # nothing but holes from here on
                    raise
                end = os.lseek(src_fd, offset, os.SEEK_HOLE)
                while offset < end:
                    copied = os.copy_file_range(src_fd, dst_fd, end - offset, offset, offset)
                    if copied == 0:
                        raise OSError(errno.EIO, f"{src} shrank while being copied")
                    offset += copied
        finally:
            os.close(dst_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(dst)
        raise
    finally:
        os.close(src_fd)


def _bind_loop(image: str) -> tuple[str, int]:
    """Bind ``image`` to a free loop device (autoclear); its path and an open fd of it."""
    image_fd = os.open(image, os.O_RDWR | os.O_CLOEXEC)
    try:
        info = struct.pack(_LOOP_INFO64, 0, 0, 0, 0, 0, 0, 0, 0, LO_FLAGS_AUTOCLEAR, b"", b"", b"", 0, 0)
        config = struct.pack("=II", image_fd, 0) + info + bytes(_LOOP_CONFIG_RESERVED)
        for _ in range(16):
            control = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
            try:
                number = fcntl.ioctl(control, LOOP_CTL_GET_FREE)
            finally:
                os.close(control)
            device = f"/dev/loop{number}"
            loop_fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
            try:
                fcntl.ioctl(loop_fd, LOOP_CONFIGURE, config)
            except OSError as exc:
                os.close(loop_fd)
                if exc.errno == errno.EBUSY:
                    continue  # someone bound it between GET_FREE and CONFIGURE
                raise
            return device, loop_fd
        raise OSError(errno.EBUSY, "no free loop device after 16 tries")
    finally:
        os.close(image_fd)


def mount_image(image: str) -> int:
    """A detached mount (fd) of the ext4 filesystem in ``image``; attach it with move_mount."""
    try:
        device, loop_fd = _bind_loop(image)
    except OSError as exc:
        raise from_oserror(exc, "bind a loop device", image, "is the loop module loaded and /dev populated?") from exc
    try:
        fs_fd = syscalls.fsopen("ext4")
        try:
            try:
                syscalls.fsconfig(fs_fd, syscalls.FSCONFIG_SET_STRING, "source", device)
                syscalls.fsconfig(fs_fd, syscalls.FSCONFIG_SET_FLAG, "noinit_itable")
                syscalls.fsconfig(fs_fd, syscalls.FSCONFIG_CMD_CREATE)
                return syscalls.fsmount(fs_fd, syscalls.FSMOUNT_CLOEXEC,
                                        syscalls.MOUNT_ATTR_NOSUID | syscalls.MOUNT_ATTR_NODEV)
            except OSError as exc:
                detail = overlay._kernel_log(fs_fd)
                raise from_oserror(exc, "mount capsule disk", image, detail or "is the image damaged?") from exc
        finally:
            os.close(fs_fd)
    finally:
        os.close(loop_fd)  # the mount (or, on failure, nothing) keeps the device; autoclear


def attach(mount_fd: int, target: str) -> None:
    """Attach a detached disk mount at ``target`` (an empty directory)."""
    try:
        syscalls.move_mount(mount_fd, "", syscalls.AT_FDCWD, target, syscalls.MOVE_MOUNT_F_EMPTY_PATH)
    except OSError as exc:
        raise from_oserror(exc, "attach capsule disk", target) from exc


def usage(path: str) -> dict[str, int]:
    """Used and free KiB of the disk holding ``path`` (statvfs: what df shows)."""
    st = os.statvfs(path)
    return {"used_kb": (st.f_blocks - st.f_bfree) * st.f_frsize // 1024, "free_kb": st.f_bavail * st.f_frsize // 1024}


# --- the pool ---------------------------------------------------------------------------


class Disks:
    """Templates per size and a pool of ready disks of the default size.

    Files live in ``<root>/templates`` (kept across restarts: a template is only ever
    renamed into place whole) and ``<root>/pool`` (emptied at start: the mounts that made
    those images useful died with the helper that held them).
    """

    def __init__(self, root: str, default_mb: int, keep: int = POOL_KEEP) -> None:
        self.default_mb = check_size("default disk size", default_mb)
        self.templates_dir = os.path.join(root, "templates")
        self.pool_dir = os.path.join(root, "pool")
        self.keep = keep
        for path in (self.templates_dir, self.pool_dir):
            os.makedirs(path, mode=0o700, exist_ok=True)
        for name in os.listdir(self.pool_dir):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.pool_dir, name))
        for name in os.listdir(self.templates_dir):
            if ".tmp-" in name:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.templates_dir, name))
        self._lock = threading.Lock()
        self._template_lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._ready: list[tuple[int, str]] = []  # (detached mount fd, image path)
        self._serial = 0
        self._closed = False
        self._thread: threading.Thread | None = None

    def template(self, size_mb: int) -> str:
        """The template image for ``size_mb``, formatted on first use."""
        path = os.path.join(self.templates_dir, f"ext4-v{TEMPLATE_VERSION}-{size_mb}m.img")
        with self._template_lock:
            if not os.path.exists(path):
                format_image(path, size_mb)
        return path

    def start(self) -> None:
        """Begin keeping the pool full (a daemon thread)."""
        with self._lock:
            if self._thread is None and self.keep > 0:
                self._thread = threading.Thread(target=self._refill, name="ccw-disk-pool", daemon=True)
                self._thread.start()

    def take(self, size_mb: int, image: str) -> int:
        """A detached mount of a fresh disk of ``size_mb`` whose image is now at ``image``.

        The disk's root holds the LAYOUT dirs, owned by root.
        """
        if size_mb == self.default_mb:
            with self._lock:
                ready = self._ready.pop() if self._ready else None
                self._wake.notify()
            if ready is not None:
                mount_fd, pooled = ready
                try:
                    os.rename(pooled, image)
                except OSError:
                    _discard(mount_fd, pooled)
                    raise
                return mount_fd
        return self._make(size_mb, image)

    def _make(self, size_mb: int, image: str) -> int:
        copy_sparse(self.template(size_mb), image)
        try:
            mount_fd = mount_image(image)
        except BaseException:
            _discard(None, image)
            raise
        try:
            for name, mode in LAYOUT:
                os.mkdir(name, mode, dir_fd=mount_fd)
                os.chmod(name, mode, dir_fd=mount_fd)  # mkdir's mode passes through the umask
        except BaseException:
            _discard(mount_fd, image)
            raise
        return mount_fd

    def _refill(self) -> None:
        while True:
            with self._lock:
                while not self._closed and len(self._ready) >= self.keep:
                    self._wake.wait()
                if self._closed:
                    return
                self._serial += 1
                image = os.path.join(self.pool_dir, f"{self._serial}.img")
            try:
                mount_fd = self._make(self.default_mb, image)
            except Exception as exc:  # the pool is an optimisation: take() makes disks itself
                log.warning("cannot fill the capsule disk pool: %s", exc)
                return
            with self._lock:
                if self._closed:
                    _discard(mount_fd, image)
                    return
                self._ready.append((mount_fd, image))

    def close(self) -> None:
        """Drop the pool: its detached mounts go with their fds."""
        with self._lock:
            self._closed = True
            ready, self._ready = self._ready, []
            self._wake.notify_all()
        for mount_fd, image in ready:
            _discard(mount_fd, image)


def _discard(mount_fd: int | None, image: str) -> None:
    """Drop a disk that will not be used: its detached mount, then its image."""
    if mount_fd is not None:
        os.close(mount_fd)
    with contextlib.suppress(OSError):
        os.unlink(image)
