"""Small private files in the state dir: the secret store and the TLS CA's key live in them.

The same facts as the generated tokens file (mcp_server/auth.py) and the witness key
(fs/witness_key.py), for files whose every reader must be this user alone:

- The state dir is opened once and every step goes through that descriptor (``dir_fd``),
  so the checks and the reads are about the same directory.  The directory itself must
  be this uid's (or root's) and writable by no one else: whoever can write it can
  replace a file in it, whatever that file's own mode says.
- Reads use ``O_NOFOLLOW`` (a symlink planted at the name fails with ELOOP instead of
  being read through) and ``O_NONBLOCK`` (a FIFO planted there cannot hang the read),
  and what is read is trusted only if it is a regular file of this uid's with no group
  or other bits.  Anything else is refused, not repaired: a file someone else could read
  may have been read, and one someone else owns holds what someone else chose.
- A write goes to a fresh temporary name (``O_CREAT | O_EXCL | O_NOFOLLOW``, mode 0600
  whatever the umask), is fsync'd, and is ``rename``d over the name: a reader sees the
  old file or the new one, never half, and a symlink at the name is replaced, never
  followed.  Writers take an flock on a lock file beside it, so two changes at once both
  land.

The state dir itself is made 0700 by ``mcp_server/statedir.py`` (``make_state_dir``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

from mcp_server.statedir import make_state_dir
from sandbox.errors import CcwError, from_oserror, wrap_oserror

FLAGS_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
FLAGS_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _owner_ok(info: os.stat_result) -> bool:
    return info.st_uid in (os.geteuid(), 0)


@contextlib.contextmanager
def state_dir_fd(state_dir: str | Path) -> Iterator[int]:
    """A descriptor of the state dir (made 0700 if absent), refused if someone else could write it."""
    where = str(state_dir)
    make_state_dir(where)
    with wrap_oserror("open state dir", where, "set CCW_STATE_DIR to a directory you own"):
        fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not _owner_ok(info) or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise CcwError("PERMISSION_DENIED", f"the state dir {where} is owned by uid {info.st_uid} with mode "
                           f"{stat.S_IMODE(info.st_mode):04o}: someone else could replace the private files in it. "
                           f"Make it yours and not writable by others (chown {os.geteuid()} {where}; chmod 700 "
                           f"{where})", {"path": where})
        yield fd
    finally:
        os.close(fd)


def read_private(dir_fd: int, name: str, path: str, limit: int, what: str) -> bytes | None:
    """The bytes of the private file ``name`` (at most ``limit``), None if absent; refused unless private."""
    remove = f"remove {path} and set it again"
    try:
        fd = os.open(name, FLAGS_READ, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP: a symlink, never followed
        raise from_oserror(exc, f"open {what}", path, f"ccw never follows a symlink there; {remove}") from exc
    try:
        info = os.fstat(fd)
        if not (stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o077):
            kind = "a regular file" if stat.S_ISREG(info.st_mode) else "not a regular file"
            raise CcwError("PERMISSION_DENIED", f"refusing {what} {path}: it must be a regular file owned by uid "
                           f"{os.geteuid()} with mode 0600, and it is {kind} owned by uid {info.st_uid} with mode "
                           f"{stat.S_IMODE(info.st_mode):04o}; what it holds may have been read or chosen by "
                           f"someone else, so it is not repaired: {remove}", {"path": path})
        with wrap_oserror(f"read {what}", path, remove):
            data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise CcwError("TOO_LARGE", f"{what} {path} is larger than {limit} bytes, so ccw did not write it: "
                       f"{remove}", {"path": path})
    return data


def replace_private(dir_fd: int, name: str, path: str, data: bytes, what: str) -> None:
    """Put ``data`` at ``name`` in one rename, through a fresh 0600 temporary file."""
    temporary = f".{name}.{os.getpid()}.{secrets.token_hex(6)}.tmp"
    with wrap_oserror(f"write {what}", path, "check the state dir's permissions and free space"):
        fd = os.open(temporary, FLAGS_CREATE, 0o600, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as handle:
                os.fchmod(fd, 0o600)  # whatever the umask left
                handle.write(data)
                handle.flush()
                os.fsync(fd)
            os.rename(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary, dir_fd=dir_fd)
            raise


def remove_private(dir_fd: int, name: str, path: str, what: str) -> bool:
    """Remove ``name``; False if it was not there."""
    with wrap_oserror(f"remove {what}", path, "check the state dir's permissions"):
        try:
            os.unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            return False
    return True


@contextlib.contextmanager
def locked(dir_fd: int, name: str, path: str) -> Iterator[None]:
    """Hold an exclusive flock on the lock file ``name`` (made 0600) for the block."""
    with wrap_oserror("lock", path, "check the state dir's permissions"):
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600,
                     dir_fd=dir_fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
