"""Trials of part of a capsule's change: units of change, and running a subset of them.

Units of change (deltamin): first whole paths (added, modified, deleted files, symlinks,
mode changes); then, within the text files that remain, their hunks (HDD).  A hunk is one
non-equal run of lines between the base and the capsule (difflib opcodes), so any
subset of a file's hunks applies cleanly to the base.  A trial applies a subset to a
fresh scratch capsule over the capsule's base (through its root descriptor, as any file
tool writes) and runs the target command there; the failure predicate judges the reply.

Where a trial runs (a local scratch capsule, a REAPI cluster) is an executor's business
(capsules/executors.py, capsules/remote.py), which builds on this module: here is only
what a trial is (``Trial``) and what running one needs (``TrialRunner``).

A trial of a capsule whose target command ran beside services (capsules/services.py)
starts them in its scratch capsule first, ready before the command (deltamin.py says
which; executors.py starts them).  A trial whose services do not become ready has not
run the command as it ran: it is UNRESOLVED (``ServicesNotReady``), neither FAIL nor PASS.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from mcp_server import events
from mcp_server.capsules.exec import exec_request
from mcp_server.capsules.service import CapsuleService
from mcp_server.capsules.service_spec import ServiceSpec
from mcp_server.core import unidiff
from mcp_server.core.deltamin import FAIL, PASS, UNRESOLVED
from mcp_server.fs import changeset
from mcp_server.fs.promote import make_symlink, remove_tree
from mcp_server.fs.view import RootView
from mcp_server.journal import Journal
from mcp_server.journal_records import CapsuleRecord
from sandbox.errors import CcwError
from sandbox.ops import ExecRequest


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
    """Level one: a unit per changed path (directories come with the files below them)."""
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


def split_hunks(material: Material, keep: Iterable[int], base: RootView) -> Material:
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


def file_contents(material: Material, subset: Iterable[int]) -> dict[str, Unit]:
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


class Finished(Protocol):
    """What a predicate judges of a finished exec: a helper's exec reply, a journaled exec's outcome."""

    @property
    def exit_code(self) -> int | None:
        """The command's exit status (None: killed by a signal)."""

    @property
    def timed_out(self) -> bool:
        """Whether the command ran out of time."""

    @property
    def stdout(self) -> bytes:
        """What it wrote to stdout (as captured)."""

    @property
    def stderr(self) -> bytes:
        """What it wrote to stderr (as captured)."""


@dataclass(frozen=True)
class Trial:
    """One trial: the target command over the capsule's base with ``files`` written in.

    ``fresh``: a flakiness confirmation run, which must really run (no action-cache
    lookup) and must not be remembered (do_not_cache).
    """

    record: CapsuleRecord
    files: dict[str, Unit]
    request: ExecRequest  # its capsule's id is the record's; each executor's run takes its own
    fresh: bool = False
    services: tuple[ServiceSpec, ...] = ()  # started (and ready) beside the command


class TrialRunner(Protocol):
    """What runs trials for ``Trials``: an executor (capsules/executors.py) seen from here."""

    parallelism: int  # trials at once

    async def run_trial(self, service: CapsuleService, trial: Trial) -> Finished:
        """The trial's run, for the failure predicate."""

    def check_trials(self, service: CapsuleService, record: CapsuleRecord, services: tuple[ServiceSpec, ...]) -> None:
        """UNSUPPORTED for trials of ``record`` beside ``services`` that it cannot run, before any runs."""


@dataclass(frozen=True)
class ServicesNotReady:
    """A trial whose services did not become ready: its command did not run (UNRESOLVED)."""

    why: str
    exit_code: int | None = None
    timed_out: bool = False
    stdout: bytes = b""
    stderr: bytes = b""


@dataclass(frozen=True)
class JournaledRun:
    """A journaled exec as a predicate sees it: the journal keeps exit status, not output."""

    exit_code: int | None
    timed_out: bool
    stdout: bytes = b""
    stderr: bytes = b""


Judge = Callable[[Finished], str]


def predicate(spec: Any) -> Judge:
    """A function from a run to FAIL / PASS / UNRESOLVED, from the tool argument."""
    if spec in (None, "exit_code"):
        return lambda r: UNRESOLVED if r.timed_out else (FAIL if r.exit_code != 0 else PASS)
    if spec == "timeout":
        return lambda r: FAIL if r.timed_out else PASS
    if isinstance(spec, dict) and len(spec) == 1:
        (key, value), = spec.items()
        if key == "exit_code" and isinstance(value, int):
            return lambda r: UNRESOLVED if r.timed_out else (FAIL if r.exit_code == value else PASS)
        if key in ("stdout_regex", "stderr_regex") and isinstance(value, str):
            try:
                pattern = re.compile(value)
            except re.error as exc:
                raise CcwError("INVALID_ARGUMENT", f"failure_predicate {key}: bad regex ({exc})") from exc
            stream = key.split("_")[0]
            return lambda r: UNRESOLVED if r.timed_out else (
                FAIL if pattern.search(getattr(r, stream).decode("utf-8", "replace")) else PASS
            )
    raise CcwError(
        "INVALID_ARGUMENT",
        'failure_predicate must be "exit_code", "timeout", {"exit_code": N}, {"stdout_regex": R} '
        'or {"stderr_regex": R}',
    )


class Trials:
    """Runs subsets of the change over the capsule's base, through an executor (capsules/executors.py)."""

    def __init__(self, service: CapsuleService, record: CapsuleRecord, material: Material, argv: list[str],
                 judge: Judge, timeout_ms: int, executor: TrialRunner, services: tuple[ServiceSpec, ...] = ()) -> None:
        self.service = service
        self.record = record
        self.spec = record.spec
        self.material = material
        self.argv = argv
        self.judge = judge
        self.timeout_ms = timeout_ms
        self.executor = executor
        self.services = services  # beside each trial's command
        self.runs = 0

    async def outcome(self, subset: Iterable[int], fresh: bool = False) -> str:
        """FAIL, PASS or UNRESOLVED: the target command over the base with ``subset`` applied.

        ``fresh``: a confirmation run, never answered from (nor stored in) a cache.
        """
        subset = tuple(subset)
        request = exec_request(self.record.capsule_id, self.argv, self.record.workspace, self.timeout_ms)
        trial = Trial(self.record, file_contents(self.material, subset), request, fresh, self.services)
        run = await self.executor.run_trial(self.service, trial)
        self.runs += 1
        verdict = UNRESOLVED if isinstance(run, ServicesNotReady) else self.judge(run)
        # A person watching sees the search: each trial's size and what it gave.
        events.add(self.service.state, "deltamin.trial", self.record.capsule_id,
                   {"size": len(set(subset)), "outcome": verdict, "fresh": fresh})
        return verdict

    async def batch(self, subsets: list[tuple[int, ...]], fresh: bool = False) -> list[str]:
        """The outcomes of several subsets, run at once (as many as the executor runs in parallel)."""
        results: list[str] = [UNRESOLVED] * len(subsets)
        limit = trio.CapacityLimiter(self.executor.parallelism)

        async def one(i: int) -> None:
            async with limit:
                results[i] = await self.outcome(subsets[i], fresh)

        async with trio.open_nursery() as nursery:
            for i in range(len(subsets)):
                nursery.start_soon(one, i)
        return results
