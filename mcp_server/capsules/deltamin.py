"""Deltamin: the smallest part of a capsule's change that still fails (seed 003 §8).

It asks "what if only part of this change had been made?" and answers by running the
target command in fresh capsules over the capsule's base with a subset of the change
applied (through the capsule's root descriptor, as any file tool writes).

Units of change: first whole paths, then the hunks of the text files that remain (see
trials.py, which also runs each trial).

Evidence (what the journal shows the failing command read) orders the units: those it
read, and every file it could not have read because the change created or deleted it,
come first and are tried alone before the search proper (core/deltamin.py: group testing,
ddmin as its fallback).  The search's last question (does the result fail?) is answered by
the final check (deltamin_check.py), which runs the result anyway.

Flakiness: before searching, the full change set must fail and the empty set pass, and
every observation must agree; otherwise the tool says so instead of minimising noise.
The observations are the capsule's own journaled execs of the target command (execs on its
current contents for the full change; execs that started on generation 0, the base as the
capsule first saw it, for the empty one) plus ``confirm_runs`` fresh scratch execs of each.  When
``confirm_runs`` is not given and the journal holds both kinds (the usual loop: the tests
passed, edits, the tests failed), no fresh confirmation runs: the journal already
observed both ends.

Stack-trace localisation: the failing runs' output (kept in the journal) often names the
line that raised (``File "x.py", line 189``, ``x.py:189:``, ``at f (x.js:12:5)``).  At the
hunk level, the hunks at or just above a named line (``TRACE_WINDOW``) are tried alone
first, as the evidence of reads orders files: a guess that costs one trial when wrong.  The minimal set is
re-run in a journaled capsule at the end: ``replay_ok`` says it failed again, and the
witness of that run gives ``root_hash``.

Services: when the newest journaled exec of the target command ran beside services
(capsules/services.py), every trial starts them in its scratch capsule, ready before the
command (trials.py, executors.py), and so does the final check (deltamin_check.py); an
executor that cannot start them (a REAPI cluster's) is refused before any trial runs.
The newest run is the one the caller saw fail; an older run beside other services
described other conditions.  A command never run in the capsule goes beside the
services running in it now (service_beside.py).

Which journaled execs count (for the flakiness check and as evidence of what was read):
only observations of the change being minimised, the capsule's contents at its current
change generation (mcp_server/core/generations.py).  A run counts when it started on the current
generation, or when its own writes produced the current generation from the one it
started on: then nothing but its own outputs (``.pytest_cache``, ``__pycache__``, build
products) differs from what it ran on.  So in the usual loop (tests pass and write
caches, an edit, tests fail and write caches, deltamin) the failing run counts and the
passing run before the edit does not; a command that gives different outcomes on the
same generation is still called flaky.  The capsule's change, and the generation it is
judged against, are read in the capsule's turn (after execs queued before this call),
so they describe the same contents.

A workspace edited under a path the capsule changed (the base is the live tree) makes the
minimal patch revert that edit, as the capsule's diff would: a note in the answer
says so, judged as capsule_diff judges it (capsules/carried.py).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from mcp_server.capsules.carried import ignored_paths, moved_notes, named
from mcp_server.capsules.deltamin_check import FinalCheck, verify
from mcp_server.capsules.executors import Executor, LocalExecutor
from mcp_server.capsules.promote import _conflicts, _scoped
from mcp_server.capsules.service import CapsuleService
from mcp_server.capsules.service_beside import runs_of, services_beside
from mcp_server.capsules.trials import (
    JournaledRun,
    Material,
    Trials,
    Unit,
    file_contents,
    predicate,
    split_hunks,
    units_from,
)
from mcp_server.capsules.turns import TakesTurn
from mcp_server.core import unidiff
from mcp_server.core.deltamin import FAIL, PASS, Search, decisive
from mcp_server.core.generations import observes
from mcp_server.fs import changeset
from mcp_server.fs.gitignore import Scope
from mcp_server.fs.view import RootView
from mcp_server.journal import Journal
from mcp_server.journal_records import CapsuleRecord
from sandbox.errors import CcwError

READ_CHANGE = TakesTurn("deltamin (reading the change)")  # the turn it takes (capsules/turns.py)
TRACE_WINDOW = 3  # a line named in a traceback usually sits at or a few lines below the changed condition
# "path", line N (Python); path:N (pytest, compilers, node's "at f (path:N:C)").
_TRACE = re.compile(r'File "([^"\n]+)", line (\d+)|([\w./+-]*\w\.\w+):(\d+)')


def _current_runs(journal: Journal, record: CapsuleRecord, argv: list[str], generation: int) -> list[dict[str, Any]]:
    """The capsule's journaled execs of ``argv`` that observed its contents at ``generation``."""
    return [ex for ex in runs_of(journal, record, argv) if observes(ex, generation)]


def _evidence(journal: Journal, record: CapsuleRecord, argv: list[str], generation: int) -> set[str] | None:
    """Paths the target command read in the capsule's own runs of its current contents, or None if unknown."""
    reads: set[str] = set()
    seen = False
    for ex in _current_runs(journal, record, argv, generation):
        if ex["touched"]["read"] is None:
            return None
        seen = True
        reads.update(ex["touched"]["read"])
    return reads if seen else None


def _journal_outcomes(journal: Journal, record: CapsuleRecord, argv: list[str], spec: Any,
                      generation: int) -> list[str]:
    """Outcomes of the capsule's own runs of target_cmd on its current contents, where the
    journal can tell them.

    They are observations of the full change set too: one that disagrees with the
    confirmation run exposes a flaky command at no cost.  Runs of earlier contents are
    not (see the module docstring).  Only exit-status predicates can be judged from the
    journal (it keeps output hashes, not output).
    """
    if isinstance(spec, dict) and "exit_code" not in spec:
        return []
    judge = predicate(spec)
    return [
        judge(JournaledRun(ex["exit_code"], bool(ex["timed_out"])))
        for ex in _current_runs(journal, record, argv, generation)
    ]


def _journal_outcomes_at_start(journal: Journal, record: CapsuleRecord, argv: list[str], spec: Any) -> list[str]:
    """Outcomes of the capsule's runs of target_cmd that started on generation 0 (its base).

    A fork's generation 0 is its parent's change, not the base: none count for it.
    """
    if record.parent is not None or (isinstance(spec, dict) and "exit_code" not in spec):
        return []
    judge = predicate(spec)
    return [
        judge(JournaledRun(ex["exit_code"], bool(ex["timed_out"])))
        for ex in runs_of(journal, record, argv)
        if ex.get("generation") == 0
    ]


def traced_lines(output: str, workspace: str, cwd: str) -> dict[str, set[int]]:
    """Workspace-relative paths and line numbers that ``output`` names (tracebacks, errors)."""
    lines: dict[str, set[int]] = {}
    for match in _TRACE.finditer(output):
        path, number = (match.group(1), match.group(2)) if match.group(1) else (match.group(3), match.group(4))
        full = os.path.normpath(os.path.join(cwd, path))
        if full.startswith(workspace.rstrip("/") + "/"):
            lines.setdefault(full[len(workspace.rstrip("/")) + 1:], set()).add(int(number))
    return lines


def _traced(journal: Journal, record: CapsuleRecord, argv: list[str], generation: int) -> dict[str, set[int]]:
    """What the capsule's failing runs of its current contents named in their output."""
    kept = journal.outputs(record.capsule_id)
    traced: dict[str, set[int]] = {}
    for ex in _current_runs(journal, record, argv, generation):
        if ex["exit_code"] == 0 and not ex["timed_out"]:
            continue
        for stream in ("stdout", "stderr"):
            data = kept.get((ex["seq"], stream))
            if data is None:
                continue
            for path, numbers in traced_lines(data[0].decode("utf-8", "replace"), record.workspace, ex["cwd"]).items():
                traced.setdefault(path, set()).update(numbers)
    return traced


def _suspects(material: Material, traced: dict[str, set[int]]) -> frozenset[int] | None:
    """Hunks at or just above a line the failing output named (1-based new-side lines)."""
    found = frozenset(
        i for i, u in enumerate(material.units)
        if u.action == "hunk" and u.hunk is not None and u.path in traced
        and any(u.hunk[2] <= line <= u.hunk[3] + TRACE_WINDOW for line in traced[u.path])
    )
    return found or None


def _relevant(material: Material, reads: set[str] | None, created: set[str]) -> frozenset[int] | None:
    if reads is None:
        return None
    return frozenset(
        i for i, u in enumerate(material.units) if u.path in reads or u.path in created or u.action == "delete"
    )


Finish = Callable[[tuple[int, ...]], Awaitable[str | None]]


async def _search(search: Search, trials: Trials, finish: Finish | None = None) -> Search:
    """Run ``search`` to its end; its last question, when a lone decisive one, goes to ``finish``.

    The search's last trial asks whether its result fails: exactly what deltamin's final
    check runs (journaled, witnessed).  ``finish`` answers it with that run (or None: run
    it as a trial after all), so the result is not run twice.
    """
    while batch := search.next_batch():
        outcome = None
        if finish is not None and len(batch) == 1 and decisive(search, batch[0]):
            outcome = await finish(batch[0])
        search.report([outcome] if outcome is not None else await trials.batch(batch))
    return search


@dataclass
class Found:
    """A search's answer: the units it kept, out of which material, and what it cost."""

    material: Material
    result: tuple[int, ...]
    trials: int = 0
    cache_hits: int = 0
    one_minimal: bool = True


async def _traced_first(trials: Trials, record: CapsuleRecord, traced: dict[str, set[int]],
                        remaining: Callable[[], float], check: FinalCheck) -> Found | None:
    """The hunks the failing output points at, tried alone before any search (None: no such
    hunk, or they do not fail by themselves).

    When the guess fails, only those hunks are searched, at once at the hunk level; the
    empty change is known to pass, so a single failing hunk is 1-minimal.
    """
    if not traced:
        return None
    base_view = await trio.to_thread.run_sync(RootView.open, record.base)
    with base_view:
        hunks = await trio.to_thread.run_sync(split_hunks, trials.material, range(len(trials.material.units)),
                                              base_view)
    suspects = _suspects(hunks, traced)
    if suspects is None or len(suspects) == len(hunks.units):
        return None
    whole, trials.material = trials.material, hunks
    guess = tuple(sorted(suspects))
    [outcome] = await trials.batch([guess])
    if outcome != FAIL:
        trials.material = whole
        return None
    narrowed = await _search(Search(guess, trials.executor.parallelism, budget_s=remaining()), trials,
                             lambda subset: check.run(hunks, subset))
    return Found(hunks, narrowed.result, 1 + narrowed.trials, narrowed.cache_hits, narrowed.one_minimal)


async def _hierarchical(trials: Trials, record: CapsuleRecord, relevant: frozenset[int] | None,
                        traced: dict[str, set[int]], remaining: Callable[[], float], check: FinalCheck) -> Found:
    """A search over whole paths (read ones first), then over the hunks of the files that remain."""
    material = trials.material

    async def last_of_level1(subset: tuple[int, ...]) -> str | None:
        # The paths' search is the last one only when its result has no files to split.
        def splits() -> bool:
            with RootView.open(record.base) as base:
                return len(split_hunks(material, subset, base).units) > len(subset)

        return None if await trio.to_thread.run_sync(splits) else await check.run(material, subset)

    level1 = await _search(Search(tuple(range(len(material.units))), trials.executor.parallelism, relevant,
                                  budget_s=remaining()), trials, last_of_level1)
    found = Found(material, level1.result, level1.trials, level1.cache_hits, level1.one_minimal)
    base_view = await trio.to_thread.run_sync(RootView.open, record.base)
    with base_view:
        split = await trio.to_thread.run_sync(split_hunks, material, level1.result, base_view)
    if len(split.units) > len(level1.result) and remaining() > 0:
        trials.material = split
        level2 = await _search(Search(tuple(range(len(split.units))), trials.executor.parallelism,
                                      _suspects(split, traced), budget_s=remaining()),
                               trials, lambda subset: check.run(split, subset))
        found = Found(split, level2.result, found.trials + level2.trials, found.cache_hits + level2.cache_hits,
                      found.one_minimal and level2.one_minimal)
    return found


@dataclass(frozen=True)
class Question:
    """What deltamin is asked: which capsule, which command, what counts as failing."""

    capsule_id: str
    target_cmd: list[str]
    failure_predicate: Any = "exit_code"  # see trials.predicate
    budget_ms: int = 600_000
    confirm_runs: int | None = None  # fresh runs of each end (None: those the journal has not seen)


@dataclass
class _Change:
    """The capsule's change, read in its turn: its units, its created paths, its generation."""

    record: CapsuleRecord
    material: Material
    created: set[str]
    generation: int
    moved: list[str]  # changed paths the workspace changed since the capsule did (capsules/carried.py)
    left: list[str]  # the notes on what was left out as promotion leaves it (ignored, made caches)


async def deltamin(service: CapsuleService, question: Question, executor: Executor | None = None) -> dict[str, Any]:
    """The smallest part of the capsule's change that still makes target_cmd fail.

    Trials run through ``executor`` (default: local capsules); the final check of the
    minimal change runs locally, in a journaled capsule, for its witness.
    """
    started = time.monotonic()
    service.live_record(question.capsule_id)
    argv = list(question.target_cmd)
    judge = predicate(question.failure_predicate)
    budget_s = question.budget_ms / 1000
    change = await _read_change(service, question.capsule_id)
    record, material = change.record, change.material
    executor = executor or LocalExecutor()
    services = services_beside(service, record, argv)
    executor.check_trials(service, record, services)
    trials = Trials(service, record, material, argv, judge, int(min(budget_s * 1000, 600_000)), executor, services)
    confirmations = await _confirm(service.journal, trials, change, question)
    remaining = lambda: budget_s - (time.monotonic() - started)  # noqa: E731
    journal = service.journal
    traced = await trio.to_thread.run_sync(_traced, journal, record, argv, change.generation)
    check = FinalCheck(service, record, trials)
    found = await _traced_first(trials, record, traced, remaining, check)
    if found is None:
        reads = _evidence(journal, record, argv, change.generation)
        found = await _hierarchical(trials, record, _relevant(material, reads, change.created), traced, remaining,
                                    check)
    files = file_contents(found.material, found.result)
    verified = check.answer(found.material, found.result) or await verify(service, record, files, argv, judge,
                                                                          trials.timeout_ms, trials.services)
    patch = await trio.to_thread.run_sync(_patch, record, files)
    notes = change.left + moved_notes(change.moved)  # the patch's base is the moved workspace: it may revert an edit
    return {
        **({"notes": notes} if notes else {}),
        "minimal_patch": patch,
        "replay_ok": verified["fails_again"],
        "root_hash": verified["root_hash"],
        "units": sorted({u.path for u in files.values()}),
        "trials": confirmations + found.trials,
        "cache_hits": found.cache_hits + executor.cache_hits,
        "executor": executor.summary(),
        "elapsed_ms": int((time.monotonic() - started) * 1000),
        "one_minimal": found.one_minimal,
    }


async def _read_change(service: CapsuleService, capsule_id: str) -> _Change:
    """The capsule's change and the generation it is judged against, read in the capsule's turn."""
    await service.helper()
    async with service.turn(capsule_id, READ_CHANGE):
        record = service.live_record(capsule_id)
        generation = service.journal.generation(record.capsule_id)
        changes = await service.changes(record.capsule_id)
        root_fd = await service.open_root(record.capsule_id)

        def read_material() -> tuple[Material, set[str], list[str], list[str]]:
            with RootView.from_fd(root_fd) as capsule, RootView.open(record.base) as base:
                everything = changeset.expand(changes, base, capsule)
                # What the runs left that promotion leaves behind (a database's data dir, caches) is no
                # cause to look for: a trial given part of a data dir starts a server on a broken one.
                try:
                    entries, skipped, _ = _scoped(everything, record.workspace, Scope(), capsule)
                    unscoped = []
                except CcwError as exc:  # git refuses the checkout (another uid's): minimise every path
                    if exc.code != "PERMISSION_DENIED":
                        raise
                    entries, skipped = everything, []
                    unscoped = [f"nothing left out as promotion would (git-ignored paths, caches): {exc.message}"]
                material = units_from(entries, base, capsule)
            moved = [one["path"] for one in _conflicts(service.journal, record, entries, {})]
            top, files = ignored_paths(everything, [one["path"] for one in skipped])
            left = unscoped + ([f"left out: {files} files in {named(top)} (git-ignored, or a cache the capsule made, "
                                "which promotion leaves behind); the trials run without them"] if top else [])
            return material, {e.path for e in entries if e.old is None}, moved, left

        material, created, moved, left = await trio.to_thread.run_sync(read_material)
    if not material.units:
        carried = f" promotion would carry ({left[0]})" if left else ""
        raise CcwError("INVALID_ARGUMENT", f"the capsule has no changes{carried}, so there is nothing to minimise")
    return _Change(record, material, created, generation, moved, left)


async def _confirm(journal: Journal, trials: Trials, change: _Change, question: Question) -> int:
    """Check that the full change fails and the empty one passes, every time; the fresh runs it took.

    The journal's runs of each end count as observations; fresh runs add to them (as many
    as asked, else one of each end the journal has not seen).
    """
    record, argv, spec, generation = change.record, trials.argv, question.failure_predicate, change.generation
    everything = tuple(range(len(change.material.units)))
    journaled = _journal_outcomes(journal, record, argv, spec, generation)
    at_start = _journal_outcomes_at_start(journal, record, argv, spec) if generation > 0 else []
    asked = question.confirm_runs
    fresh = [everything] * (asked or (0 if journaled else 1)) + [()] * (asked or (0 if at_start else 1))
    confirm = await trials.batch(fresh, fresh=True) if fresh else []
    full = [o for o, subset in zip(confirm, fresh, strict=True) if subset] + journaled
    empty = [o for o, subset in zip(confirm, fresh, strict=True) if not subset] + at_start
    if len(set(full)) > 1 or len(set(empty)) > 1:
        raise CcwError(
            "CONFLICT",
            f"target_cmd is flaky: the same change set gave different outcomes over {len(fresh)} fresh runs "
            f"and {len(journaled) + len(at_start)} journaled execs "
            f"(full change, generation {generation}: {', '.join(full)}; no change: {', '.join(empty)}); "
            "make it deterministic (seed randomness, fix the clock) before minimising",
            {"full": full, "empty": empty, "generation": generation, "journaled": len(journaled)},
        )
    if full[0] != FAIL:
        raise CcwError("INVALID_ARGUMENT", f"the full change set does not fail ({full[0]}): nothing to minimise",
                       {"full": full})
    if empty[0] != PASS:
        raise CcwError("INVALID_ARGUMENT", f"the base without any change already fails ({empty[0]}): "
                       "the change is not the cause", {"empty": empty})
    return len(fresh)


def _patch(record: CapsuleRecord, files: dict[str, Unit]) -> str:
    changes = []
    with RootView.open(record.base) as base:
        for path, unit in sorted(files.items()):
            old_side = changeset.lstat(base, path)
            old = base.read_bytes(path) if old_side and old_side.kind == "file" else (
                (old_side.target or "").encode() if old_side and old_side.kind == "symlink" else None)
            old_mode = None if old_side is None else (
                0o120000 if old_side.kind == "symlink" else (0o100755 if old_side.mode & 0o111 else 0o100644))
            if unit.action == "delete":
                new, new_mode = None, None
            elif unit.action == "symlink":
                new, new_mode = (unit.target or "").encode(), 0o120000
            elif unit.action == "chmod":
                new, new_mode = old, (0o100755 if (unit.mode or 0) & 0o111 else 0o100644)
            else:
                new, new_mode = unit.content, (0o100755 if (unit.mode or 0o644) & 0o111 else 0o100644)
            changes.append(unidiff.FileChange(path, old, new, old_mode, new_mode))
    return unidiff.render_all(changes).decode("utf-8", "replace")
