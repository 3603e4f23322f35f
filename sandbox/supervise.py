"""Supervise one jail from the helper: spawn it, feed it, drain its output, time it out, reap it.

This is nsjail's subproc: ``run`` spawns the jail's first process, ccw-jail
(sandbox/jail_launcher.py: it builds the jail from contain.py's plan, moving itself into the
exec's cgroup first), and waits, reading the command's output and the launcher's
reports (contain.py's message pipe) until the jail ends.

Choices made here (no decision of ARCHITECTURE.md's settles them):

- The command's exit ends the jail: when it exits, the init SIGKILLs whatever else still
  runs in the pid namespace (background jobs, daemons), reaps it, reports and exits.
  ``run`` returns on that last report (``R``) once the output pipes are closed, not on
  the init's exit: the exit, up to milliseconds long (the teardown of the
  jail's mounts), is reaped by jail_end.py's janitor, which then removes the exec cgroup
  once the caller released it (``JailResult.ending``).  Without an ``R`` (the init was
  killed, a step failed) ``run`` reaps the init itself, as the exec's reply needs its
  status.
  On timeout the helper asks the init to do the same at once (``END_SIGNAL``), and if
  it has not ended ``_END_GRACE_SEC`` later, SIGKILLs it (through its pidfd in the
  rootless fallback) and calls the exec cgroup's ``kill()``: the kernel then kills what
  is left, but the usage of what it reaps so is lost (see rusage.py).
- Failures of the jail's own steps (a mount, chdir to a missing cwd) raise CcwError
  naming the step; a command that cannot be executed is a *result*, exit code 127
  (not found) or 126 (not executable) with a shell-like message on stderr.
- On a terminal (``spec.tty_fd``) the jail's stdio is the caller's pty slave and
  nothing is captured: the output goes to the caller's terminal, the reply's streams
  are empty; only the report pipe is drained.
- stdin is a memfd holding ``spec.stdin`` (or /dev/null; or the caller's pipe,
  ``spec.stdin_fd``): no writer thread.  stdout and stderr are pipes drained to the end;
  bytes past ``output_cap`` are counted and dropped, so the command never blocks.
- The root tree (tmpfs, system dirs, /dev) is made by the helper's thread for the *next*
  jail while the child builds this one on the other core (``namespaces.SparePool``), as
  is a network namespace for a jail without its capsule's; every capsule's jails setns
  into the capsule's one namespace (capsule_nets.py).
"""

from __future__ import annotations

import dataclasses
import math
import os
import select
import signal
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from sandbox import idmap, jail_end, jail_launcher, mountinfo, mounts, namespaces, seccomp, syscalls
from sandbox import rusage as rusage_
from sandbox.cgroups import HINT
from sandbox.contain import END_SIGNAL, JailSpec, Plan, prepare
from sandbox.errors import JAIL_STEP_HINT, CcwError, from_oserror, jail_step_error
from sandbox.replies import ExecProgress

if TYPE_CHECKING:
    from sandbox import unotify
    from sandbox.exec_cgroup import ExecCgroup

_KILL_GRACE_SEC = 5.0  # after a timeout kill, how long to wait for the pipes to close
_END_GRACE_SEC = 1.0  # after asking the init to end the jail on timeout, how long before killing it
_READ_CHUNK = 1 << 16


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
    # What the init measured of the processes it reaped, without itself (None: killed before it could report).
    init_report: rusage_.InitReport | None = None
    # The rest of the jail's end (the init's exit, the cgroup's removal): see the essay.
    ending: jail_end.Ending = field(default_factory=jail_end.Ending.over)


PROGRESS_TAIL = 2048  # bytes of the latest output each progress report carries
STREAM_MAX = 256 * 1024  # bytes of one stream a streaming report carries at most (the newest)


@dataclass
class _Stream:
    cap: int
    keep: int = PROGRESS_TAIL  # how much of the newest output a report carries
    data: bytearray = field(default_factory=bytearray)
    total: int = 0
    tail: bytearray = field(default_factory=bytearray)  # the latest bytes, for progress

    def feed(self, chunk: bytes) -> None:
        room = self.cap - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        self.total += len(chunk)
        self.tail += chunk[-self.keep:]
        del self.tail[:-self.keep]

    def report(self, streaming: bool) -> bytes:
        """The output a progress report carries; streaming, it is then forgotten."""
        out, self.tail = bytes(self.tail), bytearray() if streaming else self.tail
        return out


_SPARE_NETS = namespaces.SparePool(namespaces.spare_net)  # a fresh network namespace, lo up
_SPARE_ROOTS = namespaces.SparePool(mounts.spare_root)  # the root tree: tmpfs, system dirs, /dev
_MAPPED_ROOTS = namespaces.SparePool(idmap.spare_root)  # a root caller's: its host trees idmapped (idmap.py)

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
    hint = JAIL_STEP_HINT
    if step.startswith("chdir"):
        hint = "pass a cwd that exists inside the jail (the workspace, /tmp or $HOME)"
    if text and not text.endswith(os.strerror(int(number or 0))):
        hint = f"ccw-jail says: {text}; {hint}"  # what the errno alone cannot say (a malformed plan's why)
    return jail_step_error(step, exc, hint)


def _entry_error(payload: bytes, paths: tuple[str, ...]) -> CcwError:
    """The error of a failed move into the exec cgroup: as cgroups.write_file words it."""
    index, number = struct.unpack("!ii", payload)
    path = paths[index] if 0 <= index < len(paths) else "the exec cgroup"
    return from_oserror(OSError(number, os.strerror(number)), "write '0' to", path, HINT)


def run(
    spec: JailSpec,
    cgroup: ExecCgroup | None = None,
    on_started: Callable[[int], None] | None = None,
    on_progress: Callable[[ExecProgress], None] | None = None,
    progress_interval_s: float = math.inf,
    on_running: Callable[[Handle | None], None] | None = None,
    record: unotify.Record | None = None,
) -> JailResult:
    """Run ``spec.argv`` in a fresh jail and wait for it (blocking).

    The child moves itself into ``cgroup`` (through ``cgroup.entry_files()``) before it
    unshares its namespaces, and a failed move fails the run.  A run that returns a
    result with a ``cgroup`` leaves its removal to the janitor: call
    ``result.ending.release()`` once done reading it (see the essay).  ``on_started``
    gets the host pid of the jail's init (pid 1 inside; killing it ends the whole jail).
    ``on_progress`` is called about every ``progress_interval_s`` (the request's, no default)
    while the command runs, with an ExecProgress: elapsed time, byte counts, output tails.
    ``on_running`` gets a handle to signal the jail by, then None once it ended.  A
    ``spec.timeout_ms`` of 0 is no time limit (a service's).  ``record``: the jail gets the
    notifying filter, and the record its listener (unotify.py: only where runs overlap).
    """
    mapping = idmap.for_caller(spec.uid)
    plan = prepare(spec, host_trees_mapped=mapping is not None)
    start = time.monotonic()
    jail, output = _start(plan, spec, cgroup, mapping, record)
    try:
        if cgroup is not None:
            cgroup.watch()
        if jail.direct and on_started is not None:
            on_started(jail.pid)
        if on_running is not None:
            on_running(jail)
        _make_spares(spec, mapping)
        deadline = start + spec.timeout_ms / 1000.0 if spec.timeout_ms else math.inf
        _drain(jail, output, start, deadline, on_started, on_progress, progress_interval_s)
        if not output.final:  # no last report (killed, a failed step): its exit is all we get
            jail.reap()
    except BaseException:
        if jail.status is None:  # an exception (or cancellation) on the way: end the jail
            jail.kill()
            jail.reap()
        output.final = False  # reaped here, not by the janitor
        raise
    finally:
        if on_running is not None:
            on_running(None)
        if not output.final:
            jail.close()
            output.close()
    duration_ms = int((time.monotonic() - start) * 1000)
    try:
        result = _result(_parse_reports(bytes(output.reports)), jail, duration_ms, output.out, output.err)
    except BaseException:
        if output.final:
            jail_end.Ending(None).finish_after(_reaper(jail, output))
        raise
    ending = result.ending = jail_end.Ending(cgroup)
    ending.finish_after(_reaper(jail, output) if output.final else None)
    return result


def _make_spares(spec: JailSpec, mapping: int | None) -> None:
    """The next jail's root tree (and net namespace, if it has no capsule's), made here while the
    child builds this one on the other core: off the next exec's path."""
    if spec.net_fd is None:
        _SPARE_NETS.refill()
    (_SPARE_ROOTS if mapping is None else _MAPPED_ROOTS).refill()


def _reaper(jail: _Running, output: _Output) -> Callable[[], None]:
    def reap() -> None:
        try:
            jail.reap()
        finally:
            jail.close()
            output.close()
    return reap


@dataclass
class _Output:
    """The helper's ends of the jail's pipes, and what came through them."""

    out_r: int | None  # None on a terminal: nothing captured
    err_r: int | None
    report_r: int
    out: _Stream
    err: _Stream
    reports: bytearray = field(default_factory=bytearray)
    final: bool = False  # the init's last report ("R") arrived: see the essay

    def close(self) -> None:
        """Close the read ends."""
        for fd in (self.out_r, self.err_r, self.report_r):
            if fd is not None:
                os.close(fd)


def _start(plan: Plan, spec: JailSpec, cgroup: ExecCgroup | None, mapping: int | None,
           record: unotify.Record | None = None) -> tuple[_Running, _Output]:
    """Spawn the jail's launcher with its descriptors, the exec cgroup's files among them.

    ``mapping``: the host's trees go to the jail idmapped through it (a root caller's: idmap.py).
    """
    # First: building a root caller's tree now may fail, and nothing else is open yet.
    root = _SPARE_ROOTS.take() if mapping is None else (_MAPPED_ROOTS.take() or _mapped_root(mapping))
    entries = cgroup.entry_files() if cgroup is not None else []
    if spec.tty_fd is not None:  # the command's output goes to the terminal, not to us
        stdin_fd, out_w, err_w = (os.dup(spec.tty_fd) for _ in range(3))
        out_r = err_r = None
    else:
        stdin_fd = os.dup(spec.stdin_fd) if spec.stdin_fd is not None else _stdin_fd(spec.stdin)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
    report_r, report_w = os.pipe()
    # An egress capsule's jail joins the capsule's own network namespace (egress.py); a
    # "none" one takes a spare empty one, or makes its own.
    net = _SPARE_NETS.take() if spec.net_fd is None else os.dup(spec.net_fd)
    # With the root tree built, the jail copies the launch namespace, not ours, and its
    # binds come as clones made here (mounts.py's essay).  Made at the first exec, so
    # that the helper's descriptors are steady from then on.
    launch = mounts.launch_namespace()
    if root is None:
        launch = None
    sources: list[int] = []
    mount_ids: tuple[int, ...] = ()
    child_fds = (stdin_fd, out_w, err_w, report_w, net, root, None if launch is None else os.dup(launch),
                 *(fd for fd, _ in entries))
    direct = namespaces.pid_namespace_restorable()
    # One copy of the plan with both changes a run may need: measurable beside a service (issue 36).
    notify_filter = seccomp.prepare(notifying=True) if record is not None else None  # unotify.py
    notify = record.socket_for_jail() if record is not None and notify_filter is not None else None
    try:
        steps = plan.mount_steps
        if launch is not None:
            steps, sources = mounts.detach_sources(plan.mount_steps, jail_launcher.FD_CGROUPS + len(entries), mapping)
            mount_ids = tuple(one for one in map(mountinfo.mount_id, sources) if one is not None)
        if steps is not plan.mount_steps or notify_filter is not None:
            plan = dataclasses.replace(plan, mount_steps=steps, notify_filter=notify_filter or plan.notify_filter)
        if direct:  # our child is the init itself
            with namespaces.pid_namespace_for_next_child():
                pid = jail_launcher.spawn(plan, child_fds, direct, tuple(sources), notify)
        else:
            pid = jail_launcher.spawn(plan, child_fds, direct, tuple(sources), notify)
    except BaseException:
        for fd in (out_r, err_r, report_r):  # no jail: our ends of its pipes go too
            if fd is not None:
                os.close(fd)
        raise
    finally:
        for fd in (*child_fds, *sources, notify[0] if notify is not None else None):
            if fd is not None:
                os.close(fd)
    keep = STREAM_MAX if spec.stream else PROGRESS_TAIL
    output = _Output(out_r, err_r, report_r, _Stream(spec.output_cap, keep), _Stream(spec.output_cap, keep))
    return _Running(pid, direct, cgroup, tuple(path for _, path in entries), mount_ids), output


def _mapped_root(mapping: int) -> int:
    """A root caller's root tree, built now (none waited): never the jail's own, which ccw-jail
    would build in place with the host's trees as they are."""
    try:
        return mounts.build_root(mapping)
    except OSError as exc:
        raise jail_step_error("root tree, its host trees idmapped", exc) from exc


def _drain(jail: _Running, output: _Output, start: float, deadline: float,
           on_started: Callable[[int], None] | None,
           on_progress: Callable[[ExecProgress], None] | None, progress_interval_s: float) -> None:
    """Read the jail's output and reports until every pipe is closed, or the output ones and
    the init has sent its last report; end the jail on timeout.  Streaming, a last report has the rest."""
    streams = {fd: stream for fd, stream in ((output.out_r, output.out), (output.err_r, output.err)) if fd is not None}
    poller = select.poll()
    for fd in streams:
        poller.register(fd, select.POLLIN)
    # Each report wakes us (rootless, the "P" is needed at once for the pidfd): the "R",
    # the init's last, ends the wait, not the hang-up after the init's exit.
    poller.register(output.report_r, select.POLLIN)
    open_fds = {*streams, output.report_r}
    next_progress, streaming = start + progress_interval_s, output.out.keep > PROGRESS_TAIL
    while open_fds:
        if output.final and open_fds == {output.report_r}:
            break  # the init's last word, the output read: its own exit is not waited for
        now = time.monotonic()
        if on_progress is not None and now >= next_progress:
            on_progress(_progress(now - start, output.out, output.err, streaming))
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
        for fd, _event in poller.poll(None if math.isinf(wait) else wait * 1000.0):
            chunk = os.read(fd, _READ_CHUNK)
            if not chunk:
                poller.unregister(fd)
                open_fds.discard(fd)
            elif fd == output.report_r:
                output.reports += chunk
                output.final = any(kind == b"R" for kind, _ in _parse_reports(bytes(output.reports)))
                if not jail.direct and jail.init_pidfd is None:
                    init_pid = _init_pid(bytes(output.reports))
                    if init_pid is not None:
                        jail.init_pidfd = _open_pidfd(init_pid)
                        if on_started is not None:
                            on_started(init_pid)
            else:
                streams[fd].feed(chunk)
    if on_progress is not None and streaming and (output.out.tail or output.err.tail):  # a crash's last words
        on_progress(_progress(time.monotonic() - start, output.out, output.err, streaming, last=True))


def _progress(elapsed_s: float, out: _Stream, err: _Stream, streaming: bool, last: bool | None = None) -> ExecProgress:
    tails = out.report(streaming), err.report(streaming)
    return ExecProgress(int(elapsed_s * 1000), out.total, err.total, *tails, last=last)


class Handle(Protocol):
    """What a caller may do to a running jail (manager.py signals services through it), and the
    ids of the mounts its binds came as (empty: the jail made its own)."""

    mounts: tuple[int, ...]

    def send(self, signum: int) -> bool: ...


class _Running:
    """The helper's handle on one running jail: its child, and the init if that is another process."""

    def __init__(self, pid: int, direct: bool, cgroup: ExecCgroup | None, entry_paths: tuple[str, ...] = (),
                 mounts: tuple[int, ...] = ()) -> None:
        self.pid, self.mounts = pid, mounts  # our child (the init itself when ``direct``); Handle.mounts
        self.direct = direct
        self.cgroup = cgroup
        self.entry_paths = entry_paths  # the cgroup files the child writes itself into, in order
        self.init_pidfd: int | None = None
        self.timed_out = False
        self.killed = False
        self.status: int | None = None  # our child's wait status once reaped

    def end(self) -> bool:
        """Ask the init to end the jail (it kills, reaps and reports); False if it cannot be asked."""
        return self.send(END_SIGNAL)

    def send(self, signum: int) -> bool:
        """Send ``signum`` to the init, which passes the ones it forwards to the command (ccw-jail's
        FORWARDED); SIGKILL ends the whole jail.  False if the jail cannot be reached (it ended)."""
        if signum == signal.SIGKILL:
            if self.status is not None:
                return False
            self.kill()
            return True
        try:
            if self.init_pidfd is not None:
                syscalls.pidfd_send_signal(self.init_pidfd, signum)
            elif self.direct and self.status is None:
                os.kill(self.pid, signum)  # not reaped yet, so the pid cannot be reused
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
            _, self.status = os.waitpid(self.pid, 0)

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
    if b"C" in by_kind:
        raise _entry_error(by_kind[b"C"], jail.entry_paths)
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
        init_report=init_report,
    )
