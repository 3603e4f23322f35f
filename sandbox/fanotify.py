"""Files an exec read and wrote, from fanotify.

Some facts about fanotify
-------------------------
(Measured on Linux 6.18 with a real overlay and a process in another mount namespace
that binds the merged dir elsewhere, as the jail does; see vm-tests/test_fanotify_*.py.)

- A ``FAN_MARK_MOUNT`` mark sees only opens through *that* mount.  The jail binds the
  merged view into its own mount namespace, which is a different mount: a mount mark on
  the helper's merged dir sees nothing the jail does.
- A ``FAN_MARK_FILESYSTEM`` mark on the merged dir marks the overlay's *superblock*, and
  each capsule has its own overlay superblock: it sees every open through any mount of
  that overlay, in any namespace, and nothing of other capsules or of the host (the
  upper and lower dirs are other superblocks).  It needs CAP_SYS_ADMIN in the initial
  user namespace, so a rootless helper has no read set: ``read`` is None with a reason.
- ``FAN_OPEN``, ``FAN_OPEN_EXEC`` and ``FAN_CLOSE_WRITE`` all work on overlayfs.
  ``FAN_REPORT_FID`` (and so ``FAN_REPORT_DFID_NAME``) is refused with EOPNOTSUPP on a
  default overlay; it works only with ``index=on,nfs_export=on``, which capsules do not
  use.  So events carry an open fd, which the kernel creates when we ``read()`` them,
  and ``O_PATH`` is refused as ``event_f_flags`` (EINVAL).
- The fd's path (``readlink /proc/self/fd/N``) is *not* a helper-side path.  It is the
  path in the opener's mount namespace ("/work/proj/a.txt" for a jail that binds the
  merged view at /work/proj), and once that namespace is gone the bind mount is detached
  and the path is relative to the overlay root ("/a.txt").  So: (1) the first time we
  see a live process of the exec, we hold its mount namespace open (an nsfs fd), which
  keeps the jail's mounts attached and the paths in one form until collect; (2) a path
  in an unknown form is resolved once by matching the fd's (st_dev, st_ino) against
  ``merged_dir/<suffix>`` for ever shorter suffixes, which learns the jail-side prefix;
  later paths with that prefix are a string slice, with no syscall.
- Attribution: events come from everyone who opens a file of the overlay, including the
  helper and the front end reading through ``open_root``.  Each event carries the pid
  (in the helper's pid namespace); a pid counts when its /proc/<pid>/cgroup is inside
  the exec cgroup (decided once per pid).  Without a cgroup, a pid counts when its mount
  namespace differs from the helper's.  When the pid has *already exited* by the time
  we look, it is counted: the only other openers (the helper, the front end) are
  long-lived and alive during the exec, so a vanished pid is almost surely a short-lived
  process of the exec (a compiler, a `cat` in a shell loop), and dropping it would lose
  real reads.  The cost is a rare false positive from a short-lived process *outside*
  the exec that opened a file of this very capsule during the exec.
- ``read`` means *opened* (any access mode, and executed): the open event does not carry
  the open flags.  ``written`` means closed after being opened for writing.  ``executed``
  means opened by execve (``FAN_OPEN_EXEC``; the same event also carries ``FAN_OPEN``, so
  an executed file is in ``read`` too).  A script's interpreter is exec-opened by the
  kernel as well, so it is seen when it lies on this overlay.  A path is as it is when
  the event is read: a file renamed meanwhile shows its new name, one deleted meanwhile
  is left out (the upper-dir scan reports creations, deletions and renames).
- Directories: with ``FAN_ONDIR`` in the mark's mask, opening a directory (``ls``,
  ``os.listdir``, ``readdir``, a dirfd for ``openat``) gives a ``FAN_OPEN`` event, on
  overlayfs as elsewhere, for lower-only and upper directories alike (measured on this
  kernel).  But in fd-reporting mode the kernel does *not* set ``FAN_ONDIR`` in the
  event's mask (only FID-reporting groups get it, and overlayfs refuses those), so a
  directory is told from a file by ``fstat`` of the event's fd, once per path.  They
  are ``listed``: opened, which is what listing needs (``getdents`` itself gives no
  event).  ``chdir``, ``stat``, ``readlink`` and ``O_PATH`` opens give no event at all,
  so symlinks followed on the way to a file are never seen: the fd's path is the
  resolved one.  The workspace root itself is reported as ``"."``.
- ``FAN_UNLIMITED_QUEUE`` removes the 16384-event queue limit, so nothing is lost; a
  ``FAN_Q_OVERFLOW`` event would still be honoured (``overflow=True``).  Identical
  events of one pid on one file merge in the queue, which only helps.
- Cost: a reader thread drains the queue while the command runs.  After each wakeup it
  waits 20 ms so events gather, then reads them 256 KiB at a time: a wakeup per open
  costs the traced process more than queueing the event does.  Per event it does one
  ``readlinkat(/proc/self/fd, "N")`` and nothing else once the opener's pid and the
  path prefix are known, plus one ``fstat`` the first time a path is seen (file or
  directory?); the fds of one read are usually consecutive and closed with a single
  ``close_range``.  Recording directory opens too cost nothing measurable: pytest on
  400 tests in a venv, median exec time within 3% either way over three rounds of 12.
"""

from __future__ import annotations

import contextlib
import errno
import os
import queue
import select
import stat
import struct
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sandbox import syscalls
from sandbox.errors import CcwError, from_oserror

if TYPE_CHECKING:
    from sandbox.exec_cgroup import ExecCgroup

_EVENT = struct.Struct("IBBHQii")  # struct fanotify_event_metadata
_METADATA_VERSION = 3
_READ_SIZE = 256 * 1024
_BATCH_DELAY = 0.02  # seconds the reader lets events gather after a wakeup
_MASK = syscalls.FAN_OPEN | syscalls.FAN_OPEN_EXEC | syscalls.FAN_CLOSE_WRITE | syscalls.FAN_ONDIR
_READ_BITS = syscalls.FAN_OPEN | syscalls.FAN_OPEN_EXEC
_ROOTLESS_REASON = (
    "fanotify needs CAP_SYS_ADMIN in the initial user namespace to watch a filesystem; "
    "this helper runs without it (rootless), so files read are not recorded. Run the helper "
    "as root for touched.read; touched.written still comes from the upper dir."
)


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


class Tracer:
    """A fanotify filesystem mark on one capsule's overlay, recording one exec."""

    def __init__(self, merged_dir: str, fan_fd: int | None, unavailable_reason: str | None) -> None:
        self.merged_dir = os.path.abspath(merged_dir)
        self.unavailable_reason = unavailable_reason
        self._fan_fd = fan_fd
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._error: BaseException | None = None
        self._cgroup: ExecCgroup | None = None
        self._self_pid = os.getpid()
        self._own_mntns = _ns_inode("self")
        self._pids: dict[int, bool] = {}
        self._ns_fd: int | None = None  # the exec's mount namespace, held open (see essay)
        self._recent: list[int] = []  # live exec pids whose namespace we may hold
        self._proc_fd: int | None = os.open("/proc/self/fd", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        self._prefixes = [self.merged_dir.rstrip("/") + "/"]
        self.read: set[str] = set()
        self.written: set[str] = set()
        self.listed: set[str] = set()
        self.executed: set[str] = set()
        self._is_dir: dict[str, bool] = {}  # per path, from one fstat (see essay)
        self.overflow = False
        self.dropped = 0

    # -- prepare
    @classmethod
    def prepare(cls, merged_dir: str) -> Tracer:
        """fanotify_init + a FAN_MARK_FILESYSTEM mark on the overlay mounted at ``merged_dir``.

        Without the privilege (rootless), returns a tracer whose collect() says why
        ``read`` is None.
        """
        flags = syscalls.FAN_CLASS_NOTIF | syscalls.FAN_CLOEXEC | syscalls.FAN_NONBLOCK | syscalls.FAN_UNLIMITED_QUEUE
        try:
            fan_fd = syscalls.fanotify_init(flags, os.O_RDONLY | os.O_LARGEFILE | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno in (errno.EPERM, errno.EACCES):
                return cls(merged_dir, None, _ROOTLESS_REASON)
            if exc.errno == errno.ENOSYS:
                return cls(merged_dir, None, "this kernel has no fanotify (CONFIG_FANOTIFY is off)")
            raise from_oserror(exc, "fanotify_init", None, "check that the kernel has CONFIG_FANOTIFY") from exc
        try:
            syscalls.fanotify_mark(
                fan_fd, syscalls.FAN_MARK_ADD | syscalls.FAN_MARK_FILESYSTEM, _MASK, -100, merged_dir
            )
        except OSError as exc:
            os.close(fan_fd)
            if exc.errno in (errno.EPERM, errno.EACCES):
                return cls(merged_dir, None, _ROOTLESS_REASON)
            if exc.errno == errno.EINVAL:
                return cls(merged_dir, None, "this kernel refuses FAN_MARK_FILESYSTEM or FAN_OPEN_EXEC "
                           "(needs Linux 5.1+), so files read are not recorded")
            raise from_oserror(exc, "fanotify_mark(FAN_MARK_FILESYSTEM) of", merged_dir,
                               "the capsule's overlay must be mounted there") from exc
        return cls(merged_dir, fan_fd, None)

    # -- enter
    def enter(self, cgroup: ExecCgroup | None, visible_at: str | None = None) -> None:
        """Start recording, counting only events of processes in ``cgroup``.

        Without a cgroup, events of processes in the helper's own mount namespace are
        the ones left out.  ``visible_at`` is where the exec sees the merged view (the
        jail binds it at the workspace's own path): paths under it are known at once,
        without learning the prefix from an inode, which a copy-up between the open
        and our read of its event would defeat.
        """
        if visible_at:
            # Longest first: with the state dir inside the workspace, the helper-side
            # merged path lies under the workspace path and must win.
            self._prefixes.append(visible_at.rstrip("/") + "/")
            self._prefixes.sort(key=len, reverse=True)
        if self._fan_fd is None or self._thread is not None:
            return
        self._cgroup = cgroup
        self._thread = threading.Thread(target=self._run, name="ccw-fanotify", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        assert self._fan_fd is not None
        poller = select.poll()
        poller.register(self._fan_fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        try:
            while True:
                poller.poll()
                if not self._stopping:
                    # Let events pile up: one big read instead of a wakeup per open,
                    # which costs the traced process more than the queueing does.  Wait
                    # on the wake pipe, not a plain sleep: collect() must not pay it.
                    select.select([self._wake_r], [], [], _BATCH_DELAY)
                self._drain()
                if self._stopping:
                    self._drain()
                    return
        except BaseException as exc:  # reported by collect(), never lost
            self._error = exc

    def _drain(self) -> None:
        assert self._fan_fd is not None
        while True:
            try:
                buf = os.read(self._fan_fd, _READ_SIZE)
            except BlockingIOError:
                return
            except InterruptedError:
                continue
            fds = self._handle(buf)
            if fds:
                _close_all(fds)
            if self._ns_fd is None:
                self._hold_namespace()

    def _handle(self, buf: bytes) -> list[int]:
        """Record the events in ``buf``; returns their fds, for the caller to close."""
        unpack, size, total = _EVENT.unpack_from, _EVENT.size, len(buf)
        pids, readlink, proc_fd = self._pids, os.readlink, self._proc_fd
        read, written, prefixes = self.read, self.written, self._prefixes
        listed, executed, is_dirs = self.listed, self.executed, self._is_dir
        fds: list[int] = []
        offset = 0
        while offset + size <= total:
            event_len, version, _, _, mask, fd, pid = unpack(buf, offset)
            if version != _METADATA_VERSION or event_len < size:
                _close_all(fds)
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
                inside = pids[pid] = self._classify(pid)
            if not inside:
                continue
            try:
                path = readlink(str(fd), dir_fd=proc_fd)
            except OSError:
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

    def _classify(self, pid: int) -> bool:
        """Whether events of ``pid`` belong to the exec (see the essay for exited pids)."""
        if pid == self._self_pid:
            return False
        if self._cgroup is not None:
            owned = self._cgroup.owns(pid)
            if owned is None:
                return True
        else:
            ns = _ns_inode(str(pid))
            if ns is None:
                return True
            owned = ns != self._own_mntns
        if owned:
            self._recent.append(pid)
            self._hold_namespace()
        return owned

    def _hold_namespace(self) -> None:
        """Hold the mount namespace of a live exec process, once it has its own (see essay).

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

    # -- collect / teardown
    def collect(self) -> Traced:
        """Stop the reader, drain what is queued, and return the touched files."""
        if self._fan_fd is None:
            return Traced(None, [], False, self.unavailable_reason)
        self._stop()
        if self._error is not None:
            raise CcwError("INTERNAL", f"the fanotify reader failed: {self._error!r}") from self._error
        if self._thread is None:  # enter() was never called: nothing belongs to an exec
            return Traced([], [], False, None, 0, [], [])
        return Traced(sorted(self.read), sorted(self.written), self.overflow, None, self.dropped,
                       sorted(self.listed), sorted(self.executed))

    def _stop(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._stopping = True
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"x")
            self._thread.join()

    def teardown(self) -> None:
        """Stop the reader and close every descriptor; idempotent.

        Closing a fanotify group waits for an SRCU grace period (milliseconds): that
        close is handed to a background thread so the exec's answer does not wait.
        """
        self._stop()
        for name in ("_fan_fd", "_ns_fd", "_proc_fd", "_wake_r", "_wake_w"):
            fd = getattr(self, name)
            if fd is not None:
                if name == "_fan_fd":
                    _close_later(fd)
                else:
                    with contextlib.suppress(OSError):
                        os.close(fd)
                setattr(self, name, None)


_closing: queue.SimpleQueue[int] = queue.SimpleQueue()
_closer: threading.Thread | None = None
_closer_lock = threading.Lock()


def _close_later(fd: int) -> None:
    """Close ``fd`` on the closer thread (started on first use, lives with the helper)."""
    global _closer
    with _closer_lock:
        if _closer is None:
            _closer = threading.Thread(target=_close_forever, name="ccw-fanotify-close", daemon=True)
            _closer.start()
    _closing.put(fd)


def _close_forever() -> None:
    while True:
        fd = _closing.get()
        with contextlib.suppress(OSError):
            os.close(fd)


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


def mechanisms() -> dict[str, str | None]:
    """For hello/isolation: whether touched.read can be recorded here."""
    try:
        fd = syscalls.fanotify_init(syscalls.FAN_CLASS_NOTIF | syscalls.FAN_CLOEXEC, os.O_RDONLY)
    except OSError as exc:
        return {"touched_read": None, "reason": _ROOTLESS_REASON if exc.errno == errno.EPERM else str(exc)}
    os.close(fd)
    return {"touched_read": "fanotify FAN_MARK_FILESYSTEM", "reason": None}
