"""capsule_race: one command in several capsules at once, ranked (issue 39).

Several attempts at one task (forks made by ``capsule_fork`` with ``count``, one per
agent or per try) are judged the same way: the same command runs in each, as
capsule_exec runs it (journaled, in the capsule's turn), then each capsule's change is
measured (its diff against its base, what promotion would carry: capsules/carried.py,
so a ``.pyc`` the command wrote does not count) and judged by promotion's dry run
(capsules/promote.py, the policy named), which writes nothing.

- **Where.**  Locally, at most ``os.cpu_count()`` commands at once, each in its capsule
  (journaled, its writes kept there).  With a cluster configured (``CCW_REAPI_URL``, as
  for deltamin's trials) each capsule's tree, its base with its whole change over it, is
  run as an Action instead, up to the cluster's parallelism: nothing runs in the capsule
  then (capsules/race_remote.py says what differs).  Each row says ``where`` it ran.
- **Progress.**  Each capsule's exec would report its own elapsed time, and reports of
  several at once would not grow as MCP asks; so the execs run quiet (``_Quiet``) and
  the race reports one line per capsule that ends.
- **A capsule that cannot run** (destroyed meanwhile, a parent frozen by its forks) is a
  row with its ``error``, ranked last: one bad capsule does not lose the others' results.
  One whose command ran but whose change cannot be read as promotion would (root's git
  refusing another uid's checkout) keeps its run's figures, without ``diff``, ``refused``.
- **The order** is ``ORDER``: the command passed (exit 0, in time), then the policy
  passed, then the smallest change (lines, then files), then the fastest; ties by id.
- **Kept.**  Each race is recorded in the state dir as it goes (capsules/races.py: its
  rows as they end, then its table), so ``ccw ui`` shows it live, after its run is
  forgotten and after the front end restarts.  The table says its ``race_id`` (the run's
  id when the call outlived ``wait_ms``), the name ``ccw ui`` shows it by.
"""

from __future__ import annotations

import os
import secrets
import time
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import trio

from mcp_server.capsules import race_remote, races
from mcp_server.capsules.asker import Asker
from mcp_server.capsules.carried import carried
from mcp_server.capsules.exec import exec_request
from mcp_server.capsules.policy import PolicyStore
from mcp_server.capsules.promote import Request, promote
from mcp_server.capsules.service import CapsuleService
from mcp_server.capsules.turns import TakesTurn, Ticket
from mcp_server.core import unidiff
from sandbox.errors import CcwError
from sandbox.replies import ExecProgress

MAX_RACERS = 32  # capsules in one race: each row is a diff and a dry-run promotion
ORDER = "passed first (exit 0, in time), then policy passed, then fewest changed lines, then files, then fastest"


@dataclass(frozen=True)
class Question:
    """What capsule_race is asked."""

    capsule_ids: tuple[str, ...]
    argv: tuple[str, ...]
    timeout_ms: int | None = None
    policy: str = "baseline"


class _Quiet:
    """Call hooks for the racing execs: the capsule's turn as the race's call takes it, no progress."""

    def __init__(self, service: CapsuleService) -> None:
        self._service = service

    async def progress(self, progress: float, total: float | None = None, message: str | None = None,
                       output: ExecProgress | None = None) -> None:
        return None

    def capsule_turn(self, capsule_id: str, label: str) -> AbstractAsyncContextManager[Ticket]:
        return self._service.turn(capsule_id, TakesTurn(label))

    def asker(self) -> Asker | None:
        return None  # the racing execs ask the race's client nothing about their misses


def check(question: Question) -> None:
    """Refuse a race that cannot be run whole: too many capsules, or one named twice."""
    ids = question.capsule_ids
    if len(ids) > MAX_RACERS:
        raise CcwError("TOO_LARGE", f"{len(ids)} capsules in one race; at most {MAX_RACERS}: race them in groups "
                       "and compare the tables", {"count": len(ids), "max": MAX_RACERS})
    twice = sorted({one for one in ids if ids.count(one) > 1})
    if twice:
        raise CcwError("INVALID_ARGUMENT", f"capsule(s) {', '.join(twice)} named twice: a capsule runs one command "
                       "at a time; fork it (capsule_fork count) to race copies", {"capsule_ids": twice})


def rank_key(row: dict[str, Any]) -> tuple[Any, ...]:
    """Where a row stands in ``ORDER`` (smaller first)."""
    ran = "error" not in row
    passed = ran and row["exit_code"] == 0 and not row["timed_out"]
    diff = row.get("diff") or {}
    return (not ran, not passed, row.get("verdict") != "passed", diff.get("lines", 0), diff.get("files", 0),
            row.get("duration_ms") or 0, row["capsule_id"])


def ranked(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows in ``ORDER``, each with its 1-based ``rank``."""
    return [{"rank": place, **row} for place, row in enumerate(sorted(rows, key=rank_key), 1)]


def diff_size(file_changes: list[unidiff.FileChange]) -> dict[str, int]:
    """A change's size: files, and text lines added plus removed (a binary file counts as a file only)."""
    lines = 0
    for change in file_changes:
        added, removed = unidiff.numstat(change)
        lines += (added or 0) + (removed or 0)
    return {"files": len(file_changes), "lines": lines}


async def _verdict(service: CapsuleService, capsule_id: str, policy: str) -> dict[str, Any]:
    """Promotion's dry run of the capsule under ``policy``: passed, failed (and why) or refused."""
    try:
        report = (await promote(service, Request(capsule_id, [policy], dry_run=True)))["policy_report"]
    except CcwError as exc:  # REPO_CHANGED, an unknown policy: said in the row
        return {"verdict": "refused", "verdict_details": f"{exc.code}: {exc.message}"}
    return {"verdict": "passed" if report["passed"] else "failed", "verdict_details": report["details"]}


async def _one(service: CapsuleService, quiet: CapsuleService, question: Question, capsule_id: str,
               limiter: trio.CapacityLimiter, values: Any, runner: race_remote.Runner | None) -> dict[str, Any]:
    row: dict[str, Any] = {"capsule_id": capsule_id, "where": "local"}
    try:
        remote = None
        if runner is not None:
            remote = await race_remote.trial(service, capsule_id, question.argv, question.timeout_ms)
            try:
                runner.check_trials(service, remote.record, ())
                row["where"] = runner.name
            except CcwError as exc:  # what a bot cannot run (an allowlist network) races here
                if exc.code != "UNSUPPORTED":
                    raise
                remote = None
        async with limiter:
            if runner is not None and remote is not None:
                row.update(await race_remote.run(service, runner, remote))
            else:
                ran = await quiet.exec(exec_request(capsule_id, question.argv, None, question.timeout_ms), values)
                row.update(exit_code=ran.reply.exit_code, timed_out=bool(ran.reply.timed_out),
                           duration_ms=ran.reply.duration_ms, usage=ran.usage)
    except CcwError as exc:
        return {**row, "error": {"code": exc.code, "message": exc.message}}
    try:
        row["diff"] = diff_size((await carried(service, capsule_id)).diff.file_changes)
    except CcwError as exc:  # the command ran and its outcome stands; what promotion would carry is unknown
        return {**row, "verdict": "refused", "verdict_details": f"{exc.code}: {exc.message}"}
    return {**row, **await _verdict(service, capsule_id, question.policy)}


async def race(service: CapsuleService, question: Question, values: Any = None, race_id: str | None = None,
               owner: str | None = None, runner: race_remote.Runner | None = None) -> dict[str, Any]:
    """Run the question's command in each capsule (``values``: the whitelisted variables' values,
    as capsule_exec takes them), or over its tree through ``runner`` (a cluster's executor),
    measure and judge each; the ranked table.  The race is kept (capsules/races.py) as
    ``race_id`` (its run's id; None: a new one), ``owner``'s."""
    check(question)
    PolicyStore(service.state).get(question.policy)  # an unknown policy fails the call before anything runs
    for capsule_id in question.capsule_ids:  # and so does an unknown capsule
        service.live_record(capsule_id)
    race_id = race_id or f"race_{secrets.token_hex(6)}"
    races.begin(service.state, race_id, owner, {"capsule_ids": list(question.capsule_ids),
                                                "cmd": list(question.argv), "policy": question.policy,
                                                "timeout_ms": question.timeout_ms})
    try:
        result = await _race(service, question, values, race_id, runner)
    except BaseException as exc:
        races.end(service.state, race_id, None, _failure(exc))
        raise
    races.end(service.state, race_id, result)
    return result


def _failure(exc: BaseException) -> dict[str, str] | None:
    """What ended a race without a table, as its record says it: None when it was cancelled
    (capsule_run's cancel, the server's end), else the error's code and message."""
    while isinstance(exc, BaseExceptionGroup):
        _, rest = exc.split(trio.Cancelled)
        if rest is None:
            return None
        exc = rest.exceptions[0]
    if isinstance(exc, trio.Cancelled | KeyboardInterrupt):
        return None
    if isinstance(exc, CcwError):
        return {"code": exc.code, "message": exc.message}
    return {"code": "INTERNAL", "message": repr(exc)}


async def _race(service: CapsuleService, question: Question, values: Any, race_id: str,
                runner: race_remote.Runner | None) -> dict[str, Any]:
    total = len(question.capsule_ids)
    parallel = max(1, min((runner.parallelism if runner else os.cpu_count()) or 1, total))
    limiter = trio.CapacityLimiter(parallel)
    quiet = CapsuleService(service.state, service.helper, _Quiet(service), service.networks, service.services)
    rows: list[dict[str, Any]] = []
    started = time.monotonic()

    async def one(capsule_id: str) -> None:
        row = await _one(service, quiet, question, capsule_id, limiter, values, runner)
        rows.append(row)
        races.progress(service.state, race_id, ranked(rows), total)
        outcome = row["error"]["code"] if "error" in row else f"exit {row['exit_code']}, {row['verdict']}"
        await service.progress(float(len(rows)), float(total), f"{len(rows)}/{total} ended: {capsule_id} ({outcome})")

    async with trio.open_nursery() as nursery:
        for capsule_id in question.capsule_ids:
            nursery.start_soon(one, capsule_id)
    return {"race_id": race_id, "order": ORDER, "policy": question.policy, "parallel": parallel,
            "executor": runner.name if runner else "local",
            "elapsed_ms": int((time.monotonic() - started) * 1000), "rows": ranked(rows)}
