"""Capsule tools: create, exec, diff, fork, list, destroy (seed 003 §1–§3 shapes).

The helper does the kernel work; these handlers check arguments, pick the environment the
capsule may see, keep the journal (every exec: argv, cwd, env keys, exit status, blake3 of
the output, usage, touched sets) and render diffs from the helper's change list plus file
contents read through the capsule's O_PATH root (no file content crosses the IPC).

Choices made here, where seed 003 is silent:
- ``env_whitelist`` names variables of the server's own environment that pass into the
  capsule; HOME is always the capsule's own home, PATH and LANG get defaults if absent.
- ``cwd`` is relative to the workspace, or absolute inside it; default the workspace.
- ``stdout``/``stderr`` are text (UTF-8, undecodable bytes replaced); the journal hashes
  the raw bytes, and ``stdout_bytes``/``stderr_bytes`` count all the command wrote, even
  past the capture cap (``truncated`` says whether the text is whole).
- ``capsule_diff`` compares the capsule's view with its base (the workspace as it is now,
  since the live tree is the capsule's lower layer); files that are not UTF-8 are shown
  as git binary patches, so the unified diff always applies with ``git apply``.
- Execs, forks and destroys of one capsule take turns in arrival order
  (``ctx.capsule_turn``, see mcp_server/capsule_queue.py): a second exec sent while one
  runs waits, reporting "queued" through progress, instead of failing; cancelled while
  it waits, it never runs.  Diff, list and file reads take no turn.
- Every result that describes a capsule carries its change ``generation`` (see
  mcp_server/journal.py); an exec's result gives the one it started on and the one it
  left.  An exec whose reply never came (cancelled while running, the helper died)
  advances the generation: what it wrote is unknown.
"""

from __future__ import annotations

import base64
import datetime as dt
import os
from typing import Any

import blake3
import trio

from mcp_server.capsule_queue import Ticket, turn_label
from mcp_server.core import unidiff
from mcp_server.core.paths import encoded as encoded_path
from mcp_server.fs import changeset
from mcp_server.fs.view import RootView, lstat
from mcp_server.journal import CapsuleRecord, Journal
from mcp_server.tools.registry import ToolContext, ToolSpec
from sandbox.errors import CcwError
from sandbox.ops import CreateRequest
from sandbox.spec import DISK_MB_MAX, DISK_MB_MIN, CapsuleSpec, Limits

MAX_TIMEOUT_MS = 24 * 3600 * 1000
DEFAULT_TIMEOUT_MS = 300_000
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
USAGE_FIGURES = ("cpu_ms", "rss_max_kb", "rss_max_process_kb", "io_read_kb", "io_write_kb")
PROGRESS_MS = 1000  # how often a running exec reports (only sent on if the caller asked)
PROGRESS_LINES = 20  # lines of the latest output in each progress message
SETTLE_S = 30.0  # after an exec's reply is lost, how long to wait for the helper to end it
SETTLE_POLL_S = 0.1
# Errors with which the helper refuses an exec before anything runs in the capsule.
_REFUSED = frozenset({"CONFLICT", "NOT_FOUND", "INVALID_ARGUMENT", "PERMISSION_DENIED", "UNSUPPORTED"})

CAPSULE_ID = {
    "type": "string",
    "pattern": "^cap_[0-9A-Za-z_]{1,64}$",
}
_NULLABLE_INT = {"type": ["integer", "null"]}
GENERATION = {
    "type": "integer",
    "minimum": 0,
    "description": "The capsule's change generation: every write to its contents (a file tool, a patch, "
                   "an exec that wrote) advances it. capsule_deltamin trusts only runs of the current one.",
}
LIMITS = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "memory_mb": {"type": "integer", "minimum": 1, "maximum": 1 << 20},
        "pids_max": {"type": "integer", "minimum": 1, "maximum": 1 << 22},
        "cpu_ms": {"type": "integer", "minimum": 1},
        "disk_mb": {"type": "integer", "minimum": DISK_MB_MIN, "maximum": DISK_MB_MAX},
    },
    "description": (
        "Per-exec limits: memory (MiB), number of processes, CPU time (ms); and the size of the "
        "capsule's own disk (MiB), which holds everything its commands write (default: the helper's)."
    ),
}
ISOLATION = {"type": "object", "description": "Each isolation mechanism in force and how."}
_CAPSULE_OUT_PROPS: dict[str, Any] = {
    "capsule_id": CAPSULE_ID,
    "mount": {"type": "string", "description": "The merged view as the helper sees it."},
    "workspace": {"type": "string"},
    "clock": {"type": "string", "description": "The time the capsule's commands see (ISO 8601)."},
    "isolation": ISOLATION,
    "parent": {"type": ["string", "null"]},
    "generation": GENERATION,
}
CAPSULE_OUT = {
    "type": "object",
    "required": ["capsule_id", "mount", "clock", "isolation", "workspace", "generation"],
    "properties": _CAPSULE_OUT_PROPS,
    "additionalProperties": False,
}


def _journal(ctx: ToolContext) -> Journal:
    return Journal(ctx.state)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _iso(moment: dt.datetime) -> str:
    return moment.isoformat(timespec="microseconds")


def live_record(ctx: ToolContext, capsule_id: str) -> CapsuleRecord:
    record = _journal(ctx).capsule(capsule_id)
    if record is None or record.destroyed_at is not None:
        raise CcwError(
            "NOT_FOUND",
            f"capsule {capsule_id} not found (destroyed or never created); "
            "call capsule_list to see live capsules or capsule_create to make one",
            {"capsule_id": capsule_id},
        )
    return record


def _capsule_result(record: CapsuleRecord) -> dict[str, Any]:
    return {
        "capsule_id": record.capsule_id,
        "mount": record.mount,
        "workspace": record.workspace,
        "clock": record.clock,
        "isolation": record.isolation,
        "parent": record.parent,
        "generation": record.generation,
    }


def _real(path: str, what: str) -> str:
    # The helper re-checks the path; resolving here makes journal entries canonical.
    encoded_path(path, what)
    return os.path.realpath(os.path.expanduser(path))


async def capsule_create(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Create a capsule over a workspace."""
    workspace = _real(args["workspace"], "workspace")
    base = args.get("base")
    base_path = _real(base, "base") if base else workspace
    offset = int(args.get("clock_offset_sec") or 0)
    spec = CapsuleSpec(
        workspace=workspace,
        base=base_path if base_path != workspace else None,
        clock_offset_sec=offset,
        env_whitelist=tuple(sorted(set(args.get("env_whitelist") or []))),
        limits=Limits(**(args.get("limits") or {})),
        network=args.get("network") or "none",
    )
    helper = await ctx.helper()
    reply = await helper.request("create", CreateRequest(spec).to_args())
    created = _now()
    record = CapsuleRecord(
        capsule_id=reply["capsule_id"],
        spec=spec,
        parent=None,
        created_at=_iso(created),
        clock=_iso(created + dt.timedelta(seconds=offset)),
        isolation=reply.get("isolation", {}),
        mount=reply.get("mount", ""),
        base_fingerprint=None,
        destroyed_at=None,
    )
    _journal(ctx).add_capsule(record)
    return _capsule_result(record)


def exec_env(record: CapsuleRecord) -> dict[str, str]:
    """The environment of a command in the capsule: whitelisted variables, else defaults.

    PATH starts with the workspace's ``.venv/bin``, as ``uv run`` and ``poetry run`` put
    the project's environment first: ``pytest`` in a capsule is the project's pytest.
    Always there, present or not, so the environment of a run does not depend on the
    host (a replay sees the same PATH).
    """
    env = {k: os.environ[k] for k in record.env_whitelist if k in os.environ and k != "HOME"}
    env.setdefault("PATH", f"{os.path.join(record.workspace, '.venv', 'bin')}:{DEFAULT_PATH}")
    env.setdefault("LANG", "C.UTF-8")
    return env


def _resolve_cwd(record: CapsuleRecord, cwd: str | None) -> str:
    if not cwd:
        return record.workspace
    joined = os.path.normpath(os.path.join(record.workspace, cwd))
    if joined != record.workspace and not joined.startswith(record.workspace.rstrip("/") + "/"):
        raise CcwError(
            "INVALID_ARGUMENT",
            f"cwd {cwd!r} is outside the workspace {record.workspace}; give a path relative to it",
            {"cwd": cwd},
        )
    return joined


def _hash(data: bytes) -> str:
    return "blake3:" + blake3.blake3(data).hexdigest()


async def capsule_exec(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Run a command in a capsule's jail, after the calls queued before it, and journal it."""
    record = live_record(ctx, args["capsule_id"])
    _resolve_cwd(record, args.get("cwd"))  # bad arguments fail now, not after the wait
    async with ctx.capsule_turn(record.capsule_id, turn_label("capsule_exec", args)) as ticket:
        return await _exec_in_turn(ctx, args, ticket)


async def _exec_in_turn(ctx: ToolContext, args: dict[str, Any], ticket: Ticket) -> dict[str, Any]:
    """capsule_exec while it holds the capsule's turn: run, journal, answer."""
    record = live_record(ctx, args["capsule_id"])  # a destroy queued before this call may have run
    cwd = _resolve_cwd(record, args.get("cwd"))
    timeout_ms = args.get("timeout_ms") or DEFAULT_TIMEOUT_MS
    stdin = args.get("stdin")
    stdin_bytes = stdin.encode() if stdin is not None else None
    request: dict[str, Any] = {
        "capsule_id": record.capsule_id,
        "argv": list(args["cmd"]),
        "cwd": cwd,
        "env": exec_env(record),
        "timeout_ms": timeout_ms,
    }
    if stdin_bytes is not None:
        request["stdin_b64"] = base64.b64encode(stdin_bytes).decode()
    if record.limits:
        request["limits"] = record.limits
    waited_ms = ticket.waited_ms
    started_generation = _journal(ctx).generation(record.capsule_id)
    started = _now()
    helper = await ctx.helper()
    request["progress_ms"] = PROGRESS_MS

    async def forward(report: dict[str, Any]) -> None:
        # Counted from the call's arrival, so the reports of a call that was queued keep
        # growing (MCP asks progress to increase).
        await ctx.progress(float(waited_ms + report["elapsed_ms"]), float(waited_ms + timeout_ms),
                           _progress_message(report))

    try:
        reply = await helper.request("exec", request, on_progress=forward)
    except BaseException as exc:
        if not (isinstance(exc, CcwError) and exc.code in _REFUSED):
            with trio.CancelScope(shield=True):
                await _settle(helper, record.capsule_id)
                _journal(ctx).advance(record.capsule_id)
        raise
    stdout = base64.b64decode(reply["stdout_b64"])
    stderr = base64.b64decode(reply["stderr_b64"])
    usage = {k: reply["usage"].get(k) for k in USAGE_FIGURES}
    usage_unavailable = dict(sorted(reply.get("usage_unavailable", {}).items()))
    usage_sources = dict(sorted(reply.get("usage_sources", {}).items()))
    # listed (directories opened) and executed are null exactly when read is.
    touched = {key: reply["touched"].get(key) for key in ("read", "written", "listed", "executed")}
    journal = _journal(ctx)
    seq = journal.add_exec(
        record.capsule_id,
        {
            "started_at": _iso(started),
            "argv": request["argv"],
            "cwd": cwd,
            "env_keys": sorted(request["env"]),
            "stdin_blake3": _hash(stdin_bytes) if stdin_bytes is not None else None,
            "stdin_b64": request.get("stdin_b64"),
            "timeout_ms": timeout_ms,
            "exit_code": reply["exit_code"],
            "signal": reply.get("signal"),
            "timed_out": int(bool(reply["timed_out"])),
            "oom_killed": int(bool(reply.get("oom_killed"))),
            "stdout_blake3": _hash(stdout),
            "stderr_blake3": _hash(stderr),
            "stdout_bytes": reply["stdout_bytes"],
            "stderr_bytes": reply["stderr_bytes"],
            "duration_ms": reply["duration_ms"],
            # The journal keeps each figure's mechanism and each null's reason with it.
            "usage": {**usage, "sources": usage_sources, "unavailable": usage_unavailable},
            "touched": touched,
            "generation": started_generation,
        },
    )
    journal.add_outputs(record.capsule_id, seq, {"stdout": stdout, "stderr": stderr})  # for witnesses
    generation = journal.generation(record.capsule_id)
    await trio.to_thread.run_sync(record_base_states, ctx, record, touched["written"])
    return {
        "exit_code": reply["exit_code"],
        "signal": reply.get("signal"),
        "timed_out": bool(reply["timed_out"]),
        "oom_killed": bool(reply.get("oom_killed")),
        "duration_ms": reply["duration_ms"],
        "stdout": stdout.decode("utf-8", "replace"),
        "stderr": stderr.decode("utf-8", "replace"),
        "stdout_bytes": reply["stdout_bytes"],
        "stderr_bytes": reply["stderr_bytes"],
        "truncated": {"stdout": bool(reply["truncated"]["stdout"]), "stderr": bool(reply["truncated"]["stderr"])},
        "usage": usage,
        "usage_unavailable": usage_unavailable,
        "usage_sources": usage_sources,
        "disk_full": bool((reply.get("disk") or {}).get("full")),
        "disk": reply.get("disk"),
        "touched": touched,
        "touched_unavailable": dict(sorted(reply.get("touched_unavailable", {}).items())),
        "started_generation": started_generation,
        "generation": generation,
        "queued_ms": waited_ms,
    }


async def _settle(helper: Any, capsule_id: str) -> None:
    """Wait (bounded) until the helper has ended an exec whose reply we gave up on.

    The helper notices a caller that went away when its next progress report fails to
    send (every PROGRESS_MS), then kills the jail; until then the capsule is busy there,
    and the next queued exec would be refused with CONFLICT.
    """
    with trio.move_on_after(SETTLE_S):
        while True:
            try:
                listed = (await helper.request("list", {}))["capsules"]
            except CcwError:
                return  # the helper is gone: nothing runs there any more
            if not any(c["capsule_id"] == capsule_id and c.get("state") == "busy" for c in listed):
                return
            await trio.sleep(SETTLE_POLL_S)


def note_tool_changes(state: Any, capsule_id: str, view: RootView, paths: list[str]) -> None:
    """Journal what a file tool just did to a capsule, path by path, as the view now shows it.

    Replays redo these between the execs (so a witness of a tool-edited capsule still
    replays), and promotion's conflict check learns the base state at each path.
    """
    journal = Journal(state)
    record = journal.capsule(capsule_id)
    if record is None:
        return
    for path in paths:
        side = lstat(view, path)
        if side is None:
            journal.add_write(capsule_id, path, "delete")
        elif side.kind == "symlink":
            journal.add_write(capsule_id, path, "symlink", target=side.target)
        elif side.kind == "file":
            journal.add_write(capsule_id, path, "write", view.read_bytes(path), mode=side.mode,
                              mtime_ns=view.stat(path).st_mtime_ns)
    _record_base(journal, record, paths)


def record_base_states(ctx: ToolContext, record: CapsuleRecord, paths: list[str]) -> None:
    """Note the base's state at newly changed paths, for promotion's conflict check.

    Called right after each change is seen (an exec, a file tool writing into the
    capsule): the base cannot be read as it was before the change, so "when first seen"
    is the closest record there is.
    """
    _record_base(_journal(ctx), record, paths)


def _record_base(journal: Journal, record: CapsuleRecord, paths: list[str]) -> None:
    known = journal.known_paths(record.capsule_id)
    fresh = [p for p in paths if p not in known]
    if not fresh:
        return
    with RootView.open(record.base) as base_view:
        journal.record_base(record.capsule_id, {p: changeset.base_state(base_view, p) for p in fresh})


def _progress_message(report: dict[str, Any]) -> str:
    """A progress line: elapsed time, byte counts, and the latest output lines."""
    out = base64.b64decode(report["stdout_tail_b64"]).decode("utf-8", "replace")
    err = base64.b64decode(report["stderr_tail_b64"]).decode("utf-8", "replace")
    tail = "\n".join((out + err).splitlines()[-PROGRESS_LINES:])
    head = (f"running {report['elapsed_ms'] // 1000} s; stdout {report['stdout_bytes']} B, "
            f"stderr {report['stderr_bytes']} B")
    return f"{head}\n{tail}" if tail else head


def _diff_entries(record: CapsuleRecord, changes: list[dict[str, Any]], root_fd: int) -> tuple[list[changeset.Entry], list[unidiff.FileChange]]:
    with RootView.from_fd(root_fd) as capsule_view, RootView.open(record.base) as base_view:
        entries = changeset.expand(changes, base_view, capsule_view)
        return entries, changeset.file_changes(entries, base_view, capsule_view)


async def capsule_diff(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """The capsule's changes against its base, as a unified diff, JSON or a stat."""
    record = live_record(ctx, args["capsule_id"])
    fmt = args.get("format") or "unified"
    helper = await ctx.helper()
    changes = (await helper.request("changes", {"capsule_id": record.capsule_id}))["changes"]
    root_fd = await helper.open_root(record.capsule_id)
    entries, file_changes = await trio.to_thread.run_sync(_diff_entries, record, changes, root_fd)
    files = []
    for fc in file_changes:
        status = "added" if fc.old is None else "deleted" if fc.new is None else "modified"
        added, removed = unidiff.numstat(fc)
        files.append(
            {
                "path": fc.path,
                "status": status,
                "binary": bool(fc.binary) or unidiff.is_binary(fc.old) or unidiff.is_binary(fc.new),
                "old_mode": f"{fc.old_mode:o}" if fc.old_mode else None,
                "new_mode": f"{fc.new_mode:o}" if fc.new_mode else None,
                "lines_added": added,
                "lines_removed": removed,
            }
        )
    if fmt == "unified":
        diff = unidiff.render_all(file_changes).decode("utf-8")
    elif fmt == "stat":
        diff = "".join(_stat_line(f) for f in files)
        diff += f"{len(files)} files changed\n"
    else:
        diff = ""
    summary = changeset.summary(entries)
    result: dict[str, Any] = {"capsule_id": record.capsule_id, "format": fmt, "summary": summary, "diff": diff}
    if fmt == "json":
        result["files"] = files
    return result


def _stat_line(file: dict[str, Any]) -> str:
    if file["binary"]:
        return f"{file['path']} | Bin\n"
    return f"{file['path']} | {(file['lines_added'] or 0) + (file['lines_removed'] or 0)}\n"


async def capsule_fork(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """A child capsule stacked on its parent's view."""
    parent = live_record(ctx, args["capsule_id"])
    async with ctx.capsule_turn(parent.capsule_id, turn_label("capsule_fork", args)):
        parent = live_record(ctx, parent.capsule_id)
        helper = await ctx.helper()
        reply = await helper.request("fork", {"capsule_id": parent.capsule_id})
    created = _now()
    record = CapsuleRecord(
        capsule_id=reply["capsule_id"],
        spec=parent.spec,
        parent=parent.capsule_id,
        created_at=_iso(created),
        clock=_iso(created + dt.timedelta(seconds=parent.clock_offset_sec)),
        isolation=reply.get("isolation", parent.isolation),
        mount=reply.get("mount", ""),
        base_fingerprint=parent.base_fingerprint,
        destroyed_at=None,
    )
    _journal(ctx).add_capsule(record)
    return _capsule_result(record)


async def capsule_list(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """The caller's live capsules, by id."""
    helper = await ctx.helper()
    live = (await helper.request("list", {}))["capsules"]
    journal = _journal(ctx)
    out = []
    for item in sorted(live, key=lambda c: c["capsule_id"]):
        record = journal.capsule(item["capsule_id"])
        execs = len(journal.execs(item["capsule_id"])) if record else 0
        out.append(
            {
                "capsule_id": item["capsule_id"],
                "workspace": item.get("workspace", record.workspace if record else ""),
                "parent": item.get("parent"),
                "created_at": record.created_at if record else item.get("created_at", ""),
                "execs": execs,
                "generation": record.generation if record else 0,
            }
        )
    return {"capsules": out}


async def capsule_destroy(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Unmount a capsule and delete its data; its journal stays for witnesses."""
    record = live_record(ctx, args["capsule_id"])
    async with ctx.capsule_turn(record.capsule_id, turn_label("capsule_destroy", args)):
        record = live_record(ctx, record.capsule_id)
        helper = await ctx.helper()
        await helper.request("destroy", {"capsule_id": record.capsule_id})
        _journal(ctx).mark_destroyed(record.capsule_id, _iso(_now()))
    return {"capsule_id": record.capsule_id, "destroyed": True}


_USAGE = {
    "type": "object",
    "description": (
        "null: not measured (the reason is in usage_unavailable), never 0; usage_sources names the "
        "mechanism of every other figure. rss_max_kb is the exec's total (its memory cgroup's peak); "
        "rss_max_process_kb the largest single process (wait4 rusage), present without cgroups too."
    ),
    "required": list(USAGE_FIGURES),
    "properties": {k: _NULLABLE_INT for k in USAGE_FIGURES},
    "additionalProperties": False,
}
_PATHS = {"type": "array", "items": {"type": "string"}}
_DISK = {
    "type": ["object", "null"],
    "description": "The capsule's disk after the command (null: the capsule has no disk limit).",
    "required": ["limit_mb", "used_kb", "free_kb", "full"],
    "properties": {
        "limit_mb": {"type": "integer"},
        "used_kb": {"type": "integer"},
        "free_kb": {"type": "integer"},
        "full": {"type": "boolean", "description": "Less than 1% (at least 4 MiB) is free: writes fail or are about to (ENOSPC)."},
    },
    "additionalProperties": False,
}
_REASONS = {"type": "object", "additionalProperties": {"type": "string"}}

TOOLS = [
    ToolSpec(
        name="capsule_create",
        family="capsule",
        title="Create capsule",
        description=(
            "Create a capsule: a copy-on-write view of `workspace` in which capsule_exec runs "
            "commands in a namespace jail. Nothing touches the real tree until capsule_promote."
        ),
        input_schema={
            "type": "object",
            "required": ["workspace"],
            "additionalProperties": False,
            "properties": {
                "workspace": {"type": "string", "minLength": 1, "description": "Absolute path of the project directory."},
                "base": {"type": ["string", "null"], "description": "Directory to use as the capsule's base (default: the workspace itself)."},
                "clock_offset_sec": {"type": ["integer", "null"], "minimum": -(10**9), "maximum": 10**9},
                "env_whitelist": {"type": ["array", "null"], "items": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"}, "maxItems": 256},
                "limits": {**LIMITS, "type": ["object", "null"]},
                "network": {"enum": ["none", None], "description": "Only 'none' (an empty network namespace with loopback)."},
            },
        },
        output_schema=CAPSULE_OUT,
        handler=capsule_create,
        scope="exec",
        aliases=("capsule/create",),
    ),
    ToolSpec(
        name="capsule_exec",
        family="capsule",
        title="Run in capsule",
        description=(
            "Run `cmd` (argv list) in the capsule's jail: own pid/net/mount namespaces, the workspace "
            "at its own path, no network; PATH starts with the workspace's .venv/bin. Returns exit "
            "status, output, resource usage and the files read and written. Execs, forks and destroys "
            "of one capsule take turns in arrival order (progress says when a call is queued)."
        ),
        input_schema={
            "type": "object",
            "required": ["capsule_id", "cmd"],
            "additionalProperties": False,
            "properties": {
                "capsule_id": CAPSULE_ID,
                "cmd": {"type": "array", "minItems": 1, "items": {"type": "string"}},
                "cwd": {"type": ["string", "null"], "description": "Relative to the workspace (default: the workspace)."},
                "timeout_ms": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_TIMEOUT_MS},
                "stdin": {"type": ["string", "null"]},
            },
        },
        output_schema={
            "type": "object",
            "required": ["exit_code", "stdout", "stderr", "usage", "touched", "timed_out", "truncated", "duration_ms",
                         "started_generation", "generation"],
            "additionalProperties": False,
            "properties": {
                "exit_code": _NULLABLE_INT,
                "signal": {"type": ["string", "null"]},
                "timed_out": {"type": "boolean"},
                "oom_killed": {"type": "boolean"},
                "disk_full": {"type": "boolean"},
                "disk": _DISK,
                "duration_ms": {"type": "integer"},
                "stdout": {"type": "string"},
                "stderr": {"type": "string"},
                "stdout_bytes": {"type": "integer"},
                "stderr_bytes": {"type": "integer"},
                "truncated": {
                    "type": "object",
                    "required": ["stdout", "stderr"],
                    "properties": {"stdout": {"type": "boolean"}, "stderr": {"type": "boolean"}},
                    "additionalProperties": False,
                },
                "usage": _USAGE,
                "usage_unavailable": _REASONS,
                "usage_sources": _REASONS,
                "touched": {
                    "type": "object",
                    "required": ["read", "written"],
                    "properties": {
                        "read": {"type": ["array", "null"], "items": {"type": "string"}},
                        "written": _PATHS,
                        "listed": {"type": ["array", "null"], "items": {"type": "string"},
                                   "description": "Directories opened (listed), '.' the workspace root; null when read is."},
                        "executed": {"type": ["array", "null"], "items": {"type": "string"},
                                     "description": "Files run (execve), also in read; null when read is."},
                    },
                    "additionalProperties": False,
                },
                "touched_unavailable": _REASONS,
                "started_generation": {**GENERATION, "description": "The capsule's change generation the command ran on."},
                "generation": {**GENERATION, "description": (
                    "The capsule's change generation after the command: one more than started_generation "
                    "if it wrote (or its writes could not be fully traced), else the same.")},
                "queued_ms": {"type": "integer", "minimum": 0,
                              "description": "How long the call waited for earlier execs on the capsule."},
            },
        },
        handler=capsule_exec,
        scope="exec",
        aliases=("capsule/exec",),
    ),
    ToolSpec(
        name="capsule_diff",
        family="capsule",
        title="Diff capsule",
        description="The capsule's changes against its base: `unified` (applies with git apply), `json` (per file) or `stat`.",
        input_schema={
            "type": "object",
            "required": ["capsule_id"],
            "additionalProperties": False,
            "properties": {"capsule_id": CAPSULE_ID, "format": {"enum": ["unified", "json", "stat"]}},
        },
        output_schema={
            "type": "object",
            "required": ["capsule_id", "format", "summary", "diff"],
            "additionalProperties": False,
            "properties": {
                "capsule_id": CAPSULE_ID,
                "format": {"enum": ["unified", "json", "stat"]},
                "summary": {
                    "type": "object",
                    "required": ["added", "deleted", "modified"],
                    "properties": {k: {"type": "integer"} for k in ("added", "deleted", "modified")},
                    "additionalProperties": False,
                },
                "diff": {"type": "string"},
                "files": {"type": "array", "items": {"type": "object"}},
            },
        },
        handler=capsule_diff,
        scope="read",
        aliases=("capsule/diff",),
        read_only=True,
        idempotent=True,
    ),
    ToolSpec(
        name="capsule_fork",
        family="capsule",
        title="Fork capsule",
        description=(
            "A child capsule that starts from the parent's current view; the parent refuses execs and "
            "writes while it has forks."
        ),
        input_schema={"type": "object", "required": ["capsule_id"], "additionalProperties": False, "properties": {"capsule_id": CAPSULE_ID}},
        output_schema=CAPSULE_OUT,
        handler=capsule_fork,
        scope="exec",
        aliases=("capsule/fork",),
    ),
    ToolSpec(
        name="capsule_list",
        family="capsule",
        title="List capsules",
        description="Your live capsules, oldest first.",
        input_schema={"type": "object", "additionalProperties": False, "properties": {}},
        output_schema={
            "type": "object",
            "required": ["capsules"],
            "additionalProperties": False,
            "properties": {
                "capsules": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["capsule_id", "workspace", "parent", "created_at", "execs", "generation"],
                        "additionalProperties": False,
                        "properties": {
                            "capsule_id": CAPSULE_ID,
                            "workspace": {"type": "string"},
                            "parent": {"type": ["string", "null"]},
                            "created_at": {"type": "string"},
                            "execs": {"type": "integer"},
                            "generation": GENERATION,
                        },
                    },
                }
            },
        },
        handler=capsule_list,
        scope="read",
        aliases=("capsule/list",),
        read_only=True,
        idempotent=True,
    ),
    ToolSpec(
        name="capsule_destroy",
        family="capsule",
        title="Destroy capsule",
        description=(
            "Unmount the capsule and delete its changes; the real tree is not touched."
        ),
        input_schema={"type": "object", "required": ["capsule_id"], "additionalProperties": False, "properties": {"capsule_id": CAPSULE_ID}},
        output_schema={
            "type": "object",
            "required": ["capsule_id", "destroyed"],
            "additionalProperties": False,
            "properties": {"capsule_id": CAPSULE_ID, "destroyed": {"const": True}},
        },
        handler=capsule_destroy,
        scope="exec",
        aliases=("capsule/destroy",),
        destructive=True,
        idempotent=False,
    ),
]
