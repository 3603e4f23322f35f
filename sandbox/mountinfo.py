"""The kernel's mount table, /proc/<pid>/mountinfo: the one parser of it in ccw.

Some facts about mountinfo (proc(5))
------------------------------------
- One line per mount, fields separated by single spaces: mount id, parent id,
  ``major:minor``, the *root* (the path inside the filesystem that is mounted here: a
  bind of a subdirectory, or a cgroup hierarchy's subtree), the mount point, the mount's
  options, zero or more optional fields (``shared:N``, ``master:N`` ...), a lone ``-``,
  then the filesystem type, the source and the superblock's options (where a cgroup v1
  hierarchy names its controllers).  The optional fields vary, so everything after them
  is found from the ``-``.
- Space, tab, newline and backslash in a path are written as ``\\ooo`` octal escapes;
  any other byte is written as is, so a path need not be UTF-8 (it is read with
  surrogateescape, as os does).
- The table is that of the reader's mount namespace: the helper reads its own.
- One directory can be reached at several paths: a bind mount shows, at its mount point,
  the directory named by its *root* inside a filesystem (``major:minor``) that is also
  mounted elsewhere.  A descriptor's own mount is the ``mnt_id`` of
  /proc/self/fdinfo/<fd>, so its other paths follow from the table (``other_paths``).
- The text is made anew at each read, and an overlay's line is dear to make (each of
  its layers' paths escaped): the helper's table holds an overlay and a disk per
  capsule, so with 100 capsules each read cost about 1.5 ms of the exec of a capsule
  that exposes a directory (issue 27), and grew with every capsule.  But the file is
  pollable: the kernel bumps a counter of the mount namespace at every mount, unmount,
  move or change of one in it (its own, or one propagated from the host), and
  ``poll`` on an open mountinfo file reports ``POLLPRI | POLLERR`` once after each
  bump (``mounts_poll``).  So ``table()`` keeps the parsed table and reads it again
  only when a poll, made under the same lock just before, says it changed: never older
  than a read would be at that moment.  The descriptor belongs to the namespace it was
  opened in, so a change of our mount namespace opens it again.

Users (``table()`` for our own table): recovery.py (``mounts_under``: what a capsule or a dead helper left mounted),
mounts.py (the host's mounts inside /etc), cgroups.py (the cgroup hierarchies),
probe.py (``filesystem_of``: what the state dir lies on), access.py (``other_paths``: a
capsule's directory checked under every path it has; exposed.py: at every exec).
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from sandbox.hostdirs import inside

PATH = "/proc/self/mountinfo"


@dataclass(frozen=True)
class Mount:
    """One line of mountinfo."""

    mount_point: str
    root: str  # the path inside the filesystem that is mounted there
    fstype: str
    super_options: frozenset[str]  # cgroup v1 controller names live here
    mount_id: int = 0
    device: str = ""  # major:minor of the filesystem


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as \ooo octal escapes.
    if "\\" not in field:
        return field  # nearly every path; the loop below costs ~10 us a path
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse(text: str) -> list[Mount]:
    """Every mount of a /proc/<pid>/mountinfo text, in order; lines that are not mounts are skipped."""
    return [mount for mount in map(_parse_line, text.splitlines()) if mount is not None]


@functools.lru_cache(maxsize=4096)
def _parse_line(line: str) -> Mount | None:
    # Kept by line: the helper reads its table at every exec of a capsule with exposed
    # directories, and between two reads a create or destroy changes a line or two of
    # it; parsing all of it again cost ~0.4 ms in the busy helper.
    fields = line.split(" ")
    try:
        sep = fields.index("-")
    except ValueError:
        return None
    if sep < 5 or sep + 1 >= len(fields):
        return None
    options = fields[sep + 3] if sep + 3 < len(fields) else ""
    return Mount(mount_point=_unescape(fields[4]), root=_unescape(fields[3]),
                 fstype=fields[sep + 1], super_options=frozenset(options.split(",")),
                 mount_id=int(fields[0]) if fields[0].isdigit() else 0, device=fields[2])


def read(path: str = PATH) -> str:
    """The text of a mountinfo file (our own mount namespace's by default)."""
    with open(path, encoding="utf-8", errors="surrogateescape") as file:
        return file.read()


class _Table:
    """Our mount table, parsed, read again only once the kernel says it changed (see the essay)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._namespace = 0  # the inode of the mount namespace ``_fd`` shows
        self._mounts: tuple[Mount, ...] = ()

    def mounts(self) -> tuple[Mount, ...]:
        with self._lock:
            namespace = os.stat("/proc/self/ns/mnt").st_ino
            if self._fd is None or namespace != self._namespace:
                self._close()
                self._fd = os.open(PATH, os.O_RDONLY | os.O_CLOEXEC)  # the poll counts from here
                self._namespace = namespace
            elif not _changed(self._fd):
                return self._mounts
            self._mounts = tuple(parse(_read_all(self._fd)))
            return self._mounts

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _changed(fd: int) -> bool:
    """Whether the mount table changed since ``fd`` was opened or last polled (this poll resets it)."""
    poller = select.poll()
    poller.register(fd, select.POLLPRI)
    return any(events & (select.POLLPRI | select.POLLERR) for _, events in poller.poll(0))


def _read_all(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "surrogateescape")


_TABLE = _Table()


def table() -> tuple[Mount, ...]:
    """Our mount namespace's mounts, in order: the last read's unless the table changed since."""
    return _TABLE.mounts()


def mounts_under(prefix: str) -> list[str]:
    """Mount points at or below ``prefix`` in our mount namespace, deepest first."""
    prefix = prefix.rstrip("/")
    found = [m.mount_point for m in table() if m.mount_point == prefix or m.mount_point.startswith(prefix + "/")]
    return sorted(found, key=lambda p: (-p.count("/"), p))


def filesystem_of(path: str) -> str:
    """The type of the filesystem ``path`` lies on, by the deepest mount above it ("?" unknown)."""
    best, fstype = "", "?"
    with contextlib.suppress(OSError):
        for mount in table():
            point = mount.mount_point
            if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
                best, fstype = point, mount.fstype
    return fstype


def mount_id(fd: int) -> int | None:
    """The id of the mount a descriptor lies on (``mnt_id`` in /proc/self/fdinfo); None if unknown.

    Read with os.open and os.read, not a text file: fanotify_record asks once per event of a
    process gone before its event was read, and a text file took four times as long (30 us).
    """
    try:
        info = os.open(f"/proc/self/fdinfo/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        text = os.read(info, 4096)  # pos, flags, mnt_id come first: a few dozen bytes
    except OSError:
        return None
    finally:
        os.close(info)
    start = text.find(b"mnt_id:")
    if start < 0:
        return None
    end = text.find(b"\n", start)
    return int(text[start + 7:end if end >= 0 else len(text)])


def other_paths(fd: int, path: str) -> list[str]:
    """The other paths at which the directory ``fd`` (resolved as ``path``) is mounted in our namespace."""
    return paths_of(table(), mount_id(fd), path)


def paths_of(mounts: Sequence[Mount], mount_id: int | None, path: str) -> list[str]:
    """The other paths showing ``path``, which lies on mount ``mount_id`` of ``mounts``; sorted.

    The mount's root plus ``path`` below its mount point is where the directory lies
    inside its filesystem; every mount of that filesystem whose root holds it shows it
    too (the source of a bind mount of /etc is /etc).
    """
    by_id, by_device = _index(mounts)
    here = by_id.get(mount_id) if mount_id is not None else None
    if here is None or not inside(path, here.mount_point):
        return []
    inner = os.path.normpath(os.path.join(here.root, os.path.relpath(path, here.mount_point)))
    found = {os.path.normpath(os.path.join(m.mount_point, os.path.relpath(inner, m.root)))
             for m in by_device[here.device] if inside(inner, m.root)}
    return sorted(found - {path})


_last_index: tuple[Sequence[Mount], dict[int, Mount], dict[str, list[Mount]]] | None = None


def _index(mounts: Sequence[Mount]) -> tuple[dict[int, Mount], dict[str, list[Mount]]]:
    """``mounts`` by id (the first of an id) and by device; kept for the last tuple asked about
    (immutable: ``table()`` hands the same one out until the table changes, and an exec asks
    once per exposed dir)."""
    global _last_index
    last = _last_index
    if last is not None and last[0] is mounts:
        return last[1], last[2]
    by_id: dict[int, Mount] = {}
    by_device: dict[str, list[Mount]] = {}
    for mount in mounts:
        by_id.setdefault(mount.mount_id, mount)
        by_device.setdefault(mount.device, []).append(mount)
    if isinstance(mounts, tuple):
        _last_index = (mounts, by_id, by_device)
    return by_id, by_device
