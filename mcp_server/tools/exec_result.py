"""capsule_exec's result: a finished exec's shape, an interactive exec's answer, and their schemas.

Shared by ``capsule_exec`` (mcp_server/tools/exec.py), whose answer it is, and
``capsule_run`` (mcp_server/tools/run.py), which answers with it once a run has ended.
What the fields mean is said in tools/exec.py's opening; an interactive exec's
answers (``output``, ``cursor``) in mcp_server/capsules/run.py and console.py.
"""

from __future__ import annotations

import json
from typing import Any

from mcp_server.capsules.exec import USAGE_FIGURES, ExecOutcome, timeout_hint
from mcp_server.capsules.fragments import GENERATION
from mcp_server.capsules.run import CONSOLE_STATUS, RUN_STATUS
from mcp_server.core.terminal_text import visible

_NULLABLE_INT = {"type": ["integer", "null"]}
# A reinstalled node_modules/ touches tens of thousands of paths, megabytes of an answer: past this
# many in a set, paths are cut to their directories, "dir/" standing for those below (the journal keeps them all).
TOUCHED_LISTED = 1000
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
            # Held while a person was asked (capsules/misses.py): the question, its answer, who, reason.
            "asked": {"type": "object"},
        },
    },
}
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
        "full": {"type": "boolean",
                 "description": "Less than 1% (at least 4 MiB) is free: writes fail or are about to (ENOSPC)."},
    },
    "additionalProperties": False,
}
_REASONS = {"type": "object", "additionalProperties": {"type": "string"}}

EXEC_RESULT: dict[str, Any] = {
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
                "not_utf8": {"type": "object", "description": "Names left out: not UTF-8 (touched_unavailable)."},
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
        "hints": {**_PATHS, "description": (
            "What to do about it: what to expose for a program the jail hides, the limit a command timed out at.")},
    },
}

# An answer about an interactive exec: its status and output, and once it has finished the result's fields too.
CONSOLE_ANSWER = {
    "type": "object",
    "required": ["status", "run_id", "output", "cursor"],
    "additionalProperties": False,
    "properties": {**EXEC_RESULT["properties"], **CONSOLE_STATUS},
}
EXEC_OUTPUT = {"type": "object", "oneOf": [RUN_STATUS, CONSOLE_ANSWER, EXEC_RESULT]}


def exec_text(result: dict[str, Any]) -> str:
    """The exec's text block: the result as JSON, then each denied connection's line, as a
    command's stderr would show it (an agent that reads only text sees why it failed); an
    interactive exec's output last, as it is (not escaped inside the JSON)."""
    shown = {key: value for key, value in result.items() if key != "output"}
    text = json.dumps(shown, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "\n".join([text, *result.get("network_notes", ()), *([result["output"]] if result.get("output") else [])])


def exec_result(ran: ExecOutcome, terminal: bool = False, timeout_ms: int | None = None) -> dict[str, Any]:
    """capsule_exec's result for a finished exec (seed 003's shape); ``terminal``: an interactive
    run's on a pty, whose stdout is shown as the screen showed it (core/terminal_text.py);
    ``timeout_ms``: the limit it ran under, told in its hints if it timed out."""
    reply = ran.reply
    stdout = reply.stdout.decode("utf-8", "replace")
    hints = [*ran.hints, *([timeout_hint(timeout_ms, "timeout_ms")] if reply.timed_out and timeout_ms else [])]
    return {
        "exit_code": reply.exit_code,
        "signal": reply.signal,
        "timed_out": bool(reply.timed_out),
        "oom_killed": bool(reply.oom_killed),
        "duration_ms": reply.duration_ms,
        "stdout": visible(stdout) if terminal else stdout,
        "stderr": reply.stderr.decode("utf-8", "replace"),
        "stdout_bytes": reply.stdout_bytes,
        "stderr_bytes": reply.stderr_bytes,
        "truncated": reply.truncated.to_args(),
        "usage": ran.usage,
        "usage_unavailable": ran.usage_unavailable_briefly,
        "usage_sources": ran.usage_sources_briefly,
        "disk_full": reply.disk is not None and reply.disk.full,
        "disk": None if reply.disk is None else reply.disk.to_args(),
        "touched": briefly(ran.touched),
        "touched_unavailable": ran.touched_unavailable_briefly,
        "network_notes": list(ran.network_notes),
        "started_generation": ran.started_generation,
        "generation": ran.generation,
        "queued_ms": ran.queued_ms,
        **({"hints": hints} if hints else {}),
    }


def briefly(touched: dict[str, Any]) -> dict[str, Any]:
    """``touched`` with each path set over ``TOUCHED_LISTED`` cut to the deepest directories that fit."""
    return {key: _within(paths) if key in ("read", "written", "listed", "executed") and paths else paths
            for key, paths in touched.items()}


def _within(paths: list[str]) -> list[str]:
    depth = max(path.count("/") for path in paths) + 1
    cut = paths
    while len(cut) > TOUCHED_LISTED and depth > 1:
        depth -= 1
        cut = list(dict.fromkeys(path if path.count("/") < depth else "/".join(path.split("/")[:depth]) + "/"
                                 for path in paths))
    return cut
