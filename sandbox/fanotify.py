"""Files an exec read and wrote, from fanotify: one group per capsule, one reader per helper.

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
  the exec that opened a file of this very capsule during the exec.  While a capsule's
  services run beside its exec (services.py), every batch goes to each run's recording
  and each keeps the pids of its own cgroup (what they would each ask of one descriptor,
  its path and its mount, is asked once: fanotify_record.Batch).  A vanished pid's event
  is then judged by the mount its descriptor came through (``mnt_id`` in
  ``/proc/self/fdinfo``): each jail binds the view as a mount of its own, and a recording
  learns its jail's from the events of its live processes; before it knows one, it
  counts the event (a superset, never a loss).  A file another process closes after
  writing (another run, the front end's file tools) is noted apart in each recording
  (``elsewhere``): what the upper dir shows changed during a run is that run's only if it
  wrote it or no one else did; a rename or deletion by another run, which opens no file,
  is still counted.
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
- One group per capsule, one reader per helper.  A group made per exec cost
  ``fanotify_init`` and the mark (0.16 ms), starting a reader thread (``Thread.start``
  waits until it runs: 0.3 to 2.2 ms under load) and collecting it (issue 27's profile).
  So a capsule's group (``group_of``) is made at its first exec and kept until the
  capsule is destroyed (``close_group``) or its overlay found remounted (another
  ``st_dev``), and one thread of the helper reads every group.  Between execs the
  opens of others (the front end through ``open_root``, the helper) still arrive: the
  reader reads and drops them, closing their descriptors (a queued event holds the
  file's mount).  An exec's recording starts by reading and dropping, under the group's
  lock, whatever is still queued (into the runs already recording, if any), so nothing
  from before the exec is attributed to it, least of all a short-lived process that
  opened a file between execs and is gone, which the rule above would count.  It ends
  (``collect``) by reading, under the same lock, everything queued until then into the
  exec's record: every process of the jail is dead and reaped by then, an open is queued
  in the opener's context as it opens, and a close-write at the last close, which an
  exiting task makes before it can be reaped.  A group refused for want of privilege or
  kernel support (rootless) is not asked for again: the helper remembers why for its
  life.  Closing a group waits for an SRCU grace period (milliseconds), so it happens on
  a thread of its own.
- Cost: the reader drains the queues while commands run.  After each wakeup it
  waits 20 ms so events gather, then reads them 256 KiB at a time: a wakeup per open
  costs the traced process more than queueing the event does.  Per event it does one
  ``readlinkat(/proc/self/fd, "N")`` and nothing else once the opener's pid and the
  path prefix are known, plus one ``fstat`` the first time a path is seen (file or
  directory?); the fds of one read are usually consecutive and closed with a single
  ``close_range``.  Recording directory opens too cost nothing measurable: pytest on
  400 tests in a venv, median exec time within 3% either way over three rounds of 12.
- What the traced process pays (issue 36, bench/parts/syscall_cost.py): the mark asks
  for opens and close-writes only, never ``FAN_ACCESS`` or ``FAN_MODIFY`` (an event per
  ``read()``/``write()``), and no permission event, so nothing waits for the helper.
  Each open still allocates and queues an event (charged to the helper's memory
  cgroup): about 1.8 us more per Python open+read+close of a workspace file (13 us on
  the host, 20 on the bare overlay, 22.5 in a capsule's exec; medians of 11 rounds),
  and nothing measurable on ``stat``.  The overlay, not the tracer, is most of what an
  open costs more in a capsule.  Inode ignore marks (``FAN_MARK_IGNORE``, evictable)
  on files already recorded would spare repeated opens their events, but they follow the
  inode, not the name: a file renamed or hard-linked after its first open would then
  be opened under its new name unseen, so they are not used.  Between wakeups the
  reader's 20 ms wait lets identical events merge in the queue (a server answering the
  same file: about one event per ten GETs), and costs the helper 15 to 22 us of CPU per
  GET of http.server; a 100 ms wait cut that to 4 to 6 us, but the server's own CPU
  per GET was no lower (1.06 ms against 1.01, medians of two runs of three), and the
  helper's drain of the server's log lines costs it 45 to 60 us per GET anyway, so the
  wait stays at 20 ms.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import queue
import select
import threading
from typing import TYPE_CHECKING

from sandbox import syscalls
from sandbox.errors import CcwError, from_oserror
from sandbox.fanotify_record import Batch, Recording, Traced, _close_all, _ns_inode, event_fds
from sandbox.usage_words import NO_FANOTIFY_ROOTLESS

if TYPE_CHECKING:
    from sandbox.exec_cgroup import ExecCgroup

__all__ = ["Group", "Recording", "Traced", "close_group", "group_of", "mechanisms", "so_far"]

log = logging.getLogger("ccw.fanotify")

_READ_SIZE = 256 * 1024
_BATCH_DELAY = 0.02  # seconds the reader lets events gather after a wakeup
_MASK = syscalls.FAN_OPEN | syscalls.FAN_OPEN_EXEC | syscalls.FAN_CLOSE_WRITE | syscalls.FAN_ONDIR
_refused: list[str] = []  # why this helper cannot have a group at all, once learned (see the essay)


class Group:
    """A fanotify filesystem mark on one capsule's overlay, kept across its execs."""

    def __init__(self, merged_dir: str, fan_fd: int | None, unavailable_reason: str | None) -> None:
        self.merged_dir = os.path.realpath(merged_dir)
        self.unavailable_reason = unavailable_reason
        self.dev = os.stat(self.merged_dir).st_dev  # the overlay it watches (see group_of)
        self.own_mntns = _ns_inode("self")
        self.proc_fd = os.open("/proc/self/fd", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        self._fan_fd = fan_fd
        self._lock = threading.Lock()  # one reader of the queue at a time: the reader or an exec
        self._recordings: list[Recording] = []  # an exec's and its capsule's services' (services.py)
        if fan_fd is not None:
            _READER.add(fan_fd, self)

    @classmethod
    def open(cls, merged_dir: str) -> Group:
        """fanotify_init + a FAN_MARK_FILESYSTEM mark on the overlay mounted at ``merged_dir``.

        Without the privilege (rootless), a group whose recordings say why ``read`` is None.
        """
        if _refused:
            return cls(merged_dir, None, _refused[0])
        if os.stat(merged_dir).st_dev == os.stat(os.path.dirname(os.path.realpath(merged_dir))).st_dev:
            # Not a mount point: a filesystem mark there would watch the host's filesystem.
            raise CcwError("INTERNAL", f"{merged_dir!r} is not a mounted overlay, so its reads are not "
                           "recorded; destroy and recreate the capsule")
        flags = syscalls.FAN_CLASS_NOTIF | syscalls.FAN_CLOEXEC | syscalls.FAN_NONBLOCK | syscalls.FAN_UNLIMITED_QUEUE
        try:
            fan_fd = syscalls.fanotify_init(flags, os.O_RDONLY | os.O_LARGEFILE | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno in (errno.EPERM, errno.EACCES):
                return cls._refuse(merged_dir, NO_FANOTIFY_ROOTLESS)
            if exc.errno == errno.ENOSYS:
                return cls._refuse(merged_dir, "this kernel has no fanotify (CONFIG_FANOTIFY is off)")
            raise from_oserror(exc, "fanotify_init", None, "check that the kernel has CONFIG_FANOTIFY") from exc
        try:
            syscalls.fanotify_mark(
                fan_fd, syscalls.FAN_MARK_ADD | syscalls.FAN_MARK_FILESYSTEM, _MASK, -100, merged_dir
            )
        except OSError as exc:
            os.close(fan_fd)
            if exc.errno in (errno.EPERM, errno.EACCES):
                return cls._refuse(merged_dir, NO_FANOTIFY_ROOTLESS)
            if exc.errno == errno.EINVAL:
                return cls._refuse(merged_dir, "this kernel refuses FAN_MARK_FILESYSTEM or FAN_OPEN_EXEC "
                                   "(needs Linux 5.1+), so files read are not recorded")
            raise from_oserror(exc, "fanotify_mark(FAN_MARK_FILESYSTEM) of", merged_dir,
                               "the capsule's overlay must be mounted there") from exc
        return cls(merged_dir, fan_fd, None)

    @classmethod
    def _refuse(cls, merged_dir: str, why: str) -> Group:
        _refused[:] = [why]
        return cls(merged_dir, None, why)

    def record(self, cgroup: ExecCgroup | None, visible_at: str | None = None) -> Recording:
        """Start recording one run: events of processes in ``cgroup`` (without one, of
        processes in another mount namespace than the helper's) from now until its
        ``collect``.  What was queued before goes to the runs already recording, or is
        dropped (see the essay).  ``visible_at`` is where the run sees the merged view
        (fanotify_record.Recording)."""
        recording = Recording(self, cgroup, visible_at)
        if self._fan_fd is not None:
            with self._lock:
                self._read_into(self._recordings)
                self._recordings.append(recording)
        return recording

    def finish(self, recording: Recording) -> None:
        """Read what is queued into the recordings and stop recording this one (if it still is)."""
        with self._lock:
            if recording in self._recordings:
                self._read_into(self._recordings)
                with contextlib.suppress(ValueError):
                    self._recordings.remove(recording)

    def pump(self) -> None:
        """Read what is queued: into the runs recording now, else dropped (the reader calls it)."""
        with self._lock:
            self._read_into(self._recordings)

    def so_far(self, cgroup: ExecCgroup) -> Traced | str:
        """Read what is queued, then what the run in ``cgroup`` touched so far (module ``so_far``)."""
        with self._lock:
            self._read_into(self._recordings)
            for recording in self._recordings:
                if recording.records(cgroup):
                    return recording.so_far()
        return "the run is not recorded (its recording ended, or the fanotify reader failed)"

    def _read_into(self, recordings: list[Recording]) -> None:
        """Each batch to every recording (each keeps the events of its own cgroup); then its
        descriptors closed once.  A recording that fails stops, its error kept for its collect()."""
        while self._fan_fd is not None:
            try:
                buf = os.read(self._fan_fd, _READ_SIZE)
            except BlockingIOError:
                return
            except InterruptedError:
                continue
            batch = Batch(self.proc_fd)  # what the recordings share of this read
            for recording in list(recordings):
                try:
                    recording.take(buf, batch)
                except Exception as exc:  # reported by the run's collect(), never lost
                    recording.error = exc
                    recordings.remove(recording)
            fds = event_fds(buf)
            if fds:
                _close_all(fds)

    def close(self) -> None:
        """Stop watching: drop what is queued and close the group; idempotent."""
        with self._lock:
            fan_fd = self._fan_fd
            if fan_fd is not None:
                _READER.remove(fan_fd)
                self._read_into([])  # a queued event holds its file's mount
                self._fan_fd = None
            self._recordings = []
            proc_fd, self.proc_fd = self.proc_fd, -1
        if proc_fd >= 0:
            os.close(proc_fd)
        if fan_fd is not None:
            _close_later(fan_fd)


_groups: dict[str, Group] = {}  # merged dir: its capsule's group
_groups_lock = threading.Lock()


def group_of(merged_dir: str) -> Group:
    """The group of the capsule mounted at ``merged_dir``: made at its first exec, kept
    until ``close_group`` (the capsule's destroy), made anew if the overlay was remounted."""
    merged_dir = os.path.realpath(merged_dir)  # as mountinfo names it (close_group's callers)
    try:
        dev = os.stat(merged_dir).st_dev
    except OSError as exc:
        raise from_oserror(exc, "stat", merged_dir, "the capsule's overlay must be mounted there") from exc
    with _groups_lock:
        group = _groups.get(merged_dir)
        if group is not None and group.dev == dev:
            return group
        stale = _groups.pop(merged_dir, None)
    if stale is not None:
        stale.close()
    group = Group.open(merged_dir)
    with _groups_lock:
        _groups[merged_dir] = group
    return group


def so_far(merged_dir: str, cgroup: ExecCgroup) -> Traced | str:
    """What the run in ``cgroup`` of the capsule at ``merged_dir`` has touched so far, its recording
    going on; or why that is not known.  The group's queue is read first, under its lock: an open
    returns only once its event is queued, so every file the run opened before this call is in."""
    with _groups_lock:
        group = _groups.get(os.path.realpath(merged_dir))
    if group is None:
        return "the capsule has no fanotify group (its overlay was remounted since the run started)"
    return group.unavailable_reason or group.so_far(cgroup)


def close_group(merged_dir: str) -> None:
    """Close the group of the capsule at ``merged_dir``, if it has one (overlay.teardown, as
    the capsule's overlay is unmounted)."""
    with _groups_lock:
        group = _groups.pop(os.path.realpath(merged_dir), None)
    if group is not None:
        group.close()


class _Reader:
    """The helper's one thread that reads every group's events (see the essay)."""

    def __init__(self) -> None:
        self._groups: dict[int, Group] = {}  # fanotify fd: its group
        self._lock = threading.Lock()
        self._wake_r = self._wake_w = -1  # made with the thread, at the first group
        self._thread: threading.Thread | None = None

    def add(self, fan_fd: int, group: Group) -> None:
        with self._lock:
            self._groups[fan_fd] = group
            if self._thread is None:
                self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
                self._thread = threading.Thread(target=self._run, name="ccw-fanotify", daemon=True)
                self._thread.start()
        self._wake()

    def remove(self, fan_fd: int) -> None:
        with self._lock:
            self._groups.pop(fan_fd, None)
        self._wake()

    def _wake(self) -> None:
        if self._wake_w >= 0:
            with contextlib.suppress(BlockingIOError):  # a full pipe wakes the reader already
                os.write(self._wake_w, b"x")

    def _run(self) -> None:
        while True:
            try:
                self._once()
            except Exception:  # the reader must outlive any one group's trouble
                log.exception("the fanotify reader failed; going on")
                select.select([], [], [], _BATCH_DELAY)

    def _once(self) -> None:
        with self._lock:
            groups = dict(self._groups)
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        for fan_fd in groups:
            poller.register(fan_fd, select.POLLIN)
        ready = [fd for fd, _ in poller.poll() if fd != self._wake_r]
        with contextlib.suppress(BlockingIOError):
            os.read(self._wake_r, 4096)
        if ready:
            # Let events pile up: one big read instead of a wakeup per open, which costs
            # the traced process more than the queueing does.  An exec's collect reads
            # under the group's lock, which this wait does not hold: it never pays it.
            select.select([self._wake_r], [], [], _BATCH_DELAY)
        for fan_fd in ready:
            group = groups.get(fan_fd)
            if group is not None:
                group.pump()


_READER = _Reader()


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


def mechanisms() -> dict[str, str | None]:
    """For hello/isolation: whether touched.read can be recorded here."""
    try:
        fd = syscalls.fanotify_init(syscalls.FAN_CLASS_NOTIF | syscalls.FAN_CLOEXEC, os.O_RDONLY)
    except OSError as exc:
        return {"touched_read": None, "reason": NO_FANOTIFY_ROOTLESS if exc.errno == errno.EPERM else str(exc)}
    os.close(fd)
    return {"touched_read": "fanotify FAN_MARK_FILESYSTEM", "reason": None}
