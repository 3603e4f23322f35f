"""One command run in a capsule: what is asked of the helper, what comes back, what is journaled.

- The request is ``sandbox.ops.ExecRequest``, the one form it has in this process and
  the helper's: built from the tool's arguments (``exec_request``), completed for its
  capsule (``for_capsule``), sent, and journaled from the same value (``journal_entry``).
- ``env_whitelist`` names variables of the server's own environment that pass into the
  capsule; HOME is always the capsule's own home; PATH and LANG get the helper's
  defaults if absent (``sandbox.spec.exec_env``).
- ``cwd`` is relative to the workspace, or absolute inside it; default the workspace
  (``sandbox.spec.resolve_cwd``: the front end makes it absolute, the helper checks it).
- ``stdout``/``stderr`` come back as bytes; the journal hashes the raw bytes, and
  ``stdout_bytes``/``stderr_bytes`` count all the command wrote, even past the capture
  cap (``truncated`` says whether the captured bytes are whole).
- Usage figures are null when not measured, never 0; the journal keeps each figure's
  mechanism and each null's reason with it.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import blake3
import trio

from mcp_server.caller import Caller
from sandbox.checks import MAX_TIMEOUT_MS
from sandbox.client import HelperClient
from sandbox.errors import CcwError
from sandbox.ops import ExecRequest, ListRequest
from sandbox.replies import ExecProgress, ExecReply, Touched, Truncated, Usage
from sandbox.spec import DEFAULT_PROGRESS_MS, DEFAULT_TIMEOUT_MS, CapsuleSpec, exec_env, resolve_cwd
from sandbox.usage_words import NO_FANOTIFY_BRIEFLY, NO_FANOTIFY_ROOTLESS, NO_REPORT, mechanism, refusal_head

USAGE_FIGURES = tuple(one.name for one in fields(Usage))
PROGRESS_MS = DEFAULT_PROGRESS_MS  # how often a journaled exec asks the helper for reports
PROGRESS_LINES = 20  # lines of the latest output in each progress message
# How often an exec whose caller prints its output as it comes (caller.py CALLER_OUTPUT)
# asks for reports; each then carries every byte since the last (ExecRequest.stream).
STREAM_PROGRESS_MS = 250
# Where the helper's standing cgroup refusal is given once, for the execs' results that only name it.
REFUSAL_GIVEN = "why: capsule_create's isolation.cgroups_unavailable"
# Why an exec cancelled while it ran is journaled cut short (``cut_entry``).
CANCELLED = "cancelled while it ran (capsule_run's cancel, or its front end ended: its client closed)"
SETTLE_S = 30.0  # after an exec's reply is lost, how long to wait for the helper to end it
SETTLE_POLL_S = 0.1
# ... and one whose front end was killed (or crashed) while it ran, by the next front end (Journal.recover_running).
FRONT_END_DIED = "its front end was killed or crashed while it ran: how long it ran is not known"
NETWORK_NONE_REASON = ("network is none: the jail has only loopback; attempts to leave fail at once (ENETUNREACH) "
                       "and are not recorded")


@dataclass(frozen=True)
class ExecOutcome:
    """What a journaled exec did: the helper's reply, and the generations and wait around it."""

    reply: ExecReply
    started_generation: int  # the capsule's change generation the command ran on
    generation: int  # the one it left (advanced if the command wrote)
    queued_ms: int  # how long the call waited for the calls on the capsule before it
    attempts: list[dict[str, Any]] | None = None  # the connection attempts (touched.network; None: network none)
    network_notes: tuple[str, ...] = ()  # a line per denied attempt, for the agent
    hints: tuple[str, ...] = ()  # what to expose for a program the jail hides (capsules/exposure.py)
    seq: int | None = None  # its journal row, once journaled

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
    def usage_unavailable_briefly(self) -> dict[str, str]:
        """``usage_unavailable`` as an exec's result says it: a missing cgroup's why, the helper's
        standing refusal, only named, with where it is given once (the journal keeps it whole)."""
        said = {}
        for figure, reason in self.usage_unavailable.items():
            head = refusal_head(figure, reason)
            own = f"; {NO_REPORT}" if reason.endswith(NO_REPORT) else ""  # this exec's own, kept
            said[figure] = reason if head is None else f"{head} ({REFUSAL_GIVEN}){own}"
        return said

    @property
    def usage_sources_briefly(self) -> dict[str, str]:
        """``usage_sources`` as an exec's result says them: each mechanism, without what it
        measures (the same for every exec; the output schema's usage description says it)."""
        return {figure: mechanism(source) for figure, source in self.usage_sources.items()}

    @property
    def touched(self) -> dict[str, Any]:
        """Files read, written, listed, executed (sandbox.replies.Touched), and the connection
        attempts, as the journal keeps them (under ``network``)."""
        return {**self.reply.touched.to_args(), "network": self.attempts}

    @property
    def touched_unavailable(self) -> dict[str, str]:
        """Why a touched set is null or incomplete."""
        unavailable = dict(self.reply.touched_unavailable)
        if self.attempts is None:  # unless the reply says why (a service's, capsules/networks.py)
            unavailable.setdefault("network", NETWORK_NONE_REASON)
        return dict(sorted(unavailable.items()))

    @property
    def touched_unavailable_briefly(self) -> dict[str, str]:
        """``touched_unavailable`` as an exec's result says it: a rootless helper's standing
        reason for recording no reads only named, with where it is given once (the journal keeps it whole)."""
        return {what: NO_FANOTIFY_BRIEFLY if why == NO_FANOTIFY_ROOTLESS else why
                for what, why in self.touched_unavailable.items()}


def exec_request(capsule_id: str, argv: Sequence[str], cwd: str | None = None, timeout_ms: int | None = None,
                 stdin: bytes | None = None, env: Mapping[str, str] | None = None) -> ExecRequest:
    """The exec request a caller asks for (no ``timeout_ms``, or 0: ``ExecRequest``'s default,
    filled in there only); ``cwd`` may still be relative to the workspace and ``env`` None
    (the capsule's whitelist): ``for_capsule`` completes both."""
    request = ExecRequest(capsule_id, tuple(argv), cwd, env, stdin)
    return dataclasses.replace(request, timeout_ms=timeout_ms) if timeout_ms else request


def for_capsule(request: ExecRequest, spec: CapsuleSpec, values: Mapping[str, str] | None = None,
                progress_ms: int | None = None) -> ExecRequest:
    """``request`` as the helper gets it for a capsule made from ``spec`` (asking for progress
    reports every ``progress_ms``, if given and the request names no interval of its own).

    Its cwd is made absolute (``resolve_cwd``: a relative one is taken from the workspace;
    one outside it is refused here, before the call waits for its turn).  A request that
    names no environment gets the values of the capsule's whitelisted variables, taken
    from ``values`` (the calling ccw command's environment, lent through the state dir's
    front end; a replay's: what its replayer passed), else from what ``Caller.env`` lets
    stand in for a caller that lent nothing; never HOME, which is always the capsule's own.  The defaults under them
    (PATH with the workspace's ``.venv/bin`` first, HOME, LANG) are the helper's
    (``spec.exec_env``).
    """
    env = whitelisted(spec.env_whitelist, values) if request.env is None else request.env
    return dataclasses.replace(request, cwd=resolve_cwd(request.cwd, spec.workspace), env=env,
                               progress_ms=request.progress_ms or progress_ms)


def whitelisted(env_whitelist: Iterable[str], values: Mapping[str, str] | None = None) -> dict[str, str]:
    """The whitelisted variables that ``values`` sets, HOME aside; None: nothing was lent, and
    ``Caller.env`` (mcp_server/caller.py) says what stands in."""
    source = Caller(values).env
    return {name: source[name] for name in env_whitelist if name in source and name != "HOME"}


def env_keys(request: ExecRequest) -> list[str]:
    """The names of the variables a command was given: its request's and the helper's defaults
    (``spec.exec_env``), HOME aside unless the request set it (the journal's ``env_keys``)."""
    given = dict(request.env or {})
    return sorted(name for name in exec_env("/", given) if name != "HOME" or name in given)


def blake3_of(data: bytes) -> str:
    """The journal's content hash of ``data``."""
    return "blake3:" + blake3.blake3(data).hexdigest()


def journal_entry(request: ExecRequest, outcome: ExecOutcome, started: dt.datetime,
                  typed: bytes | None = None, console: dict[str, Any] | None = None) -> dict[str, Any]:
    """The journal's record of one exec (Journal.add_exec).

    ``typed``: what an interactive exec (capsules/console.py) was given on its stdin, all of
    it in order; it is kept as the run's stdin, so a witness carries it and a replay feeds
    it.  ``console``: how it went in (``Console.record``: on a terminal or not, and in which
    steps), kept beside it as JSON, so a replay of a terminal run types it on a terminal in
    the same steps.  Such a run is no terminal session even on a pty: its input is kept.
    """
    reply = outcome.reply
    stdin = typed if typed is not None else request.stdin
    return {
        "started_at": started.isoformat(timespec="microseconds"),
        "argv": list(request.argv),
        "cwd": request.cwd,
        "env_keys": env_keys(request),
        "stdin_blake3": blake3_of(stdin) if stdin is not None else None,
        "stdin_b64": base64.b64encode(stdin).decode() if stdin is not None else None,
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
        "terminal": int(request.stdio == "tty" and typed is None),  # a person's session: its input is not kept
        **({"service": request.service} if request.service is not None else {}),  # a service's exec
        **({"console": json.dumps(console, sort_keys=True)} if console is not None else {}),  # an interactive exec's
    }


def cut_reason(exc: BaseException) -> str:
    """Why an exec's reply never came, for its ``cut_entry``: ``CANCELLED`` when ``exc`` is
    cancellation alone (in a group too: a console's and a network's nurseries wrap it), else
    the error that lost it."""
    rest = exc.split(trio.Cancelled)[1] if isinstance(exc, BaseExceptionGroup) else exc
    return CANCELLED if rest is None or isinstance(rest, trio.Cancelled) else f"its reply was lost ({exc!r})"


def cut_entry(request: ExecRequest, started: dt.datetime, why: str) -> dict[str, Any]:
    """The journal's record of an exec whose reply never came (cancelled while it ran: capsule_run's
    cancel, or its front end's end when its client closed; the helper died): what is known of it,
    its command and start, and ``cut_short`` (in ``usage``: the execs table has no column for it)
    saying why.  Its writes are not known (``read`` null: the capsule's generation advances), and
    it records no generation: its outcome describes no contents (core/generations.py ``observes``)."""
    elapsed_ms = int((dt.datetime.now(dt.UTC) - started).total_seconds() * 1000)
    unknown = {figure: f"not measured: {why}" for figure in USAGE_FIGURES}
    reply = ExecReply(exit_code=None, signal=None, timed_out=False, oom_killed=False, duration_ms=max(0, elapsed_ms),
                      stdout=b"", stderr=b"", stdout_bytes=0, stderr_bytes=0, truncated=Truncated(False, False),
                      usage=Usage(None, None, None, None, None), usage_unavailable=unknown, usage_sources={},
                      disk=None, touched=Touched(None, (), None, None), touched_unavailable={})
    entry = journal_entry(request, ExecOutcome(reply, 0, 0, 0), started)
    return {**entry, "generation": None, "usage": {**entry["usage"], "cut_short": why}}


def timeout_hint(limit_ms: int, option: str) -> str:
    """What the caller of an exec that timed out is told: the limit it ran under and how to raise
    it (``option``: capsule_exec's ``timeout_ms``, or ``ccw capsule exec``'s ``--timeout-ms``)."""
    default = " (the default)" if limit_ms == DEFAULT_TIMEOUT_MS else ""
    return (f"timed out: killed at the {limit_ms / 1000:g} s limit{default}; give a larger {option} "
            f"(milliseconds, at most {MAX_TIMEOUT_MS}: 24 h)")


def output_chunks(report: ExecProgress) -> dict[str, dict[str, Any]]:
    """A streaming report's output as a progress notification carries it (caller.py CALLER_OUTPUT):
    per stream with bytes, ``data`` (base64: output need not be UTF-8) and ``at``, the offset of
    its first byte in the stream, so a reader finds what it already has and what was dropped
    (a report carries at most the newest 256 KiB of each stream)."""
    chunks = {}
    for name, data, total in (("stdout", report.stdout_tail, report.stdout_bytes),
                              ("stderr", report.stderr_tail, report.stderr_bytes)):
        if data:
            chunks[name] = {"at": total - len(data), "data": base64.b64encode(data).decode()}
    return chunks


def progress_message(report: ExecProgress) -> str:
    """A progress line: elapsed time, byte counts, and the latest output lines."""
    out = report.stdout_tail.decode("utf-8", "replace")
    err = report.stderr_tail.decode("utf-8", "replace")
    tail = "\n".join((out + err).splitlines()[-PROGRESS_LINES:])
    head = (f"running {report.elapsed_ms // 1000} s; stdout {report.stdout_bytes} B, "
            f"stderr {report.stderr_bytes} B")
    return f"{head}\n{tail}" if tail else head


async def settle(helper: HelperClient, capsule_id: str) -> None:
    """Wait (bounded) until the helper has ended an exec whose reply we gave up on.

    The helper notices a caller that went away when its next progress report fails to
    send (every PROGRESS_MS), then kills the jail; until then the capsule is busy there,
    and the next queued exec would be refused with CONFLICT.
    """
    with trio.move_on_after(SETTLE_S):
        while True:
            try:
                listed = (await helper.call(ListRequest())).capsules
            except CcwError:
                return  # the helper is gone: nothing runs there any more
            if not any(c.capsule_id == capsule_id and c.state == "busy" for c in listed):
                return
            await trio.sleep(SETTLE_POLL_S)
