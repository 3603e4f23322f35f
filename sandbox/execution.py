"""One command in a capsule: exec cgroup, tracer, jail, collect, teardown, and the reply.

The registry (registry.py) has checked the caller and the arguments and marked the
capsule busy; ``run`` then does the exec's steps in order, undoing each on the way out:

    prepare the exec cgroup (exec_cgroup.py) → prepare and enter the fanotify tracer
    (fanotify.py) → run the jail (contain.py, supervise.py) → collect usage (exec_cgroup.py,
    rusage.py), the files touched (fanotify.py) and what the upper dir shows changed
    (overlay.py) → teardown (always)

Choices made here:

* The jail's environment is exactly the given variables (each in the capsule's
  whitelist) over PATH, HOME and LANG defaults; nothing of the helper's leaks in.
* The written set is what fanotify saw written *and* what the upper dir's signature says
  changed (renames and deletions do not open files); a directory that only appeared
  because something below it was copied up is no change (``upper_diff``).
* A tracer that cannot start (no fanotify) or overflows makes the read set null with the
  reason, never a guess; usage figures likewise come with their sources or reasons.
* A disk counts as full after an exec with less than 1% (at least 4 MiB) free: a write
  that hit ENOSPC leaves a little behind (a short final write, and ext4's delalloc
  reserves room for metadata of dirty data that writeback later gives back).
"""

from __future__ import annotations

import base64
import logging
import os
import stat
from collections.abc import Callable
from typing import Any

from sandbox import disk, overlay
from sandbox.access import inside
from sandbox.errors import CcwError
from sandbox.meta import Capsule
from sandbox.spec import ENV_NAME_RE

log = logging.getLogger("ccw.capsules")

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_HOME = "/home/ccw"
DEFAULT_LANG = "C.UTF-8"
ALWAYS_ALLOWED_ENV = frozenset({"PATH", "HOME", "LANG"})
DEFAULT_TIMEOUT_MS = 300_000
DEFAULT_OUTPUT_CAP = 1 << 20
DISK_FULL_MIN_KB = 4096  # see the essay: "a disk counts as full"


def final_env(env: Any, whitelist: list[str]) -> dict[str, str]:
    """The given variables (each must be whitelisted) over PATH/HOME/LANG defaults."""
    env = {} if env is None else env
    if not isinstance(env, dict):
        raise CcwError("INVALID_ARGUMENT", "env must be an object of strings")
    allowed = ALWAYS_ALLOWED_ENV | set(whitelist)
    for key, value in env.items():
        if not isinstance(key, str) or not ENV_NAME_RE.fullmatch(key):
            raise CcwError("INVALID_ARGUMENT", f"env name {key!r:.80} is not a variable name")
        if not isinstance(value, str) or "\0" in value:
            raise CcwError("INVALID_ARGUMENT", f"env value of {key} must be a string without NUL")
        if key not in allowed:
            raise CcwError("INVALID_ARGUMENT",
                           f"env variable {key} is not in the capsule's env_whitelist {sorted(allowed)}; "
                           "create the capsule with it whitelisted", {"name": key})
    return {"PATH": DEFAULT_PATH, "HOME": DEFAULT_HOME, "LANG": DEFAULT_LANG, **env}


def resolve_cwd(cwd: Any, workspace: str) -> str:
    """None → the workspace; relative → under the workspace (no escaping it); absolute as is."""
    if cwd is None:
        return workspace
    if not isinstance(cwd, str) or "\0" in cwd or not cwd or len(cwd) > 4096:
        raise CcwError("INVALID_ARGUMENT", f"cwd must be a path without NUL, got {cwd!r:.80}")
    if cwd.startswith("/"):
        return os.path.normpath(cwd)
    joined = os.path.normpath(os.path.join(workspace, cwd))
    if not inside(joined, workspace):
        raise CcwError("INVALID_ARGUMENT", f"cwd {cwd!r} leaves the workspace; pass an absolute path instead")
    return joined


def run(capsule: Capsule, exec_name: str, argv: list[str], cwd: str, env: dict[str, str],
         stdin: bytes | None, timeout_ms: int, limits: dict[str, int], output_cap: int,
         uid: int, gid: int, on_progress: Callable[[dict[str, Any]], None] | None = None,
         progress_ms: int = 1000) -> dict[str, Any]:
    """prepare cgroup → prepare+enter tracer → jail → collect → teardown (always); the exec's reply."""
    from sandbox import exec_cgroup, fanotify, rusage, supervise
    from sandbox.contain import JailSpec

    merged, upper = capsule.path("merged"), capsule.path("upper")
    spec = JailSpec(
        merged_dir=merged, workspace=capsule.meta["workspace"], tmp_dir=capsule.path("tmp"),
        home_dir=capsule.path("home"), argv=list(argv), cwd=cwd, env=env, stdin=stdin,
        timeout_ms=timeout_ms, output_cap=output_cap, uid=uid, gid=gid,
        clock_offset_sec=capsule.meta["clock_offset_sec"], network=capsule.meta["network"],
    )
    cg_limits = exec_cgroup.Limits(
        memory_bytes=limits["memory_mb"] << 20 if "memory_mb" in limits else None,
        pids_max=limits.get("pids_max"), cpu_ms=limits.get("cpu_ms"),
    )
    before = overlay.upper_signature(upper)
    cgroup = None
    tracer = None
    trace_error: str | None = None
    try:
        cgroup = exec_cgroup.ExecCgroup.prepare(_layout(), exec_name.replace(".", "-"), cg_limits)
        try:
            tracer = fanotify.Tracer.prepare(merged)
            tracer.enter(cgroup, visible_at=capsule.meta["workspace"])
        except CcwError as exc:
            trace_error = exc.message
            if tracer is not None:
                tracer.teardown()
                tracer = None
        result = supervise.run(spec, cgroup, on_progress=on_progress, progress_interval_s=progress_ms / 1000)
        touched = tracer.collect() if tracer is not None else None
        # Only the init's report: the helper's own wait4 misses what a kill ended (rusage.py).
        usage = cgroup.collect(result.init_report)
        rusage.fill(usage, result.init_report)
    finally:
        if tracer is not None:
            tracer.teardown()
        if cgroup is not None:
            cgroup.teardown()
    after = overlay.upper_signature(upper)
    moved = upper_diff(before, after, capsule.lowers)
    disk_report: dict[str, Any] | None = None
    if capsule.disk_mb is not None:
        disk_report = {"limit_mb": capsule.disk_mb, **disk.usage(upper)}
        disk_report["full"] = disk_report["free_kb"] < max(DISK_FULL_MIN_KB, capsule.disk_mb * 1024 // 100)
    touched_unavailable: dict[str, str] = {}
    listed: list[str] | None = None  # directories opened and files executed: known when read is
    executed: list[str] | None = None
    if touched is None:
        read: list[str] | None = None
        written = moved
        touched_unavailable["read"] = trace_error or "no tracer"
    else:
        read, listed, executed = touched.read, touched.listed, touched.executed
        written = sorted(set(touched.written) | set(moved), key=os.fsencode)
        if touched.overflow:
            read = listed = executed = None
            touched_unavailable["read"] = "the fanotify queue overflowed; the read set is incomplete"
        elif read is None:
            touched_unavailable["read"] = touched.unavailable_reason or "not recorded"
    return {
        "exit_code": result.exit_code,
        "signal": result.signal,
        "timed_out": result.timed_out,
        "oom_killed": usage.oom_killed,
        "duration_ms": result.duration_ms,
        "stdout_b64": base64.b64encode(result.stdout).decode(),
        "stderr_b64": base64.b64encode(result.stderr).decode(),
        "stdout_bytes": result.stdout_bytes,
        "stderr_bytes": result.stderr_bytes,
        "truncated": {"stdout": result.stdout_truncated, "stderr": result.stderr_truncated},
        "usage": {"cpu_ms": usage.cpu_ms, "rss_max_kb": usage.rss_max_kb,
                  "rss_max_process_kb": usage.rss_max_process_kb,
                  "io_read_kb": usage.io_read_kb, "io_write_kb": usage.io_write_kb},
        "usage_unavailable": dict(usage.unavailable),
        "usage_sources": dict(usage.sources),
        "disk": disk_report,
        "touched": {"read": read, "written": written, "listed": listed, "executed": executed},
        "touched_unavailable": touched_unavailable,
    }


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


_LAYOUT: Any = None


def _layout() -> Any:
    global _LAYOUT
    if _LAYOUT is None:
        from sandbox import cgroups

        _LAYOUT = cgroups.detect_layout()
    return _LAYOUT


def cleanup_stale_cgroups() -> list[str]:
    """Remove the exec cgroups a dead helper left (at recovery); a failure is logged, not raised."""
    try:
        from sandbox import exec_cgroup

        return list(exec_cgroup.cleanup_stale())
    except Exception as exc:  # recovery of cgroups must not keep capsules from being served
        log.warning("cleaning stale cgroups failed: %s", exc)
        return []
