"""One command run in a capsule: what is asked of the helper, what comes back, what is journaled.

- ``stdout``/``stderr`` come back as bytes; the journal hashes the raw bytes, and
  ``stdout_bytes``/``stderr_bytes`` count all the command wrote, even past the capture
  cap (``truncated`` says whether the captured bytes are whole).
- Usage figures are null when not measured, never 0; the journal keeps each figure's
  mechanism and each null's reason with it.
"""

from __future__ import annotations

import base64
import datetime as dt
from dataclasses import dataclass
from typing import Any

import blake3

from mcp_server.capsules.execenv import DEFAULT_TIMEOUT_MS, exec_env, resolve_cwd
from mcp_server.journal import CapsuleRecord

USAGE_FIGURES = ("cpu_ms", "rss_max_kb", "rss_max_process_kb", "io_read_kb", "io_write_kb")
PROGRESS_MS = 1000  # how often a running exec reports (only sent on if the caller asked)
PROGRESS_LINES = 20  # lines of the latest output in each progress message
TOUCHED_SETS = ("read", "written", "listed", "executed")


@dataclass(frozen=True)
class Command:
    """A command to run in a capsule, as a caller asks for it."""

    argv: list[str]
    cwd: str | None = None  # relative to the workspace, or absolute inside it; None: the workspace
    timeout_ms: int | None = None  # None: DEFAULT_TIMEOUT_MS
    stdin: bytes | None = None


@dataclass(frozen=True)
class ExecOutcome:
    """What a journaled exec did: the helper's reply, normalised, and the generations around it."""

    exit_code: int | None
    signal: str | None
    timed_out: bool
    oom_killed: bool
    duration_ms: int
    stdout: bytes
    stderr: bytes
    stdout_bytes: int
    stderr_bytes: int
    truncated: dict[str, bool]
    usage: dict[str, Any]
    usage_unavailable: dict[str, str]
    usage_sources: dict[str, str]
    disk: dict[str, Any] | None
    touched: dict[str, Any]  # read/written/listed/executed; listed and executed are null exactly when read is
    touched_unavailable: dict[str, str]
    started_generation: int
    generation: int
    queued_ms: int


def exec_request(record: CapsuleRecord, command: Command) -> dict[str, Any]:
    """The helper's ``exec`` arguments for ``command`` in the capsule of ``record``."""
    request: dict[str, Any] = {
        "capsule_id": record.capsule_id,
        "argv": list(command.argv),
        "cwd": resolve_cwd(record.workspace, command.cwd),
        "env": exec_env(record.workspace, record.env_whitelist),
        "timeout_ms": command.timeout_ms or DEFAULT_TIMEOUT_MS,
    }
    if command.stdin is not None:
        request["stdin_b64"] = base64.b64encode(command.stdin).decode()
    if record.limits:
        request["limits"] = record.limits
    return request


def blake3_of(data: bytes) -> str:
    """The journal's content hash of ``data``."""
    return "blake3:" + blake3.blake3(data).hexdigest()


def outcome_of(reply: dict[str, Any], started_generation: int, queued_ms: int) -> ExecOutcome:
    """The outcome of an exec from the helper's reply (``generation``: as it started, until journaled)."""
    return ExecOutcome(
        exit_code=reply["exit_code"],
        signal=reply.get("signal"),
        timed_out=bool(reply["timed_out"]),
        oom_killed=bool(reply.get("oom_killed")),
        duration_ms=reply["duration_ms"],
        stdout=base64.b64decode(reply["stdout_b64"]),
        stderr=base64.b64decode(reply["stderr_b64"]),
        stdout_bytes=reply["stdout_bytes"],
        stderr_bytes=reply["stderr_bytes"],
        truncated={"stdout": bool(reply["truncated"]["stdout"]), "stderr": bool(reply["truncated"]["stderr"])},
        usage={k: reply["usage"].get(k) for k in USAGE_FIGURES},
        usage_unavailable=dict(sorted(reply.get("usage_unavailable", {}).items())),
        usage_sources=dict(sorted(reply.get("usage_sources", {}).items())),
        disk=reply.get("disk"),
        touched={key: reply["touched"].get(key) for key in TOUCHED_SETS},
        touched_unavailable=dict(sorted(reply.get("touched_unavailable", {}).items())),
        started_generation=started_generation,
        generation=started_generation,
        queued_ms=queued_ms,
    )


def journal_entry(request: dict[str, Any], outcome: ExecOutcome, started: dt.datetime) -> dict[str, Any]:
    """The journal's record of one exec (Journal.add_exec)."""
    stdin_b64 = request.get("stdin_b64")
    return {
        "started_at": started.isoformat(timespec="microseconds"),
        "argv": request["argv"],
        "cwd": request["cwd"],
        "env_keys": sorted(request["env"]),
        "stdin_blake3": blake3_of(base64.b64decode(stdin_b64)) if stdin_b64 is not None else None,
        "stdin_b64": stdin_b64,
        "timeout_ms": request["timeout_ms"],
        "exit_code": outcome.exit_code,
        "signal": outcome.signal,
        "timed_out": int(outcome.timed_out),
        "oom_killed": int(outcome.oom_killed),
        "stdout_blake3": blake3_of(outcome.stdout),
        "stderr_blake3": blake3_of(outcome.stderr),
        "stdout_bytes": outcome.stdout_bytes,
        "stderr_bytes": outcome.stderr_bytes,
        "duration_ms": outcome.duration_ms,
        # The journal keeps each figure's mechanism and each null's reason with it.
        "usage": {**outcome.usage, "sources": outcome.usage_sources, "unavailable": outcome.usage_unavailable},
        "touched": outcome.touched,
        "generation": outcome.started_generation,
    }


def progress_message(report: dict[str, Any]) -> str:
    """A progress line: elapsed time, byte counts, and the latest output lines."""
    out = base64.b64decode(report["stdout_tail_b64"]).decode("utf-8", "replace")
    err = base64.b64decode(report["stderr_tail_b64"]).decode("utf-8", "replace")
    tail = "\n".join((out + err).splitlines()[-PROGRESS_LINES:])
    head = (f"running {report['elapsed_ms'] // 1000} s; stdout {report['stdout_bytes']} B, "
            f"stderr {report['stderr_bytes']} B")
    return f"{head}\n{tail}" if tail else head
