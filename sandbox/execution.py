"""One command in a capsule: exec cgroup, tracer, jail, collect, teardown, and the reply.

The capsule manager (manager.py) has checked the caller and marked the capsule busy; ``run``
takes the exec request itself (sandbox/ops.py: ``ExecRequest``, its arguments checked
when the helper read it) and does the exec's steps in order, undoing each on the way out:

    the jail's spec (``jail_spec``: cwd, environment and exposed dirs checked against
    the capsule) → take the exec cgroup (made ahead: spare_cgroups.py) → start recording
    on the capsule's fanotify group (fanotify.py) → run the jail (contain.py, supervise.py)
    → collect usage (exec_cgroup.py, rusage.py), the files touched (fanotify.py) and what
    the upper dir shows changed
    → teardown (always): the recording's at once; the cgroup's, once the jail ran, after
    the reply, when the init has exited (jail_end.py)

Choices made here:

* The jail's environment is exactly the given variables (each in the capsule's
  whitelist) over PATH, HOME and LANG defaults (``spec.exec_env``: applied here alone),
  and for an "egress" capsule over the proxy variables (egress.PROXY_ENV); nothing of
  the helper's leaks in.
* The written set is what fanotify saw written *and* what the upper dir's signature
  (``upper_signature``, taken before and after) says changed: renames and deletions
  open no file.  A directory that only appeared because something below it was copied
  up is no change (``upper_diff``).  While runs overlap (a service, or an exec beside
  one), a change another run's renames or deletions named, and this run's did not, is
  the other's (unotify.py: seccomp user notification, one listener per run).
* A tracer that cannot start (no fanotify) or overflows makes the read set null with the
  reason, never a guess; usage figures likewise come with their sources or reasons.
* A disk counts as full after an exec with less than 1% (at least 4 MiB) free: a write
  that hit ENOSPC leaves a little behind (a short final write, and ext4's delalloc
  reserves room for metadata of dirty data that writeback later gives back).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import stat
from collections.abc import Callable
from typing import TYPE_CHECKING

from sandbox import cgroups, disk, egress, exposed, gitdirs, overlay, rawnames, spec, unotify
from sandbox.cgroups import CgroupLayout
from sandbox.errors import CcwError
from sandbox.meta import Capsule
from sandbox.ops import ExecRequest
from sandbox.replies import DiskUse, ExecProgress, ExecReply, Touched, Truncated
from sandbox.spec import Limits, resolve_cwd

if TYPE_CHECKING:
    from sandbox.contain import JailSpec
    from sandbox.exec_cgroup import ExecCgroup
    from sandbox.fanotify import Recording, Traced
    from sandbox.jail_end import Ending
    from sandbox.rusage import Measurement
    from sandbox.supervise import Handle, JailResult

log = logging.getLogger("ccw.capsules")

ALWAYS_ALLOWED_ENV = frozenset({"PATH", "HOME", "LANG"})
DISK_FULL_MIN_KB = 4096  # see the essay: "a disk counts as full"


def run(capsule: Capsule, request: ExecRequest, exec_name: str, uid: int, gid: int, *,
        on_progress: Callable[[ExecProgress], None] | None = None, net_fd: int | None = None,
        on_ending: Callable[[Ending], None] | None = None,
        on_running: Callable[[Handle | None, ExecCgroup | None], None] | None = None) -> ExecReply:
    """jail spec → prepare cgroup → prepare+enter tracer → jail → collect → teardown (always); the reply.

    The reply comes once the init has reported the jail's end; ``on_ending`` gets what is
    then left (the init's exit, the cgroup's removal; jail_end.py) as soon as it exists.

    ``net_fd``: the capsule's network namespace (capsule_nets.py; the caller keeps it).
    ``on_running`` gets the jail's handle and cgroup once it is spawned, and None, None once
    it has ended (services.py signals and freezes runs through them).
    ``request.tty_fd``: the caller's pty slave (access.check_terminal), the command's stdio
    and controlling terminal; its output goes there, so the reply's stdout and stderr are empty.
    """
    jail = jail_spec(capsule, request, uid, gid, net_fd)
    upper = capsule.path("upper")
    before = upper_signature(upper)
    # Only a run that can overlap another pays for the notifying filter (unotify.py).
    record = unotify.begin(upper, jail.workspace) if request.service is not None or capsule.services else None
    try:
        result, usage, traced, trace_error = _run_traced(
            jail, exec_name, exec_limits(capsule, request), on_progress if request.progress_ms is not None else None,
            request.progress_ms, on_ending, on_running, request.service is not None and jail.network == "egress",
            record)
    finally:
        named = record.finish() if record is not None else None
    moved = upper_diff(before, upper_signature(upper), capsule.lowers)
    touched, touched_unavailable = _touched(traced, trace_error, moved, named)
    return ExecReply(
        exit_code=result.exit_code,
        signal=result.signal,
        timed_out=result.timed_out,
        oom_killed=usage.oom_killed,
        duration_ms=result.duration_ms,
        stdout=result.stdout,
        stderr=result.stderr,
        stdout_bytes=result.stdout_bytes,
        stderr_bytes=result.stderr_bytes,
        truncated=Truncated(result.stdout_truncated, result.stderr_truncated),
        usage=usage.figures(),
        usage_unavailable=dict(usage.unavailable),
        usage_sources=dict(usage.sources),
        disk=_disk_report(capsule),
        touched=touched,
        touched_unavailable=touched_unavailable,
    )


def jail_spec(capsule: Capsule, request: ExecRequest, uid: int, gid: int, net_fd: int | None = None) -> JailSpec:
    """The jail for ``request`` in ``capsule``, built once; the checks that depend on the capsule made here.

    The request's arguments were checked when the helper read it (sandbox/ops.py): types
    and bounds.  What depends on the capsule is checked here, once: the cwd lies in its
    workspace, each variable is in its whitelist, each exposed dir is still fit to show.
    """
    from sandbox.contain import JailSpec

    workspace = capsule.spec.workspace
    return JailSpec(
        merged_dir=capsule.path("merged"), workspace=workspace, tmp_dir=capsule.path("tmp"),
        home_dir=capsule.path("home"), argv=list(request.argv), cwd=resolve_cwd(request.cwd, workspace),
        env=jail_env(capsule, request), stdin=request.stdin, timeout_ms=request.timeout_ms, stream=request.stream,
        output_cap=request.output_cap, uid=uid, gid=gid, clock_offset_sec=capsule.spec.clock_offset_sec,
        network=capsule.spec.network, net_fd=net_fd,
        tty_fd=request.tty_fd if request.stdio != "stdin" else None,
        stdin_fd=request.tty_fd if request.stdio == "stdin" else None,
        binds=(*gitdirs.binds(capsule), *exposed.binds(capsule, uid, gid)),
    )


def jail_env(capsule: Capsule, request: ExecRequest) -> dict[str, str]:
    """The command's whole environment: the request's variables (each must be in the capsule's
    whitelist; a session on a terminal may pass its TERM too) over ``spec.exec_env``'s
    defaults, and an "egress" capsule's proxy variables under them."""
    given = dict(request.env or {})
    allowed = ALWAYS_ALLOWED_ENV | set(capsule.spec.env_whitelist) | ({"TERM"} if request.stdio == "tty" else set())
    for key in given:
        if key not in allowed:
            raise CcwError("INVALID_ARGUMENT",
                           f"env variable {key} is not in the capsule's env_whitelist {sorted(allowed)}; "
                           "create the capsule with it whitelisted", {"name": key})
    env = spec.exec_env(capsule.spec.workspace, given)
    return egress.proxy_env(env) if capsule.spec.network == "egress" else env


def exec_limits(capsule: Capsule, request: ExecRequest) -> dict[str, int]:
    """The capsule's limits, which an exec's may only tighten (the disk's size is the capsule's,
    fixed when it was made)."""
    limits = {key: value for key, value in capsule.spec.limits.to_json().items() if key != "disk_mb"}
    for key, value in (request.limits or Limits()).to_json().items():
        if key != "disk_mb":
            limits[key] = min(value, limits.get(key, value))
    return limits


def _run_traced(spec: JailSpec, exec_name: str, limits: dict[str, int],
                on_progress: Callable[[ExecProgress], None] | None, progress_ms: int | None,
                on_ending: Callable[[Ending], None] | None,
                on_running: Callable[[Handle | None, ExecCgroup | None], None] | None,
                own_v2: bool = False, record: unotify.Record | None = None,
                ) -> tuple[JailResult, Measurement, Traced | None, str | None]:
    """The jail in its exec cgroup, recorded by its capsule's fanotify group: its result, usage,
    the files it touched (None: no record, the error says why); the recording stopped whatever happens, the cgroup
    too, after the init's exit once the jail ran (``on_ending`` gets that end: jail_end.py).  ``own_v2``: a
    cgroup v2 of its own too, whose id names its sockets (an egress capsule's service: run_sockets.py).
    ``record``: the jail's renames and deletions go to it (unotify.py)."""
    from sandbox import exec_cgroup, fanotify, jail_end, rusage, spare_cgroups, supervise
    from sandbox.run_sockets import join_unified

    cg_limits = exec_cgroup.Limits(
        memory_bytes=limits["memory_mb"] << 20 if "memory_mb" in limits else None,
        pids_max=limits.get("pids_max"), cpu_ms=limits.get("cpu_ms"),
    )
    cgroup = None
    recording = None
    result = None
    trace_error: str | None = None
    try:
        cgroup = spare_cgroups.take(_layout(), exec_name.replace(".", "-"), cg_limits)
        if own_v2 and (why := join_unified(cgroup)) is not None:
            log.info("%s has no cgroup v2 of its own (%s): its connections are counted per exec window", exec_name, why)
        try:  # the capsule's group, kept across its execs (fanotify.py)
            recording = fanotify.group_of(spec.merged_dir).record(cgroup, visible_at=spec.workspace)
        except CcwError as exc:
            trace_error = exc.message
        taken = cgroup

        def running(handle: supervise.Handle | None) -> None:
            if handle is not None and recording is not None:
                recording.claim(handle.mounts)  # its binds' mounts: whose events are whose (fanotify.py)
            if on_running is not None:
                on_running(handle, taken if handle is not None else None)

        result = supervise.run(spec, cgroup, on_progress=_with_writes(on_progress, recording),
                               progress_interval_s=math.inf if progress_ms is None else progress_ms / 1000,
                               on_running=running, record=record)
        if on_ending is not None:
            on_ending(result.ending)
        traced = recording.collect() if recording is not None else None
        # Only the init's report: the helper's own wait4 misses what a kill ended (rusage.py).
        usage = cgroup.collect(result.init_report)
        rusage.fill(usage, result.init_report)
    finally:
        if recording is not None:
            recording.close()
        if result is not None:  # the janitor removes the cgroup once the init has exited (jail_end.py)
            result.ending.release()
        elif cgroup is not None:
            cgroup.teardown()
        if cgroup is not None and cgroup.dirs:  # the next exec's cgroup, made ahead (spare_cgroups.py)
            jail_end.submit(lambda: spare_cgroups.refill(_layout()))
    return result, usage, traced, trace_error


LIVE_WRITTEN = 200  # paths a progress report names at most; the reply has them all


def _with_writes(on_progress: Callable[[ExecProgress], None] | None,
                 recording: Recording | None) -> Callable[[ExecProgress], None] | None:
    """``on_progress`` with each report naming the files written since the last one (the
    helper's fanotify reader adds them as their writers close them)."""
    if on_progress is None or recording is None:
        return on_progress
    reported: set[str] = set()

    def report(progress: ExecProgress) -> None:
        # set(): one copy under the GIL; a name that is not UTF-8 waits for the reply's not_utf8
        new = sorted(name for name in set(recording.written) - reported if rawnames.carried(name))[:LIVE_WRITTEN]
        reported.update(new)
        on_progress(dataclasses.replace(progress, written=tuple(new)))

    return report


def _touched(traced: Traced | None, trace_error: str | None, moved: list[str],
             named: unotify.Named | None = None) -> tuple[Touched, dict[str, str]]:
    """The reply's touched sets and, for each one not known, why.  ``named``: the renames and
    deletions of the runs overlapping this one (unotify.py), which pick whose each change is."""
    if named is not None:
        moved = [path for path in moved if named.owns(path)]
    unavailable: dict[str, str] = {}
    listed: list[str] | None = None  # directories opened and files executed: known when read is
    executed: list[str] | None = None
    if traced is None:
        read: list[str] | None = None
        written = moved
        unavailable["read"] = trace_error or "no tracer"
    else:
        read, listed, executed = traced.read, traced.listed, traced.executed
        # Other runs (a service beside an exec) and the file tools change the upper dir too.
        mine = set(traced.written)
        moved = [path for path in moved if path in mine or path not in traced.elsewhere]
        written = sorted(mine | set(moved), key=os.fsencode)
        if traced.overflow:
            read = listed = executed = None
            unavailable["read"] = "the fanotify queue overflowed; the read set is incomplete"
        elif read is None:
            unavailable["read"] = traced.unavailable_reason or "not recorded"
    touched = Touched.carried(_tuple(read), tuple(written), _tuple(listed), _tuple(executed))
    if touched.not_utf8 is not None:  # the exec's reply and journal row must not be lost to a name (rawnames.py)
        names = [*(read or ()), *written, *(listed or ()), *(executed or ())]
        first = min((name for name in names if not rawnames.carried(name)), key=rawnames.raw)
        unavailable["not_utf8"] = rawnames.warning(touched.not_utf8.count, touched.not_utf8.names, first)
    return touched, unavailable


def _tuple(paths: list[str] | None) -> tuple[str, ...] | None:
    return None if paths is None else tuple(paths)


def _disk_report(capsule: Capsule) -> DiskUse | None:
    """The capsule disk's size and use after the exec, and whether it counts as full."""
    if capsule.disk_mb is None:
        return None
    used = disk.usage(capsule.path("upper"))
    full = used["free_kb"] < max(DISK_FULL_MIN_KB, capsule.disk_mb * 1024 // 100)
    return DiskUse(capsule.disk_mb, used["used_kb"], used["free_kb"], full)


def upper_signature(upper: str) -> dict[str, tuple[int, ...]]:
    """A cheap fingerprint of every entry in one upper dir (lstat only, no content).

    Two signatures taken around an exec differ exactly at the paths it created,
    deleted, renamed or rewrote; a directory's signature ignores its mtime, so adding a
    file does not mark its directory.
    """
    signature: dict[str, tuple[int, ...]] = {}
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        dir_path = os.path.join(upper, rel_dir) if rel_dir else upper
        try:
            entries = list(os.scandir(dir_path))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                signature[rel] = (stat.S_IFDIR, st.st_ino, int(overlay.is_opaque(entry.path)))
                stack.append(rel)
            else:
                signature[rel] = (st.st_mode, st.st_ino, st.st_size, st.st_mtime_ns, st.st_rdev)
    return signature


def upper_diff(before: dict[str, tuple[int, ...]], after: dict[str, tuple[int, ...]], lowers: list[str]) -> list[str]:
    """Paths an exec created, deleted, renamed or rewrote, per two upper-dir signatures.

    A directory that merely appeared because something below it was copied up is not a
    creation (it exists in a lower layer and is not opaque), so it is left out.
    """
    paths = []
    for path in set(before) | set(after):
        old, new = before.get(path), after.get(path)
        if old == new:
            continue
        if (old is None and new is not None and new[0] == stat.S_IFDIR and not new[2]
                and overlay.lower_lookup(lowers, path) is not None):
            continue
        paths.append(path)
    return sorted(paths, key=os.fsencode)


@functools.lru_cache(maxsize=1)
def _layout() -> CgroupLayout:
    """The host's cgroup hierarchies, found once per helper."""
    return cgroups.detect_layout()


def cleanup_stale_cgroups() -> list[str]:
    """Remove the exec cgroups a dead helper left (at recovery); a failure is logged, not raised."""
    try:
        from sandbox import spare_cgroups

        return list(spare_cgroups.cleanup_stale())
    except Exception as exc:  # recovery of cgroups must not keep capsules from being served
        log.warning("cleaning stale cgroups failed: %s", exc)
        return []
