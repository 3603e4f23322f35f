"""Capsule tools: create, diff, fork, list, destroy (seed 003 §1–§3 shapes).

Adapters over the capsule service (``ctx.capsules``, mcp_server/capsules/service.py,
which keeps the journal, the change generation and each capsule's turns; what create
decides is capsules/create.py's): each handler turns its arguments into the service's
types and the service's answer into the tool's result.  capsule_exec, listed after
capsule_create, is tools/exec.py's.  What the results mean, where seed 003 is silent:

- ``capsule_diff`` compares the capsule's view with its base (the workspace as it is now,
  since the live tree is the capsule's lower layer); files that are not UTF-8 are shown
  as git binary patches, so the unified diff always applies with ``git apply``.  It
  shows what promotion would carry, names what it leaves behind, warns when the
  workspace moved under a changed path, and cuts a long diff at a file's end
  (capsules/carried.py says why).
- Every result that describes a capsule carries its change ``generation``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mcp_server.capsules import carried, service
from mcp_server.capsules.create import Asked, create
from mcp_server.capsules.fragments import CAPSULE_ID, GENERATION, NETWORK_IN
from mcp_server.capsules.gitdirs import Found, listing
from mcp_server.core import unidiff, volatile
from mcp_server.core.netrules import parse_network
from mcp_server.fs import changeset
from mcp_server.fs.gitignore import Scope
from mcp_server.fs.netpresets import expand_network
from mcp_server.journal_records import CapsuleRecord
from mcp_server.tools.registry import ToolContext, ToolSpec
from sandbox.checks import DISK_MB_MAX, DISK_MB_MIN
from sandbox.spec import Limits

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
        "Per-exec memory (MiB), processes, CPU time (ms); disk_mb: the capsule's disk (default: the helper's)."
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


async def capsule_create(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Create a capsule over a workspace (never a system directory or a home's secrets: what
    it may be, and what it shows, capsules/create.py decides)."""
    network = parse_network(expand_network(args.get("network"), ctx.state.root))  # preset:NAME: fs/netpresets.py
    asked = Asked(
        workspace=args["workspace"],
        base=args.get("base"),
        clock_offset_sec=int(args.get("clock_offset_sec") or 0),
        env_whitelist=tuple(sorted(set(args.get("env_whitelist") or []))),
        limits=Limits(**(args.get("limits") or {})),
        expose=tuple(args.get("expose") or ()),
        auto_expose=args.get("auto_expose") is not False,
        network=network,
        network_given=args.get("network"),
        volatile=volatile.globs_arg(args.get("volatile")),
        secrets=tuple(args.get("secrets") or ()),  # ccw secret list's names (capsules/capsecrets.py)
    )
    made = await create(ctx.capsules, asked, ctx.caller_env)  # PATH and HOME: the caller's (mcp_server/caller.py)
    result = _git_result(_capsule_result(made.record), made.git)
    if made.exposed:
        result["exposed"] = [{"path": need.path, "reason": need.reason} for need in made.exposed]
    return result


async def capsule_diff(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """The capsule's change as promotion would carry it (capsules/carried.py), as a unified diff, JSON or a stat."""
    fmt = args.get("format") or "unified"
    scope = Scope(include_ignored=bool(args.get("ignored")), paths=tuple(args.get("paths") or ()))
    found = await carried.carried(ctx.capsules, args["capsule_id"], scope)
    diff = found.diff
    files = [_file_item(fc) for fc in diff.file_changes]
    result: dict[str, Any] = {"capsule_id": diff.record.capsule_id, "format": fmt,
                              "summary": changeset.summary(diff.entries)}
    notes = carried.notes(found)
    if fmt == "unified":
        max_chars = args.get("max_chars", carried.MAX_CHARS)
        result["diff"], left_out = carried.unified(diff.file_changes, max_chars)
        if left_out:
            notes.append(carried.cut_note(left_out, len(result["diff"])))
    elif fmt == "stat":
        result["diff"] = "".join(_stat_line(f) for f in files) + f"{len(files)} files changed\n"
    else:
        result["diff"] = ""
        result["files"] = files
    if notes:
        result["notes"] = notes
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
    """A child capsule stacked on its parent's view; with ``count``, that many, answered by their ids."""
    if args.get("count") is None:  # the single fork's answer, as callers that give no count know it
        return _capsule_result(await ctx.capsules.fork(args["capsule_id"]))
    made = await ctx.capsules.forks(args["capsule_id"], args["count"])
    return {"parent": args["capsule_id"], "capsule_ids": [record.capsule_id for record in made]}


async def capsule_list(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """The caller's live capsules, by id."""
    listed = await ctx.capsules.list_live()
    return {"capsules": [{key: value for key, value in dataclasses.asdict(summary).items()
                          if value is not None or key not in _LISTED_IF_ANY} for summary in listed]}


_LISTED_IF_ANY = ("services", "held_by", "merged_from")  # left out of a capsule_list entry when None


async def capsule_destroy(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Unmount a capsule and delete its data; its journal stays for witnesses."""
    record = await ctx.capsules.destroy(args["capsule_id"])
    return {"capsule_id": record.capsule_id, "destroyed": True}


TOOLS = [
    ToolSpec(
        name="capsule_create",
        family="capsule",
        title="Create capsule",
        description=(
            "A copy-on-write view of `workspace` for capsule_exec's jailed commands; "
            "the real tree changes only at capsule_promote."
        ),
        input_schema={
            "type": "object",
            "required": ["workspace"],
            "additionalProperties": False,
            "properties": {
                "workspace": {"type": "string", "minLength": 1,
                              "description": "Absolute project dir (not /etc, a home or a key store)."},
                "base": {"type": ["string", "null"], "description": "Default: the workspace."},
                "clock_offset_sec": {"type": ["integer", "null"], "minimum": -(10**9), "maximum": 10**9},
                "env_whitelist": {"type": ["array", "null"],
                                  "items": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"}, "maxItems": 256},
                "limits": {**LIMITS, "type": ["object", "null"]},
                "network": NETWORK_IN,
                "volatile": {**volatile.GLOBS_SCHEMA, "description": "Random outputs replays skip (.nyc_output/*)."},
                "expose": {"type": ["array", "null"], "items": {"type": "string"},
                           "description": "Toolchain dirs shown read-only, beside auto_expose's."},
                "auto_expose": {"type": "boolean"},
                "secrets": {"type": "array", "items": {"type": "string"}},
            },
        },
        output_schema=CAPSULE_OUT,
        handler=capsule_create,
        scope="exec",
        aliases=("capsule/create",),
    ),
    ToolSpec(
        name="capsule_diff",
        family="capsule",
        title="Diff capsule",
        description="The change promote would carry (git-ignored files only named): unified, json or stat.",
        input_schema={
            "type": "object",
            "required": ["capsule_id"],
            "additionalProperties": False,
            "properties": {"capsule_id": CAPSULE_ID, "format": {"enum": ["unified", "json", "stat"]},
                           "ignored": {"type": "boolean"}, "paths": {"type": "array", "items": {"type": "string"}},
                           "max_chars": {"type": ["integer", "null"]}},
        },
        output_schema={
            "type": "object",
            "required": ["capsule_id", "format", "summary", "diff"],
            "additionalProperties": False,
            "properties": {
                "capsule_id": CAPSULE_ID,
                "format": {"type": "string"},  # as asked
                # each changed git dir: {gitdir, count, paths, refs}
                "git": {"type": "array", "items": {"type": "object"}},
                "summary": {
                    "type": "object",
                    "required": ["added", "deleted", "modified"],
                    "properties": {k: {"type": "integer"} for k in ("added", "deleted", "modified")},
                    "additionalProperties": False,
                },
                "diff": {"type": "string"},
                "files": {"type": "array", "items": {"type": "object"}},
                # left out as ignored, the workspace moved, the diff cut (capsules/carried.py)
                "notes": {"type": "array", "items": {"type": "string"}},
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
            "A child capsule of the parent's current view (the parent refuses execs and writes while it has "
            f"forks). count (at most {service.MAX_FORKS}): that many, all or none: {{parent, capsule_ids}}."
        ),
        input_schema={"type": "object", "required": ["capsule_id"], "additionalProperties": False, "properties": {
            "capsule_id": CAPSULE_ID,
            "count": {"type": ["integer", "null"], "minimum": 1}}},
        output_schema={"type": "object", "oneOf": [CAPSULE_OUT, {
            "type": "object", "required": ["parent", "capsule_ids"], "additionalProperties": False,
            "properties": {"parent": CAPSULE_ID, "capsule_ids": {"type": "array", "items": CAPSULE_ID}}}]},
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
                        "required": ["capsule_id", "workspace", "parent", "created_at", "execs", "generation", "state"],
                        "additionalProperties": False,
                        "properties": {
                            "capsule_id": CAPSULE_ID,
                            "workspace": {"type": "string"},
                            "parent": {"type": ["string", "null"]},
                            "created_at": {"type": "string"},
                            "execs": {"type": "integer"},
                            "generation": GENERATION,
                            "state": {"type": "string"},
                            "services": {"type": "object", "additionalProperties": {"type": "string"},
                                         "description": "Its services by name: their state (running, ready, ...)."},
                            "held_by": {"type": "array", "items": CAPSULE_ID,
                                        "description": "Forks and merges on it: frozen until destroyed."},
                            "merged_from": {"type": "array", "items": CAPSULE_ID},
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
            "Unmount the capsule and delete its changes (the real tree stays as it is)."
        ),
        input_schema={"type": "object", "required": ["capsule_id"], "additionalProperties": False,
                      "properties": {"capsule_id": CAPSULE_ID}},
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
