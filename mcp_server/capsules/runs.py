"""One command run in a capsule: what is asked of the helper, what comes back, what is journaled.

- ``env_whitelist`` names variables of the server's own environment that pass into the
  capsule; HOME is always the capsule's own home, PATH and LANG get defaults if absent.
- ``cwd`` is relative to the workspace, or absolute inside it; default the workspace
  (``sandbox.spec.resolve_cwd``, the rule the helper re-checks).
- ``stdout``/``stderr`` come back as bytes; the journal hashes the raw bytes, and
  ``stdout_bytes``/``stderr_bytes`` count all the command wrote, even past the capture
  cap (``truncated`` says whether the captured bytes are whole).
- Usage figures are null when not measured, never 0; the journal keeps each figure's
  mechanism and each null's reason with it.
"""

from __future__ import annotations

import base64
import datetime as dt
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import blake3

from sandbox.ops import ExecReply, ExecRequest
from sandbox.spec import DEFAULT_PATH, DEFAULT_TIMEOUT_MS, CapsuleSpec, resolve_cwd

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
    signal: Any  # the signal's name ("SIGKILL") or None
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


def exec_env(workspace: str, env_whitelist: Iterable[str]) -> dict[str, str]:
    """The environment of a command in the capsule: whitelisted variables, else defaults.

    PATH starts with the workspace's ``.venv/bin``, as ``uv run`` and ``poetry run`` put
    the project's environment first: ``pytest`` in a capsule is the project's pytest.
    Always there, present or not, so the environment of a run does not depend on the
    host (a replay sees the same PATH).
    """
    env = {k: os.environ[k] for k in env_whitelist if k in os.environ and k != "HOME"}
    env.setdefault("PATH", f"{os.path.join(workspace, '.venv', 'bin')}:{DEFAULT_PATH}")
    env.setdefault("LANG", "C.UTF-8")
    return env


def exec_request(capsule_id: str, spec: CapsuleSpec, command: Command, progress_ms: int | None = None) -> ExecRequest:
    """The helper's ``exec`` request for ``command`` in a capsule made from ``spec``."""
    limits = spec.limits if spec.limits.to_json() else None
    return ExecRequest(
        capsule_id=capsule_id,
        argv=tuple(command.argv),
        cwd=resolve_cwd(command.cwd, spec.workspace),
        env=exec_env(spec.workspace, spec.env_whitelist),
        stdin=command.stdin,
        timeout_ms=command.timeout_ms or DEFAULT_TIMEOUT_MS,
        limits=limits,
        progress_ms=progress_ms,
    )


def blake3_of(data: bytes) -> str:
    """The journal's content hash of ``data``."""
    return "blake3:" + blake3.blake3(data).hexdigest()


def outcome_of(reply: ExecReply, started_generation: int, queued_ms: int) -> ExecOutcome:
    """The outcome of an exec from the helper's reply (``generation``: as it started, until journaled)."""
    return ExecOutcome(
        exit_code=reply.exit_code,
        signal=reply.signal,
        timed_out=bool(reply.timed_out),
        oom_killed=bool(reply.oom_killed),
        duration_ms=reply.duration_ms,
        stdout=reply.stdout,
        stderr=reply.stderr,
        stdout_bytes=reply.stdout_bytes,
        stderr_bytes=reply.stderr_bytes,
        truncated={"stdout": bool(reply.truncated["stdout"]), "stderr": bool(reply.truncated["stderr"])},
        usage={k: reply.usage.get(k) for k in USAGE_FIGURES},
        usage_unavailable=dict(sorted(reply.usage_unavailable.items())),
        usage_sources=dict(sorted(reply.usage_sources.items())),
        disk=reply.disk,
        touched={key: reply.touched.get(key) for key in TOUCHED_SETS},
        touched_unavailable=dict(sorted(reply.touched_unavailable.items())),
        started_generation=started_generation,
        generation=started_generation,
        queued_ms=queued_ms,
    )


def journal_entry(request: ExecRequest, outcome: ExecOutcome, started: dt.datetime) -> dict[str, Any]:
    """The journal's record of one exec (Journal.add_exec)."""
    return {
        "started_at": started.isoformat(timespec="microseconds"),
        "argv": list(request.argv),
        "cwd": request.cwd,
        "env_keys": sorted(request.env or {}),
        "stdin_blake3": blake3_of(request.stdin) if request.stdin is not None else None,
        "stdin_b64": base64.b64encode(request.stdin).decode() if request.stdin is not None else None,
        "timeout_ms": request.timeout_ms,
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
