"""capsule_deltamin: the smallest part of a change that still fails (seed 003 §8).

It asks "what if only part of this change had been made?" and answers by running the
target command in fresh capsules over the capsule's base with a subset of the change
applied (through the capsule's root descriptor, as any file tool writes).

Units of change (deltamin): first whole paths (added, modified, deleted files, symlinks,
mode changes); then, within the text files that remain, their hunks (HDD).  A hunk is one
non-equal run of lines between the base and the capsule (difflib opcodes), so any
subset of a file's hunks applies cleanly to the base.

Evidence (what the journal shows the failing command read) orders the units: those it
read, and every file it could not have read because the change created or deleted it,
come first and are tried alone before ddmin proper (core/deltamin.py).

Flakiness: before searching, the full change set must fail and the empty set pass, and
every observation must agree; otherwise the tool says so instead of minimising noise.
The observations are the capsule's own journaled runs of the target command (runs of its
current contents for the full change; runs that started on generation 0, the base as the
capsule first saw it, for the empty one) plus ``confirm_runs`` fresh runs of each.  When
``confirm_runs`` is not given and the journal holds both kinds (the usual loop: the tests
passed, edits, the tests failed), no fresh confirmation runs: the journal already
observed both ends.

Stack-trace localisation: the failing runs' output (kept in the journal) often names the
line that raised (``File "x.py", line 189``, ``x.py:189:``, ``at f (x.js:12:5)``).  At the
hunk level, the hunks at or just above a named line (``TRACE_WINDOW``) are tried alone
first, as the evidence of reads orders files: a guess that costs one trial when wrong.  The minimal set is
re-run in a journaled capsule at the end: ``replay_ok`` says it failed again, and the
witness of that run gives ``root_hash``.

Which journaled runs count (for the flakiness check and as evidence of what was read):
only observations of the change being minimised, the capsule's contents at its current
change generation (mcp_server/journal.py).  A run counts when it started on the current
generation, or when its own writes produced the current generation from the one it
started on: then nothing but its own outputs (``.pytest_cache``, ``__pycache__``, build
products) differs from what it ran on.  So in the usual loop (tests pass and write
caches, an edit, tests fail and write caches, deltamin) the failing run counts and the
passing run before the edit does not; a command that gives different outcomes on the
same generation is still called flaky.  The capsule's change, and the generation it is
judged against, are read in the capsule's turn (after execs queued before this call),
so they describe the same contents.
"""

from __future__ import annotations

import base64
import difflib
import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import trio

from mcp_server.capsule_queue import turn_label
from mcp_server.core import unidiff
from mcp_server.core.deltamin import FAIL, PASS, UNRESOLVED, Search
from mcp_server.fs import changeset
from mcp_server.fs.promote import make_symlink, remove_tree
from mcp_server.fs.view import RootView
from mcp_server.journal import CapsuleRecord, Journal, observes
from mcp_server.tools.capsule import (
    CAPSULE_ID,
    capsule_create,
    capsule_destroy,
    capsule_exec,
    exec_env,
    live_record,
)
from mcp_server.tools.registry import ToolContext, ToolSpec
from mcp_server.tools.witness import make_witness
from sandbox.errors import CcwError

PARALLEL = 2  # trials at once: this is a 2-core machine
TRACE_WINDOW = 3  # a line named in a traceback usually sits at or a few lines below the changed condition
# "path", line N (Python); path:N (pytest, compilers, node's "at f (path:N:C)").
_TRACE = re.compile(r'File "([^"\n]+)", line (\d+)|([\w./+-]*\w\.\w+):(\d+)')


@dataclass(frozen=True)
class Unit:
    """One piece of the change: a whole path, or one hunk of a text file."""

    path: str
    action: str  # write | delete | symlink | chmod | hunk
    mode: int | None = None
    target: str | None = None
    content: bytes | None = None
    hunk: tuple[int, int, int, int] | None = None  # base lines [i1, i2) -> capsule lines [j1, j2)


@dataclass
class Material:
    """Everything a trial needs, read once from the capsule and its base."""

    units: list[Unit]
    old: dict[str, bytes]  # base bytes of files that get hunk units
    new_lines: dict[str, list[bytes]]  # capsule lines of those files
    modes: dict[str, int]


def units_from(entries: list[changeset.Entry], base: RootView, capsule: RootView) -> Material:
    units = []
    modes: dict[str, int] = {}
    for entry in entries:
        new = entry.new
        if new is None:
            units.append(Unit(entry.path, "delete"))
        elif new.kind == "dir":
            continue  # created on demand by the files below it
        elif new.kind == "symlink":
            units.append(Unit(entry.path, "symlink", target=new.target))
        elif new.kind == "file":
            if entry.old is not None and entry.old.kind == "file" and not entry.modified:
                units.append(Unit(entry.path, "chmod", mode=new.mode))
            else:
                units.append(Unit(entry.path, "write", mode=new.mode, content=capsule.read_bytes(entry.path)))
            modes[entry.path] = new.mode
    return Material(units, {}, {}, modes)


def _split_hunks(material: Material, keep: Iterable[int], base: RootView) -> Material:
    """Level two: the kept units, with each multi-hunk text file split into its hunks."""
    units: list[Unit] = []
    old: dict[str, bytes] = {}
    new_lines: dict[str, list[bytes]] = {}
    for index in keep:
        unit = material.units[index]
        if unit.action != "write" or unit.content is None:
            units.append(unit)
            continue
        try:
            before = base.read_bytes(unit.path)
        except CcwError:
            units.append(unit)
            continue
        if unidiff.is_binary(before) or unidiff.is_binary(unit.content):
            units.append(unit)
            continue
        a = before.splitlines(keepends=True)
        b = unit.content.splitlines(keepends=True)
        ops = [op for op in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes() if op[0] != "equal"]
        if len(ops) < 2:
            units.append(unit)
            continue
        old[unit.path] = before
        new_lines[unit.path] = b
        units.extend(Unit(unit.path, "hunk", mode=unit.mode, hunk=(i1, i2, j1, j2)) for _, i1, i2, j1, j2 in ops)
    return Material(units, old, new_lines, material.modes)


def _file_contents(material: Material, subset: Iterable[int]) -> dict[str, Unit]:
    """Whole-path units of a subset, with hunk units folded into file writes."""
    hunks: dict[str, list[tuple[int, int, int, int]]] = {}
    out: dict[str, Unit] = {}
    for index in subset:
        unit = material.units[index]
        if unit.action == "hunk":
            assert unit.hunk is not None
            hunks.setdefault(unit.path, []).append(unit.hunk)
        else:
            out[unit.path] = unit
    for path, chosen in hunks.items():
        lines = material.old[path].splitlines(keepends=True)
        new = material.new_lines[path]
        for i1, i2, j1, j2 in sorted(chosen, reverse=True):  # from the end: indices stay valid
            lines[i1:i2] = new[j1:j2]
        out[path] = Unit(path, "write", mode=material.modes.get(path), content=b"".join(lines))
    return out


def apply_units(root_fd: int, units: dict[str, Unit], journal: Journal | None = None, capsule_id: str = "") -> None:
    """Write whole-path units into a capsule through its root descriptor."""
    with RootView.from_fd(root_fd) as view:
        for path in sorted(units, key=lambda p: (p.count("/"), p)):
            unit = units[path]
            parent = path.rpartition("/")[0]
            if unit.action in ("write", "symlink") and parent:
                view.makedirs(parent)
            if unit.action == "write":
                assert unit.content is not None
                side = changeset.lstat(view, path)
                if side is not None and side.kind == "dir":
                    remove_tree(view, path)
                view.write_bytes(path, unit.content, unit.mode)
            elif unit.action == "symlink":
                remove_tree(view, path)
                make_symlink(view, unit.target or "", path)
            elif unit.action == "delete":
                remove_tree(view, path)
            elif unit.action == "chmod" and unit.mode is not None:
                view.chmod(path, unit.mode)
            if journal is not None:
                journal.add_write(capsule_id, path, unit.action, unit.content, unit.target, unit.mode)


# --- the failure predicate ---------------------------------------------------------------


def predicate(spec: Any) -> Any:
    """A function from an exec reply to FAIL / PASS / UNRESOLVED, from the tool argument."""
    if spec in (None, "exit_code"):
        return lambda r: UNRESOLVED if r["timed_out"] else (FAIL if r["exit_code"] != 0 else PASS)
    if spec == "timeout":
        return lambda r: FAIL if r["timed_out"] else PASS
    if isinstance(spec, dict) and len(spec) == 1:
        (key, value), = spec.items()
        if key == "exit_code" and isinstance(value, int):
            return lambda r: UNRESOLVED if r["timed_out"] else (FAIL if r["exit_code"] == value else PASS)
        if key in ("stdout_regex", "stderr_regex") and isinstance(value, str):
            try:
                pattern = re.compile(value)
            except re.error as exc:
                raise CcwError("INVALID_ARGUMENT", f"failure_predicate {key}: bad regex ({exc})") from exc
            stream = key.split("_")[0]
            return lambda r: UNRESOLVED if r["timed_out"] else (
                FAIL if pattern.search(base64.b64decode(r[f"{stream}_b64"]).decode("utf-8", "replace")) else PASS
            )
    raise CcwError(
        "INVALID_ARGUMENT",
        'failure_predicate must be "exit_code", "timeout", {"exit_code": N}, {"stdout_regex": R} or {"stderr_regex": R}',
    )


class Trials:
    """Runs subsets of the change in fresh capsules over the capsule's base."""

    def __init__(self, ctx: ToolContext, record: CapsuleRecord, material: Material, argv: list[str], judge: Any, timeout_ms: int) -> None:
        self.ctx = ctx
        self.record = record
        self.material = material
        self.argv = argv
        self.judge = judge
        self.timeout_ms = timeout_ms
        self.runs = 0

    async def outcome(self, subset: Iterable[int]) -> str:
        helper = await self.ctx.helper()
        request: dict[str, Any] = {
            "workspace": self.record.workspace, "clock_offset_sec": self.record.clock_offset_sec,
            "env_whitelist": self.record.env_whitelist, "limits": self.record.limits, "network": self.record.network,
        }
        if self.record.base != self.record.workspace:
            request["base"] = self.record.base
        capsule = (await helper.request("create", request))["capsule_id"]
        try:
            root = await helper.open_root(capsule)
            await trio.to_thread.run_sync(apply_units, root, _file_contents(self.material, subset))
            reply = await helper.request("exec", {
                "capsule_id": capsule, "argv": self.argv, "cwd": self.record.workspace,
                "env": exec_env(self.record), "timeout_ms": self.timeout_ms,
            })
            self.runs += 1
            return str(self.judge(reply))
        finally:
            with trio.CancelScope(shield=True):
                await helper.request("destroy", {"capsule_id": capsule})

    async def batch(self, subsets: list[tuple[int, ...]]) -> list[str]:
        results: list[str] = [UNRESOLVED] * len(subsets)

        async def one(i: int) -> None:
            results[i] = await self.outcome(subsets[i])

        async with trio.open_nursery() as nursery:
            for i in range(len(subsets)):
                nursery.start_soon(one, i)
        return results


def _current_runs(journal: Journal, record: CapsuleRecord, argv: list[str], generation: int) -> list[dict[str, Any]]:
    """The capsule's journaled runs of ``argv`` that observed its contents at ``generation``."""
    return [ex for ex in journal.execs(record.capsule_id) if ex["argv"] == argv and observes(ex, generation)]


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


def _journal_outcomes(journal: Journal, record: CapsuleRecord, argv: list[str], spec: Any, generation: int) -> list[str]:
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
        str(judge({"exit_code": ex["exit_code"], "timed_out": ex["timed_out"]}))
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
        str(judge({"exit_code": ex["exit_code"], "timed_out": ex["timed_out"]}))
        for ex in journal.execs(record.capsule_id)
        if ex["argv"] == argv and ex.get("generation") == 0
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


async def _search(search: Search, trials: Trials) -> Search:
    while batch := search.next_batch():
        search.report(await trials.batch(batch))
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
                        remaining: Any) -> Found | None:
    """The hunks the failing output points at, tried alone before any search (None: no such
    hunk, or they do not fail by themselves).

    When the guess fails, only those hunks are searched, at once at the hunk level; the
    empty change is known to pass, so a single failing hunk is 1-minimal.
    """
    if not traced:
        return None
    base_view = await trio.to_thread.run_sync(RootView.open, record.base)
    with base_view:
        hunks = await trio.to_thread.run_sync(_split_hunks, trials.material, range(len(trials.material.units)), base_view)
    suspects = _suspects(hunks, traced)
    if suspects is None or len(suspects) == len(hunks.units):
        return None
    whole, trials.material = trials.material, hunks
    guess = tuple(sorted(suspects))
    [outcome] = await trials.batch([guess])
    if outcome != FAIL:
        trials.material = whole
        return None
    narrowed = await _search(Search(guess, PARALLEL, budget_s=remaining()), trials)
    return Found(hunks, narrowed.result, 1 + narrowed.trials, narrowed.cache_hits, narrowed.one_minimal)


async def _hierarchical(trials: Trials, record: CapsuleRecord, relevant: frozenset[int] | None,
                        traced: dict[str, set[int]], remaining: Any) -> Found:
    """ddmin over whole paths (read ones first), then over the hunks of the files that remain."""
    material = trials.material
    level1 = await _search(Search(tuple(range(len(material.units))), PARALLEL, relevant, budget_s=remaining()), trials)
    found = Found(material, level1.result, level1.trials, level1.cache_hits, level1.one_minimal)
    base_view = await trio.to_thread.run_sync(RootView.open, record.base)
    with base_view:
        split = await trio.to_thread.run_sync(_split_hunks, material, level1.result, base_view)
    if len(split.units) > len(level1.result) and remaining() > 0:
        trials.material = split
        level2 = await _search(Search(tuple(range(len(split.units))), PARALLEL, _suspects(split, traced),
                                      budget_s=remaining()), trials)
        found = Found(split, level2.result, found.trials + level2.trials, found.cache_hits + level2.cache_hits,
                      found.one_minimal and level2.one_minimal)
    return found


async def capsule_deltamin(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """The smallest part of the capsule's change that still makes target_cmd fail."""
    started = time.monotonic()
    record = live_record(ctx, args["capsule_id"])
    argv = list(args["target_cmd"])
    judge = predicate(args.get("failure_predicate", "exit_code"))
    budget_s = (args.get("budget_ms") or 600_000) / 1000
    journal = Journal(ctx.state)
    helper = await ctx.helper()
    async with ctx.capsule_turn(record.capsule_id, turn_label("capsule_deltamin", args)):
        record = live_record(ctx, record.capsule_id)
        generation = journal.generation(record.capsule_id)
        changes = (await helper.request("changes", {"capsule_id": record.capsule_id}))["changes"]
        root_fd = await helper.open_root(record.capsule_id)

        def read_material() -> tuple[Material, set[str]]:
            with RootView.from_fd(root_fd) as capsule, RootView.open(record.base) as base:
                entries = changeset.expand(changes, base, capsule)
                return units_from(entries, base, capsule), {e.path for e in entries if e.old is None}

        material, created = await trio.to_thread.run_sync(read_material)
    if not material.units:
        raise CcwError("INVALID_ARGUMENT", "the capsule has no changes, so there is nothing to minimise")
    trials = Trials(ctx, record, material, argv, judge, timeout_ms=int(min(budget_s * 1000, 600_000)))
    everything = tuple(range(len(material.units)))
    spec = args.get("failure_predicate", "exit_code")
    journaled = _journal_outcomes(journal, record, argv, spec, generation)
    at_start = _journal_outcomes_at_start(journal, record, argv, spec) if generation > 0 else []
    asked = args.get("confirm_runs")
    # Fresh runs of each end: as many as asked, else one of each end the journal has not seen.
    fresh = [everything] * (asked or (0 if journaled else 1)) + [()] * (asked or (0 if at_start else 1))
    confirm = await trials.batch(fresh) if fresh else []
    full = [o for o, subset in zip(confirm, fresh, strict=True) if subset] + journaled
    empty = [o for o, subset in zip(confirm, fresh, strict=True) if not subset] + at_start
    if len(set(full)) > 1 or len(set(empty)) > 1:
        raise CcwError(
            "CONFLICT",
            f"target_cmd is flaky: the same change set gave different outcomes over {len(fresh)} fresh runs "
            f"and {len(journaled) + len(at_start)} journaled runs "
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
    remaining = lambda: budget_s - (time.monotonic() - started)  # noqa: E731
    traced = await trio.to_thread.run_sync(_traced, journal, record, argv, generation)
    found = await _traced_first(trials, record, traced, remaining)
    if found is None:
        found = await _hierarchical(trials, record, _relevant(material, _evidence(journal, record, argv, generation),
                                                              created), traced, remaining)
    chosen, final = found.material, found.result
    total_trials, cache_hits, one_minimal = len(fresh) + found.trials, found.cache_hits, found.one_minimal
    files = _file_contents(chosen, final)
    verified = await _verify(ctx, record, files, argv, judge)
    patch = await trio.to_thread.run_sync(_patch, record, files)
    return {
        "minimal_patch": patch,
        "replay_ok": verified["fails_again"],
        "root_hash": verified["root_hash"],
        "units": sorted({u.path for u in files.values()}),
        "trials": total_trials,
        "cache_hits": cache_hits,
        "elapsed_ms": int((time.monotonic() - started) * 1000),
        "one_minimal": one_minimal,
    }


def _patch(record: CapsuleRecord, files: dict[str, Unit]) -> str:
    changes = []
    with RootView.open(record.base) as base:
        for path, unit in sorted(files.items()):
            old_side = changeset.lstat(base, path)
            old = base.read_bytes(path) if old_side and old_side.kind == "file" else (
                (old_side.target or "").encode() if old_side and old_side.kind == "symlink" else None)
            old_mode = None if old_side is None else (0o120000 if old_side.kind == "symlink" else (0o100755 if old_side.mode & 0o111 else 0o100644))
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


async def _verify(ctx: ToolContext, record: CapsuleRecord, files: dict[str, Unit], argv: list[str], judge: Any) -> dict[str, Any]:
    """Re-run the minimal change in a journaled capsule; witness that run."""
    created = await capsule_create(ctx, {
        "workspace": record.workspace, "base": record.base if record.base != record.workspace else None,
        "clock_offset_sec": record.clock_offset_sec, "env_whitelist": record.env_whitelist,
        "limits": record.limits or None,
    })
    capsule_id = created["capsule_id"]
    try:
        helper = await ctx.helper()
        root = await helper.open_root(capsule_id)
        await trio.to_thread.run_sync(apply_units, root, files, Journal(ctx.state), capsule_id)
        ran = await capsule_exec(ctx, {"capsule_id": capsule_id, "cmd": argv})
        reply = {
            "exit_code": ran["exit_code"], "timed_out": ran["timed_out"],
            "stdout_b64": base64.b64encode(ran["stdout"].encode()).decode(),
            "stderr_b64": base64.b64encode(ran["stderr"].encode()).decode(),
        }
        made = await make_witness(ctx, capsule_id, "zstd", True)
        return {"fails_again": judge(reply) == FAIL, "root_hash": made["root_hash"]}
    finally:
        with trio.CancelScope(shield=True):
            await capsule_destroy(ctx, {"capsule_id": capsule_id})


TOOLS = [
    ToolSpec(
        name="capsule_deltamin",
        family="capsule",
        title="Minimise failing change",
        description=(
            "Find the smallest part of the capsule's change (files, then hunks) that still makes "
            "target_cmd fail, by delta debugging in fresh capsules. Returns a patch that applies with git apply."
        ),
        input_schema={
            "type": "object", "required": ["capsule_id", "target_cmd"], "additionalProperties": False,
            "properties": {
                "capsule_id": CAPSULE_ID,
                "target_cmd": {"type": "array", "minItems": 1, "items": {"type": "string"}},
                "failure_predicate": {
                    "oneOf": [
                        {"enum": ["exit_code", "timeout"]},
                        {"type": "object", "additionalProperties": False, "minProperties": 1, "maxProperties": 1,
                         "properties": {"exit_code": {"type": "integer"}, "stdout_regex": {"type": "string"},
                                        "stderr_regex": {"type": "string"}}},
                    ]
                },
                "budget_ms": {"type": "integer", "minimum": 1000, "maximum": 24 * 3600 * 1000},
                "confirm_runs": {"type": "integer", "minimum": 1, "maximum": 10,
                                 "description": "Runs of the full and the empty change before searching (flakiness check; default 1)."},
            },
        },
        output_schema={
            "type": "object",
            "required": ["minimal_patch", "replay_ok", "root_hash", "trials", "cache_hits", "elapsed_ms", "one_minimal"],
            "additionalProperties": False,
            "properties": {
                "minimal_patch": {"type": "string"}, "replay_ok": {"type": "boolean"},
                "root_hash": {"type": "string"}, "units": {"type": "array", "items": {"type": "string"}},
                "trials": {"type": "integer"}, "cache_hits": {"type": "integer"},
                "elapsed_ms": {"type": "integer"}, "one_minimal": {"type": "boolean"},
            },
        },
        handler=capsule_deltamin,
        scope="exec",
        aliases=("capsule/deltamin",),
        read_only=True,
    ),
]
