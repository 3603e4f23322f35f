"""The paths a stopped process's rename or unlink names, read for unotify.py's reader.

The process waits in its syscall while the reader looks (unotify.py's essay), so its
memory and its cwd and descriptors are what the syscall will use, unless another thread
changes them meanwhile (that essay says why attribution may live with that):

- A path argument is read from its memory with process_vm_readv(2), a page at most at a
  time: a string may end just before an unmapped page, and the call never splits an iovec
  element, so a longer read would fail whole.  An address the process cannot read fails
  its syscall with EFAULT too (``Unreadable``).
- A relative path's base is ``/proc/PID/cwd`` or ``/proc/PID/fd/N``: the path in the
  process's own mount namespace, as the workspace is seen there.
"""

from __future__ import annotations

import ctypes
import errno
import os

AT_FDCWD = -100
PATH_MAX = 4096
PAGE = os.sysconf("SC_PAGE_SIZE")


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.process_vm_readv.argtypes = [ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_ulong,
                                   ctypes.POINTER(_Iovec), ctypes.c_ulong, ctypes.c_ulong]
_libc.process_vm_readv.restype = ctypes.c_ssize_t


class Unreadable(Exception):
    """The path cannot be read, and the syscall would not succeed either (EFAULT)."""


def read_path(pid: int, address: int, buffer: ctypes.Array[ctypes.c_char]) -> bytes:
    """The NUL-terminated string at ``address`` in ``pid``'s memory, read a page at most at a time."""
    got = b""
    base = ctypes.addressof(buffer)
    while len(got) < PATH_MAX:
        want = min(PAGE - (address + len(got)) % PAGE, PATH_MAX - len(got))
        local = _Iovec(base, want)
        remote = _Iovec(address + len(got), want)
        n = _libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if n <= 0:
            number = ctypes.get_errno() if n < 0 else errno.EFAULT
            if number == errno.EFAULT:
                raise Unreadable
            raise OSError(number, os.strerror(number))
        chunk = ctypes.string_at(base, n)
        end = chunk.find(b"\0")
        if end >= 0:
            return got + chunk[:end]
        got += chunk
    raise Unreadable  # ENAMETOOLONG for the kernel too


def resolve(pid: int, dirfd: int | None, path: bytes, bases: dict[int, bytes] | None = None) -> bytes:
    """The absolute path (in the process's mount namespace) a syscall's (dirfd, path) names;
    ``bases``: the directories already read for this notification, by descriptor."""
    if path.startswith(b"/"):
        return os.path.normpath(path)
    fd = AT_FDCWD if dirfd is None else ctypes.c_int32(dirfd & 0xFFFFFFFF).value
    base = None if bases is None else bases.get(fd)
    if base is None:
        base = os.readlink(os.fsencode(f"/proc/{pid}/cwd" if fd == AT_FDCWD else f"/proc/{pid}/fd/{fd}"))
        if bases is not None:
            bases[fd] = base
    return os.path.normpath(base + b"/" + path)
