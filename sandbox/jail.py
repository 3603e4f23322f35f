"""Run one command in a namespace jail: the list of steps, the init, the output capture.

The process tree of one exec::

    helper thread ── fork ─▶ jail init      pid 1 of a new pid namespace (the thread
                               │             unshares CLONE_NEWPID for its next child, then
                               │             setns back); waits for the sync byte while the
                               │             helper puts it in the exec's cgroup, then builds
                               │             the jail (``contain``), drops every privilege,
                               │             and reaps, forwards signals, reports
                               └ posix_spawn ─▶ command   (vfork + exec: no second Python fork)

A rootless helper cannot setns back into its pid namespace, so there the helper's child
waits for the sync byte, unshares the pid namespace and forks the init itself.

Choices made here (DESIGN §2 leaves them open):

- The command's exit ends the jail: when it exits, the init SIGKILLs whatever else still
  runs in the pid namespace (background jobs, daemons), reaps it, reports and exits.
  On timeout the helper asks the init to do the same at once (``END_SIGNAL``), and if
  it has not ended ``_END_GRACE_SEC`` later, SIGKILLs it (through its pidfd in the
  rootless fallback) and calls the exec cgroup's ``kill()``: the kernel then kills what
  is left, but the usage of what it reaps so is lost (see rusage.py).
- Failures of the jail's own steps (a mount, chdir to a missing cwd) raise CcwError
  naming the step; a command that cannot be executed is a *result*, exit code 127
  (not found) or 126 (not executable) with a shell-like message on stderr.
- stdin is a memfd holding ``spec.stdin`` (or /dev/null): no writer thread, no deadlock
  however large it is.  stdout and stderr are pipes drained to the end; bytes past
  ``output_cap`` are counted and dropped, so the command never blocks on a full pipe.
- The children forked from the (multi-threaded) helper use only os, ctypes and
  C-level modules (prctl, signal, fcntl, socket, resource): no logging, no locks.  Every
  path in them ends in ``os._exit``, never back in the helper's code.
- The init drops its own privileges before spawning the command, so the command
  inherits them (uid/gid, empty capability sets, no_new_privs, RLIMIT_CORE 0, and the
  seccomp filter of seccomp.py, installed last).  The
  init is then non-dumpable, so a command under the same uid can neither ptrace it nor
  open its /proc/1/fd; PR_SET_PDEATHSIG on the command itself is replaced by the pid
  namespace: when the init dies, the kernel kills every process in it.
- Messages from the children to the helper go over one pipe, each a single write
  shorter than PIPE_BUF (atomic): ``P`` the init's host pid, ``E`` a failed step,
  ``W`` the command's wait status (from the init), ``A`` the init's wait status,
  ``R`` the rusage of every process the init reaped (rusage.py), sent last.
- When the command has exited, the init SIGKILLs what is left of the jail (``kill(-1)``
  reaches only its own pid namespace) and reaps it before it reports ``R`` and exits:
  what the kernel would do when the init exits, but done by the init, so that
  ``getrusage(RUSAGE_CHILDREN)`` covers every process the jail ever had.  This is the
  usage source where no cgroup serves (rootless mode).
- The two dearest parts of a jail that need nothing of its process, the network
  namespace with lo up and the root tree (tmpfs, system dirs, /dev), are made by the
  helper's thread for the *next* jail while the child builds the current one on the
  other core (``_SparePool``); the init setns into the one and moves the other onto
  /tmp, or makes its own when none waits.  Each serves one jail.
"""

from __future__ import annotations

import errno
import fcntl
import gc
import os
import resource
import select
import signal
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

import prctl

from sandbox import mounts, namespaces, seccomp, syscalls
from sandbox import rusage as rusage_
from sandbox.errors import CcwError, from_oserror

if TYPE_CHECKING:
    from sandbox.cgroups import ExecCgroup

_FD_SYNC, _FD_REPORT = 3, 4  # in the jail parent; 0-2 are the command's stdio
_FD_NET, _FD_ROOT = 5, 6  # spares made ahead, when the helper had them (see _SparePool)
_SETUP_FAILED = 125
_KILL_GRACE_SEC = 5.0  # after a timeout kill, how long to wait for the pipes to close
_END_GRACE_SEC = 1.0  # after asking the init to end the jail on timeout, how long before killing it
# Sent by the helper to the init on timeout: "end the jail yourself" (so that it still
# reports the rusage of what it reaps); not one of the forwarded signals.  A command may
# send it to its init too, which gains it nothing: it can kill(-1) its own jail anyway.
END_SIGNAL = signal.SIGRTMIN
_READ_CHUNK = 1 << 16
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
    network: str = "none"  # "none": an empty network namespace with lo up


@dataclass
class JailResult:
    """How the command ended and what it printed."""

    exit_code: int | None
    signal: str | None
    timed_out: bool
    duration_ms: int
    stdout: bytes
    stderr: bytes
    stdout_bytes: int
    stderr_bytes: int
    stdout_truncated: bool
    stderr_truncated: bool
    # wait4's rusage of the helper's child: the init itself (and, rootless, its parent),
    # and what the init reaped while it ran; not what a kill of the init ended (rusage.py).
    rusage: resource.struct_rusage | None = None
    # What the init measured of the processes it reaped, without itself (None: it was
    # killed, on timeout, before it could report).
    init_report: rusage_.InitReport | None = None


@dataclass(frozen=True)
class _Plan:
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
    seccomp_filter: seccomp.Filter | None = None  # built once in the helper; None: no filter for this arch


PROGRESS_TAIL = 2048  # bytes of the latest output each progress report carries


@dataclass
class _Stream:
    cap: int
    data: bytearray = field(default_factory=bytearray)
    total: int = 0
    tail: bytearray = field(default_factory=bytearray)  # the latest bytes, for progress

    def feed(self, chunk: bytes) -> None:
        room = self.cap - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        self.total += len(chunk)
        self.tail += chunk[-PROGRESS_TAIL:]
        del self.tail[:-PROGRESS_TAIL]


class _SparePool:
    """Kernel objects made ahead for the next jail, each handed to one jail: at most ``limit`` wait.

    ``make`` returns a descriptor, or None when it cannot make one (then nothing waits
    and jails make their own).  The helper refills on its thread while a jail is being
    built on the other core, off the next exec's path.
    """

    def __init__(self, make: Callable[[], int | None], limit: int = 1) -> None:
        self._make = make
        # One waits: a second jail started at the same moment makes its own.  So the
        # helper's descriptors stay steady once the pool is full (the abuse tests count them).
        self._limit = limit
        self._ready: list[int] = []
        self._lock = threading.Lock()

    def take(self) -> int | None:
        """A spare's descriptor (the caller owns it), or None when none waits."""
        with self._lock:
            return self._ready.pop() if self._ready else None

    def refill(self) -> None:
        """Make one spare, unless enough wait."""
        with self._lock:
            if len(self._ready) >= self._limit:
                return
        spare = self._make()
        if spare is None:
            return
        with self._lock:
            if len(self._ready) < self._limit:
                self._ready.append(spare)
                return
        os.close(spare)


_SPARE_NETS = _SparePool(namespaces.spare_net)  # a fresh network namespace, lo up
_SPARE_ROOTS = _SparePool(mounts.spare_root)  # the root tree: tmpfs, system dirs, /dev


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
    if spec.network != "none":
        raise CcwError("UNSUPPORTED", f"network {spec.network!r} is not supported; use 'none'")
    if not 0 < len(spec.hostname.encode()) <= 64 or "\0" in spec.hostname:
        raise _invalid("hostname must be 1 to 64 bytes")
    if spec.timeout_ms <= 0 or spec.output_cap < 0 or spec.uid < 0 or spec.gid < 0:
        raise _invalid("timeout_ms must be > 0; output_cap, uid and gid must be >= 0")


def prepare(spec: JailSpec) -> _Plan:
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
    )
    uid_ranges, gid_ranges = namespaces.read_id_maps()
    return _Plan(
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
        seccomp_filter=seccomp.prepare(),
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


def _jail_child(plan: _Plan, fds: tuple[int | None, ...], is_init: bool) -> NoReturn:
    """The helper's child: wait until it is in the exec's cgroup, then become (or fork) the init.

    ``fds``: stdin, stdout, stderr, sync, report, then a spare network namespace and a
    spare root tree or None; they become descriptors 0 to 6.
    """
    try:
        gc.disable()  # a collection would touch (and so copy) every page of the helper's heap
        _arrange_fds(fds)
        prctl.set_pdeathsig(signal.SIGKILL)  # the helper's thread blocks in run() until we end
        if os.read(_FD_SYNC, 1) != b"1":
            os._exit(1)  # the helper gave up (cgroup.enter failed)
        os.close(_FD_SYNC)
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


def contain(plan: _Plan, net_prepared: bool, root: int | None) -> None:
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


def drop_privileges(plan: _Plan) -> None:
    """Caller's uid/gid, no capabilities in any set, no_new_privs, PDEATHSIG, no core dumps, seccomp."""
    for cap in range(plan.last_cap + 1):
        prctl.capbset_drop(cap)  # needs CAP_SETPCAP, so before the uid changes
    if plan.clear_groups:
        os.setgroups([])
    if plan.set_gid:
        os.setresgid(plan.gid, plan.gid, plan.gid)
    if plan.set_uid:
        os.setresuid(plan.uid, plan.uid, plan.uid)
    syscalls.capset_clear()  # uid 0 keeps its sets through setresuid; empty them all
    prctl.set_no_new_privs(1)
    # The init keeps the report pipe: a non-dumpable process cannot be ptraced, nor its
    # /proc/1/fd opened, by the command running under the same uid.
    prctl.set_dumpable(0)
    prctl.set_pdeathsig(signal.SIGKILL)  # after the credential change, which clears it
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # Last: the filter holds for the init and everything it spawns (see seccomp.py).
    if plan.seccomp_filter is not None:
        seccomp.enter(plan.seccomp_filter)


def _spawn(plan: _Plan) -> int:
    """posix_spawn the command as the init's child (vfork: no second Python fork); PATH as execvp."""
    name = plan.argv[0]
    if "/" in name:
        candidates = [name]
    else:
        path = plan.env.get("PATH", os.defpath)
        candidates = [os.path.join(directory or ".", name) for directory in path.split(":")]
    denied: OSError | None = None
    for candidate in candidates:
        try:
            return os.posix_spawn(candidate, plan.argv, plan.env, setsid=True,
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


def _jail_init(plan: _Plan, net_prepared: bool, root: int | None) -> NoReturn:
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


# --- the helper's side ----------------------------------------------------------------


def _stdin_fd(data: bytes | None) -> int:
    if data is None:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    fd = os.memfd_create("ccw-stdin", os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"SIG{number}"


def _parse_reports(raw: bytes) -> list[tuple[bytes, bytes]]:
    messages = []
    offset = 0
    while offset + 2 <= len(raw):
        (length,) = struct.unpack_from("!H", raw, offset)
        body = raw[offset + 2 : offset + 2 + length]
        messages.append((body[:1], body[1:]))
        offset += 2 + length
    return messages


def _setup_error(payload: bytes) -> CcwError:
    step, number, text = [*payload.decode(errors="replace").split("\0"), "", ""][:3]
    exc = OSError(int(number or 0), text)
    hint = "check that the capsule's directories exist and the helper has the privileges it reported in hello"
    if step.startswith("chdir"):
        hint = "pass a cwd that exists inside the jail (the workspace, /tmp or $HOME)"
    error = from_oserror(exc, f"jail step '{step}'", hint=hint)
    error.details["step"] = step
    return error


def run(
    spec: JailSpec,
    cgroup: ExecCgroup | None = None,
    on_started: Callable[[int], None] | None = None,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    progress_interval_s: float = 1.0,
) -> JailResult:
    """Run ``spec.argv`` in a fresh jail and wait for it (blocking).

    ``cgroup.enter(pid)`` is called before the child unshares its namespaces;
    ``on_started`` gets the host pid of the jail's init (pid 1 inside; killing it ends
    the whole jail).  ``on_progress`` is called about every ``progress_interval_s`` while
    the command runs, with the elapsed time, byte counts and the latest output (tails).
    """
    plan = prepare(spec)
    start = time.monotonic()
    stdin_fd = _stdin_fd(spec.stdin)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    report_r, report_w = os.pipe()
    sync_r, sync_w = os.pipe()
    child_fds = (stdin_fd, out_w, err_w, sync_r, report_w, _SPARE_NETS.take(), _SPARE_ROOTS.take())
    direct = namespaces.pid_namespace_restorable()
    try:
        if direct:  # our child is the init itself
            with namespaces.pid_namespace_for_next_child():
                pid = os.fork()
                if pid == 0:
                    _jail_child(plan, child_fds, is_init=True)
        else:
            pid = os.fork()
            if pid == 0:
                _jail_child(plan, child_fds, is_init=False)
    finally:
        for fd in child_fds:
            if fd is not None:
                os.close(fd)
    jail = _Running(pid, direct, cgroup)
    streams = {out_r: _Stream(spec.output_cap), err_r: _Stream(spec.output_cap)}
    reports = bytearray()
    try:
        try:
            if cgroup is not None:
                cgroup.enter(pid)
            os.write(sync_w, b"1")
        finally:
            os.close(sync_w)
        if direct and on_started is not None:
            on_started(pid)
        # The next jail's network namespace and root tree, made on this thread while the
        # child builds this one on the other core: off the next exec's path.
        _SPARE_NETS.refill()
        _SPARE_ROOTS.refill()
        poller = select.poll()
        for fd in (out_r, err_r):
            poller.register(fd, select.POLLIN)
        # The init's few reports (well under a pipe's capacity) wait in the pipe until it
        # exits: woken only by the hang-up (always reported), this thread sleeps through
        # the "W" that comes just before.  Rootless, the "P" is needed at once (pidfd).
        poller.register(report_r, 0 if direct else select.POLLIN)
        open_fds = {out_r, err_r, report_r}
        deadline = start + spec.timeout_ms / 1000.0
        next_progress = start + progress_interval_s
        while open_fds:
            now = time.monotonic()
            if on_progress is not None and now >= next_progress:
                on_progress(_progress(now - start, streams[out_r], streams[err_r]))
                next_progress = now + progress_interval_s
            remaining = deadline - now
            if remaining <= 0:
                if not jail.timed_out:
                    jail.timed_out = True
                    deadline = time.monotonic() + _END_GRACE_SEC
                    if jail.end():
                        continue
                if jail.killed:
                    break  # something outside the jail holds a pipe: stop waiting for it
                jail.kill()
                deadline = time.monotonic() + _KILL_GRACE_SEC
                continue
            wait = remaining if on_progress is None else min(remaining, max(next_progress - now, 0.0))
            for fd, _event in poller.poll(wait * 1000.0):
                chunk = os.read(fd, _READ_CHUNK)
                if not chunk:
                    poller.unregister(fd)
                    open_fds.discard(fd)
                elif fd == report_r:
                    reports += chunk
                    if not direct and jail.init_pidfd is None:
                        init_pid = _init_pid(bytes(reports))
                        if init_pid is not None:
                            jail.init_pidfd = _open_pidfd(init_pid)
                            if on_started is not None:
                                on_started(init_pid)
                else:
                    streams[fd].feed(chunk)
        jail.reap()
    finally:
        if jail.status is None:  # an exception (or cancellation) on the way: end the jail
            jail.kill()
            jail.reap()
        jail.close()
        for fd in (out_r, err_r, report_r):
            os.close(fd)
    duration_ms = int((time.monotonic() - start) * 1000)
    return _result(_parse_reports(bytes(reports)), jail, duration_ms, streams[out_r], streams[err_r])


def _progress(elapsed_s: float, out: _Stream, err: _Stream) -> dict[str, Any]:
    return {
        "elapsed_ms": int(elapsed_s * 1000),
        "stdout_bytes": out.total,
        "stderr_bytes": err.total,
        "stdout_tail": bytes(out.tail),
        "stderr_tail": bytes(err.tail),
    }


class _Running:
    """The helper's handle on one running jail: its child, and the init if that is another process."""

    def __init__(self, pid: int, direct: bool, cgroup: ExecCgroup | None) -> None:
        self.pid = pid  # our child: the init itself when ``direct``
        self.direct = direct
        self.cgroup = cgroup
        self.init_pidfd: int | None = None
        self.timed_out = False
        self.killed = False
        self.status: int | None = None  # our child's wait status once reaped
        self.rusage: resource.struct_rusage | None = None

    def end(self) -> bool:
        """Ask the init to end the jail (it kills, reaps and reports); False if it cannot be asked."""
        try:
            if self.init_pidfd is not None:
                syscalls.pidfd_send_signal(self.init_pidfd, END_SIGNAL)
            elif self.direct and self.status is None:
                os.kill(self.pid, END_SIGNAL)  # not reaped yet, so the pid cannot be reused
            else:
                return False
        except OSError:
            return False
        return True

    def kill(self) -> None:
        """SIGKILL the jail's init (the kernel then kills its whole pid namespace) and the cgroup."""
        self.killed = True
        if self.init_pidfd is not None:
            try:
                syscalls.pidfd_send_signal(self.init_pidfd, signal.SIGKILL)
            except OSError:
                pass
        elif self.status is None:
            # Our child is the init, or (fallback) the init's parent, whose death the init
            # follows through PDEATHSIG.  With the init's pidfd we spare its parent, which
            # then reaps it: killed first, the init would linger as the host init's zombie.
            try:
                os.kill(self.pid, signal.SIGKILL)  # not reaped yet, so the pid cannot be reused
            except OSError:
                pass
        if self.cgroup is not None:
            self.cgroup.kill()

    def reap(self) -> None:
        """Wait for our child to end."""
        if self.status is None:
            _, self.status, self.rusage = os.wait4(self.pid, 0)

    def close(self) -> None:
        """Release the init's pidfd."""
        if self.init_pidfd is not None:
            os.close(self.init_pidfd)
            self.init_pidfd = None


def _init_pid(raw: bytes) -> int | None:
    for kind, payload in _parse_reports(raw):
        if kind == b"P" and len(payload) == 4:
            return int(struct.unpack("!i", payload)[0])
    return None


def _open_pidfd(pid: int) -> int | None:
    try:
        return syscalls.pidfd_open(pid)
    except OSError:
        return None  # already gone; killing the jail parent still ends it


def _result(messages: list[tuple[bytes, bytes]], jail: _Running, duration_ms: int,
            out: _Stream, err: _Stream) -> JailResult:
    by_kind = {kind: payload for kind, payload in reversed(messages)}  # first of each kind wins
    exit_code: int | None = None
    signal_name: str | None = None
    timed_out = jail.timed_out
    init_status = jail.status if jail.direct else None
    if b"A" in by_kind:
        init_status = struct.unpack("!i", by_kind[b"A"])[0]
    if b"E" in by_kind and not timed_out:
        raise _setup_error(by_kind[b"E"])
    if b"W" in by_kind:
        status = struct.unpack("!i", by_kind[b"W"])[0]
        if os.WIFSIGNALED(status):
            signal_name = _signal_name(os.WTERMSIG(status))
        else:
            exit_code = os.waitstatus_to_exitcode(status)
    elif timed_out:
        signal_name = "SIGKILL"
    elif init_status is not None and os.WIFSIGNALED(init_status):
        # The init was killed from outside (OOM killer, a stray kill): so was the command.
        signal_name = _signal_name(os.WTERMSIG(init_status))
    else:
        raise CcwError("INTERNAL", "the jail ended without reporting the command's status; see the helper's log")
    init_report = rusage_.unpack(by_kind[b"R"]) if b"R" in by_kind else None
    return JailResult(
        exit_code=exit_code,
        signal=signal_name,
        timed_out=timed_out,
        duration_ms=duration_ms,
        stdout=bytes(out.data),
        stderr=bytes(err.data),
        stdout_bytes=out.total,
        stderr_bytes=err.total,
        stdout_truncated=out.total > len(out.data),
        stderr_truncated=err.total > len(err.data),
        rusage=jail.rusage,
        init_report=init_report,
    )


def mechanisms() -> dict[str, object]:
    """What the jail puts in force, for ``hello`` and a capsule's ``isolation``."""
    info = namespaces.mechanisms()
    info.update({
        "root": "tmpfs, host system dirs read-only, workspace read-write at its own path",
        "proc": "fresh; /proc/sys, sysrq-trigger, irq, bus, fs read-only; kcore, keys, timer_list... masked",
        "dev": "minimal: null zero full random urandom tty (bound), devpts, shm",
        "capabilities": "none (bounding, effective, permitted, inheritable, ambient all empty)",
        "no_new_privs": True,
        "seccomp": seccomp.mechanisms(),
        "uid": "the caller's (SO_PEERCRED), unless unmapped in the helper's user namespace",
        "init": "python reaper as pid 1; command started with posix_spawn",
        "direct_pid_namespace": namespaces.pid_namespace_restorable(),
    })
    return info
