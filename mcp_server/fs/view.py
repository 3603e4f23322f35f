"""File access confined beneath one directory descriptor.

Some facts about confining paths on Linux:

- Checking a path and then using it (``realpath`` + ``startswith`` + ``open``) leaves a
  window: a symlink swapped in between the two calls sends the open outside the root.
  ``openat2(2)`` closes the window by resolving in the kernel, relative to a directory
  descriptor, with rules that hold for the whole walk.
- ``RESOLVE_BENEATH`` refuses any step that leaves the starting directory: ``..`` above
  it, absolute paths and absolute symlinks fail with EXDEV.  ``RESOLVE_NO_MAGICLINKS``
  refuses ``/proc/self/fd/N``-style links, which would otherwise jump anywhere.
- ``RESOLVE_NO_SYMLINKS`` refuses every symlink (ELOOP).  Writes use it for the parent
  directory so that the file written is exactly the repo path named, never another
  path reached through a link; reads allow symlinks that stay beneath the root.
- The last component of a write is replaced with ``renameat``, which never follows a
  symlink there: writing onto a symlink replaces the link, never its target.
- The root descriptor may be ``O_PATH`` (the helper passes one over SCM_RIGHTS for a
  capsule's merged view); ``openat2`` and ``*at`` calls accept it as a starting point.

Paths given to ``RootView`` are already-normalised repo-relative strings
(``mcp_server.core.paths``); ``""`` and ``"."`` both mean the root itself.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat as stat_mod
from collections.abc import Iterator
from dataclasses import dataclass

from sandbox import syscalls
from sandbox.checks import kind_of
from sandbox.errors import CcwError, from_oserror

# A capsule's file is read whole into the front end's memory (promotion, merge, branch, diff):
# a sparse file of any size costs the jail no disk, so its size is bounded here, not by its quota;
# and below Linux's largest single read (0x7ffff000), which ``_read_all`` would take for the end.
MAX_READ_BYTES = 1 << 30
_RESOLVE_READ = syscalls.RESOLVE_BENEATH | syscalls.RESOLVE_NO_MAGICLINKS
_RESOLVE_WRITE = _RESOLVE_READ | syscalls.RESOLVE_NO_SYMLINKS
# openat2's RESOLVE_* refusals, as the agent reads them: what happened, what to do instead.
_REFUSALS = {
    errno.EXDEV: "the path escapes the workspace root (through '..', an absolute path or a "
    "symlink pointing outside); name a path inside the root",
    errno.ELOOP: "the path passes through a symlink, which could lead outside the workspace "
    "root; write to the link's target path instead",
}


def _error(exc: OSError, what: str, rel: str) -> CcwError:
    refusal = _REFUSALS.get(exc.errno or 0)
    if refusal is None:
        return from_oserror(exc, what, rel)
    return CcwError("PERMISSION_DENIED", f"{what} {rel!r}: {refusal}",
                    {"path": rel, "errno": errno.errorcode[exc.errno or 0]})


def _split(rel: str) -> tuple[str, str]:
    if rel.startswith("/"):
        raise CcwError("PERMISSION_DENIED", f"{rel!r} is an absolute path; name a path relative to the workspace root",
                       {"path": rel})
    rel = rel.rstrip("/")
    if rel in ("", "."):
        raise CcwError("INVALID_ARGUMENT", "the workspace root itself cannot be written or removed; name a file")
    head, _, name = rel.rpartition("/")
    return head or ".", name


class RootView:
    """One directory, and every file beneath it, reachable only through its descriptor."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    @classmethod
    def open(cls, path: str) -> RootView:
        """Open ``path`` (symlinks in ``path`` itself are resolved once, here) as a root."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise from_oserror(exc, "open workspace root", path,
                               "check CCW_WORKSPACE or the workspace argument") from exc
        return cls(fd)

    @classmethod
    def from_fd(cls, fd: int) -> RootView:
        """Wrap a directory descriptor (O_PATH is fine); the view takes ownership of it."""
        return cls(fd)

    @property
    def fd(self) -> int:
        """The root descriptor (owned by the view)."""
        if self._fd < 0:
            raise CcwError("INTERNAL", "RootView used after close")
        return self._fd

    def __enter__(self) -> RootView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the root descriptor."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    # -- descriptors ------------------------------------------------------------------
    def open_fd(self, rel: str, flags: int, mode: int = 0, *, write: bool = False, what: str = "open") -> int:
        """openat2 beneath the root; the caller closes the descriptor."""
        path = rel.rstrip("/") or ("/" if rel else ".")
        try:
            return syscalls.openat2(
                self.fd, path, flags | os.O_CLOEXEC, mode, _RESOLVE_WRITE if write else _RESOLVE_READ
            )
        except OSError as exc:
            raise _error(exc, what, rel) from exc

    @contextlib.contextmanager
    def _in_parent(self, rel: str, what: str) -> Iterator[tuple[int, str]]:
        """Open ``rel``'s parent directory (never through a symlink) for the block, which
        gets (parent fd, name); an OSError in it becomes the CcwError for ``what``."""
        head, name = _split(rel)
        if name in (".", ".."):
            raise CcwError("INVALID_ARGUMENT", f"{what} {rel!r}: '.' and '..' are not file names")
        parent = self.open_fd(head, os.O_RDONLY | os.O_DIRECTORY, write=True, what=what)
        try:
            yield parent, name
        except OSError as exc:
            raise _error(exc, what, rel) from exc
        finally:
            os.close(parent)

    # -- reads ------------------------------------------------------------------------
    def read_bytes(self, rel: str) -> bytes:
        """The whole content of a regular file (symlinks beneath the root are followed)."""
        data = self.read_regular(rel, follow=True, missing_ok=False)
        assert data is not None
        return data

    def read_regular(self, rel: str, *, follow: bool = False, missing_ok: bool = True) -> bytes | None:
        """A regular file's content in one open; None for a symlink (unless ``follow``), a
        non-regular file or (with ``missing_ok``) a missing path.

        O_NONBLOCK keeps a FIFO planted in the tree from blocking the open; it changes
        nothing for regular files.
        """
        flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
        try:
            fd = syscalls.openat2(self.fd, rel.rstrip("/") or ".", flags | os.O_CLOEXEC, 0, _RESOLVE_READ)
        except OSError as exc:
            if missing_ok and exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return None
            if not follow and exc.errno == errno.ELOOP:
                return None
            raise _error(exc, "read", rel) from exc
        return _read_regular_stat(fd, rel, missing_ok)[0]

    def readlink(self, rel: str) -> str:
        """The target of a symlink beneath the root (the link itself is not followed)."""
        parent, name = self._parent_read(rel, "readlink")
        try:
            return os.readlink(name, dir_fd=parent)
        except OSError as exc:
            raise _error(exc, "readlink", rel) from exc
        finally:
            os.close(parent)

    def _parent_read(self, rel: str, what: str) -> tuple[int, str]:
        head, name = _split(rel)
        return self.open_fd(head, os.O_RDONLY | os.O_DIRECTORY, what=what), name

    def stat(self, rel: str, follow: bool = False) -> os.stat_result:
        """lstat (or stat with ``follow``) of a path beneath the root."""
        flags = syscalls.O_PATH | (0 if follow else os.O_NOFOLLOW)
        fd = self.open_fd(rel, flags, what="stat")
        try:
            return os.fstat(fd)
        except OSError as exc:
            raise _error(exc, "stat", rel) from exc
        finally:
            os.close(fd)

    def exists(self, rel: str) -> bool:
        """True when the path names anything (a dangling symlink counts)."""
        try:
            self.stat(rel)
        except CcwError as exc:
            if exc.code == "NOT_FOUND":
                return False
            raise
        return True

    def listdir(self, rel: str = "") -> list[tuple[str, str]]:
        """``(name, kind)`` of each entry of a directory, sorted by the name's bytes."""
        fd = self.open_fd(rel, os.O_RDONLY | os.O_DIRECTORY, what="list")
        try:
            with os.scandir(fd) as it:
                entries = [(e.name, _entry_kind(e)) for e in it]
        except OSError as exc:
            raise _error(exc, "list", rel) from exc
        finally:
            os.close(fd)
        entries.sort(key=lambda item: os.fsencode(item[0]))
        return entries

    def walk(self, rel: str = "", skip: frozenset[str] = frozenset({".git"})) -> Iterator[tuple[str, str]]:
        """Every non-directory beneath ``rel``, as ``(repo path, kind)`` in byte order.

        Directories named in ``skip`` are not entered (``.git`` by default).  Symlinked
        directories are reported as symlinks, never entered.
        """
        base = rel.strip("/")
        yield from self._walk("" if base in ("", ".") else base, skip)

    def _walk(self, base: str, skip: frozenset[str]) -> Iterator[tuple[str, str]]:
        # Sorting a directory's entries by name, with "/" appended to subdirectories,
        # yields full paths in byte order: "a-b" < "a/x" < "a0".
        entries = [(n, k) for n, k in self.listdir(base) if n not in skip]
        entries.sort(key=lambda item: os.fsencode(item[0]) + (b"/" if item[1] == "dir" else b""))
        for name, kind in entries:
            path = _join(base, name)
            if kind == "dir":
                yield from self._walk(path, skip)
            else:
                yield path, kind

    # -- writes -----------------------------------------------------------------------
    def write_bytes(self, rel: str, data: bytes, mode: int | None = None, mtime_ns: int | None = None) -> None:
        """Atomically replace (or create) a file: temp file, fsync, renameat, dir fsync.

        ``mtime_ns`` sets the file's mtime (and atime); by default it is the time of writing.
        """
        with self._in_parent(rel, "write") as (parent, name):
            tmp = f".{name}.ccw-{secrets.token_hex(6)}.tmp"
            if mode is None:
                try:
                    old = os.stat(name, dir_fd=parent, follow_symlinks=False)
                    mode = stat_mod.S_IMODE(old.st_mode) if stat_mod.S_ISREG(old.st_mode) else 0o644
                except FileNotFoundError:
                    mode = 0o644
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=parent)
            try:
                view = memoryview(data)
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
                os.fchmod(fd, mode)
                if mtime_ns is not None:
                    os.utime(fd, ns=(mtime_ns, mtime_ns))
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
            except OSError:
                os.unlink(tmp, dir_fd=parent)
                raise
            os.fsync(parent)

    def unlink(self, rel: str) -> None:
        """Remove a file or symlink (never follows the link)."""
        with self._in_parent(rel, "delete") as (parent, name):
            os.unlink(name, dir_fd=parent)
            os.fsync(parent)

    def rmdir(self, rel: str) -> None:
        """Remove an empty directory."""
        with self._in_parent(rel, "delete") as (parent, name):
            os.rmdir(name, dir_fd=parent)

    def makedirs(self, rel: str) -> None:
        """Create a directory and its missing parents, never through a symlink."""
        parts = [p for p in rel.strip("/").split("/") if p not in ("", ".")]
        fd = os.dup(self.fd)
        done: list[str] = []
        try:
            for part in parts:
                done.append(part)
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                except OSError as exc:
                    raise _error(exc, "mkdir", "/".join(done)) from exc
                try:
                    nxt = syscalls.openat2(fd, part, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, 0, _RESOLVE_WRITE)
                except OSError as exc:
                    raise _error(exc, "mkdir", "/".join(done)) from exc
                os.close(fd)
                fd = nxt
        finally:
            os.close(fd)

    def chmod(self, rel: str, mode: int) -> None:
        """Change a regular file's permission bits (the file itself, never a link)."""
        fd = self.open_fd(rel, os.O_RDONLY | os.O_NOFOLLOW, write=True, what="chmod")
        try:
            os.fchmod(fd, mode)
        except OSError as exc:
            raise _error(exc, "chmod", rel) from exc
        finally:
            os.close(fd)


def _read_regular_stat(fd: int, rel: str, missing_ok: bool) -> tuple[bytes | None, os.stat_result]:
    """Read and close ``fd``: the content if it is a regular file, else None or an error; with
    the file's ``fstat``, taken before its bytes were read."""
    try:
        st = os.fstat(fd)
        if not stat_mod.S_ISREG(st.st_mode):
            if missing_ok:
                return None, st
            raise CcwError("INVALID_ARGUMENT", f"read {rel!r}: not a regular file ({kind_of(st.st_mode)})",
                           {"path": rel})
        if st.st_size > MAX_READ_BYTES:
            raise _too_large(rel, st.st_size)
        return _read_all(fd, st.st_size, rel), st
    except OSError as exc:
        raise _error(exc, "read", rel) from exc
    finally:
        os.close(fd)


def _too_large(rel: str, size: int) -> CcwError:
    return CcwError("TOO_LARGE", f"{rel!r} is {size} bytes, over the {MAX_READ_BYTES} ccw reads into memory "
                    "(a sparse file costs no disk but is read whole), so it was not read. Remove or shrink it "
                    "in the capsule, or copy it by hand", {"path": rel, "size": size, "limit": MAX_READ_BYTES})


def _read_all(fd: int, size: int, rel: str) -> bytes:
    # A regular file read returns short only at end of file, so one read of size + 1
    # bytes that comes back short is the whole file; a file that grew keeps reading,
    # up to the cap (a capsule's running service may still be writing it).
    want = size + 1
    first = os.read(fd, want)
    if len(first) < want:
        return first
    chunks, total = [first], len(first)
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
        total += len(chunk)
        if total > MAX_READ_BYTES:
            raise _too_large(rel, total)
    return b"".join(chunks)


def _join(base: str, name: str) -> str:
    return f"{base}/{name}" if base else name


def _entry_kind(entry: os.DirEntry[str]) -> str:
    try:
        if entry.is_symlink():
            return "symlink"
        if entry.is_dir(follow_symlinks=False):
            return "dir"
        if entry.is_file(follow_symlinks=False):
            return "file"
    except OSError:
        pass
    return "other"


@dataclass(frozen=True)
class Side:
    """One path's state in one view."""

    kind: str  # file | dir | symlink | other
    mode: int  # permission bits
    target: str | None = None  # symlink target


def lstat(view: RootView, path: str) -> Side | None:
    """lstat of ``path`` where every parent must be a real directory, or None.

    A path below a symlink does not exist as such in that tree (``src/x`` when ``src``
    became a link is gone, whatever the link points at), so parents are resolved with
    RESOLVE_NO_SYMLINKS and a link or file on the way means "absent".
    """
    head, _, name = path.rpartition("/")
    parent = _open_parent(view, head)
    if parent is None:
        return None
    try:
        return _lstat_at(parent, name)
    finally:
        os.close(parent)


def _open_parent(view: RootView, head: str) -> int | None:
    """A directory beneath the root, resolved without symlinks; None if it is not one."""
    try:
        return view.open_fd(head or ".", os.O_RDONLY | os.O_DIRECTORY, write=True, what="stat")
    except CcwError as exc:
        if exc.code == "NOT_FOUND" or exc.details.get("errno") in ("ELOOP", "ENOTDIR"):
            return None
        raise


def _lstat_at(parent: int, name: str) -> Side | None:
    return _lstat_info_at(parent, name)[0]


def _lstat_info_at(parent: int, name: str) -> tuple[Side | None, os.stat_result | None]:
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        target = os.readlink(name, dir_fd=parent) if stat_mod.S_ISLNK(st.st_mode) else None
    except FileNotFoundError:
        return None, None
    return Side(kind_of(st.st_mode), stat_mod.S_IMODE(st.st_mode), target), st


def open_name(dir_fd: int, name: str, flags: int, mode: int = 0) -> int:
    """Open one entry of a directory descriptor, with what openat2's rules would give.

    A plain name (no ``/``, not ``.`` or ``..``) walks nothing, so the kernel's resolve
    rules only matter for its last step, and ``O_NOFOLLOW`` (which the caller passes)
    refuses a symlink there as RESOLVE_NO_SYMLINKS would: plain ``openat`` is then
    equivalent, and much cheaper from Python than openat2 through ctypes.  Any other
    name goes through openat2.
    """
    if name in ("", ".", "..") or "/" in name or not flags & os.O_NOFOLLOW:
        return syscalls.openat2(dir_fd, name, flags | os.O_CLOEXEC, mode, _RESOLVE_WRITE)
    return os.open(name, flags | os.O_CLOEXEC, mode, dir_fd=dir_fd)


class DirFds:
    """Directory descriptors beneath one root, each resolved once (RESOLVE_NO_SYMLINKS).

    A thousand paths in one directory then cost one openat2 and a thousand ``*at`` calls
    on a single name, instead of a thousand walks from the root.  The last component is
    never followed (``AT_SYMLINK_NOFOLLOW``, ``O_NOFOLLOW``), so what is reached is the
    same as with ``lstat`` and ``RootView``'s write resolution.

    A descriptor keeps naming the directory it was opened on, so the cache lives for one
    phase only; any step that may remove or create a directory calls ``forget`` first
    (absent directories are cached too, for the read-only phases).  ``KEPT`` stay open at most,
    oldest closed first (``node_modules/`` has more directories than a 1024-descriptor limit).
    """
    KEPT = 64

    def __init__(self, view: RootView) -> None:
        self.view = view
        self._fds: dict[str, int] = {}
        self._absent: set[str] = set()

    def get(self, rel: str, what: str = "open") -> int:
        """The descriptor of directory ``rel`` (``""``: the root); errors if it is not one."""
        fd = self._fds.get(rel)
        if fd is None:
            fd = self._keep(rel, self.view.open_fd(rel or ".", os.O_RDONLY | os.O_DIRECTORY, write=True, what=what))
            self._absent.discard(rel)
        return fd

    def find(self, rel: str) -> int | None:
        """Like ``get``, but None when ``rel`` is missing, a file or reached through a link."""
        fd = self._fds.get(rel)
        if fd is not None or rel in self._absent:
            return fd
        fd = _open_parent(self.view, rel)
        if fd is None:
            self._absent.add(rel)
            return None
        return self._keep(rel, fd)

    def _keep(self, rel: str, fd: int) -> int:
        if len(self._fds) >= self.KEPT:
            os.close(self._fds.pop(next(iter(self._fds))))
        self._fds[rel] = fd
        return fd

    def lstat(self, path: str) -> Side | None:
        """``lstat(view, path)``, through the cache."""
        head, _, name = path.rpartition("/")
        parent = self.find(head)
        return None if parent is None else _lstat_at(parent, name)

    def lstat_info(self, path: str) -> tuple[Side | None, os.stat_result | None]:
        """``lstat`` with the stat result it was read from (None, None: nothing there)."""
        head, _, name = path.rpartition("/")
        parent = self.find(head)
        return (None, None) if parent is None else _lstat_info_at(parent, name)

    def read_regular(self, path: str, *, missing_ok: bool = True) -> bytes | None:
        """A regular file's content; None for anything else (or, with ``missing_ok``, nothing)."""
        read = self.read_stat(path, missing_ok=missing_ok)
        return None if read is None else read[0]

    def read_stat(self, path: str, *, missing_ok: bool = True) -> tuple[bytes, os.stat_result] | None:
        """``read_regular`` with the file's ``fstat`` as it was read (its mode, its mtime)."""
        head, _, name = path.rpartition("/")
        parent = self.find(head) if missing_ok else self.get(head, "read")
        if parent is None:
            return None
        try:
            fd = open_name(parent, name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError as exc:
            if missing_ok and exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                return None
            raise _error(exc, "read", path) from exc
        data, st = _read_regular_stat(fd, path, missing_ok)
        return None if data is None else (data, st)

    def forget(self) -> None:
        """Close every descriptor; the next use resolves afresh."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._absent.clear()

    def __enter__(self) -> DirFds:
        return self

    def __exit__(self, *exc: object) -> None:
        self.forget()
