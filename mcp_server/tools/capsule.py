"""Capsule tools: create, exec, diff, fork, list, destroy (seed 003 §1–§3 shapes).

Adapters over the capsule service (``ctx.capsules``, mcp_server/capsules/service.py,
which keeps the journal, the change generation and each capsule's turns): each
handler turns its arguments into the service's types and the service's answer into
the tool's result.  What the results mean, where seed 003 is silent:

- ``stdout``/``stderr`` are text (UTF-8, undecodable bytes replaced); the journal hashes
  the raw bytes, and ``stdout_bytes``/``stderr_bytes`` count all the command wrote, even
  past the capture cap (``truncated`` says whether the text is whole).
- ``capsule_diff`` compares the capsule's view with its base (the workspace as it is now,
  since the live tree is the capsule's lower layer); files that are not UTF-8 are shown
  as git binary patches, so the unified diff always applies with ``git apply``.
- Every result that describes a capsule carries its change ``generation``; an exec's
  result gives the one it started on and the one it left, and ``queued_ms`` how long it
  waited for the calls on the capsule before it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import trio

from mcp_server.capsules import exposure, service
from mcp_server.capsules.exec import USAGE_FIGURES, ExecOutcome, exec_request
from mcp_server.capsules.fragments import CAPSULE_ID, GENERATION, NETWORK_IN
from mcp_server.capsules.gitdirs import Found, listing
from mcp_server.capsules.gitdirs import find as find_gitdir
from mcp_server.capsules.run import RUN_STATUS, WAIT_MS, WAIT_MS_DEFAULT, Run
from mcp_server.core import unidiff, volatile
from mcp_server.core.netrules import parse_network
from mcp_server.core.paths import encoded as encoded_path
from mcp_server.fs import changeset
from mcp_server.journal import CapsuleRecord
from mcp_server.tools.registry import ToolContext, ToolSpec
from sandbox.spec import (
    DISK_MB_MAX,
    DISK_MB_MIN,
    MAX_TIMEOUT_MS,
    CapsuleSpec,
    Limits,
    check_capsule_dir,
    login_homes,
)

_NULLABLE_INT = {"type": ["integer", "null"]}
NETWORK_RECORDS = {
    "type": ["array", "null"],
    "description": "Every connection attempt, allowed or denied (and by which rule), sorted; null: network none.",
    "items": {
        "type": "object",
        "required": ["host", "port", "protocol", "allowed"],
        "properties": {
            "host": {"type": "string"},
            "port": {"type": "integer"},
            "protocol": {"enum": ["http", "https", "socks5", "tcp", "udp"]},
            "allowed": {"type": "boolean"},
            "rule": {"type": ["string", "null"]},
            "reason": {"type": ["string", "null"]},
            "address": {"type": ["string", "null"]},
            "bytes_out": {"type": "integer"},
            "bytes_in": {"type": "integer"},
            "cut": {"type": ["string", "null"]},
        },
    },
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
        "Per-exec memory (MiB), processes, CPU time (ms); disk_mb: the capsule's own disk, "
        "holding all it writes (default: the helper's)."
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
    "network": {"type": ["string", "object"], "description": "'none', or the allowlist in canonical form."},
    "git": {"type": "object"},  # create only: {gitdir} shown copy-on-write, or {note}: why git will not work
    "exposed": {"type": "array", "description": "create: each dir shown read-only, and why.", "items": {
        "type": "object", "required": ["path", "reason"], "additionalProperties": False,
        "properties": {"path": {"type": "string"}, "reason": {"type": "string"}}}},
}
CAPSULE_OUT = {
    "type": "object",
    "required": ["capsule_id", "mount", "clock", "isolation", "workspace", "generation"],
    "properties": _CAPSULE_OUT_PROPS,
    "additionalProperties": False,
}


def _capsule_result(record: CapsuleRecord) -> dict[str, Any]:
    return {
        "capsule_id": record.capsule_id,
        "network": record.network,
        "mount": record.mount,
        "workspace": record.workspace,
        "clock": record.clock,
        "isolation": record.isolation,
        "parent": record.parent,
        "generation": record.generation,
    }


def _git_result(result: dict[str, Any], git: Found) -> dict[str, Any]:
    """capsule_create's result with the git dir a worktree or submodule workspace needs, or why git will not work."""
    if git.gitdir is not None:
        result["git"] = {"gitdir": git.gitdir}
    elif git.note is not None:
        result["git"] = {"note": git.note}
    return result


def _real(path: str, what: str) -> str:
    # The helper re-checks the path; resolving here makes journal entries canonical.
    encoded_path(path, what)
    return os.path.realpath(os.path.expanduser(path))


async def capsule_create(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Create a capsule over a workspace (never a system directory or a home's secrets: the
    rule is sandbox/spec.py's ``check_capsule_dir``, which the helper applies again)."""
    workspace = _real(args["workspace"], "workspace")
    base = _real(args["base"], "base") if args.get("base") else workspace
    homes, uid = login_homes(), os.getuid()
    check_capsule_dir("workspace", workspace, uid, homes, shown_only=base != workspace, given=args["workspace"])
    if base != workspace:
        check_capsule_dir("base", base, uid, homes, given=args["base"])
    git = find_gitdir(base, uid, homes)  # a few bounded reads of small files
    spec = CapsuleSpec(
        workspace=workspace,
        base=base if base != workspace else None,
        clock_offset_sec=int(args.get("clock_offset_sec") or 0),
        env_whitelist=tuple(sorted(set(args.get("env_whitelist") or []))),
        limits=Limits(**(args.get("limits") or {})),
        gitdirs=(git.gitdir,) if git.gitdir is not None else (),
    )
    globs = volatile.globs_arg(args.get("volatile"))
    # The caller's PATH and HOME: the front end's own (its stdio client runs as the caller),
    # or those the ccw command sent through the state dir's front end (mcp_server/frontdoor.py).
    env = getattr(ctx, "caller_env", None) or os.environ
    needs = await trio.to_thread.run_sync(exposure.plan, workspace, list(args.get("expose") or []),
                                          args.get("auto_expose") is not False, env, uid, homes)
    spec = dataclasses.replace(spec, expose=tuple(sorted(need.path for need in needs)))
    result = _git_result(_capsule_result(await ctx.capsules.create(spec, parse_network(args.get("network")), globs)), git)
    if needs:
        result["exposed"] = [{"path": need.path, "reason": need.reason} for need in needs]
    return result


def exec_text(result: dict[str, Any]) -> str:
    """The exec's text block: the result as JSON, then each denied connection's line, as a
    command's stderr would show it (an agent that reads only text sees why it failed)."""
    text = json.dumps(result, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "\n".join([text, *result.get("network_notes", ())])


async def capsule_exec(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Run a command in a capsule's jail, after the calls queued before it, and journal it."""
    stdin = args.get("stdin")
    request = exec_request(args["capsule_id"], args["cmd"], args.get("cwd"), args.get("timeout_ms"),
                           stdin.encode() if stdin is not None else None)
    values = getattr(ctx, "caller_env", None)  # the whitelist's values: the calling ccw command's (frontdoor.py)
    terminal = getattr(ctx, "terminal", None)  # a shell's pty: the call lasts as long as its session

    async def body(run: Run) -> dict[str, Any]:
        return _exec_result(await ctx.for_run(run).capsules.exec(request, values, terminal))

    wait_ms = args.get("wait_ms", WAIT_MS_DEFAULT) if terminal is None else None
    return await ctx.runs.call("capsule_exec", args["capsule_id"], body, wait_ms, ctx.progress)


def _exec_result(ran: ExecOutcome) -> dict[str, Any]:
    """capsule_exec's result for a finished exec (seed 003's shape)."""
    reply = ran.reply
    return {
        "exit_code": reply.exit_code,
        "signal": reply.signal,
        "timed_out": bool(reply.timed_out),
        "oom_killed": bool(reply.oom_killed),
        "duration_ms": reply.duration_ms,
        "stdout": reply.stdout.decode("utf-8", "replace"),
        "stderr": reply.stderr.decode("utf-8", "replace"),
        "stdout_bytes": reply.stdout_bytes,
        "stderr_bytes": reply.stderr_bytes,
        "truncated": reply.truncated.to_args(),
        "usage": ran.usage,
        "usage_unavailable": ran.usage_unavailable,
        "usage_sources": ran.usage_sources,
        "disk_full": reply.disk is not None and reply.disk.full,
        "disk": None if reply.disk is None else reply.disk.to_args(),
        "touched": ran.touched,
        "touched_unavailable": ran.touched_unavailable,
        "network_notes": list(ran.network_notes),
        "started_generation": ran.started_generation,
        "generation": ran.generation,
        "queued_ms": ran.queued_ms,
        **({"hints": list(ran.hints)} if ran.hints else {}),
    }


async def capsule_diff(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """The capsule's changes against its base, as a unified diff, JSON or a stat."""
    fmt = args.get("format") or "unified"
    diff = await ctx.capsules.diff(args["capsule_id"])
    files = [_file_item(fc) for fc in diff.file_changes]
    if fmt == "unified":
        text = unidiff.render_all(diff.file_changes).decode("utf-8")
    elif fmt == "stat":
        text = "".join(_stat_line(f) for f in files)
        text += f"{len(files)} files changed\n"
    else:
        text = ""
    summary = changeset.summary(diff.entries)
    result: dict[str, Any] = {"capsule_id": diff.record.capsule_id, "format": fmt, "summary": summary, "diff": text}
    if fmt == "json":
        result["files"] = files
    if diff.gitdirs:  # a worktree's git dir changes are not in the diff text: listed apart
        result["git"] = listing(diff.gitdirs)
    return result


def _file_item(fc: unidiff.FileChange) -> dict[str, Any]:
    status = "added" if fc.old is None else "deleted" if fc.new is None else "modified"
    added, removed = unidiff.numstat(fc)
    return {
        "path": fc.path,
        "status": status,
        "binary": bool(fc.binary) or unidiff.is_binary(fc.old) or unidiff.is_binary(fc.new),
        "old_mode": f"{fc.old_mode:o}" if fc.old_mode else None,
        "new_mode": f"{fc.new_mode:o}" if fc.new_mode else None,
        "lines_added": added,
        "lines_removed": removed,
    }


def _stat_line(file: dict[str, Any]) -> str:
    if file["binary"]:
        return f"{file['path']} | Bin\n"
    return f"{file['path']} | {(file['lines_added'] or 0) + (file['lines_removed'] or 0)}\n"


async def capsule_fork(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """A child capsule stacked on its parent's view."""
    return _capsule_result(await ctx.capsules.fork(args["capsule_id"]))


async def capsule_list(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """The caller's live capsules, by id."""
    return {"capsules": [dataclasses.asdict(summary) for summary in await ctx.capsules.list_live()]}


async def capsule_destroy(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Unmount a capsule and delete its data; its journal stays for witnesses."""
    record = await ctx.capsules.destroy(args["capsule_id"])
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
            "Create a capsule: a copy-on-write view of `workspace` where capsule_exec runs commands "
            "in a jail. The real tree is untouched until capsule_promote."
        ),
        input_schema={
            "type": "object",
            "required": ["workspace"],
            "additionalProperties": False,
            "properties": {
                "workspace": {"type": "string", "minLength": 1, "description": "Absolute project directory (not /etc, a home or a key store)."},
                "base": {"type": ["string", "null"], "description": "The capsule's base (default: the workspace)."},
                "clock_offset_sec": {"type": ["integer", "null"], "minimum": -(10**9), "maximum": 10**9},
                "env_whitelist": {"type": ["array", "null"], "items": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"}, "maxItems": 256},
                "limits": {**LIMITS, "type": ["object", "null"]},
                "network": NETWORK_IN,
                "volatile": {**volatile.GLOBS_SCHEMA, "description": "Randomly named outputs (.nyc_output/*.json) replays leave out."},
                "expose": {"type": ["array", "null"], "items": {"type": "string"},
                           "description": "Toolchain dirs to show read-only, besides those auto_expose finds."},
                "auto_expose": {"type": "boolean"},
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
            "Run `cmd` in the capsule's jail: own namespaces, the workspace at its own path, no network "
            "but its allowlist's (via ccw's proxy); PATH starts with the workspace's .venv/bin. Returns "
            "exit status, output, usage, files read and written, connections tried. Calls on one "
            "capsule queue in order."
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
                "wait_ms": WAIT_MS,
            },
        },
        output_schema={"type": "object", "oneOf": [RUN_STATUS, {
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
                        "network": NETWORK_RECORDS,
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
                "network_notes": {"type": "array", "items": {"type": "string"},
                                  "description": "A line per denied connection attempt (also in the text content)."},
                "started_generation": {**GENERATION, "description": "The capsule's change generation the command ran on."},
                "generation": {**GENERATION, "description": (
                    "The capsule's change generation after the command: one more than started_generation "
                    "if it wrote (or its writes could not be fully traced), else the same.")},
                "queued_ms": {"type": "integer", "minimum": 0,
                              "description": "How long the call waited for earlier execs on the capsule."},
                "hints": {**_PATHS, "description": "What to expose for a program the jail hides."},
            },
        }]},
        handler=capsule_exec,
        turn=service.EXEC,
        text=exec_text,
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
                "git": {"type": "array", "items": {"type": "object"}},  # each changed git dir: {gitdir, count, paths, refs}
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
        turn=service.FORK,
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
        turn=service.DESTROY,
        scope="exec",
        aliases=("capsule/destroy",),
        destructive=True,
        idempotent=False,
    ),
]
