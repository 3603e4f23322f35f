"""One exec's record of the files it read and wrote, from its capsule's fanotify events.

A capsule's fanotify group and the helper's reader (fanotify.py, whose essay gives the
facts this relies on) hand each batch of events that arrives while an exec runs to that
exec's ``Recording``: it decides which events are the exec's (its cgroup, or without one
its mount namespace), turns each event's descriptor into a path relative to the merged
dir, and keeps the sets the reply's ``touched`` is made of (execution.py).
"""

from __future__ import annotations

import contextlib
import os
import stat
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from sandbox import syscalls
from sandbox.errors import CcwError
from sandbox.mountinfo import mount_id

if TYPE_CHECKING:
    from sandbox.exec_cgroup import ExecCgroup

_EVENT = struct.Struct("IBBHQii")  # struct fanotify_event_metadata
_METADATA_VERSION = 3
_READ_BITS = syscalls.FAN_OPEN | syscalls.FAN_OPEN_EXEC
_GONE = 2  # a pid that exited before the reader looked (``Recording._classify``)


@dataclass
class Traced:
    """What the tracer saw an exec open and write, relative to the merged dir, sorted
    (execution.py makes the reply's ``replies.Touched`` of it).

    ``listed`` (directories opened) and ``executed`` are None exactly when ``read`` is.
    """

    read: list[str] | None
    written: list[str]
    overflow: bool
    unavailable_reason: str | None = None
    dropped: int = field(default=0)  # events whose file was gone before we could name it
    listed: list[str] | None = None
    executed: list[str] | None = None
    elsewhere: frozenset[str] = frozenset()  # written meanwhile by others: other runs, the file tools


class Batch:
    """What every recording of one read of the group would ask the kernel about the same
    descriptor or pid, asked once for them all: the descriptor's path and the mount it lies
    on, the pid's cgroups.  Beside a running service each event goes to two recordings at
    least: each new pid costs each a read of /proc/PID/cgroup, and each event of a process
    gone before it was read a read of /proc/self/fdinfo (fanotify.py's essay)."""

    def __init__(self, proc_fd: int) -> None:
        self._proc_fd = proc_fd
        self._paths: dict[int, str | None] = {}
        self._mounts: dict[int, int | None] = {}
        self._cgroups: dict[int, str | None] = {}

    def cgroups(self, pid: int) -> str | None:
        """The text of /proc/PID/cgroup; None if the process is gone."""
        if pid not in self._cgroups:
            self._cgroups[pid] = _read_small(f"/proc/{pid}/cgroup")
        return self._cgroups[pid]

    def path(self, fd: int) -> str | None:
        """The descriptor's path (readlink of /proc/self/fd/N); None if it cannot be read."""
        if fd not in self._paths:
            try:
                self._paths[fd] = os.readlink(str(fd), dir_fd=self._proc_fd)
            except OSError:
                self._paths[fd] = None
        return self._paths[fd]

    def mount(self, fd: int) -> int | None:
        """The id of the mount the descriptor lies on (mountinfo.mount_id)."""
        if fd not in self._mounts:
            self._mounts[fd] = mount_id(fd)
        return self._mounts[fd]


class Source(Protocol):
    """What a recording needs of its group (fanotify.Group)."""

    merged_dir: str
    unavailable_reason: str | None
    own_mntns: int | None
    proc_fd: int

    def finish(self, recording: Recording) -> None:
        """Read what is queued into ``recording`` and stop recording it."""


class Recording:
    """What one exec opened and wrote, as its capsule's group reads the events (fanotify.py)."""

    def __init__(self, group: Source, cgroup: ExecCgroup | None, visible_at: str | None) -> None:
        self._group = group
        self.merged_dir = group.merged_dir
        self._cgroup = cgroup
        self._self_pid = os.getpid()
        self._own_mntns = group.own_mntns
        self._proc_fd = group.proc_fd
        self._pids: dict[int, int] = {}  # pid: 1 the run's, 0 not, _GONE exited before we looked
        self._ns_fd: int | None = None  # the exec's mount namespace, held open (see fanotify.py)
        self._recent: list[int] = []  # live exec pids whose namespace we may hold
        self._prefixes = [self.merged_dir.rstrip("/") + "/"]
        if visible_at:
            # Where the exec sees the merged view (the jail binds it at the workspace's own
            # path): paths under it are known at once, without learning the prefix from an
            # inode, which a copy-up between the open and our read of its event would
            # defeat.  Longest first: with the state dir inside the workspace, the
            # helper-side merged path lies under the workspace path and must win.
            self._prefixes.append(visible_at.rstrip("/") + "/")
            self._prefixes.sort(key=len, reverse=True)
        self.read: set[str] = set()
        self.written: set[str] = set()
        self.elsewhere: set[str] = set()  # written by others meanwhile (``_written_outside``)
        self._mounts: set[int] = set()  # the mount ids its live processes opened files through
        self.listed: set[str] = set()
        self.executed: set[str] = set()
        self._is_dir: dict[str, bool] = {}  # per path, from one fstat (see fanotify.py)
        self.overflow = False
        self.dropped = 0
        self.error: BaseException | None = None  # the reader's, reported by collect()

    def take(self, buf: bytes, batch: Batch | None = None) -> None:
        """Record the events of one read of the group (the group's lock held), with what the
        other recordings of the same read learnt (``batch``); the group closes the events'
        descriptors once every recording has taken them."""
        self._handle(buf, batch or Batch(self._proc_fd))
        if self._ns_fd is None:
            self._hold_namespace()

    def _handle(self, buf: bytes, batch: Batch) -> list[int]:
        """Record the events in ``buf``; returns their fds, for the caller to close."""
        unpack, size, total = _EVENT.unpack_from, _EVENT.size, len(buf)
        pids = self._pids
        read, written, prefixes = self.read, self.written, self._prefixes
        listed, executed, is_dirs = self.listed, self.executed, self._is_dir
        fds: list[int] = []
        offset = 0
        while offset + size <= total:
            event_len, version, _, _, mask, fd, pid = unpack(buf, offset)
            if version != _METADATA_VERSION or event_len < size:
                raise CcwError("INTERNAL", f"fanotify event metadata version {version} (expected "
                               f"{_METADATA_VERSION}) or length {event_len}: this kernel's ABI is not understood")
            offset += event_len
            if mask & syscalls.FAN_Q_OVERFLOW:
                self.overflow = True
            if fd < 0:
                continue
            fds.append(fd)
            inside = pids.get(pid)
            if inside is None:
                inside = pids[pid] = self._classify(pid, fd, batch)
            if inside == _GONE:
                inside = self._through_own_mount(fd, batch)
            if not inside:
                if mask & syscalls.FAN_CLOSE_WRITE:
                    self._written_outside(fd, batch)
                continue
            path = batch.path(fd)
            if path is None:
                self.dropped += 1
                continue
            rel = None
            for prefix in prefixes:
                if path.startswith(prefix):
                    rel = path[len(prefix) :]
                    break
            if rel is None:
                rel = "." if path + "/" in prefixes else self._learn(path, fd)
                if rel is None:
                    self.dropped += 1
                    continue
            if mask & _READ_BITS:
                is_dir = is_dirs.get(rel)
                if is_dir is None:
                    is_dir = is_dirs[rel] = _fd_is_dir(fd)
                if is_dir:
                    listed.add(rel or ".")
                    continue
                read.add(rel)
                if mask & syscalls.FAN_OPEN_EXEC:
                    executed.add(rel)
            if mask & syscalls.FAN_CLOSE_WRITE:
                written.add(rel)
        return fds

    def _written_outside(self, fd: int, batch: Batch) -> None:
        """A file some other process closed after writing (another run of the capsule, the front
        end's file tools): kept apart, so that the upper dir's changes during this run are not
        all taken for its own (execution.py: ``_touched``)."""
        path = batch.path(fd)
        if path is None:
            return
        for prefix in self._prefixes:
            if path.startswith(prefix):
                self.elsewhere.add(path[len(prefix) :])
                return
        rel = self._learn(path, fd)  # another jail's path, or the detached form once it is gone
        if rel is not None:
            self.elsewhere.add(rel)

    def _classify(self, pid: int, fd: int, batch: Batch) -> int:
        """Whether events of ``pid`` belong to the run (1, 0), or ``_GONE``: it exited before we
        looked, and each of its events is judged by the mount it came through (fanotify.py)."""
        if pid == self._self_pid:
            return 0
        if self._cgroup is not None:
            text = batch.cgroups(pid)
            owned = None if text is None else self._cgroup.owns(pid, text)
            if owned is None:
                return _GONE
        else:
            ns = _ns_inode(str(pid))
            if ns is None:
                return _GONE
            owned = ns != self._own_mntns
        if owned:
            self._recent.append(pid)
            self._hold_namespace()
            mount = batch.mount(fd)
            if mount is not None:  # the jail's own mount of the view: its events come through it
                self._mounts.add(mount)
        return int(owned)

    def claim(self, mounts: tuple[int, ...]) -> None:
        """The mounts of the view the run's jail was given (supervise.py knows them before it
        starts): its exited processes' events are recognised from the first."""
        self._mounts.update(mounts)

    def _through_own_mount(self, fd: int, batch: Batch) -> bool:
        """An exited process's event: the run's if it came through a mount of the view that the
        run's live processes used (or, before any is known, as fanotify.py's rule says)."""
        if not self._mounts:
            return True
        return batch.mount(fd) in self._mounts

    def _hold_namespace(self) -> None:
        """Hold the mount namespace of a live exec process, once it has its own (fanotify.py).

        The jail moves its child into the cgroup *before* the child unshares, so a pid
        seen early may still be in the helper's namespace: try again on later batches.
        """
        del self._recent[:-8]  # the latest few are enough
        for pid in reversed(self._recent):
            try:
                fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            if os.fstat(fd).st_ino == self._own_mntns:
                os.close(fd)
                continue
            self._ns_fd = fd
            self._recent.clear()
            return

    def _learn(self, path: str, fd: int) -> str | None:
        """Find which suffix of ``path`` names the fd's file under merged_dir; learn the prefix."""
        if path.endswith(" (deleted)") or not path.startswith("/"):
            return None
        try:
            st = os.fstat(fd)
        except OSError:
            return None
        parts = path[1:].split("/")
        for k in range(len(parts)):
            rel = "/".join(parts[k:])
            try:
                cand = os.lstat(os.path.join(self.merged_dir, rel))
            except OSError:
                continue
            if (cand.st_dev, cand.st_ino) == (st.st_dev, st.st_ino):
                if k > 0:  # k == 0 is the detached form: relative to the overlay root
                    self._prefixes.append("/" + "/".join(parts[:k]) + "/")
                return rel
        return None

    def records(self, cgroup: ExecCgroup) -> bool:
        """Whether this is the recording of the run in ``cgroup`` (fanotify.so_far looks it up)."""
        return self._cgroup is cgroup

    def so_far(self) -> Traced:
        """What was recorded until now, recording on (the group's lock held, so no batch is half
        taken): the ``run_reads`` op's answer about a service that still runs (services.py)."""
        return Traced(sorted(self.read), sorted(self.written), self.overflow, None, self.dropped,
                      sorted(self.listed), sorted(self.executed), frozenset(self.elsewhere))

    # -- collect / close
    def collect(self) -> Traced:
        """Stop recording: what is still queued is read into the record; the touched files."""
        if self._group.unavailable_reason is not None:
            return Traced(None, [], False, self._group.unavailable_reason)
        self._group.finish(self)
        if self.error is not None:
            raise CcwError("INTERNAL", f"the fanotify reader failed: {self.error!r}") from self.error
        return Traced(sorted(self.read), sorted(self.written), self.overflow, None, self.dropped,
                      sorted(self.listed), sorted(self.executed), frozenset(self.elsewhere))

    def close(self) -> None:
        """Stop recording if still recording, and let the exec's mount namespace go; idempotent."""
        self._group.finish(self)
        if self._ns_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._ns_fd)
            self._ns_fd = None


def event_fds(buf: bytes) -> list[int]:
    """The descriptors of the events in ``buf``, for events no exec records (to be closed)."""
    unpack, size, total = _EVENT.unpack_from, _EVENT.size, len(buf)
    fds = []
    offset = 0
    while offset + size <= total:
        event_len, _, _, _, _, fd, _ = unpack(buf, offset)
        if fd >= 0:
            fds.append(fd)
        if event_len < size:
            break
        offset += event_len
    return fds


def _close_all(fds: list[int]) -> None:
    # The fds of one read() are often consecutive: every number in [lo, hi] is then one
    # of ours, and one close_range() replaces len(fds) close() calls.
    lo, hi = min(fds), max(fds)
    if hi - lo + 1 == len(fds):
        os.closerange(lo, hi + 1)
        return
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _fd_is_dir(fd: int) -> bool:
    try:
        return stat.S_ISDIR(os.fstat(fd).st_mode)
    except OSError:
        return False


def _ns_inode(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/mnt").st_ino
    except OSError:
        return None


def _read_small(path: str) -> str | None:
    """A small /proc file's text with os.open and os.read (a text file object costs about four
    times as much here, mountinfo.mount_id's docstring says); None if it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    return b"".join(chunks).decode(errors="replace")
