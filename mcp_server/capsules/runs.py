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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import blake3

from sandbox.ops import ExecRequest
from sandbox.replies import ExecReply, Usage
from sandbox.spec import DEFAULT_PATH, DEFAULT_TIMEOUT_MS, CapsuleSpec, resolve_cwd

USAGE_FIGURES = tuple(one.name for one in fields(Usage))
PROGRESS_MS = 1000  # how often a running exec reports (only sent on if the caller asked)
PROGRESS_LINES = 20  # lines of the latest output in each progress message
NETWORK_NONE_REASON = ("network is none: the jail has only loopback; attempts to leave fail at once (ENETUNREACH) "
                       "and are not recorded")


@dataclass(frozen=True)
class Command:
    """A command to run in a capsule, as a caller asks for it."""

    argv: list[str]
    cwd: str | None = None  # relative to the workspace, or absolute inside it; None: the workspace
    timeout_ms: int | None = None  # None: DEFAULT_TIMEOUT_MS
    stdin: bytes | None = None
    env: dict[str, str] | None = None  # the whole environment (a REAPI Command's); None: exec_env's
    # Where the whitelisted variables' values come from: the calling ccw command's own
    # environment, lent through the state dir's front end; None: this process's.
    values: Mapping[str, str] | None = None


@dataclass(frozen=True)
class ExecOutcome:
    """What a journaled exec did: the helper's reply, and the generations and wait around it."""

    reply: ExecReply
    started_generation: int  # the capsule's change generation the command ran on
    generation: int  # the one it left (advanced if the command wrote)
    queued_ms: int  # how long the call waited for the calls on the capsule before it
    network: list[dict[str, Any]] | None = None  # the attempts to connect out (None: network none)
    network_notes: tuple[str, ...] = ()  # a line per denied attempt, for the agent
    hints: tuple[str, ...] = ()  # what to expose for a program the jail hides (capsules/exposure.py)

    @property
    def usage(self) -> dict[str, Any]:
        """The usage figures (null: not measured, never 0)."""
        return self.reply.usage.to_args()

    @property
    def usage_unavailable(self) -> dict[str, str]:
        """Why each null usage figure is null."""
        return dict(sorted(self.reply.usage_unavailable.items()))

    @property
    def usage_sources(self) -> dict[str, str]:
        """The mechanism behind each usage figure."""
        return dict(sorted(self.reply.usage_sources.items()))

    @property
    def touched(self) -> dict[str, Any]:
        """Files read, written, listed, executed (sandbox.replies.Touched), and the network
        attempts, as the journal keeps them."""
        return {**self.reply.touched.to_args(), "network": self.network}

    @property
    def touched_unavailable(self) -> dict[str, str]:
        """Why a touched set is null or incomplete."""
        unavailable = dict(self.reply.touched_unavailable)
        if self.network is None:
            unavailable["network"] = NETWORK_NONE_REASON
        return dict(sorted(unavailable.items()))


def exec_env(workspace: str, env_whitelist: Iterable[str], values: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a command in the capsule: whitelisted variables, else defaults.

    The values come from ``values`` (a replay's: what its replayer passed), by default
    from the server's own environment.  PATH starts with the workspace's ``.venv/bin``,
    as ``uv run`` and ``poetry run`` put the project's environment first: ``pytest`` in
    a capsule is the project's pytest.  Always there, present or not, so the
    environment of a run does not depend on the host (a replay sees the same PATH).
    """
    source = os.environ if values is None else values
    env = {k: source[k] for k in env_whitelist if k in source and k != "HOME"}
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
        env=dict(command.env) if command.env is not None else exec_env(spec.workspace, spec.env_whitelist,
                                                                         command.values),
        stdin=command.stdin,
        timeout_ms=command.timeout_ms or DEFAULT_TIMEOUT_MS,
        limits=limits,
        progress_ms=progress_ms,
    )


def blake3_of(data: bytes) -> str:
    """The journal's content hash of ``data``."""
    return "blake3:" + blake3.blake3(data).hexdigest()


def journal_entry(request: ExecRequest, outcome: ExecOutcome, started: dt.datetime) -> dict[str, Any]:
    """The journal's record of one exec (Journal.add_exec)."""
    reply = outcome.reply
    return {
        "started_at": started.isoformat(timespec="microseconds"),
        "argv": list(request.argv),
        "cwd": request.cwd,
        "env_keys": sorted(request.env or {}),
        "stdin_blake3": blake3_of(request.stdin) if request.stdin is not None else None,
        "stdin_b64": base64.b64encode(request.stdin).decode() if request.stdin is not None else None,
        "timeout_ms": request.timeout_ms,
        "exit_code": reply.exit_code,
        "signal": reply.signal,
        "timed_out": int(bool(reply.timed_out)),
        "oom_killed": int(bool(reply.oom_killed)),
        "stdout_blake3": blake3_of(reply.stdout),
        "stderr_blake3": blake3_of(reply.stderr),
        "stdout_bytes": reply.stdout_bytes,
        "stderr_bytes": reply.stderr_bytes,
        "duration_ms": reply.duration_ms,
        # The journal keeps each figure's mechanism and each null's reason with it.
        "usage": {**outcome.usage, "sources": outcome.usage_sources, "unavailable": outcome.usage_unavailable},
        "touched": outcome.touched,
        "generation": outcome.started_generation,
        "terminal": int(request.stdio == "tty"),  # an interactive session: its input is not kept
    }


def progress_message(report: dict[str, Any]) -> str:
    """A progress line: elapsed time, byte counts, and the latest output lines."""
    out = base64.b64decode(report["stdout_tail_b64"]).decode("utf-8", "replace")
    err = base64.b64decode(report["stderr_tail_b64"]).decode("utf-8", "replace")
    tail = "\n".join((out + err).splitlines()[-PROGRESS_LINES:])
    head = (f"running {report['elapsed_ms'] // 1000} s; stdout {report['stdout_bytes']} B, "
            f"stderr {report['stderr_bytes']} B")
    return f"{head}\n{tail}" if tail else head
