"""Whose rename and deletion: seccomp user notification, one listener per overlapping run.

While a capsule's runs overlap (a service, and the exec or services beside it), the upper
dir's diff (execution.upper_diff) cannot say which run renamed or deleted what, and
fanotify cannot either (THREATS.md, "Known gaps": its directory-entry events need a
FID-reporting group, which overlayfs refuses for a whole overlay, and the pid of a reaped
``mv`` is unknowable).  So each such run's jail gets its seccomp filter in a notifying
form (seccomp.build_program with ``notifying``), which hands the rename and unlink family
to a listener:

- ``seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER)`` installs the
  filter and returns a descriptor, the listener.  ccw-jail's init installs it instead of
  the plain filter (after no_new_privs: steps.c ``install_listener``) and keeps
  the listener, polled beside its signals, until a notification is pending; only then
  does it send the listener over its capsule's socket (SCM_RIGHTS, steps.c
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
  unavailable record owns all).  The helper keeps its own copy of the jail's end of the
  socket while a record of the capsule lives, so an init's exit is no hang-up to wake on,
  and silence means what it says: no notification came.
- One socket per capsule (``Board``: SOCK_SEQPACKET), watched by the reader while a record
  of the capsule lives.  Each plan gives its init a copy of the jail's end and 8 random
  bytes, the run's key ('k'); a message is its kind ('L', 'F') and the key.  Who can send
  there: only the helper and the capsule's inits.  The copy is close-on-exec and ccw-jail
  closes the helper's other descriptors before the command runs; the init is not dumpable
  and the command has a user namespace of its own, so it can neither take the init's
  descriptors (ptrace, pidfd_getfd, /proc/1/fd) nor make it send; the key's plan is a
  memfd the init reads and closes.  So a listener goes to the run whose init sent it; a
  key of no running run is logged and dropped with its descriptor; a random key is one an
  init made to misbehave could name only by guessing 64 bits.  Past net.unix.max_dgram_qlen
  messages (10) an init waits in sendmsg until the reader reads, which it does at once.
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
- Only runs that can overlap pay: a plain exec in a capsule without services gets the
  plain filter (execution.run decides).  What a notification costs the process is
  measured by ``bench/run.py unotify``.  What a run that renames nothing costs is the
  helper's Python on the exec's thread, as that thread's CPU time (medians of 164 execs
  beside a service and alone; their wall time moved with others' load by more than this):
  its record (about 20 us), the socket's copy and the key in the plan (about 15 us), and
  the finish (about 30 us: a poll(2) of the socket, the board, which stays small beside a
  service that has seen thousands of execs: ``Board``); the reader wakes for nothing.  A
  socket per run cost about 45 us more at the spawn (a socketpair, an epoll_ctl) and 55 us
  at the finish (an epoll_ctl, two closes, a recvmsg that found nothing: its exception
  alone about 30 us of cold Python); a listener sent at once woke the reader four times a
  run (about 300 us of its CPU, taking the GIL from the exec's thread).  The jail paid too
  while this was a second filter over the jail's own: its cgroup's CPU for ``true`` was
  about 120 us more beside a service (2.22 against 2.10 ms, medians of 122), and a forked
  child that installs a second filter after the jail's own used about 50 us more CPU for
  a one-instruction filter, 75 us for this one and 105 us with its listener (medians of
  800): most of a filter's cost is fixed, not its length.  So the notifying rules are in
  the jail's own program, one filter installed with the listener; a kernel that refuses
  the listener gets the plain program instead.  Measured again as that change was made
  (forked children that install the filters and exec ``true``, CPU from wait4, medians
  of 1,000 interleaved, twice): the plain filter 2,270 and 2,402 us, the two filters
  2,302 and 2,440, the one notifying filter 2,300 and 2,434.  So the listener is what
  costs (about 30 us), not the second filter: one filter saves 3-6 us, and 2 million
  getppid calls took the same time under each.  It stays one filter for the simpler
  rule (each run has exactly one), not for speed.
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
from sandbox.jail_interface import LIMITS
from sandbox.unotify_paths import PAGE, Unreadable, read_path, resolve

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
_BATCH = 64  # notifications of one listener the reader answers before it looks at the others again
MAX_NAMES = 200_000  # paths one run's record keeps; past it the record owns everything
KEY_SIZE = LIMITS["NOTIFY_KEY"]  # a run's key: random, so that no init could name another run even by guessing

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
        self.start = 0  # the board's tick when it began (begin sets it)
        self.end: int | None = None
        self.key = os.urandom(KEY_SIZE)  # names this run's messages on its capsule's socket
        self.listener: int | None = None
        self.hung = False  # its listener polled POLLHUP: no process of the run is left
        self.synced = False  # SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP asked for (at its first notification)

    def socket_for_jail(self) -> tuple[int, bytes]:
        """A copy of the jail's end of the capsule's socket, which the init sends the listener
        on (the caller closes it once the jail is spawned), and the key the init names this run
        by there.  The filter counts as installed from here: the init says so if the kernel
        refused it, and sends the listener only when needed."""
        self.unavailable = None
        return _READER.expect(self), self.key

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
            dropped = not board.records and _boards.get(self.upper_dir) is board
            if dropped:
                del _boards[self.upper_dir]
        if dropped:
            _READER.forget(board)
        if self.unavailable is not None:
            log.info("renames and deletions unattributed: %s", self.unavailable)
        elif self.unknown:
            log.info("%d renames or deletions could not be read: this run keeps every one", self.unknown)
        return named


class Board:
    """One capsule's records, so that a run can see what the overlapping ones named, and the
    socket its runs' inits send their listeners on.

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
        # The capsule's socket (SOCK_SEQPACKET: a message each), made at the first jail that
        # needs it, kept (the jail's end too, copied to each init) while a record of it lives;
        # and the running records a jail was given the socket for, by key (the reader's lock held).
        self.sock: socket.socket | None = None
        self.jail_end: socket.socket | None = None
        self.queued: select.poll | None = None  # polls ``sock``: whether a message waits
        self.expected: dict[bytes, Record] = {}

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
        board = _boards.get(upper_dir)
        if board is None:  # not setdefault: a Board made and dropped at every exec beside a service
            board = _boards[upper_dir] = Board()
        record = Record(board, upper_dir, visible_at)
        with board.lock:
            record.start = next(board.counter)
            board.records.append(record)
    return record


def _pending(fd: int) -> int:
    """The poll(2) events ``fd`` has now (POLLIN: a notification waits; POLLHUP: no process is left)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return sum(event for _, event in poller.poll(0))


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

    Its epoll set holds each capsule's socket while a run of it lives, and each listener
    that came over one, each armed for one event at a time (EPOLLONESHOT): a run that
    renames nothing wakes the thread never (its listener stays with its init), one that
    does wakes it for its listener and then for its notifications; adding or removing a
    run is a dictionary entry from the caller's thread, not a wake-up.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: dict[int, Record | Board] = {}  # a descriptor in the epoll set: its record or board
        self._epoll: select.epoll | None = None  # made with the thread, at the first run
        self._buffer = ctypes.create_string_buffer(PAGE)
        self._calls = _names()

    def expect(self, record: Record) -> int:
        """A copy of the jail's end of ``record``'s capsule socket (made and watched at its first
        jail); a listener named by the record's key is the record's from now until ``remove``."""
        board = record.board
        with self._lock:
            if self._epoll is None:
                self._epoll = select.epoll()
                threading.Thread(target=self._run, args=(self._epoll,), name="ccw-unotify", daemon=True).start()
            if board.sock is None or board.jail_end is None:
                board.sock, board.jail_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                board.queued = select.poll()
                board.queued.register(board.sock, select.POLLIN)
                self._arm(board.sock.fileno(), board, new=True)
            board.expected[record.key] = record
            return os.dup(board.jail_end.fileno())

    def remove(self, record: Record) -> None:
        """Take the listener if it is still in flight, answer what is pending, close it."""
        board = record.board
        with self._lock:
            if board.expected.get(record.key) is record:
                # Its init sent what it sends before its last report: taken by now, or queued.
                # Polled first: a recvmsg that finds nothing costs the exception (about 30 us here).
                if board.queued is not None and board.queued.poll(0):
                    self._take(board)
                del board.expected[record.key]
            fd = record.listener
            if fd is None:
                return
            if self._armed.get(fd) is record:
                del self._armed[fd]
                with contextlib.suppress(OSError, ValueError):
                    self._epoll.unregister(fd)  # type: ignore[union-attr]
            if not record.hung:
                self._answer_all(record)
            os.close(fd)
            record.listener = None

    def forget(self, board: Board) -> None:
        """Close a board's socket: no record of it lives, so no jail is left to send on it."""
        with self._lock:
            if board.sock is not None:
                fd = board.sock.fileno()
                if self._armed.get(fd) is board:
                    del self._armed[fd]
                    with contextlib.suppress(OSError, ValueError):
                        self._epoll.unregister(fd)  # type: ignore[union-attr]
            for end in (board.sock, board.jail_end):
                if end is not None:
                    end.close()
            board.sock = board.jail_end = None
            board.queued = None

    def _arm(self, fd: int, owner: Record | Board, new: bool = False) -> None:
        """Watch ``fd`` for its next event (the lock held)."""
        assert self._epoll is not None
        self._armed[fd] = owner
        (self._epoll.register if new else self._epoll.modify)(fd, select.EPOLLIN | select.EPOLLONESHOT)

    def _run(self, epoll: select.epoll) -> None:
        while True:
            try:
                events = epoll.poll()
                with self._lock:  # remove() closes under it: an event of a closed descriptor finds no record
                    for fd, _mask in events:
                        owner = self._armed.get(fd)
                        if isinstance(owner, Board):
                            self._take(owner)
                            if owner.sock is not None:
                                self._arm(fd, owner)
                        elif owner is not None:
                            self._event(fd, owner)
            except Exception:  # the reader must outlive any one run's trouble: a blocked process waits on it
                log.exception("the seccomp notification reader failed; going on")
                select.select([], [], [], 0.02)  # a fault that repeats must not spin

    def _event(self, fd: int, record: Record) -> None:
        """One event of ``record``'s listener (the lock held).  The descriptor's state is read
        again here, not taken from the event: a number closed and reused since the event was
        returned must not be judged by its predecessor's."""
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

    def _take(self, board: Board) -> None:
        """Receive what the capsule's inits have sent (nonblocking, the lock held): each message
        its kind and its run's key, a listener ('L') or the kernel's refusal ('F')."""
        while board.sock is not None:
            try:  # not socket.recv_fds: before 3.12 it drops its flags, and would wait here
                message, ancillary, _flags, _addr = board.sock.recvmsg(
                    1 + KEY_SIZE, socket.CMSG_SPACE(_INT.size), socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC)
            except BlockingIOError:
                return
            if not message:
                return  # no message: only the helper's own copy of the jail's end would make one
            fds = [fd for level, kind, data in ancillary if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
                   for (fd,) in _INT.iter_unpack(data[:len(data) - len(data) % _INT.size])]
            record = board.expected.get(message[1:])
            if record is None or record.listener is not None:  # not a running run's: no one to answer for
                log.warning("a message on a capsule's notification socket names no running run; dropped")
            elif message[:1] == b"L" and fds:
                record.listener = fds.pop(0)
                self._arm(record.listener, record, new=True)
            elif message[:1] == b"F":
                record.unavailable = "the kernel refused the notifying seccomp filter"
            else:
                record.unavailable = "the jail's listener came without its descriptor"
            for extra in fds:
                os.close(extra)

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
            except Unreadable:
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
