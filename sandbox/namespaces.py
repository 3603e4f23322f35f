"""The jail's namespaces: which ones, the time offsets, the hostname, ``lo``, and id maps.

Some facts about namespaces, as the jail uses them:

- ``unshare(CLONE_NEWPID)`` does not move the caller: only its *next* child becomes pid 1
  of the new namespace.  The setting (``pid_for_children``) belongs to one *thread*, so
  the helper's thread can unshare, spawn the jail's init (ccw-jail) directly and
  ``setns`` back to its own pid namespace, sparing a second process.  Going back needs
  CAP_SYS_ADMIN over the user namespace that owns the helper's pid namespace, which a
  rootless helper usually lacks; then ccw-jail unshares it and forks the init.  When the
  init exits, the kernel SIGKILLs every other process of the namespace, so killing the
  init is how a timeout kills grandchildren and daemons alike.  Signals from inside the
  namespace reach the init only for signals it handles, so commands cannot kill it by
  accident.
- ``CLONE_NEWCGROUP`` makes the cgroup the caller is in *now* the namespace's root, so
  the per-exec cgroup must be entered before unsharing (the helper does that while the
  child waits on a pipe).
- ``CLONE_NEWTIME`` too applies to children only, and its offsets
  (``/proc/self/timens_offsets``) can be written only while no process lives in it.
  They shift CLOCK_MONOTONIC and CLOCK_BOOTTIME; the wall clock (CLOCK_REALTIME) has no
  namespace, so a wall-clock shift needs libfaketime's LD_PRELOAD, which works only for
  dynamically linked programs that go through libc.  A negative offset that would make
  a clock negative is refused (ERANGE), so it is clamped to the current uptime.
- A fresh network namespace has only ``lo``, and it is down.  Raising it is one
  ``SIOCSIFFLAGS`` ioctl.  pyroute2 does the same over netlink, but creating an
  ``IPRoute`` costs milliseconds (module machinery, an asyncio loop) in a process that
  was just forked from a multi-threaded helper, where anything that takes locks is a
  hazard; the ioctl is two syscalls.  Measured in a forked child in a fresh netns on
  this project's 2-core VM: ioctl median 0.35 ms, pyroute2 ``IPRoute().link("set",
  state="up")`` median 12 ms.
- Creating a network namespace is the dearest namespace by far (about 0.6 ms here,
  against 0.1 ms for mount, uts, ipc and cgroup together; the kernel registers every
  protocol's per-namespace state and sysctls), and raising its ``lo`` costs 0.2 ms
  more.  Neither needs the jail's process: a thread may ``unshare(CLONE_NEWNET)`` for
  itself alone (the namespace proxy is per thread), raise ``lo``, keep a descriptor
  of the namespace and ``setns`` back.  So while one jail builds its root, the helper's
  thread makes the next jail's network namespace (``spare_net``), and that jail's
  init ``setns`` into it.  Each spare serves one jail only and no process ever lives in
  it before; it is owned by the same user namespace as one the init would make, so the
  jail sees exactly what it would see after its own unshare.  Going back needs
  CAP_SYS_ADMIN over the user namespace that owns the helper's network namespace; a
  helper that lacks it makes no spares.
- Inside a user namespace (the rootless helper), ``setresuid`` to a uid that has no
  mapping fails with EINVAL and ``setgroups`` fails with EPERM once
  ``/proc/self/setgroups`` says "deny"; the jail then keeps the mapped ids.
- A rootless helper maps its user to 0, so its jail's command would be uid 0 of that
  namespace (no capability, but ``id`` says root: tests that skip for root skip, PostgreSQL
  refuses to start, pip and npm change course).  So the command gets a user namespace of
  its own (``command_ids``), mapping the user's own ids (the helper's map, read from
  inside, names them relative to the namespace the helper was started in) to the
  launcher's 0, as bubblewrap gives its command the caller's uid.  The launcher makes it
  after every mount and before it drops privileges (steps.c ``enter_user``): the single
  line "ID 0 1", for the launcher's own euid, is what an unprivileged process may write
  (user_namespaces(7)), once setgroups says "deny", and the command's kuid is unchanged,
  so the files it makes are still the user's on the host.  The jail's other namespaces stay
  owned by the helper's user namespace, so a capability the command ever regained there
  would reach none of them.  Only a helper whose namespace denies setgroups (one an
  unprivileged user made) does this: a privileged helper, even in a container's user
  namespace, already gives the caller's ids as the caller sees them.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from sandbox import syscalls
from sandbox.spec import JAIL_HOSTNAME, JAIL_NAMESPACES

# Every jail gets these (and a pid namespace, made before the init is spawned; a time
# namespace only when a clock offset is asked for).  They all apply to the caller itself.
JAIL_FLAGS = (
    syscalls.CLONE_NEWNS
    | syscalls.CLONE_NEWNET
    | syscalls.CLONE_NEWUTS
    | syscalls.CLONE_NEWIPC
    | syscalls.CLONE_NEWCGROUP
)

FAKETIME_LIBRARIES = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
)

_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_SIOCGSKNS = 0x894C  # a socket's network namespace, as a new descriptor
_IFF_UP = 0x1
_IFREQ = "16sH14x"  # struct ifreq: name, then ifr_flags in the union (40 bytes in all)


@dataclass(frozen=True)
class NamespacePlan:
    """What the jail's namespaces need, computed in the helper before the jail starts."""

    flags: int = JAIL_FLAGS
    timens_offsets: bytes | None = None  # text for /proc/self/timens_offsets, or None: no time ns
    extra_env: dict[str, str] = field(default_factory=dict)  # libfaketime's LD_PRELOAD/FAKETIME
    hostname: str = JAIL_HOSTNAME


def faketime_library() -> str | None:
    """The installed libfaketime (Debian package ``libfaketime``), or None."""
    for path in FAKETIME_LIBRARIES:
        if os.path.exists(path):
            return path
    return None


def time_namespace_supported() -> bool:
    """Whether the kernel has time namespaces (5.6+, CONFIG_TIME_NS)."""
    return os.path.exists("/proc/self/ns/time")


def timens_offsets(clock_offset_sec: int, monotonic_now: float, boottime_now: float) -> bytes:
    """The offsets text for a shift of ``clock_offset_sec``; negative shifts are clamped so no clock goes below 1 s."""
    mono = max(clock_offset_sec, 1 - int(monotonic_now))
    boot = max(clock_offset_sec, 1 - int(boottime_now))
    return f"monotonic {mono} 0\nboottime {boot} 0\n".encode()


def prepare(clock_offset_sec: int = 0, hostname: str = JAIL_HOSTNAME,
            env: dict[str, str] | None = None) -> NamespacePlan:
    """Plan the namespaces of one jail (in the helper; ccw-jail enters them)."""
    flags = JAIL_FLAGS
    offsets = None
    extra: dict[str, str] = {}
    if clock_offset_sec:
        if time_namespace_supported():
            offsets = timens_offsets(
                clock_offset_sec,
                time.clock_gettime(time.CLOCK_MONOTONIC),
                time.clock_gettime(time.CLOCK_BOOTTIME),
            )
        library = faketime_library()
        if library is not None:
            preload = (env or {}).get("LD_PRELOAD")
            extra["LD_PRELOAD"] = f"{library}:{preload}" if preload else library
            extra["FAKETIME"] = f"{clock_offset_sec:+d}"
            # The time namespace shifts the monotonic clocks already; libfaketime shifting
            # them too would double the offset (and it hangs some runtimes, per its README).
            extra["FAKETIME_DONT_FAKE_MONOTONIC"] = "1"
    return NamespacePlan(flags=flags, timens_offsets=offsets, extra_env=extra, hostname=hostname)


_PID_FOR_CHILDREN = "/proc/thread-self/ns/pid_for_children"


@functools.cache
def _restorable(path: str, nstype: int) -> bool:
    """Whether this helper may setns back into its own namespace at ``path`` (probed once)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            syscalls.setns(fd, nstype)  # to the namespace we are in: a no-op
        finally:
            os.close(fd)
        return True
    except OSError:
        return False


def pid_namespace_restorable() -> bool:
    """Whether this helper may setns back into its own pid namespace (probed once)."""
    return _restorable(_PID_FOR_CHILDREN, syscalls.CLONE_NEWPID)


@contextlib.contextmanager
def pid_namespace_for_next_child() -> Iterator[None]:
    """In this thread only, make the next child (fork or spawn) pid 1 of a new pid namespace."""
    saved = os.open(_PID_FOR_CHILDREN, os.O_RDONLY | os.O_CLOEXEC)
    try:
        syscalls.unshare(syscalls.CLONE_NEWPID)
        yield
    finally:
        try:
            syscalls.setns(saved, syscalls.CLONE_NEWPID)
        finally:
            os.close(saved)


_NET = "/proc/thread-self/ns/net"


def socket_in_own_net_namespace(fd: int) -> bool:
    """Whether socket ``fd`` was made in this thread's network namespace (a caller's may be
    of another: a helper under systemd's ``PrivateNetwork=yes`` has a namespace of its own)."""
    theirs = fcntl.ioctl(fd, _SIOCGSKNS)
    try:
        made_in, ours = os.fstat(theirs), os.stat(_NET)
    finally:
        os.close(theirs)
    return (made_in.st_dev, made_in.st_ino) == (ours.st_dev, ours.st_ino)


def net_namespace_restorable() -> bool:
    """Whether this helper's threads may setns back into its own network namespace (probed once)."""
    return _restorable(_NET, syscalls.CLONE_NEWNET)


def spare_net() -> int | None:
    """A fresh network namespace with ``lo`` up, for a later jail (made on this thread; see the essay).

    None when this helper could not come back to its own namespace, or the new one
    could not be made (the jail then unshares its own and reports what fails).  A
    failure to come back raises: this thread would otherwise stay in the spare.
    """
    if not net_namespace_restorable():
        return None
    saved = os.open(_NET, os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            syscalls.unshare(syscalls.CLONE_NEWNET)
        except OSError:
            return None
        spare: int | None = None
        try:
            loopback_up()
            spare = os.open(_NET, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            pass
        try:
            syscalls.setns(saved, syscalls.CLONE_NEWNET)
        except OSError:
            if spare is not None:
                os.close(spare)
            raise
        return spare
    finally:
        os.close(saved)


T = TypeVar("T")


def on_own_thread(work: Callable[[], T]) -> T:
    """``work()`` on a thread of its own, which ends with it: it may be left in another network
    namespace (egress.py and capsule_nets.py make theirs so, see egress.py's essay)."""
    outcome: list[T | BaseException] = []

    def run() -> None:
        try:
            outcome.append(work())
        except BaseException as exc:  # handed to the caller's thread
            outcome.append(exc)

    thread = threading.Thread(target=run, name="ccw-netns", daemon=True)
    thread.start()
    thread.join()
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


class SparePool(Generic[T]):
    """Kernel objects made ahead for later use, each handed out once: at most ``limit`` wait.

    ``make`` returns one (a descriptor, an egress kit), or None when it cannot make one
    (then nothing waits and the user makes its own); ``discard`` releases one nobody will
    take.  Refills run on a thread that would otherwise wait (supervise.py's, while a jail
    is built on the other core), off the next user's path.
    """

    def __init__(self, make: Callable[[], T | None], discard: Callable[[T], None] = os.close,  # type: ignore[assignment]
                 limit: int = 1) -> None:
        self._make = make
        self._discard = discard
        # One waits: a second user at the same moment makes its own.  So the helper's
        # descriptors stay steady once the pool is full (the abuse tests count them).
        self._limit = limit
        self._ready: list[T] = []
        self._making = 0  # spares being made now: they count toward the limit
        self._lock = threading.Condition()
        self._closed = False

    def take(self) -> T | None:
        """A spare (the caller owns it), or None when none waits."""
        with self._lock:
            return self._ready.pop() if self._ready else None

    def refill(self) -> None:
        """Make one spare, unless enough wait or are being made (or the pool is closed)."""
        with self._lock:
            if self._closed or len(self._ready) + self._making >= self._limit:
                return
            self._making += 1
        # ``_making`` drops only once the spare is in the pool or discarded: ``close`` waits
        # for it, so a spare made while the helper exits is never left to a daemon thread
        # the interpreter stops halfway through the discard.
        try:
            spare = self._make()
            if spare is None:
                return
            with self._lock:
                kept = not self._closed and len(self._ready) < self._limit
                if kept:
                    self._ready.append(spare)
            if not kept:
                self._discard(spare)  # closed meanwhile, or another filled the pool
        finally:
            with self._lock:
                self._making -= 1
                self._lock.notify_all()

    def close(self, wait_s: float = 5.0) -> None:
        """Discard what waits, after the spares being made (at most ``wait_s``); later refills make nothing.

        A spare still being made when its maker's process exits would be left behind (a
        spare cgroup's directories outlive the helper): its maker discards it instead.
        """
        with self._lock:
            self._closed = True
            self._lock.wait_for(lambda: self._making == 0, wait_s)
            ready, self._ready = self._ready, []
        for spare in ready:
            self._discard(spare)


def loopback_up() -> None:
    """Bring ``lo`` up in the jail's fresh network namespace (one ioctl; see the essay)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        got = fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, struct.pack(_IFREQ, b"lo", 0))
        flags = struct.unpack(_IFREQ, got)[1]
        fcntl.ioctl(sock.fileno(), _SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | _IFF_UP))


def parse_id_map(text: str) -> list[tuple[int, int, int]]:
    """Parse /proc/PID/uid_map or gid_map: (inside, outside, count) per line."""
    ranges = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3:
            ranges.append((int(parts[0]), int(parts[1]), int(parts[2])))
    return ranges


def is_mapped(inside_id: int, ranges: list[tuple[int, int, int]]) -> bool:
    """Whether ``inside_id`` has a mapping in the given id map."""
    return any(start <= inside_id < start + count for start, _outside, count in ranges)


def outside_id(inside_id: int, ranges: list[tuple[int, int, int]]) -> int:
    """What ``inside_id`` is in the parent user namespace, by the given map (itself if unmapped)."""
    for start, outside, count in ranges:
        if start <= inside_id < start + count:
            return outside + inside_id - start
    return inside_id


def command_ids(uid: int, gid: int) -> tuple[int, int] | None:
    """The uid and gid a rootless jail's command gets in a user namespace of its own, or None (see the essay).

    Only where the helper's namespace was made by an unprivileged user (setgroups denied), for
    the helper's own ids (the one line the launcher may map), and when they stand for others outside.
    """
    if setgroups_allowed() or (uid, gid) != (os.geteuid(), os.getegid()):
        return None
    uid_ranges, gid_ranges = read_id_maps()
    outside = (outside_id(uid, uid_ranges), outside_id(gid, gid_ranges))
    return outside if outside != (uid, gid) else None


def is_initial_user_namespace(uid_ranges: list[tuple[int, int, int]]) -> bool:
    """The initial user namespace maps every id to itself: ``0 0 4294967295``."""
    return uid_ranges == [(0, 0, 4294967295)]


@functools.lru_cache(maxsize=1)
def read_id_maps() -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    """The helper's own uid and gid maps (fixed once its user namespace is set up; read once)."""
    with open("/proc/self/uid_map") as uid_file, open("/proc/self/gid_map") as gid_file:
        return parse_id_map(uid_file.read()), parse_id_map(gid_file.read())


@functools.lru_cache(maxsize=1)
def setgroups_allowed() -> bool:
    """False when /proc/self/setgroups says "deny" (an unprivileged user namespace; read once)."""
    try:
        with open("/proc/self/setgroups") as handle:
            return handle.read().strip() != "deny"
    except OSError:
        return True


def mechanisms() -> dict[str, object]:
    """What namespace isolation is in force, for ``hello`` and ``isolation``."""
    uid_ranges, _ = read_id_maps()
    library = faketime_library()
    timens = time_namespace_supported()
    if timens and library:
        clock = "time namespace (monotonic, boottime) + libfaketime LD_PRELOAD (wall clock)"
    elif timens:
        clock = "time namespace (monotonic, boottime) only; wall clock not shifted: install libfaketime"
    elif library:
        clock = "libfaketime LD_PRELOAD (wall clock) only; no time namespace in this kernel"
    else:
        clock = "unavailable: no time namespace and no libfaketime"
    return {
        "namespaces": list(JAIL_NAMESPACES) + (["time (when clock_offset_sec != 0)"] if timens else []),
        "user_namespace": not is_initial_user_namespace(uid_ranges),
        "clock_offset": clock,
        "faketime_library": library,
        "network": "none: empty network namespace, lo up",
        "hostname": JAIL_HOSTNAME,
    }
