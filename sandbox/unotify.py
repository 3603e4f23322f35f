"""Whose rename and deletion: seccomp user notification, one listener per overlapping run.

While a capsule's runs overlap (a service, and the exec or services beside it), the upper
dir's diff (execution.upper_diff) cannot say which run renamed or deleted what, and
fanotify cannot either (THREATS.md, "Known gaps": its directory-entry events need a
FID-reporting group, which overlayfs refuses for a whole overlay, and the pid of a reaped
``mv`` is unknowable).  So each such run's jail gets a second seccomp filter
(seccomp.build_notify_program) that hands the rename and unlink family to a listener:

- ``seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER)`` installs the
  filter and returns a descriptor, the listener.  ccw-jail's init installs it last
  (after no_new_privs and the jail's own filter: steps.c ``install_listener``) and keeps
  the listener, polled beside its signals, until a notification is pending; only then
  does it send the listener over a socket the helper gave it (SCM_RIGHTS, steps.c
  ``hand_listener``) and close its copy.  So a run that renames and deletes nothing (most
  execs beside a service) costs the helper's reader nothing: no descriptor comes, no
  thread wakes.  No privilege is needed but no_new_privs, so a rootless helper has it
  too; no ptrace permission is needed to take the descriptor, as pidfd_getfd(2) would.
- Every notification on a listener comes from a process of that one run (the filter is
  inherited across fork and exec and cannot be removed): no pid has to be judged.  The
  process waits in the syscall until the listener answers, so it is alive while the
  helper reads its arguments: the paths from its memory (process_vm_readv), a relative
  path's base from ``/proc/PID/cwd`` or ``/proc/PID/fd/N`` (the path in the jail's mount
  namespace, as fanotify.py's essay says of descriptors).  ``SECCOMP_IOCTL_NOTIF_ID_VALID``
  after reading says the process is still the one that asked (seccomp_unotify(2)); then
  the helper answers ``SECCOMP_USER_NOTIF_FLAG_CONTINUE``: the kernel runs the syscall
  as if no filter had stopped it.
- CONTINUE re-reads the arguments from the process's memory: another thread may change
  them in between (the TOCTOU the man page warns about), so a record may name another
  path than the one renamed.  That is acceptable here because nothing is *decided* on it:
  the upper dir's diff stays the truth of what changed, and a run's notifications only
  pick which run a diff entry belongs to (``Named.owns``).
- The kernel's rules the helper must live with: a notification no one answers blocks its
  process for ever (so one helper thread reads every listener, and answers CONTINUE in a
  ``finally`` whatever went wrong); and once the last copy of a listener closes, every
  pending and later notified syscall fails with ENOSYS (seccomp_unotify(2): the filter
  stays, its listener is gone).  So the helper keeps a run's listener until the run has
  ended (its init's last report: every other process of its pid namespace is dead, and
  the init renames nothing); the init closes a listener it never handed over only by its
  exit, when no process is left to fail; and a listener it could not send fails the
  jail rather than leave its ``rm`` failing.  A kernel that refuses the filter: the init
  sends an ``F`` instead, and the run is attributed as before (``Named`` of an
  unavailable record owns all).  The helper keeps a copy of the jail's end of the
  socket until the run's record is finished, so the init's exit is no hang-up to wake on,
  and silence means what it says: no notification came.
- ``RECV`` needs its buffer zeroed (EINVAL otherwise) and blocks while nothing is
  pending, so the reader asks only when poll(2) says one is; a listener whose processes
  have all exited polls POLLHUP.
- Cost: each notified call is two context switches and the reader's Python (the memory
  read, a readlink, three ioctls): on this 2-core VM under others' load, 100 to 250 us
  a call against about 11 us for a bare rename on the overlay.  Most of it is the
  ping-pong: the answer wakes the process, which runs to its next notified call before
  the reader has the CPU back.  ``SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP`` (6.6) hands the
  CPU over directly on both wake-ups, and is asked for (it gave about a quarter less in
  a bare rename loop here; a kernel without it answers EINVAL, and nothing changes).
- Only runs that can overlap pay: a plain exec in a capsule without services gets no
  second filter (execution.run decides).  What a notification costs the process is
  measured by ``bench/run.py unotify``.  What a run that renames nothing costs is the
  helper's Python on the exec's own thread (its record, a socketpair, an epoll_ctl, and
  the finish: about 60 us together here, with a service beside that has seen thousands
  of execs: ``Board``); the reader wakes for nothing.  The first version had the listener
  sent at once, and woke its reader four times a run (a run added; the listener came; its
  last process exited; the run removed), each time rebuilding a poll set and taking the
  GIL from the exec's thread while it spawned the jail and built the reply (about 300 us
  of the reader's CPU a run, here under others' load).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import itertools
import logging
import os
import select
import socket
import struct
import threading
from dataclasses import dataclass

from sandbox import seccomp

log = logging.getLogger("ccw.unotify")

# linux/seccomp.h: _IOWR('!', 0, struct seccomp_notif) and friends.
NOTIF_RECV = 0xC0502100
NOTIF_SEND = 0xC0182101
NOTIF_ID_VALID = 0x40082102
NOTIF_SET_FLAGS = 0x40082104  # _IOW('!', 4, __u64), Linux 6.6; its argument is the flags' value
USER_NOTIF_FD_SYNC_WAKE_UP = 1
USER_NOTIF_FLAG_CONTINUE = 1
_NOTIF = struct.Struct("=QIIiIQ6Q")  # id, pid, flags, then seccomp_data: nr, arch, ip, args
_RESP = struct.Struct("=QqiI")  # id, val, error, flags
_INT = struct.Struct("=i")  # a descriptor in SCM_RIGHTS
AT_FDCWD = -100
PATH_MAX = 4096
_BATCH = 64  # notifications of one listener the reader answers before it looks at the others again
MAX_NAMES = 200_000  # paths one run's record keeps; past it the record owns everything
_PAGE = os.sysconf("SC_PAGE_SIZE")

# For each notified syscall: the (dirfd arg or None, path arg) pairs it names.
_ARGS = {"rename": ((None, 0), (None, 1)), "renameat": ((0, 1), (2, 3)), "renameat2": ((0, 1), (2, 3)),
         "unlink": ((None, 0),), "unlinkat": ((0, 1),), "rmdir": ((None, 0),)}


@dataclass(frozen=True)
class Named:
    """What one run's notifications named, beside what the overlapping runs' named meanwhile."""

    mine: frozenset[str]
    others: frozenset[str]
    complete: bool  # False: some notification could not be read, or none could be had at all
    unknown: int = 0

    def owns(self, path: str) -> bool:
        """Whether a diff entry may be this run's: unless another run named it (or a parent
        directory) and this one did not, or this record is incomplete (a superset, never a loss)."""
        if not self.complete:
            return True
        ancestry = _ancestry(path)
        return any(p in self.mine for p in ancestry) or not any(p in self.others for p in ancestry)


def _ancestry(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(len(parts), 0, -1)]


class Record:
    """One run's notifications: the run-relative paths they named, each with when."""

    def __init__(self, board: Board, upper_dir: str, visible_at: str) -> None:
        self.board = board
        self.upper_dir = upper_dir
        self.visible_at = os.fsencode(visible_at.rstrip("/") or "/")
        self.names: dict[str, int] = {}
        self.unknown = 0
        self.unavailable: str | None = "no listener came from the jail"
        self.start = board.tick()
        self.end: int | None = None
        self.sock: socket.socket | None = None
        self.jail_end: socket.socket | None = None  # the init's end, kept here: its exit is no hang-up
        self.listener: int | None = None
        self.hung = False  # its listener polled POLLHUP: no process of the run is left
        self.synced = False  # SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP asked for (at its first notification)

    def socket_for_jail(self) -> int:
        """A copy of the jail's end of a new socket the init sends the listener on (the caller
        closes it once the jail is spawned); this record reads the other end from now on, and
        holds the jail's end until it is finished.  The filter counts as installed from here:
        the init says so if the kernel refused it, and sends the listener only when needed."""
        self.sock, self.jail_end = socket.socketpair()
        self.unavailable = None
        _READER.add(self)
        return os.dup(self.jail_end.fileno())

    def note(self, full: bytes | None) -> None:
        """One path a notification named (None: unreadable)."""
        if full is None:
            self.unknown += 1
            return
        ws = self.visible_at
        if full == ws:
            rel = "."
        elif full.startswith(ws + b"/") or ws == b"/":
            rel = os.fsdecode(full[len(ws):].lstrip(b"/"))
        else:
            return  # outside the workspace (/tmp, $HOME): not in the upper dir
        with self.board.lock:
            if rel in self.names:
                del self.names[rel]  # named again: to the end, so that the dict stays in the order of when
            elif len(self.names) >= MAX_NAMES:
                self.unknown += 1
                return
            self.names[rel] = next(self.board.counter)

    def since(self, tick: int) -> list[str]:
        """The paths this run named at ``tick`` or later (the board's lock held): the newest
        first, and no older one looked at."""
        paths = []
        for path, when in reversed(self.names.items()):
            if when < tick:
                break
            paths.append(path)
        return paths

    def finish(self) -> Named:
        """Stop: answer what is pending, close the listener, and what this run named beside
        what the others named since it began."""
        _READER.remove(self)
        board = self.board
        with _boards_lock, board.lock:
            self.end = next(board.counter)
            board.records.remove(self)
            others: set[str] = set()
            for record in board.records:
                others.update(record.since(self.start))
            for record in reversed(board.ended):  # in the order they ended: those that overlapped this run
                if record.end is not None and record.end < self.start:
                    break
                others.update(record.since(self.start))
            named = Named(frozenset(self.names), frozenset(others), self.unavailable is None and not self.unknown,
                          self.unknown)
            if self.names:  # a run that named nothing has nothing to tell the runs it overlapped
                board.ended.append(self)
            board.prune()
            if not board.records and _boards.get(self.upper_dir) is board:
                del _boards[self.upper_dir]
        if self.unavailable is not None:
            log.info("renames and deletions unattributed: %s", self.unavailable)
        elif self.unknown:
            log.info("%d renames or deletions could not be read: this run keeps every one", self.unknown)
        return named


class Board:
    """One capsule's records, so that a run can see what the overlapping ones named.

    The running ones, and the ended ones that named something while a running one may
    need them, in the order they ended.  A finish looks only at those that overlapped it,
    and at their names from its start on: an exec beside a service that has run for days,
    beside thousands of execs before, costs what one beside a new one costs.  (The first
    version kept every record a running one overlapped and scanned them all, each with all
    its names: a finish grew with every exec before it.)
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counter = itertools.count()
        self.records: list[Record] = []  # running
        self.ended: list[Record] = []  # ended, having named something, in the order they ended

    def tick(self) -> int:
        with self.lock:
            return next(self.counter)

    def prune(self) -> None:
        """Forget the ended records that ended before every running one began (the lock held)."""
        first = min((record.start for record in self.records), default=None)
        drop = 0
        for record in self.ended:
            if first is not None and record.end is not None and record.end >= first:
                break
            drop += 1
        del self.ended[:drop]


_boards: dict[str, Board] = {}  # a capsule's upper dir: its board, while a record of it lives
_boards_lock = threading.Lock()  # taken before a board's own


def begin(upper_dir: str, visible_at: str) -> Record:
    """A record for one run of the capsule whose upper dir this is; ``visible_at``: where the
    run sees the workspace.  The caller calls its ``finish`` once the run has ended."""
    with _boards_lock:
        board = _boards.setdefault(upper_dir, Board())
        record = Record(board, upper_dir, visible_at)
        with board.lock:
            board.records.append(record)
    return record


def _pending(fd: int) -> int:
    """The poll(2) events ``fd`` has now (POLLIN: a notification waits; POLLHUP: no process is left)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return sum(event for _, event in poller.poll(0))


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.process_vm_readv.argtypes = [ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_ulong,
                                   ctypes.POINTER(_Iovec), ctypes.c_ulong, ctypes.c_ulong]
_libc.process_vm_readv.restype = ctypes.c_ssize_t


class _Unreadable(Exception):
    """The path cannot be read, and the syscall would not succeed either (EFAULT)."""


def read_path(pid: int, address: int, buffer: ctypes.Array[ctypes.c_char]) -> bytes:
    """The NUL-terminated string at ``address`` in ``pid``'s memory, read a page at most at a time."""
    got = b""
    base = ctypes.addressof(buffer)
    while len(got) < PATH_MAX:
        want = min(_PAGE - (address + len(got)) % _PAGE, PATH_MAX - len(got))
        local = _Iovec(base, want)
        remote = _Iovec(address + len(got), want)
        n = _libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if n <= 0:
            number = ctypes.get_errno() if n < 0 else errno.EFAULT
            if number == errno.EFAULT:
                raise _Unreadable
            raise OSError(number, os.strerror(number))
        chunk = ctypes.string_at(base, n)
        end = chunk.find(b"\0")
        if end >= 0:
            return got + chunk[:end]
        got += chunk
    raise _Unreadable  # ENAMETOOLONG for the kernel too


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


def _names() -> dict[int, tuple[tuple[int | None, int], ...]]:
    arch = os.uname().machine
    out: dict[int, tuple[tuple[int | None, int], ...]] = {}
    for name, args in _ARGS.items():
        number = seccomp.syscall_number(name, arch) if arch in ("x86_64", "aarch64") else None
        if number is not None:
            out[number] = args
    return out


class _Reader:
    """The helper's one thread that takes the listeners and answers every notification.

    Its epoll set holds each run's socket until the listener comes over it, then the
    listener, each armed for one event at a time (EPOLLONESHOT): a run that renames
    nothing wakes the thread twice (its listener comes; its last process exits), and
    adding or removing a run is an epoll_ctl from the caller's thread, not a wake-up.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: dict[int, Record] = {}  # a descriptor in the epoll set: its record
        self._epoll: select.epoll | None = None  # made with the thread, at the first run
        self._buffer = ctypes.create_string_buffer(_PAGE)
        self._calls = _names()

    def add(self, record: Record) -> None:
        assert record.sock is not None
        with self._lock:
            if self._epoll is None:
                self._epoll = select.epoll()
                threading.Thread(target=self._run, args=(self._epoll,), name="ccw-unotify", daemon=True).start()
            self._arm(record.sock.fileno(), record, new=True)

    def remove(self, record: Record) -> None:
        """Take the listener if it is still in flight, answer what is pending, close both ends."""
        with self._lock:
            for fd in (record.listener, record.sock.fileno() if record.sock is not None else None):
                if fd is not None and self._armed.get(fd) is record:
                    del self._armed[fd]
                    with contextlib.suppress(OSError, ValueError):
                        self._epoll.unregister(fd)  # type: ignore[union-attr]
            self._take(record)
            if record.listener is not None:
                if not record.hung:
                    self._answer_all(record)
                os.close(record.listener)
                record.listener = None
            for end in (record.sock, record.jail_end):
                if end is not None:
                    end.close()
            record.sock = record.jail_end = None

    def _arm(self, fd: int, record: Record, new: bool = False) -> None:
        """Watch ``fd`` for its next event (the lock held)."""
        assert self._epoll is not None
        self._armed[fd] = record
        (self._epoll.register if new else self._epoll.modify)(fd, select.EPOLLIN | select.EPOLLONESHOT)

    def _run(self, epoll: select.epoll) -> None:
        while True:
            try:
                events = epoll.poll()
                with self._lock:  # remove() closes under it: an event of a closed descriptor finds no record
                    for fd, _mask in events:
                        record = self._armed.get(fd)
                        if record is not None:
                            self._event(fd, record)
            except Exception:  # the reader must outlive any one run's trouble: a blocked process waits on it
                log.exception("the seccomp notification reader failed; going on")
                select.select([], [], [], 0.02)  # a fault that repeats must not spin

    def _event(self, fd: int, record: Record) -> None:
        """One event of ``record``'s socket or listener (the lock held).  The descriptor's state
        is read again here, not taken from the event: a number closed and reused since the
        event was returned must not be judged by its predecessor's."""
        if fd != record.listener:
            self._take(record)
            del self._armed[fd]  # the socket is closed, or watched again below
            if record.listener is not None:
                self._arm(record.listener, record, new=True)
            elif record.sock is not None:
                self._arm(fd, record)
            return
        state = _pending(fd)
        if state & select.POLLIN:
            if not record.synced:  # set at the first notification: a run with none never pays for it
                record.synced = True
                with contextlib.suppress(OSError):  # before 6.6: EINVAL, and the ordinary wake-up
                    fcntl.ioctl(fd, NOTIF_SET_FLAGS, USER_NOTIF_FD_SYNC_WAKE_UP)
            self._answer_all(record, _BATCH)
            self._arm(fd, record)
        elif state & select.POLLHUP:  # every process of the run has exited; remove() closes it
            record.hung = True
        else:
            self._arm(fd, record)

    def _take(self, record: Record) -> None:
        """Receive the listener from the socket, if the init has sent it (nonblocking)."""
        if record.listener is not None or record.sock is None:
            return
        try:  # not socket.recv_fds: before 3.12 it drops its flags, and would wait here
            _msg, ancillary, _flags, _addr = record.sock.recvmsg(
                1, socket.CMSG_SPACE(_INT.size), socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC)
        except BlockingIOError:
            return
        fds = [fd for level, kind, data in ancillary if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
               for (fd,) in _INT.iter_unpack(data[:len(data) - len(data) % _INT.size])]
        if fds:
            record.listener = fds[0]
            record.unavailable = None
            for extra in fds[1:]:
                os.close(extra)
        else:  # an 'F' and no descriptor: the kernel refused the filter
            record.unavailable = "the kernel refused the notifying seccomp filter"
        record.sock.close()
        record.sock = None

    def _answer_all(self, record: Record, most: int | None = None) -> None:
        """Answer the pending notifications of ``record``'s listener (poll says when one is),
        ``most`` at a time: a run that floods its listener must not starve the others'."""
        assert record.listener is not None
        poller = select.poll()
        poller.register(record.listener, select.POLLIN)
        for _ in itertools.count() if most is None else range(most):
            if not any(event & select.POLLIN for _, event in poller.poll(0)):
                return
            self._answer(record, record.listener)

    def _answer(self, record: Record, listener: int) -> None:
        buf = bytearray(_NOTIF.size)
        try:
            fcntl.ioctl(listener, NOTIF_RECV, buf)
        except OSError as exc:  # ENOENT: its process was killed meanwhile
            if exc.errno not in (errno.ENOENT, errno.EINTR):
                raise
            return
        notif_id, pid, _flags, nr, _arch, _ip, *args = _NOTIF.unpack(buf)
        try:
            self._note(record, listener, notif_id, pid, self._calls.get(nr, ()), args)
        finally:
            with contextlib.suppress(OSError):  # ENOENT: it is gone, and its syscall with it
                fcntl.ioctl(listener, NOTIF_SEND, _RESP.pack(notif_id, 0, 0, USER_NOTIF_FLAG_CONTINUE))

    def _note(self, record: Record, listener: int, notif_id: int, pid: int,
              pairs: tuple[tuple[int | None, int], ...], args: list[int]) -> None:
        paths: list[bytes | None] = []
        bases: dict[int, bytes] = {}  # a rename's two names mostly share their directory
        for dirfd_arg, path_arg in pairs:
            try:
                raw = read_path(pid, args[path_arg], self._buffer)
                paths.append(resolve(pid, None if dirfd_arg is None else args[dirfd_arg], raw, bases))
            except _Unreadable:
                continue  # the kernel fails the syscall too (EFAULT, ENAMETOOLONG)
            except OSError:
                paths.append(None)
        try:
            fcntl.ioctl(listener, NOTIF_ID_VALID, struct.pack("=Q", notif_id))
        except OSError:
            return  # no longer the process that asked: nothing happened
        for path in paths:
            record.note(path)


_READER = _Reader()
