"""Promotion: policies first, then an all-or-nothing write into the real tree (capsule_promote).

Order of checks, cheapest first, and why:
1. **Conflicts** (``REPO_CHANGED``): for each path the capsule changed, the base state
   recorded when the change was first seen must still be the live workspace's state,
   and so must the tree below a directory it deleted, replaced or emptied
   (``changeset.tree_key``).  Otherwise promotion would overwrite or delete someone
   else's edit; nothing is written and the error names every such path.
   Only the paths in scope count (below): a path left behind overwrites nothing.
2. **Hazards** (core/hazards.py), under every policy: setuid and setgid bits, git hooks
   and config, files tools run by themselves.  They are judged on the very ops the
   Promoter will write (``changeset.promote_ops`` of the checked change), and the
   directories that look like bare repositories are read from the capsule's view,
   which is what the workspace will hold at those paths.  The files the host's git
   config names (fs/gitconfig.py: ``include.path``, ``core.hooksPath``, filter and diff
   drivers in the tree) are read from the live workspace's git, as its config stands
   before anything is written: a capsule's own ``.git/config`` is already a hazard, and
   decides nothing.  So are the refs moved in the workspace's own git dirs: their old values
   and whether a branch moved forward come from the live workspace (capsules/gitrefs.py).
   Each one found is a named entry of the report's ``hazards``; one the request's
   ``allow_hazards`` does not name fails it (``hazards_ok: false``).  fs/promote.py never
   writes a setuid or setgid bit anyway, allowed or not.
3. **Policies**: paths and resources from the journal (no new runs), then required
   tests (run in a *fork* of the capsule, so test runs leave the capsule itself as it
   is and are not promoted), then the replay if a policy requires it
   (``require_replay_ok`` or ``require_identical_output``: a witness with blobs,
   replayed in a fresh capsule).
4. **Write** with fs/promote.Promoter: temp files, fsync, journal, renames; recovered
   on the next start if interrupted.  A worktree capsule's git dir (capsules/gitdirs.py)
   is never copied: the branches and tags its git moved are fetched from a bundle and
   checked to fast-forward before the files are written, and moved after them
   (capsules/gitpromote.py); what else changed there is listed in ``git``.

**Scope** (``Request.scope``, fs/gitignore.py): by default what the live workspace's git ignores
(``.pytest_cache/``, ``__pycache__/``, ``build/``, a built ``.so``) is not promoted;
``include_ignored`` promotes it too, ``paths`` and ``exclude`` globs select. Each path left
behind is in the result's ``skipped`` (path, reason ``ignored``, ``excluded``, ``not in paths``,
or ``pseudoref``: core/refmoves.py ``left_behind``); ``ignored: "not a git repository"`` says
the workspace has no ignore rules. Conflicts and hazards are judged on the paths promoted, since
the rest is never written; the policies' required tests still run on the whole capsule (a fork
of it, build output included). A partial promotion leaves the capsule as it is. Its base is the
live tree, so the paths promoted now equal it and are no change any more: promoting the capsule
again writes the rest, with no conflict (vm-tests/test_devmachine_scope.py shows it).

``dry_run`` runs 1 to 3 and step 4's checks of the git refs (writing nothing: the capsule's git
judges the fast-forwards), and lists in ``applied`` what would be applied.  Default policies:
``["baseline"]``.

``as_branch`` (capsules/branch.py) runs 2 and 3 on the same change (``judge``, in the same
turn: ``in_turn``) and commits it onto a new branch instead of step 4; step 1 does not
apply, since nothing in the workspace is written.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import trio
from outcome import acapture

from mcp_server.capsules import capsecrets, gitdirs, gitindex, gitpromote, gitrefs
from mcp_server.capsules.exec import exec_request
from mcp_server.capsules.policy import PolicyStore
from mcp_server.capsules.replay import ReplayOptions, replay
from mcp_server.capsules.service import CapsuleService
from mcp_server.capsules.turns import TakesTurn
from mcp_server.capsules.witness import WitnessOptions, make_witness
from mcp_server.core import hazards, refmoves
from mcp_server.core.policy import (
    CapsuleFacts,
    CombinedRules,
    ExecFacts,
    RequiredTestOutcome,
    evaluate,
)
from mcp_server.core.refmoves import RefChange
from mcp_server.fs import changeset, gitconfig
from mcp_server.fs.gitignore import MAX_MARKER, Scope, declares_cache
from mcp_server.fs.promote import Op, Promoter
from mcp_server.fs.view import DirFds, RootView
from mcp_server.journal import Journal
from mcp_server.journal_records import CapsuleRecord
from sandbox import rawnames
from sandbox.errors import CcwError
from sandbox.ops import ChangesRequest, FreezeRequest, ListRequest
from sandbox.replies import Change

PROMOTE = TakesTurn("promote")  # the turn it takes (capsules/turns.py)
TEST_TIMEOUT_MS = 600_000


def _lineage(journal: Journal, record: CapsuleRecord) -> list[CapsuleRecord]:
    chain = [record]
    while chain[-1].parent:
        parent = journal.capsule(chain[-1].parent)
        if parent is None:
            break
        chain.append(parent)
    return chain


def judged_capsules(journal: Journal, record: CapsuleRecord, runs_of: Sequence[str] = ()) -> list[CapsuleRecord]:
    """The capsules whose runs promotion judges as ``record``'s: its line of parents and those of the
    capsules merged into it, each once, ancestors first."""
    others = [found for found in map(journal.capsule, journal.judged_with(record, runs_of)) if found is not None]
    chains = [capsule for one in (record, *others) for capsule in reversed(_lineage(journal, one))]
    return list({capsule.capsule_id: capsule for capsule in chains}.values())


def _recorded_states(journal: Journal, record: CapsuleRecord) -> dict[str, str]:
    # A fork's changes include its parents', so their recorded base states count too.
    recorded: dict[str, str] = {}
    for capsule in reversed(_lineage(journal, record)):
        recorded.update(journal.base_states(capsule.capsule_id))
    return recorded


def _live_states(workspace: str, paths: list[str]) -> dict[str, str]:
    """The live workspace's state at each path, as ``changeset.base_state`` records it."""
    with RootView.open(workspace) as live, DirFds(live) as live_dirs:
        return {path: changeset.base_state(live, path, live_dirs) for path in paths}


def _read_live_early(journal: Journal, record: CapsuleRecord) -> dict[str, str]:
    """Live states at every path with a recorded base state, read while the helper lists changes."""
    return _live_states(record.workspace, sorted(_recorded_states(journal, record)))


def _conflicts(journal: Journal, record: CapsuleRecord, entries: list[changeset.Entry],
               early: dict[str, str]) -> list[dict[str, Any]]:
    # Recorded states are read afresh: an exec that ended after the early read may have
    # recorded more, and those paths are then read from the workspace here.
    recorded = _recorded_states(journal, record)
    checked = [key for entry in entries for key in (entry.path, changeset.tree_key(entry.path)) if key in recorded]
    live = {**early, **_live_states(record.workspace, [path for path in checked if path not in early])}
    return [
        {"path": path, "expected": changeset.shown_state(recorded[path]),
         "actual": changeset.shown_state(live[path])}
        for path in checked
        if live[path] != recorded[path]
    ]


@dataclass
class _Plan:
    """The entries to promote (in scope), the skipped ones, the conflicts among the promoted."""

    entries: list[changeset.Entry]
    skipped: list[dict[str, str]]
    ignored_note: str | None
    conflicts: list[dict[str, Any]]
    bare_gitdirs: frozenset[str]
    config_named: list[hazards.ConfigNamed]  # the workspace paths the host's git config names (fs/gitconfig.py)
    checked_data: frozenset[str]  # the git data written that reads as plain (_checked_data)
    on_path: dict[str, str]  # the changed paths the promoting user's PATH would run, with why (fs/gitconfig.py)
    git: list[dict[str, Any]] = field(default_factory=list)  # the git dirs' changes left behind (capsules/gitdirs.py)
    refs: list[RefChange] = field(default_factory=list)  # the refs changed in the workspace's git dirs (gitrefs.py)
    staged: dict[str, str] = field(default_factory=dict)  # index files staging unseen content, why (gitindex.py)


def _plan(record: CapsuleRecord, changes: Sequence[Change], root_fd: int, journal: Journal,
          early: dict[str, str], scope: Scope) -> _Plan:
    with RootView.from_fd(root_fd) as capsule, RootView.open(record.base) as base:
        entries, skipped, note = _scoped(changeset.expand(changes, base, capsule), record.workspace, scope, capsule)
        bare = _bare_gitdirs(capsule, [entry.path for entry in entries])
        checked_data = _checked_data(capsule, entries, bare)
        refs = gitrefs.changes(capsule, record.workspace, entries, bare, checked_data)
        behind = refmoves.left_behind(refs, [entry.path for entry in entries], bare)  # the host's stay
        entries, refs = [e for e in entries if e.path not in behind], [r for r in refs if r.path not in behind]
        skipped += [{"path": path, "reason": refmoves.LEFT_BEHIND} for path in sorted(behind)]
        staged = gitindex.reasons(capsule, record.workspace, entries, bare, checked_data)
    return _Plan(entries, skipped, note, _conflicts(journal, record, entries, early), bare,
                 gitconfig.read(record.workspace), checked_data,
                 gitconfig.on_path(record.workspace, [(e.path, e.new.kind) for e in entries if e.new is not None]),
                 refs=refs, staged=staged)


def _is_dir(side: changeset.Side | None) -> bool:
    return side is not None and side.kind == "dir"


def _caches(entries: list[changeset.Entry], capsule: RootView) -> list[str]:
    """The directories the capsule made that declare themselves caches (fs/gitignore.declares_cache)."""
    def marker(path: str) -> bytes | None:
        try:
            if capsule.stat(path).st_size > MAX_MARKER:
                return None
            return capsule.read_regular(path)
        except CcwError:
            return None

    made = [e.path for e in entries if e.old is None and _is_dir(e.new)]
    return [d for d in made if declares_cache(marker(f"{d}/.gitignore"), marker(f"{d}/CACHEDIR.TAG"))]


def _scoped(entries: list[changeset.Entry], workspace: str, scope: Scope,
            capsule: RootView) -> tuple[list[changeset.Entry], list[dict[str, str]], str | None]:
    """The entries the scope keeps, and the skipped ones with their reason.

    Directories follow their contents so the Promoter's ops stay consistent: a
    directory that holds a kept path is kept (its file needs it), a deleted directory
    that holds a skipped path is skipped (it would not be empty), and so is a changed
    one whose every changed path is skipped (``__pycache__/`` when ``*.pyc`` is ignored).
    """
    dirs = {e.path for e in entries if _is_dir(e.new) or _is_dir(e.old)}
    stays_dir = {e.path for e in entries if _is_dir(e.new)}
    caches = [] if scope.include_ignored else _caches(entries, capsule)
    kept_paths, skipped, note = scope.split(workspace, [e.path for e in entries], dirs, caches)
    kept = set(kept_paths)
    reasons = {s["path"]: s["reason"] for s in skipped}
    for path in sorted(kept_paths):
        for parent in _parents(path):
            if parent in reasons and parent in dirs:
                kept.add(parent)
                del reasons[parent]
    holds_kept: set[str] = set()
    for path in kept:
        holds_kept.update(_parents(path))
    for path, reason in list(reasons.items()):
        for parent in _parents(path):
            # A deleted directory would not be empty; a made one would hold nothing promoted.
            if parent in kept and parent in dirs and (parent not in stays_dir or parent not in holds_kept):
                kept.discard(parent)
                reasons[parent] = reason
    skipped = [{"path": e.path, "reason": reasons[e.path]} for e in entries if e.path in reasons]
    return [e for e in entries if e.path in kept], skipped, note


def _parents(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _bare_gitdirs(capsule: RootView, paths: list[str]) -> frozenset[str]:
    """The changed paths' directories (and ancestors) that git would take for a repository."""
    with DirFds(capsule) as dirs:

        def holds(directory: str) -> Callable[[str], bool]:
            return lambda mark: dirs.lstat(f"{directory}/{mark}" if directory else mark) is not None

        return frozenset(d for d in hazards.gitdir_candidates(paths) if hazards.looks_like_gitdir(holds(d)))


def _checked_data(capsule: RootView, entries: list[changeset.Entry], bare: frozenset[str]) -> frozenset[str]:
    """The git data the capsule wrote that reads as plain: loose objects whose bytes hash to their names,
    packed refs that name no replace ref (hazards.find's ``checked_data``)."""
    found = set()
    with DirFds(capsule) as dirs:
        for entry in entries:
            if entry.new is None or entry.new.kind != "file":
                continue
            oid = hazards.loose_object_id(entry.path, bare)
            packed = oid is None and entry.path.rpartition("/")[2] == "packed-refs"
            data = dirs.read_regular(entry.path) if oid is not None or packed else None
            if data is not None and (hazards.true_loose_object(oid, data) if oid else hazards.plain_packed_refs(data)):
                found.add(entry.path)
    return frozenset(found)


def _hazard_changes(entries: list[changeset.Entry], ops: list[Op]) -> list[hazards.Change]:
    """The ops the Promoter will write, each with what its path becomes (from the entry it was made from)."""
    by_path = {entry.path: entry for entry in entries}
    out = []
    for op in ops:
        entry = by_path[op.path]
        new = None if op.action == "delete" else entry.new
        old = entry.old if entry.old is not None and new is not None and entry.old.kind == new.kind else None
        out.append(hazards.Change(op.path, op.action, None if new is None else new.kind, op.mode,
                                  None if old is None else old.mode))
    return out


def _facts(record: CapsuleRecord, journal: Journal, entries: list[changeset.Entry],
           runs_of: tuple[str, ...] = ()) -> CapsuleFacts:
    facts = CapsuleFacts(workspace=record.workspace, home=os.path.expanduser("~"), exposed=list(record.spec.expose))
    for capsule in judged_capsules(journal, record, runs_of):
        for ex in journal.execs(capsule.capsule_id):
            usage = ex["usage"]
            facts.execs.append(ExecFacts(ex["seq"], ex["argv"], usage.get("cpu_ms"), usage.get("rss_max_kb"),
                                         usage.get("rss_max_process_kb"), usage.get("unavailable", {}),
                                         ex["touched"].get("network") or [],
                                         None if capsule.capsule_id == record.capsule_id else capsule.capsule_id))
            read = ex["touched"]["read"]
            if read is None:
                facts.read_unavailable = "an exec ran without file-read tracing (rootless mode, or it was cut short)"
            for path in read or []:
                facts.paths.setdefault(path, set()).add("read")
            for path in ex["touched"]["written"]:
                facts.paths.setdefault(path, set()).add("written")
    for entry in entries:
        facts.paths.setdefault(entry.path, set()).add("changed")
    return facts


async def _run_tests(service: CapsuleService, record: CapsuleRecord,
                     tests: list[str | list[str]]) -> list[RequiredTestOutcome]:
    """Run the policy's required tests in a fork of the capsule (so they leave it as it is)."""
    if not tests:
        return []
    outcomes = []
    async with service.scratch_fork(record.capsule_id) as fork_id:
        for test in tests:
            argv = ["sh", "-c", test] if isinstance(test, str) else list(test)
            request = exec_request(fork_id, argv, record.workspace, TEST_TIMEOUT_MS)
            reply = (await service.scratch_exec(request, record.spec, network=record.network_spec)).value
            tail = reply.stderr[-2000:].decode("utf-8", "replace")
            outcomes.append(RequiredTestOutcome(test, reply.exit_code, bool(reply.timed_out), tail))
    return outcomes


@dataclass(frozen=True)
class Request:
    """What capsule_promote is asked."""

    capsule_id: str
    policies: list[str] = field(default_factory=lambda: ["baseline"])
    dry_run: bool = False
    allow_hazards: frozenset[str] = frozenset()  # hazard kinds (core/hazards.KINDS) to promote anyway
    scope: Scope = field(default_factory=Scope)  # what is written: by default not what the workspace's git ignores
    runs_of: tuple[str, ...] = ()  # capsules whose runs are judged as this one's (capsule_merge's inputs)


async def promote(service: CapsuleService, request: Request) -> dict[str, Any]:
    """Check policies and conflicts, then write the capsule's changes to the workspace.

    It takes the capsule's turn: execs sent before it finish first, and none runs while
    it reads, tests and writes the change.
    """
    service.live_record(request.capsule_id)
    async with service.turn(request.capsule_id, PROMOTE):
        return await in_turn(service, request, _promote_frozen)


Body = Callable[[CapsuleService, Request, CapsuleRecord], Awaitable[dict[str, Any]]]


async def in_turn(service: CapsuleService, request: Request, body: Body) -> dict[str, Any]:
    """Run ``body`` (a promotion, or a branch's commit: capsules/branch.py) in the capsule's turn, its
    running services frozen from the change list's read to the last write."""
    record = service.live_record(request.capsule_id)  # a destroy queued before this call may have run
    running = service.services.running(record.capsule_id) if service.services is not None else []
    if not running:
        return await body(service, request, record)
    # Its services would change the tree between the check and the write: they are frozen
    # (the cgroup freezer, as capsule_pause does) from the change list's read to the last write.
    # A rootless helper's runs have no freezer (UNSUPPORTED): the promotion goes on, as a
    # promotion beside a person's own running server would, and each service says it ran on.
    paused = any(c.capsule_id == record.capsule_id and c.state == "paused"
                 for c in (await service.call(ListRequest())).capsules)
    frozen, unfrozen = paused, {}
    if not paused:
        try:
            await service.call(FreezeRequest(record.capsule_id, True))
            frozen = True
        except CcwError as exc:
            if exc.code != "UNSUPPORTED":
                raise
            unfrozen = {"unfrozen": "not frozen while the change was read and written (no cgroup freezer for "
                                    "a rootless helper's runs): a file it wrote meanwhile is promoted as it was read"}
    try:
        result = await body(service, request, record)
    finally:
        if frozen and not paused:
            with trio.CancelScope(shield=True):
                await service.call(FreezeRequest(record.capsule_id, False))
    result["policy_report"]["services"] = [{**run.summary(), "frozen": frozen, **unfrozen} for run in running]
    return result


@dataclass
class Judged:
    """A change in scope judged by the policies and hazard checks: the ops the Promoter would
    write, the policy report, the paths they touch and the scope's notes (skipped, ignored, git)."""

    plan: _Plan
    ops: list[Op]
    report: dict[str, Any]
    would_apply: list[str]
    scoped: dict[str, Any]


async def judge(service: CapsuleService, request: Request, record: CapsuleRecord, *,
                conflicts: bool = True) -> Judged:
    """Steps 1 to 3 of the module docstring on the capsule's change in ``request.scope``; with
    ``conflicts`` false the live workspace's edits since are no refusal (a branch writes no file)."""
    rules = CombinedRules.combine(PolicyStore(service.state).get(name) for name in request.policies)
    journal = service.journal
    plan = await _checked_entries(service, journal, record, request.scope, conflicts)
    entries = plan.entries
    # The helper refused the capsule's own such names; these are a deleted directory's files.
    rawnames.refuse([entry.path for entry in entries], "changes", rawnames.IN_WORKSPACE)
    ops = changeset.promote_ops(entries)  # what the hazards are judged on is what the Promoter writes
    facts = _facts(record, journal, entries, request.runs_of)
    changes = _hazard_changes(entries, ops)
    found = hazards.find(changes, plan.bare_gitdirs, plan.config_named, plan.checked_data, plan.on_path,
                         refmoves.reasons(plan.refs) | plan.staged)
    facts.hazards = hazards.judge(found, request.allow_hazards)
    tests = await _run_tests(service, record, rules.require_tests)
    replayed = (await _replay(service, record, rules.volatile, request.scope.include_ignored) if rules.needs_replay
                else _Replayed())
    report = evaluate(rules, facts, tests, replayed.ok, replayed.details, replayed.output_identical,
                      replayed.output_details)
    report["policies"] = list(request.policies)
    would_apply = sorted({op.path for op in ops}, key=lambda p: p.encode("utf-8", "surrogateescape"))
    scoped = {"skipped": plan.skipped, **({"ignored": plan.ignored_note} if plan.ignored_note else {}),
              **({"git": plan.git} if plan.git else {})}
    return Judged(plan, ops, report, would_apply, scoped)


async def _promote_frozen(service: CapsuleService, request: Request, record: CapsuleRecord) -> dict[str, Any]:
    judged = await judge(service, request, record)
    plan, ops, report, would_apply, scoped = judged.plan, judged.ops, judged.report, judged.would_apply, judged.scoped
    if not report["passed"] or request.dry_run:
        if report["passed"]:  # a dry run: what step 4 would refuse of the git refs, found writing nothing
            for one in (one for one in plan.git if one["refs"]):
                await gitpromote.prepare(service, record.capsule_id, record.workspace, one["refs"], dry_run=True)
        return {"promoted": False, "dry_run": request.dry_run, "applied": [] if not request.dry_run else would_apply,
                "policy_report": report, **scoped}
    # The capsule's commits fetched into the host repository and checked before any file is written.
    moves = [(one, await gitpromote.prepare(service, record.capsule_id, record.workspace, one["refs"]))
             for one in plan.git if one["refs"]]
    root_fd = await service.open_root(record.capsule_id)

    def write() -> list[str]:
        with RootView.from_fd(root_fd) as capsule, DirFds(capsule) as capsule_dirs:

            def content(op: Op) -> bytes:
                data = capsule_dirs.read_regular(op.path, missing_ok=False)
                assert data is not None
                return data

            return Promoter(service.state.root).promote(record.workspace, ops, content)

    applied = await trio.to_thread.run_sync(write)
    for one, found in moves:
        one["promoted_refs"] = await trio.to_thread.run_sync(gitpromote.apply, record.workspace, found, applied,
                                                             record.capsule_id)
    return {"promoted": True, "dry_run": False, "applied": applied, "policy_report": report, **scoped}


async def _checked_entries(service: CapsuleService, journal: Journal, record: CapsuleRecord, scope: Scope,
                           check_conflicts: bool = True) -> _Plan:
    """The capsule's change in scope, its bare-looking git directories and the paths the host's
    git config names, once the conflict check passed; REPO_CHANGED (nothing written) if not.

    Only what the scope promotes is checked: a path left behind overwrites nothing, so
    a workspace edit there is no conflict.

    The conflict check reads (and hashes) the live workspace at every changed path; it
    needs only the recorded paths, not the helper's change list, so it runs in a thread
    while the helper compares the capsule with its base in its own process.  Errors keep
    their type (no exception group): the helper's is captured and raised after the
    nursery, and an early read that fails is simply done again, and its error reported,
    by the conflict check proper.
    """
    early: dict[str, str] = {}

    async def read_early() -> None:
        try:
            early.update(await trio.to_thread.run_sync(_read_live_early, journal, record))
        except CcwError:
            pass

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_early)
        listed = await acapture(service.call, ChangesRequest(record.capsule_id))
    reply = listed.unwrap()
    git = gitdirs.left_behind(reply.gitdirs)  # refused here when the capsule's git moved a ref
    root_fd = await service.open_root(record.capsule_id)
    plan = await trio.to_thread.run_sync(_plan, record, reply.changes, root_fd, journal, early, scope)
    plan.git = git
    if plan.conflicts and check_conflicts:
        conflicts = plan.conflicts
        paths = [c["path"] for c in conflicts]
        raise CcwError(
            "REPO_CHANGED",
            f"the workspace changed underneath the capsule at {len(paths)} path(s) ({', '.join(paths[:5])}"
            f"{', …' if len(paths) > 5 else ''}); nothing was written. Re-create the capsule from the "
            "current workspace and redo the change, or revert those edits in the workspace",
            {"paths": paths, "conflicts": conflicts},
        )
    return plan


@dataclass(frozen=True)
class _Replayed:
    """What the policies' replay found (None: no replay was asked for)."""

    ok: bool | None = None
    output_identical: bool | None = None
    details: str = ""
    output_details: str = ""


async def _replay(service: CapsuleService, record: CapsuleRecord, volatile: list[str],
                  strict_outputs: bool) -> _Replayed:
    """Witness the capsule with blobs and replay the witness in a fresh capsule (``volatile``:
    the policies' globs, the only ones that count here; ``strict_outputs`` when the promotion
    carries the ignored files too, so the replay judges everything that will be written)."""
    made = await make_witness(service, record.capsule_id, WitnessOptions("zstd", True))
    secrets = capsecrets.recall(service.state.root, record.capsule_id)  # their variables held placeholders
    options = replace(ReplayOptions.of_capsule(record, secrets), volatile=tuple(volatile),
                      strict_outputs=strict_outputs)
    outcome = await replay(service, Path(made["path"]), made["root_hash"], options)
    ok = bool(outcome["replay_ok"])
    output_identical = bool(outcome["output_identical"])
    details = output_details = ""
    if not ok:
        first = outcome["mismatches"][0]
        details = (f"{len(outcome['mismatches'])} mismatch(es), first {first.get('kind')} "
                   f"{first.get('exec', first.get('path'))} {first.get('field', '')}").strip()
    if not output_identical:
        diff = outcome["output_diffs"][0]
        shown = "; ".join((diff["lines"] or [])[:2])
        output_details = f"exec {diff['exec']} {diff['stream']}" + (f" ({shown})" if shown else "")
    return _Replayed(ok, output_identical, details, output_details)
