"""The jail's launcher: the plan handed to ``ccw-jail`` (C), spawned with posix_spawn.

The helper computes a jail's ``Plan`` (contain.prepare) and ``spawn`` writes it to a
memfd in the launcher's format, then posix_spawns ``ccw-jail`` (sandbox/jail/ccw_jail.c),
which builds the jail, becomes (or forks) its init and reports on descriptor 3
(contain.py's essay lists the reports; supervise.py reads them).

Some facts this follows from:

- Why a C program at all: issue 27's profile.  A fork of the 28 MB multi-threaded helper
  cost 1.3-2.0 ms in the parent and 1.3-2.8 ms more before the child ran, every Python
  step of the jail build then paid copy-on-write faults, the init's exit took 2.5-6.5 ms
  (its copy of the helper's image), and rootless a second fork 3.4 ms.  ``posix_spawn``
  (vfork + exec) of a small program returns in 0.14 ms; the program is static, so no
  dynamic loader runs before its first line.  The essay of ccw_jail.c says the rest.
- The plan (jail.h documents it, byte for byte): the magic, then records of a tag
  byte, a u32 length (native order: the launcher runs on this machine) and a payload;
  strings carry their NUL.  Every number both sides use (descriptors, option bits, step
  codes, bounds) is in one table, sandbox/jail_interface.py, which the build turns into
  the launcher's header; the magic ends in a digest of it, so a launcher built from
  another table refuses the plan rather than read shifted bits.  It is written to a
  memfd, not a pipe, so its size is known before it is read and no writer blocks on a
  large argv or environment.
- The descriptors the launcher gets (jail_interface.DESCRIPTORS): 0-2 the command's
  stdio, 3 the report pipe, 4 the plan, 5 a network namespace to join, 6 the root tree,
  7 the mount namespace to copy (``mounts.launch_namespace``: the capsule's binds then
  come inside the root tree), 8 and up the exec cgroup's ``tasks`` files, the binds'
  sources, and where a capsule's runs overlap the socket the notifying filter's listener
  goes back on (unotify.py).  Each source is first copied above the last target, so no
  dup2 of the spawn's file actions overwrites a source still to be placed; the launcher
  closes every descriptor past its own before anything else.
- The root tree comes built when the helper could make it ahead (``mounts.build_root``,
  detached, on the helper's thread).  A kernel before 6.15 cannot build a detached tree
  (mounts.py's essay); there the plan carries the tree's own steps
  (``mounts.root_steps``, as 'r' records) and the launcher builds it in place on the
  staging dir, attached (mounttree.py's essay on the /etc mask): one program builds
  every jail, and contain.py has no Python children any more.
- ``ccw-jail userns`` is the launcher's other use: it unshares a user namespace and holds
  it while the helper writes its maps (``user_namespace``; sandbox/idmap.py says why).
- The launcher lives next to this package (``ccw-jail``), built by the install
  (setup.py), never looked up on PATH.  A helper without it refuses to start
  (``require``): an exec must not silently take the slow path, or a different program.
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import struct

from sandbox import mounts
from sandbox.contain import END_SIGNAL, Plan
from sandbox.errors import CcwError
from sandbox.jail_interface import ACTIONS, DESCRIPTORS, MAGIC, OPTIONS, STEP_BITS

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ccw-jail")
# The table's numbers under the names this module's callers use (the table's keys).
FD_PLAN, FD_NET, FD_ROOT, FD_LAUNCH, FD_CGROUPS = (DESCRIPTORS[name] for name in (
    "PLAN", "NET", "ROOT", "LAUNCH", "CGROUPS"))
DIRECT, NET, ROOT, SET_UID, SET_GID, CLEAR_GROUPS, CONTROLLING_TTY, LAUNCH, OWN_USERNS = (
    OPTIONS[name] for name in (
        "DIRECT", "NET", "ROOT", "SET_UID", "SET_GID", "CLEAR_GROUPS", "CONTROLLING_TTY", "LAUNCH", "OWN_USERNS"))
SOURCE_IS_FILE, NOFOLLOW, SOURCE_FD = (STEP_BITS[name] for name in ("SOURCE_IS_FILE", "NOFOLLOW", "SOURCE_FD"))
_ALL_SIGNALS = signal.valid_signals()


def missing() -> str | None:
    """Why the launcher cannot be run (None: it can), with how to recover."""
    if os.access(PATH, os.X_OK):
        return None
    return (f"the jail launcher {PATH} is missing or not executable; reinstall ccw "
            "(pip install --force-reinstall ccw; in a checkout ./dev setup, or "
            "python setup.py launcher to build only it, in place: it needs gcc)")


def require() -> None:
    """Raise UNAVAILABLE when the launcher is missing (the helper's start)."""
    why = missing()
    if why is not None:
        raise CcwError("UNAVAILABLE", why, {"path": PATH})


def _record(tag: bytes, payload: bytes) -> bytes:
    return tag + struct.pack("=I", len(payload)) + payload


def _text(value: str) -> bytes:
    return os.fsencode(value) + b"\0"


def _step(tag: bytes, step: mounts.MountStep) -> bytes:
    bits = ((SOURCE_IS_FILE if step.source_is_file else 0) | (NOFOLLOW if step.data == "nofollow" else 0)
            | (SOURCE_FD if step.from_fd else 0))
    # The names the /etc overlay hides travel with its step ('/' is in no file name), then
    # after a newline (in none either) the hosts file its top layer holds (mounts.ETC_HOSTS).
    data = "/".join(mounts.ETC_SECRETS) + "\n" + step.data if step.action == "etc" else step.data
    strings = b"".join(_text(s) for s in (step.target, step.source, data, step.describe()))
    return _record(tag, struct.pack("=3I", ACTIONS[step.action], step.attrs, bits) + strings)


def encode(plan: Plan, options: int, cgroups: int, notify_fd: int | None = None, notify_key: bytes = b"") -> bytes:
    """The plan in the launcher's format (``options``: DIRECT, NET, ROOT, LAUNCH; ``cgroups``: tasks files passed;
    ``notify_fd``: where the notifying filter's socket is, with the plan's ``notify_filter``, and
    ``notify_key`` the run's key the init names its messages on it with: unotify.py).

    Without ROOT (no tree built ahead) the root tree's own steps go along, for the
    launcher to build the tree in place.
    """
    options |= ((SET_UID if plan.set_uid else 0) | (SET_GID if plan.set_gid else 0)
                | (CLEAR_GROUPS if plan.clear_groups else 0) | (CONTROLLING_TTY if plan.controlling_tty else 0)
                | (OWN_USERNS if plan.own_user_namespace else 0))
    keep = plan.keep_caps
    parts = [MAGIC, _record(b"O", struct.pack("=9I", plan.ns.flags, options, plan.uid, plan.gid, plan.last_cap,
                                                int(END_SIGNAL), cgroups, keep & 0xFFFFFFFF, keep >> 32)),
             _record(b"h", _text(plan.ns.hostname)), _record(b"c", _text(plan.cwd))]
    if plan.ns.timens_offsets is not None:
        parts.append(_record(b"t", plan.ns.timens_offsets))
    if plan.seccomp_filter is not None:
        parts.append(_record(b"f", plan.seccomp_filter.buffer.raw))
    if plan.notify_filter is not None and notify_fd is not None:
        parts.append(_record(b"u", struct.pack("=I", notify_fd) + plan.notify_filter.buffer.raw))
        if notify_key:
            parts.append(_record(b"k", notify_key))
    parts += [_record(b"a", _text(arg)) for arg in plan.argv]
    parts += [_record(b"e", _text(f"{key}={value}")) for key, value in plan.env.items()]
    parts += [_step(b"m", step) for step in plan.mount_steps]
    if not options & ROOT:
        parts += [_step(b"r", step) for step in mounts.root_steps()]
    parts.append(_record(b"Z", b""))
    return b"".join(parts)


def _plan_fd(raw: bytes) -> int:
    fd = os.memfd_create("ccw-jail-plan", os.MFD_CLOEXEC)
    try:
        view = memoryview(raw)
        while view:
            view = view[os.write(fd, view):]
    except BaseException:
        os.close(fd)
        raise
    return fd


def spawn(plan: Plan, fds: tuple[int | None, ...], direct: bool, sources: tuple[int, ...] = (),
          notify: tuple[int, bytes] | None = None) -> int:
    """posix_spawn the launcher with ``fds`` (stdin, stdout, stderr, report, net, root, launch, tasks files...).

    The caller keeps (and closes) ``fds``; a None net or root is made by the launcher, a
    None launch namespace is its own (the helper's: the plan's binds then come from there).
    ``sources``: the binds' detached sources (mounts.detach_sources), after the tasks files.
    ``notify``: the socket the init sends the notifying filter's listener on, after the
    sources, and the run's key (unotify.py); only with the plan's ``notify_filter``.
    Returns the launcher's pid: the jail's init when ``direct``.
    """
    stdio_report, net, root, launch, cgroups = fds[:4], fds[4], fds[5], fds[6], fds[7:]
    options = ((DIRECT if direct else 0) | (NET if net is not None else 0) | (ROOT if root is not None else 0)
               | (LAUNCH if launch is not None else 0))
    if plan.notify_filter is None:
        notify = None
    extra = (*cgroups, *sources) if notify is None else (*cgroups, *sources, notify[0])
    notify_fd = None if notify is None else FD_CGROUPS + len(cgroups) + len(sources)
    plan_fd = _plan_fd(encode(plan, options, len(cgroups), notify_fd, b"" if notify is None else notify[1]))
    placed = [*enumerate(stdio_report), (FD_PLAN, plan_fd), (FD_NET, net), (FD_ROOT, root), (FD_LAUNCH, launch),
              *((FD_CGROUPS + i, fd) for i, fd in enumerate(extra))]
    high: list[int] = []
    try:
        # Above every target first: no dup2 of the file actions then clobbers a source.
        lowest = FD_CGROUPS + len(extra)
        actions = []
        for target, fd in placed:
            if fd is not None:
                high.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, lowest))
                actions.append((os.POSIX_SPAWN_DUP2, high[-1], target))
        # Named by its bare name: the jail's /proc/1/cmdline need not show where ccw is installed.
        # Every signal blocked from its first instruction: an END_SIGNAL sent the moment the
        # spawn returns waits for the init's loop instead of killing it (the mask survives exec).
        return os.posix_spawn(PATH, ["ccw-jail"], {}, file_actions=actions, setsigmask=_ALL_SIGNALS)
    except OSError as exc:
        raise CcwError("UNAVAILABLE", f"could not start the jail launcher {PATH}: {exc.strerror}; "
                       "reinstall ccw if it is missing", {"path": PATH}) from exc
    finally:
        for fd in (*high, plan_fd):
            os.close(fd)


_USERNS_WAIT_MS = 5000  # for ccw-jail's one byte: it unshares, then writes


def user_namespace(uid_map: str, gid_map: str) -> int:
    """A new user namespace with these maps, as a descriptor the caller keeps (sandbox/idmap.py).

    ``ccw-jail userns`` unshares it and holds it until its stdin ends; meanwhile the helper,
    root of the parent namespace, writes both maps (the kernel takes them once, from a
    process of the parent holding CAP_SETUID and CAP_SETGID) and opens the namespace.
    """
    to_child, from_child = os.pipe2(os.O_CLOEXEC), os.pipe2(os.O_CLOEXEC)
    try:
        # Above stdio first, as ``spawn`` does: no dup2 then clobbers a source still to be placed.
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3) for fd in (to_child[0], from_child[1])]
        try:
            pid = os.posix_spawn(PATH, ["ccw-jail", "userns"], {}, file_actions=[
                (os.POSIX_SPAWN_DUP2, high[0], 0), (os.POSIX_SPAWN_DUP2, high[1], 1)])
        finally:
            for fd in (*high, to_child[0], from_child[1]):
                os.close(fd)
    except OSError as exc:
        for fd in (to_child[1], from_child[0]):
            os.close(fd)
        raise CcwError("UNAVAILABLE", f"could not start the jail launcher {PATH}: {exc.strerror}; "
                       "reinstall ccw if it is missing", {"path": PATH}) from exc
    try:
        poller = select.poll()
        poller.register(from_child[0], select.POLLIN)
        said = os.read(from_child[0], 16) if poller.poll(_USERNS_WAIT_MS) else b""
        if said[:1] == b"E" and said[1:].isdigit():  # unshare's errno, in the same write
            raise OSError(int(said[1:]), f"ccw-jail userns: unshare(CLONE_NEWUSER): {os.strerror(int(said[1:]))}")
        if said != b"U":
            raise OSError(0, "ccw-jail userns did not unshare a user namespace")
        for name, text in (("uid_map", uid_map), ("gid_map", gid_map)):
            with open(f"/proc/{pid}/{name}", "w") as handle:
                handle.write(text)
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(to_child[1])  # its stdin ends: it exits, the descriptor keeps the namespace
        os.close(from_child[0])
        os.waitpid(pid, 0)
