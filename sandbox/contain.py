"""Build one jail in its init: the plan made in the helper, then the list of steps in the child.

This is nsjail's contain: ``prepare`` turns a ``JailSpec`` into a ``Plan`` in the helper,
and the jail's first process applies it step by step.  That process is ``ccw-jail``, a
small C program the helper posix_spawns with the plan (sandbox/launcher.py says why C,
sandbox/jail/ is the program); it takes every step below exactly as the Python children
here do.  Those children (``jail_child``, then the init, applying ``contain``) are forked
only where no root tree can be built ahead, detached: kernels before 6.15 (mounts.py's
essay).  supervise.py starts either, feeds it and waits for it.

The process tree of one exec::

    helper thread ── posix_spawn ─▶ jail init   pid 1 of a new pid namespace (the thread
                               │             unshares CLONE_NEWPID for its next child, then
                               │             setns back); moves itself into the exec's
                               │             cgroups, then builds the jail (``contain``),
                               │             drops every privilege, and reaps, forwards
                               │             signals, reports
                               └ posix_spawn ─▶ command   (vfork + exec)

A rootless helper cannot setns back into its pid namespace, so there the helper's child
unshares the pid namespace and forks the init itself (a rootless helper has no cgroups).

Choices made here (DESIGN §2 leaves them open):

- The children forked from the (multi-threaded) helper use only os, ctypes and
  C-level modules (prctl, signal, fcntl, socket, resource): no logging, no locks.  Every
  path in them ends in ``os._exit``, never back in the helper's code.
- The init drops its own privileges before spawning the command, so the command
  inherits them (uid/gid, empty capability sets but a root caller's four file-ownership
  ones (rootcaps.py), no_new_privs, RLIMIT_CORE 0, and the
  seccomp filter of seccomp.py, installed last).  The
  init is then non-dumpable, so a command under the same uid can neither ptrace it nor
  open its /proc/1/fd; PR_SET_PDEATHSIG on the command itself is replaced by the pid
  namespace: when the init dies, the kernel kills every process in it.
- The first child moves *itself* into the exec's cgroups (``_enter_cgroups``), first
  thing, through files the helper opened (``ExecCgroup.entry_files``): nothing of the
  command's runs before every write has returned, and the cgroup namespace, unshared
  later in ``contain``, is rooted at the exec's cgroups, so the jail sees them as ``/``.
  Why the child writes rather than the helper: exec_cgroup.py's essay (the cost of a
  migration).
- Messages from the children to the helper go over one pipe, each a single write
  shorter than PIPE_BUF (atomic): ``C`` a failed move into a cgroup, ``P`` the init's
  host pid, ``E`` a failed step,
  ``W`` the command's wait status (from the init), ``A`` the init's wait status,
  ``R`` the rusage of every process the init reaped (rusage.py), sent last.
  supervise.py reads them.
- When the command has exited, the init SIGKILLs what is left of the jail (``kill(-1)``
  reaches only its own pid namespace) and reaps it before it reports ``R`` and exits:
  what the kernel would do when the init exits, but done by the init, so that
  ``getrusage(RUSAGE_CHILDREN)`` covers every process the jail ever had.  This is the
  usage source where no cgroup serves (rootless mode).
- An exec on a terminal (``JailSpec.tty_fd``, a pty slave the caller sent) has it as
  descriptors 0, 1 and 2, and the command runs in a session of its own with it as
  controlling terminal (``_spawn``), so a shell does job control and Ctrl-C reaches
  the foreground job, never the init.  The seccomp filter still denies TIOCSTI and
  TIOCLINUX on it.  The jail names it /dev/console (mounts.py: the jail's devpts is
  another instance, where it has no name), so ``tty`` and ttyname answer; the helper's
  name for it comes from ``readlink(/proc/self/fd/N)`` (``_terminal_name``).
- The init setns into a network namespace and moves a root tree onto /tmp when the
  helper made them ahead (supervise.py's spare pools, descriptors 5 and 6), or makes its
  own when none waits.  An "egress" capsule's init always gets descriptor 5: the
  capsule's own jail namespace (egress.py), lo and eth0 already up.
"""

from __future__ import annotations

import errno
import fcntl
import gc
import os
import resource
import signal
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

import prctl

from sandbox import egress, mounts, namespaces, rootcaps, seccomp, syscalls
from sandbox import rusage as rusage_
from sandbox.errors import CcwError

_FD_REPORT = 3  # in the jail parent; 0-2 are the command's stdio
_FD_NET, _FD_ROOT = 4, 5  # spares made ahead, when the helper had them (see supervise._SparePool)
_FD_CGROUPS = 6  # and up: the exec cgroup's files to move into (ExecCgroup.entry_files)
_SETUP_FAILED = 125
# Sent by the helper to the init on timeout: "end the jail yourself" (so that it still
# reports the rusage of what it reaps); not one of the forwarded signals.  A command may
# send it to its init too, which gains it nothing: it can kill(-1) its own jail anyway.
END_SIGNAL = signal.SIGRTMIN
_FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
                      signal.SIGUSR1, signal.SIGUSR2)
_FORBIDDEN_WORKSPACES = ("/proc", "/dev", "/sys", mounts.OLD_ROOT)
# Reset in the command: Python ignores SIGPIPE and SIGXFSZ, and ignoring survives exec.
_DEFAULT_SIGNALS = tuple(s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP))


@dataclass
class JailSpec:
    """One command to run, and the capsule it runs in."""

    merged_dir: str  # the capsule's overlay merged view (path in the helper's mount ns)
    workspace: str  # absolute path at which the merged view is bound read-write inside the jail
    tmp_dir: str  # becomes /tmp; persists across execs of the capsule
    home_dir: str  # becomes $HOME (env["HOME"]); persists across execs
    argv: list[str]
    cwd: str  # inside the jail
    env: dict[str, str]  # final: exactly what the command sees
    stdin: bytes | None = None
    timeout_ms: int = 300_000
    output_cap: int = 1 << 20  # bytes kept per stream
    uid: int = 0
    gid: int = 0
    clock_offset_sec: int = 0
    hostname: str = "ccw"
    network: str = "none"  # "none": an empty network namespace with lo up; "egress": net_fd's
    net_fd: int | None = None  # "egress": the capsule's jail network namespace (the caller keeps it)
    binds: tuple[mounts.Bind, ...] = ()  # host dirs shown besides the workspace (toolchains, git dirs)
    tty_fd: int | None = None  # a pty slave: the command's stdio and controlling terminal (the caller keeps it)


@dataclass(frozen=True)
class Plan:
    """Everything the forked children need, computed in the helper."""

    ns: namespaces.NamespacePlan
    mount_steps: list[mounts.MountStep]
    argv: list[str]
    env: dict[str, str]
    cwd: str
    uid: int
    gid: int
    set_uid: bool
    set_gid: bool
    clear_groups: bool
    last_cap: int
    keep_caps: int = 0  # rootcaps.kept_for: the capabilities the command keeps (a mask)
    seccomp_filter: seccomp.Filter | None = None  # built once in the helper; None: no filter for this arch
    controlling_tty: bool = False  # stdin is a pty slave: the command's session takes it as its terminal


def _last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as handle:
            return int(handle.read())
    except (OSError, ValueError):
        return 63


_LAST_CAP = _last_cap()


def _invalid(message: str, **details: object) -> CcwError:
    return CcwError("INVALID_ARGUMENT", message, dict(details))


def _check_spec(spec: JailSpec) -> None:
    if not spec.argv or not all(isinstance(arg, str) and "\0" not in arg for arg in spec.argv):
        raise _invalid("argv must be a non-empty list of strings without NUL bytes")
    for key, value in spec.env.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise _invalid(f"env name {key!r} or its value is not valid; names need no '=' or NUL")
    workspace = spec.workspace
    if not os.path.isabs(workspace) or os.path.normpath(workspace) != workspace or workspace == "/":
        raise _invalid(f"workspace {workspace!r} must be a normalised absolute path other than '/'")
    if any(mounts._under(workspace, p) for p in _FORBIDDEN_WORKSPACES) or workspace in ("/tmp", spec.env.get("HOME")):
        raise _invalid(f"workspace {workspace!r} collides with a path the jail mounts itself (/proc, /dev, /sys, /tmp, $HOME)")
    if not os.path.isabs(spec.cwd):
        raise _invalid(f"cwd {spec.cwd!r} must be absolute (a path inside the jail)")
    for name in ("merged_dir", "tmp_dir", "home_dir"):
        path = getattr(spec, name)
        if not os.path.isdir(path):
            raise CcwError("NOT_FOUND", f"{name} {path!r} is not a directory; create the capsule's dirs first", {"path": path})
    if spec.network not in ("none", "egress") or (spec.network == "egress") != (spec.net_fd is not None):
        raise CcwError("INTERNAL", f"network {spec.network!r} with net_fd {spec.net_fd}: 'egress' comes with "
                       "the capsule's namespace, 'none' without one")
    if not 0 < len(spec.hostname.encode()) <= 64 or "\0" in spec.hostname:
        raise _invalid("hostname must be 1 to 64 bytes")
    if spec.timeout_ms <= 0 or spec.output_cap < 0 or spec.uid < 0 or spec.gid < 0:
        raise _invalid("timeout_ms must be > 0; output_cap, uid and gid must be >= 0")


def _terminal_name(tty_fd: int | None) -> str | None:
    """The path the helper's mount namespace gives the exec's terminal (/dev/pts/N), or None."""
    if tty_fd is None:
        return None
    try:
        name = os.readlink(f"/proc/self/fd/{tty_fd}")
    except OSError:
        return None
    return name if name.startswith("/") else None  # "anon_inode:..." and the like are no path


def prepare(spec: JailSpec) -> Plan:
    """Check the spec and compute the jail's plan (mounts, namespaces, credentials)."""
    _check_spec(spec)
    ns = namespaces.prepare(spec.clock_offset_sec, spec.hostname, spec.env)
    home = spec.env.get("HOME")
    steps = mounts.prepare(
        merged_dir=spec.merged_dir,
        workspace=spec.workspace,
        tmp_dir=spec.tmp_dir,
        home=home if home and os.path.isabs(home) else None,
        home_dir=spec.home_dir,
        binds=spec.binds,
        terminal=_terminal_name(spec.tty_fd),
    )
    uid_ranges, gid_ranges = namespaces.read_id_maps()
    return Plan(
        ns=ns,
        mount_steps=steps,
        argv=list(spec.argv),
        env={**spec.env, **ns.extra_env},
        cwd=spec.cwd,
        uid=spec.uid,
        gid=spec.gid,
        # Rootless: an id with no mapping in our user namespace cannot be switched to.
        set_uid=namespaces.is_mapped(spec.uid, uid_ranges),
        set_gid=namespaces.is_mapped(spec.gid, gid_ranges),
        clear_groups=namespaces.setgroups_allowed(),
        last_cap=_LAST_CAP,
        keep_caps=rootcaps.kept_for(spec.uid, uid_ranges),
        seccomp_filter=seccomp.prepare(),
        controlling_tty=spec.tty_fd is not None,
    )


# --- the children (forked; os, ctypes and C modules only) --------------------------------


def _send(kind: bytes, payload: bytes) -> None:
    message = kind + payload[:3000]
    os.write(_FD_REPORT, struct.pack("!H", len(message)) + message)


def _fail(step: str, exc: BaseException) -> NoReturn:
    number = exc.errno if isinstance(exc, OSError) and exc.errno else 0
    text = exc.strerror if isinstance(exc, OSError) and exc.strerror else repr(exc)
    try:
        _send(b"E", f"{step}\0{number}\0{text}".encode(errors="replace"))
    finally:
        os._exit(_SETUP_FAILED)


def _arrange_fds(fds: tuple[int | None, ...]) -> None:
    # Copy above any target first, so no dup2 clobbers a descriptor still to be moved.
    high = [None if fd is None else fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in fds]
    for target, fd in enumerate(high):
        if fd is not None:
            os.dup2(fd, target, inheritable=target <= 2)
        else:
            try:
                os.close(target)  # whatever of the helper's sits in an unused slot
            except OSError:
                pass
    syscalls.close_range(len(fds))  # every descriptor of the helper: sockets, fanotify, capsule dirs


def jail_child(plan: Plan, fds: tuple[int | None, ...], is_init: bool) -> NoReturn:
    """The helper's child: move itself into the exec's cgroups, then become (or fork) the init.

    ``fds``: stdin, stdout, stderr, report, a spare network namespace and a spare root
    tree or None, then one open file per hierarchy of the exec's cgroup; they become
    descriptors 0, 1, 2 and so on.
    """
    try:
        gc.disable()  # a collection would touch (and so copy) every page of the helper's heap
        _arrange_fds(fds)
        prctl.set_pdeathsig(signal.SIGKILL)  # the helper's thread blocks in run() until we end
        _enter_cgroups(len(fds))
        if not is_init:  # rootless fallback: unshare the pid namespace here, fork its init
            try:
                syscalls.unshare(syscalls.CLONE_NEWPID)
            except OSError as exc:
                _fail("unshare pid namespace", exc)
            init = os.fork()
            if init:
                _send(b"P", struct.pack("!i", init))
                os.closerange(0, 3)  # only the jail holds the output pipes now
                _, status = os.waitpid(init, 0)
                _send(b"A", struct.pack("!i", status))
                os._exit(0)
            prctl.set_pdeathsig(signal.SIGKILL)  # this process's death ends the namespace
        _jail_init(plan, net_prepared=fds[_FD_NET] is not None,
                   root=_FD_ROOT if fds[_FD_ROOT] is not None else None)
    except BaseException as exc:
        _fail("jail child", exc)


def _enter_cgroups(end: int) -> None:
    """Move ourselves into the exec's cgroups, before anything else: "0" is the writing
    thread, and we have only one (a forked copy of the calling thread), so the whole process.

    Each write returns once the kernel has moved us; one that fails ends this child with a
    ``C`` report (which file, the errno), and the helper fails the exec.
    """
    for fd in range(_FD_CGROUPS, end):
        try:
            os.write(fd, b"0")
        except OSError as exc:
            try:
                _send(b"C", struct.pack("!ii", fd - _FD_CGROUPS, exc.errno or 0))
            finally:
                os._exit(_SETUP_FAILED)
        os.close(fd)


def contain(plan: Plan, net_prepared: bool, root: int | None) -> None:
    """Build the jail, step by step, in the jail's init (nsjail's containProc).

    ``net_prepared``: descriptor 5 is a fresh network namespace with lo up; ``root``, a
    descriptor of the root tree (mounts.build_root); both made by the helper while the
    previous jail was being built.  Without them, the init makes its own.
    """
    if net_prepared:
        _step("setns into the prepared network namespace", namespaces.enter_net, _FD_NET)
        _step("unshare mount, uts, ipc, cgroup namespaces", namespaces.enter,
              plan.ns.flags & ~syscalls.CLONE_NEWNET)
    else:
        _step("unshare mount, net, uts, ipc, cgroup namespaces", namespaces.enter, plan.ns.flags)
    # Mount points are made for the caller to traverse (a workspace under a 0700 $HOME
    # needs its parents made inside the jail's $HOME), whatever umask the helper has: the
    # service runs with UMask=0077, which made them 0700 root's (found in the Vagrant VM).
    helper_umask = os.umask(0o022)
    for mount_step in plan.mount_steps:  # private → root (system, /dev) → capsule → proc → sys → seal
        _step(mount_step.describe(), mounts.enter, mount_step, root)
    os.umask(helper_umask)
    _step("sethostname", namespaces.set_hostname, plan.ns.hostname)
    if not net_prepared:
        _step("lo up", namespaces.loopback_up)
    if plan.ns.timens_offsets is not None:
        _step("time namespace", namespaces.enter_time, plan.ns.timens_offsets)
    _step("drop privileges", drop_privileges, plan)
    _step(f"chdir {plan.cwd}", os.chdir, plan.cwd)


def _step(name: str, action: Callable[..., object], *args: object) -> None:
    try:
        action(*args)
    except OSError as exc:
        _fail(name, exc)


def drop_privileges(plan: Plan) -> None:
    """Caller's uid/gid, no capabilities (a root caller keeps rootcaps.py's four), no_new_privs,
    PDEATHSIG, no core dumps, seccomp."""
    for cap in range(plan.last_cap + 1):
        if not plan.keep_caps >> cap & 1:
            prctl.capbset_drop(cap)  # needs CAP_SETPCAP, so before the uid changes
    if plan.clear_groups:
        os.setgroups([])
    if plan.set_gid:
        os.setresgid(plan.gid, plan.gid, plan.gid)
    if plan.set_uid:
        os.setresuid(plan.uid, plan.uid, plan.uid)
    # uid 0 keeps its sets through setresuid: set them to exactly what is kept.  With
    # no_new_privs, root's exec then gives the command the bounding set (= keep_caps).
    syscalls.capset(plan.keep_caps)
    prctl.set_no_new_privs(1)
    # The init keeps the report pipe: a non-dumpable process cannot be ptraced, nor its
    # /proc/1/fd opened, by the command running under the same uid.
    prctl.set_dumpable(0)
    prctl.set_pdeathsig(signal.SIGKILL)  # after the credential change, which clears it
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # Last: the filter holds for the init and everything it spawns (see seccomp.py).
    if plan.seccomp_filter is not None:
        seccomp.enter(plan.seccomp_filter)


def _spawn(plan: Plan) -> int:
    """posix_spawn the command as the init's child (vfork: no second Python fork); PATH as execvp."""
    name = plan.argv[0]
    if "/" in name:
        candidates = [name]
    else:
        path = plan.env.get("PATH", os.defpath)
        candidates = [os.path.join(directory or ".", name) for directory in path.split(":")]
    # A session leader without a terminal that opens a tty without O_NOCTTY takes it as
    # its controlling terminal: posix_spawn calls setsid() before the file actions, and
    # /proc/self/fd/0 reopens the pty slave (the jail's /dev/pts is another devpts).  The
    # slot is closed first (glibc closes an open action's target), so not 0 itself.
    # Any slot above 2 does: the spawned child's copy of it is close-on-exec anyway.
    actions = [(os.POSIX_SPAWN_OPEN, _FD_REPORT, "/proc/self/fd/0", os.O_RDWR, 0),
               (os.POSIX_SPAWN_CLOSE, _FD_REPORT)] if plan.controlling_tty else []
    denied: OSError | None = None
    for candidate in candidates:
        try:
            return os.posix_spawn(candidate, plan.argv, plan.env, setsid=True, file_actions=actions,
                                  setsigdef=_DEFAULT_SIGNALS, setsigmask=())
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ESTALE, errno.ENAMETOOLONG):
                continue
            if exc.errno == errno.EACCES:
                denied = denied or exc
                continue
            raise
    if denied is not None:
        raise denied
    raise FileNotFoundError(errno.ENOENT, "command not found" if "/" not in name else "No such file or directory")


def _jail_init(plan: Plan, net_prepared: bool, root: int | None) -> NoReturn:
    """pid 1: build the jail, spawn the command, forward signals, reap until it ends."""
    contain(plan, net_prepared, root)
    try:
        command = _spawn(plan)
    except OSError as exc:
        # Like a shell: 127 when there is nothing to run, 126 when it cannot be run.
        code = 127 if exc.errno == errno.ENOENT else 126
        os.write(2, f"ccw: {plan.argv[0]}: {exc.strerror}\n".encode(errors="replace"))
        _send(b"W", struct.pack("!i", code << 8))
        _send(b"R", rusage_.pack(resource.getrusage(resource.RUSAGE_CHILDREN), 0))
        os._exit(0)
    os.closerange(0, 3)

    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(command, signum)
        except OSError:
            pass

    # The peak the command inherits from this process's image (see rusage.py), read
    # after the spawn: posix_spawn's vfork child has exec'd by the time it returns.
    inherited_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for signum in _FORWARDED_SIGNALS:
        signal.signal(signum, forward)
    signal.signal(END_SIGNAL, _kill_all)  # the helper's timeout: the command is reaped below
    while True:
        pid, status = os.waitpid(-1, 0)  # reaps orphans too: we are their init
        if pid == command:
            break
    _send(b"W", struct.pack("!i", status))
    _end_jail()
    _send(b"R", rusage_.pack(resource.getrusage(resource.RUSAGE_CHILDREN), inherited_kb))
    os._exit(0)


def _kill_all(_signum: int = 0, _frame: object = None) -> None:
    """SIGKILL every process of our pid namespace but ourselves.

    One call suffices: kill(-1) walks the tasks under the lock fork needs to add a child,
    and a process with SIGKILL pending cannot fork any more.
    """
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        pass  # ESRCH: nothing left


def _end_jail() -> None:
    """SIGKILL every other process of the pid namespace and reap them all (we are its pid 1)."""
    _kill_all()
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def mechanisms() -> dict[str, object]:
    """What the jail puts in force, for ``hello`` and a capsule's ``isolation``."""
    info = namespaces.mechanisms()
    info.update({
        "root": "tmpfs, host system dirs read-only, workspace read-write at its own path",
        "proc": "fresh; /proc/sys, sysrq-trigger, irq, bus, fs read-only; kcore, keys, timer_list... masked",
        "dev": "minimal: null zero full random urandom tty (bound), devpts, shm; a terminal as console",
        "capabilities": rootcaps.mechanism(),
        "no_new_privs": True,
        "seccomp": seccomp.mechanisms(),
        "uid": "the caller's (SO_PEERCRED), unless unmapped in the helper's user namespace",
        "init": "ccw-jail (C) as pid 1, spawned with posix_spawn; command started with posix_spawn",
        "direct_pid_namespace": namespaces.pid_namespace_restorable(),
        "network_egress": egress.MECHANISM,
    })
    return info
