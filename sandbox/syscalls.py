"""Thin ctypes wrappers for the syscalls Python 3.11 does not expose, and the kernel's
limit on unix socket addresses (``unix_address``).

Each wrapper raises OSError with the syscall's name and arguments in the message, so a
failure deep in jail setup still says exactly what was asked of the kernel.  Numbers are
x86_64/aarch64 generic values; the syscall numbers that differ per architecture are
looked up from ``_SYSCALL_NR``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import platform
import struct
from collections.abc import Iterator

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)

# --- clone/unshare flags -----------------------------------------------------------
CLONE_NEWNS = 0x00020000
CLONE_FS = 0x00000200
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEWTIME = 0x00000080

# --- mount flags --------------------------------------------------------------------
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOSYMFOLLOW = 256
MS_BIND = 4096
MS_MOVE = 8192
MS_REC = 16384
MS_SILENT = 32768
MS_PRIVATE = 1 << 18
MS_SLAVE = 1 << 19
MS_STRICTATIME = 1 << 24

MNT_FORCE = 1
MNT_DETACH = 2
UMOUNT_NOFOLLOW = 8

# --- openat2 ------------------------------------------------------------------------
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10
O_PATH = getattr(os, "O_PATH", 0o10000000)

# --- fanotify -----------------------------------------------------------------------
FAN_CLASS_NOTIF = 0x00000000
FAN_CLOEXEC = 0x00000001
FAN_NONBLOCK = 0x00000002
FAN_UNLIMITED_QUEUE = 0x00000010
FAN_UNLIMITED_MARKS = 0x00000020
FAN_MARK_ADD = 0x00000001
FAN_MARK_REMOVE = 0x00000002
FAN_MARK_FLUSH = 0x00000080
FAN_MARK_MOUNT = 0x00000010
FAN_MARK_FILESYSTEM = 0x00000100
FAN_ACCESS = 0x00000001
FAN_MODIFY = 0x00000002
FAN_CLOSE_WRITE = 0x00000008
FAN_CLOSE_NOWRITE = 0x00000010
FAN_OPEN = 0x00000020
FAN_OPEN_EXEC = 0x00001000
FAN_Q_OVERFLOW = 0x00004000
FAN_ONDIR = 0x40000000
FAN_EVENT_ON_CHILD = 0x08000000
FAN_NOFD = -1

_ARCH = platform.machine()
_SYSCALL_NR: dict[str, dict[str, int]] = {
    "x86_64": {
        "pivot_root": 155,
        "setns": 308,
        "fanotify_init": 300,
        "fanotify_mark": 301,
        "pidfd_open": 434,
        "pidfd_send_signal": 424,
        "openat2": 437,
        "close_range": 436,
        "bpf": 321,
    },
    "aarch64": {
        "pivot_root": 41,
        "setns": 268,
        "fanotify_init": 262,
        "fanotify_mark": 263,
        "pidfd_open": 434,
        "pidfd_send_signal": 424,
        "openat2": 437,
        "close_range": 436,
        "bpf": 280,
    },
}

_libc.syscall.restype = ctypes.c_long
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.sethostname.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


def _nr(name: str) -> int:
    try:
        return _SYSCALL_NR[_ARCH][name]
    except KeyError:
        raise OSError(38, f"{name}: no syscall number known for architecture {_ARCH}") from None


def _check(ret: int, what: str) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what} failed: {os.strerror(err)}")
    return ret


def bpf(cmd: int, attr: bytes) -> int:
    """bpf(2) with ``attr``, the leading part of a ``union bpf_attr`` (the kernel takes the
    rest as zeros); pointers packed in it are the caller's to keep alive.  The result: a
    new descriptor for the commands that make one, else 0."""
    buf = ctypes.create_string_buffer(attr, len(attr))
    return _check(_libc.syscall(_nr("bpf"), ctypes.c_int(cmd), buf, ctypes.c_uint(len(attr))), f"bpf({cmd})")


def _b(value: str | bytes | None) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return os.fsencode(value)


def mount(source: str | None, target: str, fstype: str | None, flags: int = 0, data: str | None = None) -> None:
    """mount(2)."""
    ret = _libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data))
    _check(ret, f"mount({source!r}, {target!r}, {fstype!r}, {flags:#x}, {data!r})")


def umount2(target: str, flags: int = 0) -> None:
    """umount2(2)."""
    _check(_libc.umount2(_b(target), flags), f"umount2({target!r}, {flags:#x})")


def unshare(flags: int) -> None:
    """unshare(2) (os.unshare arrives only in Python 3.12)."""
    _check(_libc.unshare(flags), f"unshare({flags:#x})")


def setns(fd: int, nstype: int = 0) -> None:
    """setns(2)."""
    _check(_libc.syscall(_nr("setns"), fd, nstype), f"setns({fd}, {nstype:#x})")


def pivot_root(new_root: str, put_old: str) -> None:
    """pivot_root(2); glibc has no wrapper."""
    ret = _libc.syscall(_nr("pivot_root"), _b(new_root), _b(put_old))
    _check(ret, f"pivot_root({new_root!r}, {put_old!r})")


def sethostname(name: str) -> None:
    """sethostname(2), inside a fresh uts namespace."""
    raw = name.encode()
    _check(_libc.sethostname(raw, len(raw)), f"sethostname({name!r})")


OPENAT2_RACE_RETRIES = 16


def openat2(dirfd: int, path: str, flags: int, mode: int = 0, resolve: int = 0) -> int:
    """openat2(2) with struct open_how {u64 flags; u64 mode; u64 resolve}.

    With RESOLVE_BENEATH or RESOLVE_IN_ROOT, a rename or mount anywhere on the system
    during the lookup makes the kernel give up on proving that a ``..`` stayed beneath
    the root, and it returns EAGAIN, asking the caller to retry (openat2(2)).  Seen
    under load as an INTERNAL error from a file tool; the lookup is retried a few times.
    """
    how = struct.pack("QQQ", flags & 0xFFFFFFFFFFFFFFFF, mode, resolve)
    buf = ctypes.create_string_buffer(how, len(how))
    encoded = _b(path)
    for _ in range(OPENAT2_RACE_RETRIES):
        ret = _libc.syscall(_nr("openat2"), ctypes.c_int(dirfd), encoded, buf, ctypes.c_size_t(len(how)))
        if ret >= 0 or ctypes.get_errno() != errno.EAGAIN:
            break
    return _check(ret, f"openat2({dirfd}, {path!r}, {flags:#o}, resolve={resolve:#x})")


def fanotify_init(flags: int, event_f_flags: int) -> int:
    """fanotify_init(2)."""
    ret = _libc.syscall(_nr("fanotify_init"), ctypes.c_uint(flags), ctypes.c_uint(event_f_flags))
    return _check(ret, f"fanotify_init({flags:#x}, {event_f_flags:#x})")


def fanotify_mark(fd: int, flags: int, mask: int, dirfd: int, path: str | None) -> None:
    """fanotify_mark(2); the mask is 64-bit on every ABI we support."""
    ret = _libc.syscall(
        _nr("fanotify_mark"),
        ctypes.c_int(fd),
        ctypes.c_uint(flags),
        ctypes.c_uint64(mask),
        ctypes.c_int(dirfd),
        _b(path),
    )
    _check(ret, f"fanotify_mark({fd}, {flags:#x}, {mask:#x}, {dirfd}, {path!r})")


def pidfd_open(pid: int, flags: int = 0) -> int:
    """pidfd_open(2)."""
    return _check(_libc.syscall(_nr("pidfd_open"), pid, flags), f"pidfd_open({pid})")


def pidfd_send_signal(pidfd: int, sig: int) -> None:
    """pidfd_send_signal(2): signal a process without pid-reuse races."""
    ret = _libc.syscall(_nr("pidfd_send_signal"), pidfd, sig, None, 0)
    _check(ret, f"pidfd_send_signal({pidfd}, {sig})")


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` names a running process (kill(2) with signal 0).

    A process we may not signal (EPERM) still exists, so it counts as alive.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def close_range(first: int, last: int = 0xFFFFFFFF, flags: int = 0) -> None:
    """close_range(2): close every descriptor in [first, last]."""
    ret = _libc.syscall(_nr("close_range"), ctypes.c_uint(first), ctypes.c_uint(last), ctypes.c_uint(flags))
    _check(ret, f"close_range({first}, {last})")


# --- the new mount API (open_tree/fsopen/fsconfig/fsmount/move_mount) ---------------
# Added after 5.1, these share one number on every architecture (the unified table).
_NEW_MOUNT_NR = {"open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432}
FSOPEN_CLOEXEC = 0x1
FSMOUNT_CLOEXEC = 0x1
FSCONFIG_SET_FLAG = 0
FSCONFIG_SET_STRING = 1
FSCONFIG_CMD_CREATE = 6
MOVE_MOUNT_F_EMPTY_PATH = 0x4
OPEN_TREE_CLONE = 0x1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
AT_EMPTY_PATH = 0x1000
AT_FDCWD = -100


def open_tree(dirfd: int, path: str, flags: int) -> int:
    """open_tree(2); with OPEN_TREE_CLONE, a detached copy of the mount (a bind not yet attached)."""
    ret = _libc.syscall(_NEW_MOUNT_NR["open_tree"], ctypes.c_int(dirfd), _b(path), ctypes.c_uint(flags))
    return _check(ret, f"open_tree({dirfd}, {path!r}, {flags:#x})")


def fsopen(fstype: str, flags: int = FSOPEN_CLOEXEC) -> int:
    """fsopen(2): a filesystem context fd; read() on it yields the kernel's error log."""
    ret = _libc.syscall(_NEW_MOUNT_NR["fsopen"], _b(fstype), ctypes.c_uint(flags))
    return _check(ret, f"fsopen({fstype!r})")


def fsconfig(fd: int, cmd: int, key: str | None = None, value: str | None = None, aux: int = 0) -> None:
    """fsconfig(2): set one parameter (FSCONFIG_SET_STRING/FLAG) or FSCONFIG_CMD_CREATE."""
    ret = _libc.syscall(
        _NEW_MOUNT_NR["fsconfig"], ctypes.c_int(fd), ctypes.c_uint(cmd), _b(key), _b(value), ctypes.c_int(aux)
    )
    _check(ret, f"fsconfig({fd}, {cmd}, {key!r}, {value!r})")


def fsmount(fd: int, flags: int = FSMOUNT_CLOEXEC, attr_flags: int = 0) -> int:
    """fsmount(2): a detached mount fd for a created filesystem context."""
    ret = _libc.syscall(_NEW_MOUNT_NR["fsmount"], ctypes.c_int(fd), ctypes.c_uint(flags), ctypes.c_uint(attr_flags))
    return _check(ret, f"fsmount({fd}, {flags:#x})")


def move_mount(from_fd: int, from_path: str, to_fd: int, to_path: str, flags: int = 0) -> None:
    """move_mount(2): attach a detached mount (from fsmount) at ``to_path``."""
    ret = _libc.syscall(
        _NEW_MOUNT_NR["move_mount"], ctypes.c_int(from_fd), _b(from_path), ctypes.c_int(to_fd), _b(to_path),
        ctypes.c_uint(flags)
    )
    _check(ret, f"move_mount({from_fd}, {from_path!r}, {to_fd}, {to_path!r}, {flags:#x})")


# --- mount_setattr (5.12+): change mount flags of a whole subtree in one call -------
_MOUNT_SETATTR_NR = 442  # unified table, same on every architecture
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_NOEXEC = 0x8
MOUNT_ATTR_IDMAP = 0x100000  # with userns_fd: owners shown through that namespace's maps (sandbox/idmap.py)


def bind(source: str, target: str, nofollow: bool = False) -> None:
    """A recursive bind of ``source`` at ``target``; ``nofollow``: of the directory ``source``
    reached following no symlink in any component (RESOLVE_NO_SYMLINKS: one swapped in gives ELOOP)."""
    if not nofollow:
        mount(source, target, None, MS_BIND | MS_REC)
        return
    fd = openat2(AT_FDCWD, source, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, resolve=RESOLVE_NO_SYMLINKS)
    try:
        tree = open_tree(fd, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE | AT_EMPTY_PATH)
    finally:
        os.close(fd)
    try:
        move_mount(tree, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH)
    finally:
        os.close(tree)


def mount_setattr(path: str, attr_set: int, attr_clr: int = 0, flags: int = AT_RECURSIVE,
                  dirfd: int = AT_FDCWD, propagation: int = 0, userns_fd: int = 0) -> None:
    """mount_setattr(2) on ``path`` (recursively by default): struct mount_attr {set, clr, propagation, userns_fd}.

    ``userns_fd`` is read only with MOUNT_ATTR_IDMAP in ``attr_set``."""
    attr = struct.pack("QQQQ", attr_set, attr_clr, propagation, userns_fd)
    buf = ctypes.create_string_buffer(attr, len(attr))
    ret = _libc.syscall(
        _MOUNT_SETATTR_NR, ctypes.c_int(dirfd), _b(path), ctypes.c_uint(flags), buf, ctypes.c_size_t(len(attr))
    )
    _check(ret, f"mount_setattr({dirfd}, {path!r}, set={attr_set:#x}, clr={attr_clr:#x}, "
                f"propagation={propagation:#x}, flags={flags:#x}" + (f", userns_fd={userns_fd})" if userns_fd else ")"))


# --- capset: set every capability set (python-prctl only knows the caps it was built with)
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_CAPSET_NR = {"x86_64": 126, "aarch64": 91}


def capset(keep: int = 0) -> None:
    """capset(2): effective and permitted exactly ``keep`` (a bit mask), inheritable empty (so ambient too)."""
    header = ctypes.create_string_buffer(struct.pack("Ii", _LINUX_CAPABILITY_VERSION_3, 0), 8)
    low, high = keep & 0xFFFFFFFF, keep >> 32
    # two struct __user_cap_data_struct {effective, permitted, inheritable}: bits 0-31, then 32-63
    data = ctypes.create_string_buffer(struct.pack("6I", low, low, 0, high, high, 0), 24)
    nr = _CAPSET_NR.get(_ARCH)
    if nr is None:
        raise OSError(38, f"capset: no syscall number known for architecture {_ARCH}")
    _check(_libc.syscall(nr, header, data), f"capset(effective=permitted={keep:#x}, inheritable=0)")


_libc.syncfs.argtypes = [ctypes.c_int]


def syncfs(fd: int) -> None:
    """syncfs(2): write back everything dirty on the filesystem holding ``fd``."""
    _check(_libc.syncfs(fd), f"syncfs({fd})")


# --- unix socket addresses ----------------------------------------------------------
SUN_PATH_MAX = 107  # sockaddr_un.sun_path holds 108 bytes with the terminating NUL


@contextlib.contextmanager
def unix_address(path: str) -> Iterator[str]:
    """Yield an address for ``path`` that fits sun_path (via /proc/self/fd for long paths)."""
    if len(os.fsencode(path)) <= SUN_PATH_MAX:
        yield path
        return
    directory, name = os.path.split(os.path.abspath(path))
    dirfd = os.open(directory or "/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{dirfd}/{name}"
    finally:
        os.close(dirfd)
