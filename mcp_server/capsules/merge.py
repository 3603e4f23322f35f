"""capsule_merge: several capsules' changes merged against their common base, before promotion (issue 39).

**The base** is decided by what the capsule service recorded, never by what a capsule
holds: the journal's ``parent`` of each capsule (written by the service when it forked
it) gives each one's line of ancestors, and the nearest capsule in every line is the
merge base; with none in common the base is the directory under them all (the
workspace, or a snapshot), which every input must share (same ``spec.lower`` and
workspace, both recorded at creation), or nothing is merged.  A capsule made to look
like another's descendant (same files, a base directory copied from a fork's view) is
therefore merged against what it really grew from, and one over another directory is
refused.  An input that is another's ancestor is refused too: its change is already in
its descendant.

**The live tree under them**: a capsule's view reads its base directory where it
changed nothing, so the base read now is the base the attempts were made on only if
the workspace did not move since.  The base states every input (and its ancestors)
recorded when each change was first seen (capsules/notes.py) must equal the live
states at every merged path, as promotion checks (REPO_CHANGED otherwise, nothing made).

**Steps**: the inputs' turns and their common ancestor's are taken (in id order, so two merges
cannot deadlock) and held until the merge is made (into live: promoted, and its capsule
destroyed), so that a call sent to an input after the merge finds the input as the merge left
it (frozen under the merged capsule), not a fork of it refused under the call; the changes are
listed and read; capsules/merge_plan.py merges path by path (capsules/merge3.py: git's
rules), and each git directory as a unit
(capsules/merge_git.py: where several inputs changed one, the first keeps it whole).  A
conflict at a path the workspace's git ignores does not count (``_ignored_conflicts``:
promotion leaves it behind; the first input's is kept).  Any other conflict stops there: the answer lists
each conflicting path with both sides and the base, and nothing is made or written.
Otherwise ``into: "new"`` makes a capsule holding the merge (capsules/merge_write.py),
where tests can run; ``into: "live"`` makes one the same way (destroyed after) and
promotes it with capsule_promote's own code
(capsules/promote.py): the same policies, hazard checks (set-id bits, git hooks and
config, symlinked parents), conflict check and all-or-nothing write.  The policies judge
the inputs' runs too (``Request.runs_of``: what each read, wrote, used and reached), not
only the merged capsule's, which ran nothing of its own.  A capsule whose
git moved refs in a git dir outside its workspace is refused: promotion carries refs
one capsule at a time (capsules/gitpromote.py), and a merge has no single capsule's
commits to carry.  ``dry_run`` makes nothing for ``new``, and for ``live`` runs
promotion's dry run on the merged capsule, then destroys it.

**The merged capsule is a fork of the first input with the others' layers stacked over
it** (the helper's ForkRequest ``donors``), as git merges into the branch checked out,
except that git writes the other branch's files and overlayfs shows them: the fork is O(1)
and shows every path only one input changed as that input has it, so only the paths it
shows otherwise than the merge (those several inputs changed, and the few a donor's
layers hold or hide unchanged: merge_write.stacked_start) are written into its own upper
layer.  Its lineage stays true: its base directory is the inputs' (so its diff and its
promotion carry every input's change against that base), its line of ancestors runs
through the first input (whose runs are in its tree, so promotion's policies judge them
as its own), and its journal names every path the merge changed against the merge base,
kept or written (a witness replays it from the base alone).  What it costs: every input
is frozen (its execs refused) and cannot be destroyed while the merged capsule lives, as
a forked capsule's parent is.  Each input's generation, read in its turn with its change,
must be the same once it is stacked (a write landed between is refused: CONFLICT, merge
again).  Where the others cannot be stacked (an input over another base directory, a
layer two inputs share that the first does not, more than ``MAX_DONORS``, an input running
services) the fork is of the first input alone and the others' changes are written into
it; where the first cannot be forked (forks nested ``MAX_FORK_DEPTH`` deep, a state dir
inside the workspace) or runs services (a fork would freeze them), the capsule is a fork
of the common ancestor, or a new capsule over the base, with every merged path written.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import trio

from mcp_server.capsules import gitdirs, merge_git, merge_write
from mcp_server.capsules.merge3 import Outcome
from mcp_server.capsules.merge_git import GIT_KEPT
from mcp_server.capsules.merge_make import make, of_input
from mcp_server.capsules.merge_plan import (
    Plan,
    Side,
    SideRead,
    combine,
    needing_bytes,
    pairs,
    read_side,
    read_unread,
)
from mcp_server.capsules.promote import Request, _lineage, _live_states, _recorded_states, promote
from mcp_server.capsules.service import CapsuleService
from mcp_server.capsules.turns import TakesTurn
from mcp_server.fs import changeset
from mcp_server.fs.gitignore import Scope
from mcp_server.fs.statcache import StatCache
from mcp_server.fs.view import RootView
from mcp_server.journal_records import CapsuleRecord
from sandbox.errors import CcwError
from sandbox.ops import ChangesRequest
from sandbox.replies import Change, ChangesReply

MERGE = TakesTurn("merge")
MAX_INPUTS = 16
MAX_LISTED = 1000  # paths listed in ``files``; ``counts`` has them all
MAX_HELD_BYTES = 2 << 30  # every input's changed files are read into memory before anything is merged


@dataclass(frozen=True)
class Question:
    """What capsule_merge is asked."""

    capsule_ids: tuple[str, ...]
    into: str = "new"  # new | live
    dry_run: bool = False
    policies: tuple[str, ...] = ("baseline",)  # into live: promotion's
    allow_hazards: frozenset[str] = field(default_factory=frozenset)


def _inputs(service: CapsuleService, ids: tuple[str, ...]) -> tuple[list[CapsuleRecord], CapsuleRecord | None]:
    """The inputs' records and their nearest common ancestor (None: their base directory)."""
    if not 2 <= len(ids) <= MAX_INPUTS or len(set(ids)) != len(ids):
        raise CcwError("INVALID_ARGUMENT", f"capsule_merge takes 2 to {MAX_INPUTS} different capsules, got "
                       f"{len(ids)} ({len(set(ids))} different); name each attempt once", {"capsule_ids": list(ids)})
    records = [service.live_record(one) for one in ids]
    first = records[0]
    strangers = [r.capsule_id for r in records if (r.base, r.workspace) != (first.base, first.workspace)]
    if strangers:
        raise CcwError("INVALID_ARGUMENT", f"{', '.join(strangers)} {'was' if len(strangers) == 1 else 'were'} not "
                       f"made over the same base and workspace as {first.capsule_id} ({first.base}): they have no "
                       "common base to merge against; merge capsules forked from one capsule or made over one "
                       "workspace",
                       {"capsule_ids": strangers, "base": first.base})
    journal = service.journal
    lines = [[one.capsule_id for one in _lineage(journal, record)] for record in records]
    for record, line in zip(records, lines, strict=True):
        above = [other for other in ids if other in line[1:]]
        if above:
            raise CcwError("INVALID_ARGUMENT", f"{above[0]} is an ancestor of {record.capsule_id}: its change is "
                           f"already in {record.capsule_id}; merge the others with {record.capsule_id} alone",
                           {"ancestor": above[0], "descendant": record.capsule_id})
    common = next((one for one in lines[0][1:] if all(one in line for line in lines[1:])), None)
    return records, service.live_record(common) if common is not None else None


def _checked_base(each: list[dict[str, str]], plan: Plan, live: dict[str, str]) -> dict[str, str]:
    """The base states the inputs recorded (``each``: one input's and its ancestors', ``_recorded``)
    at the merged paths, once the live tree still holds them (``live``: its states at every path
    they recorded)."""
    recorded: dict[str, str] = {}
    moved: list[tuple[str, str, str]] = []  # (path, expected, actual), as base_state's texts
    for states in each:
        for path, state in states.items():
            if changeset.keyed_path(path) not in plan.base:  # a path's own state, or its tree's
                continue
            if recorded.setdefault(path, state) != state:
                moved.append((path, recorded[path], state))
    moved += [(p, s, live[p]) for p, s in sorted(recorded.items()) if live[p] != s]
    if moved:
        paths = sorted({path for path, _expected, _actual in moved})
        raise CcwError("REPO_CHANGED", f"the workspace changed underneath the capsules at {len(paths)} path(s) "
                       f"({', '.join(paths[:5])}{', …' if len(paths) > 5 else ''}): the base they were made on is "
                       "gone, so no merge is made; re-create the attempts from the current workspace, or revert "
                       "those edits", {"paths": paths, "conflicts": [
                           {"path": path, "expected": changeset.shown_state(expected),
                            "actual": changeset.shown_state(actual)} for path, expected, actual in moved]})
    return recorded


def _recorded(service: CapsuleService, records: list[CapsuleRecord]) -> list[dict[str, str]]:
    """The base states each input (with its ancestors) recorded, read once for the live check."""
    return [_recorded_states(service.journal, record) for record in records]


def _lower_recorded(paths: set[str], plan: Plan, workspace: str) -> dict[str, str]:
    """The live workspace's states at the recorded ``paths`` where the capsules' base directory is the
    workspace: the plan's digests there, at the merged paths (the only ones ``_checked_base`` looks at),
    and the trees recorded below merged directories, read from the workspace."""
    states = {path: changeset.state_text(merge_write.view_side(state), None, state.digest)
              for path, state in plan.lower.items() if path in paths}
    trees = sorted(key for key in paths if key.endswith("/") and changeset.keyed_path(key) in plan.base)
    return {**states, **_live_states(workspace, trees)} if trees else states


def _unmoved_refs(every: list[CapsuleRecord], replies: dict[str, ChangesReply]) -> None:
    """Refuse a capsule whose git moved refs: a merge carries files, not commits."""
    for record in every:
        moved = [one for one in gitdirs.listing(replies[record.capsule_id].gitdirs) if one["refs"]]
        if moved:
            raise CcwError("UNSUPPORTED", f"{record.capsule_id}'s git moved {', '.join(moved[0]['refs'][:5])} in "
                           f"{moved[0]['gitdir']}: a merge carries files, not commits; promote that capsule by "
                           "itself (capsule_promote carries its commits) and merge the others after",
                           {"capsule_id": record.capsule_id, "refs": moved[0]["refs"]})


def _within_memory(held: int, reply: ChangesReply) -> int:
    """The bytes of the inputs' changed files so far, with ``reply``'s; TOO_LARGE past ``MAX_HELD_BYTES``."""
    held += sum(change.size or 0 for change in reply.changes if change.type == "file")
    if held > MAX_HELD_BYTES:
        raise CcwError("TOO_LARGE", f"the inputs' changed files come to over {MAX_HELD_BYTES} bytes, more than a "
                       "merge holds in memory at once (a sparse file costs no disk but is read whole); nothing was "
                       "merged. Remove the large files in the capsules, or promote them one at a time",
                       {"limit": MAX_HELD_BYTES})
    return held


async def _listed_and_read(service: CapsuleService, every: list[CapsuleRecord], low: RootView,
                           cache: trio.Event, infos: dict[str, os.stat_result],
                           unlisted: dict[str, frozenset[str]], roots: dict[str, int]) -> dict[str, SideRead]:
    """Each capsule's change list, asked one after another, and each read through its view
    (``read_side``) as soon as its list is in, while the helper lists the next: the helper lists
    one capsule in about half the time it takes for two at once (its threads share one
    interpreter), and the front end reads the first meanwhile.  The inputs keyed in ``unlisted`` are
    asked for their unlisted paths too (merge_write.stacked_start's).  Those keyed in ``roots`` are
    read lazily (their listed files' bytes left unread), a copy of each root kept there for
    ``_read_needed``.  No read starts before ``cache`` is set (the base directory's stat cache
    loaded: its clock must be read before any lstat).
    Refused whole if any fails (naming the capsule: ``_of``), or if a capsule's git moved refs
    (``_unmoved_refs``)."""
    replies: dict[str, ChangesReply] = {}
    reads: dict[str, SideRead] = {}
    failed: list[CcwError] = []  # raised as itself below, not in the nursery's group

    async def read(capsule_id: str, changes: tuple[Change, ...], root_fd: int, scope: trio.CancelScope) -> None:
        taken = False

        def work() -> SideRead:
            nonlocal taken
            lazy = capsule_id in roots
            if lazy:
                roots[capsule_id] = os.dup(root_fd)
            taken = True  # read_side closes the root from here on
            return read_side(low, Side(capsule_id, root_fd, changes), infos, lazy)
        try:
            await cache.wait()
            reads[capsule_id] = await trio.to_thread.run_sync(work)
        except CcwError as exc:
            failed.append(of_input(capsule_id, exc))
            scope.cancel()
        finally:
            if not taken:
                os.close(root_fd)

    async def ask(nursery: trio.Nursery) -> None:
        held = 0
        for record in every:
            try:
                donor, lazy = record.capsule_id in unlisted, record.capsule_id in roots
                reply = replies[record.capsule_id] = await service.call(ChangesRequest(
                    record.capsule_id, unlisted=donor or None, mtimes=lazy or None))
                if donor:
                    unlisted[record.capsule_id] = frozenset(reply.unlisted or ())
                held = _within_memory(held, reply)
                root_fd = await service.open_root(record.capsule_id)
            except CcwError as exc:
                failed.append(of_input(record.capsule_id, exc))
                nursery.cancel_scope.cancel()
                return
            nursery.start_soon(read, record.capsule_id, reply.changes, root_fd, nursery.cancel_scope)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask, nursery)
    if failed:
        raise failed[0]
    _unmoved_refs(every, replies)
    return reads


async def _read(service: CapsuleService, records: list[CapsuleRecord], ancestor: CapsuleRecord | None,
                turns: contextlib.AsyncExitStack) -> tuple[Plan, dict[str, int], list[dict[str, str]], dict[str, str]]:
    """The plan, read in the inputs' turns (no exec of theirs lands while their changes are read),
    the inputs' generations then, the base states each input recorded (``_recorded``) and the
    live workspace's states at those paths.  Over the workspace itself those are the plan's own
    digests of the base directory (``_lower_recorded``: each file read at most once, not again to
    hash it, and not at all where the stat cache knows it); over a snapshot, the workspace is read
    beside the plan (on two cores the one's hashing overlaps the other's reads).  The base
    directory's stat cache (fs/statcache.py) is kept in the state dir."""
    every = [*records, *([ancestor] if ancestor else [])]
    lower = records[0].base
    # held by ``turns`` until the merge is made (``merge``): the ancestor's too, which may be forked to hold it
    for one in sorted({record.capsule_id for record in every}):
        await turns.enter_async_context(service.turn(one, MERGE))
    generations = {one.capsule_id: service.journal.generation(one.capsule_id) for one in records}
    each: list[dict[str, str]] = []
    loaded, caches = trio.Event(), []
    infos: dict[str, os.stat_result] = {}  # the base files' lstat, as the reads' ``expand`` took them
    unlisted = {one.capsule_id: frozenset[str]() for one in records[1:]}
    roots = {one.capsule_id: -1 for one in records}  # lazily read: _read_needed reads what the merge needs

    async def load() -> None:
        caches.append(await trio.to_thread.run_sync(StatCache.load, service.state.root, lower))
        loaded.set()

    failed: list[CcwError] = []  # raised as itself below, not in the nursery's group
    live: dict[str, str] = {}
    snapshot = records[0].spec.given_base is not None

    async def recorded() -> None:
        try:
            each.extend(await trio.to_thread.run_sync(_recorded, service, records))
            if snapshot:
                paths = sorted({path for states in each for path in states})
                live.update(await trio.to_thread.run_sync(_live_states, records[0].workspace, paths))
        except CcwError as exc:
            failed.append(exc)

    with RootView.open(lower) as low:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(load)
            nursery.start_soon(recorded)
            try:
                reads = await _listed_and_read(service, every, low, loaded, infos, unlisted, roots)
            except CcwError as exc:
                failed.append(exc)
        names, common = [record.capsule_id for record in records], ancestor.capsule_id if ancestor else None
        await trio.to_thread.run_sync(_read_needed, None if failed else reads, roots, names, common, unlisted)
        if failed:
            raise failed[0]
        plan = await trio.to_thread.run_sync(_combined, service.state, low, names, common, reads, caches[0], infos)
        plan.unlisted = unlisted
    if not snapshot:
        paths = {path for states in each for path in states}
        live = await trio.to_thread.run_sync(_lower_recorded, paths, plan, records[0].workspace)
    return plan, generations, each, live


def _read_needed(reads: dict[str, SideRead] | None, roots: dict[str, int], names: list[str], ancestor: str | None,
                 unlisted: dict[str, frozenset[str]]) -> None:
    """Read the files the lazy reads left unread whose bytes the merge needs (``needing_bytes``), each
    input's through its root in ``roots``; a refusal names the input.  Every root is closed (none
    read where ``reads`` is None: the reading failed)."""
    try:
        for name, paths in needing_bytes(reads, names, ancestor, unlisted).items() if reads is not None else ():
            fd, roots[name] = roots[name], -1
            try:
                read_unread(fd, (reads or {})[name], paths)
            except CcwError as exc:
                raise of_input(name, exc) from None
    finally:
        for fd in roots.values():
            if fd >= 0:
                os.close(fd)


def _combined(state: Any, low: RootView, names: list[str], ancestor: str | None, reads: dict[str, SideRead],
              cache: StatCache, infos: dict[str, os.stat_result]) -> Plan:
    """``combine``, its stat cache saved after."""
    plan = combine(low, names, ancestor, reads, cache, infos)
    cache.save(state.root)
    return plan


def _conflict(one: Outcome, plan: Plan) -> dict[str, Any]:
    ours, theirs = (*one.sides, "", "")[:2]
    first = plan.sides.get(ours.split("+")[0], {}).get(one.path)
    second = plan.sides.get(theirs, {}).get(one.path)
    return {"path": one.path, "how": one.how, "capsules": list(one.sides), "base": plan.base[one.path].describe(),
            "ours": first.describe() if first else "", "theirs": second.describe() if second else "",
            "hunks": [{"line": h.line, "base": h.base, "ours": h.ours, "theirs": h.theirs} for h in one.hunks]}


def report(question: Question, plan: Plan, ancestor: CapsuleRecord | None, lower: str) -> dict[str, Any]:
    """The merge's answer before anything is made: base, files, conflicts, pairs."""
    changed = plan.changed
    counts: dict[str, int] = {}
    for one in changed:
        counts[one.how] = counts.get(one.how, 0) + 1
    return {
        "base": {"capsule_id": ancestor.capsule_id} if ancestor else {"directory": lower},
        "merged": not plan.conflicts,
        "files": [{"path": one.path, "how": one.how, "capsules": list(one.sides)} for one in changed[:MAX_LISTED]],
        "counts": counts,
        "conflicts": [_conflict(one, plan) for one in plan.conflicts],
        "pairs": pairs(plan, list(question.capsule_ids),
                       frozenset(path for path, one in plan.outcomes.items() if one.how in (IGNORED, GIT_KEPT))),
    }


class CollectorPause:
    """Python's cyclic garbage collector held off while merges run (reference counting still frees).

    A merge makes tens of thousands of objects that live until it ends (each path's states,
    entries and outcomes): every 700 start a collection, and the older generations' walk them
    all again with the front end's whole heap, a fifth of a merge of 2 x 1,000 files
    (bench/parts/merge.py).  Cycles made meanwhile wait for the collector, which is set back
    as it was once the last of the merges running at once ends.
    """

    def __init__(self) -> None:
        self.running = 0
        self.was_enabled = False

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """The collector off until the last holder leaves."""
        if self.running == 0:
            self.was_enabled = gc.isenabled()
            gc.disable()
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            if self.running == 0 and self.was_enabled:
                gc.enable()


COLLECTOR = CollectorPause()  # merges run in the trio thread: its count needs no lock


async def merge(service: CapsuleService, question: Question) -> dict[str, Any]:
    """Merge the capsules; make the merged capsule or promote the merge, as asked (see the module's docstring).

    The collector is held off for the merge itself, not for the promotion of an into-live one,
    whose policies' tests may run for minutes while the front end serves others."""
    async with contextlib.AsyncExitStack() as turns:  # the inputs', from their reading on (``_read``)
        with COLLECTOR.held():
            result, made = await _merge(service, question, turns)
        if made is None:
            return result
        try:
            promoted = await promote(service, Request(made.capsule_id, list(question.policies), question.dry_run,
                                                      question.allow_hazards, runs_of=question.capsule_ids))
        finally:
            with trio.CancelScope(shield=True):
                await service.destroy(made.capsule_id)
    return {**result, "written": bool(promoted["promoted"]), "promote": promoted}


async def _merge(service: CapsuleService, question: Question,
                 turns: contextlib.AsyncExitStack) -> tuple[dict[str, Any], CapsuleRecord | None]:
    """The merge's report and, for an into-live merge without conflicts, the capsule holding it
    (to be promoted, then destroyed); None when the report is the whole answer."""
    records, ancestor = _inputs(service, question.capsule_ids)
    plan, generations, each, live = await _read(service, records, ancestor, turns)
    merge_git.one_history(plan, [r.capsule_id for r in records])
    if plan.conflicts:
        await trio.to_thread.run_sync(_ignored_conflicts, plan, [r.capsule_id for r in records], records[0].workspace)
    recorded = await trio.to_thread.run_sync(_checked_base, each, plan, live)
    result = report(question, plan, ancestor, records[0].base)
    if plan.conflicts or (question.dry_run and question.into == "new"):
        return {**result, "written": False}, None
    made = await make(service, records, generations, ancestor, plan, recorded, question.capsule_ids)
    if question.into == "new":
        return {**result, "written": True, "capsule_id": made.capsule_id}, None
    return result, made


IGNORED = "ignored by the workspace's git: the first input's kept (promotion leaves it behind)"


def _ignored_conflicts(plan: Plan, names: list[str], workspace: str) -> None:
    """A conflict at a path the workspace's git ignores stops no merge: promotion leaves such a
    path behind (fs/gitignore.Scope, as capsule_promote and capsule_diff judge it), so two
    attempts that both ran Python, each with its own ``__pycache__/*.pyc``, would otherwise
    never merge.  The first input that changed it keeps its state there (``IGNORED``), unless the
    merge made its directory a link or a file (``_below_no_dir``): that stays a conflict."""
    paths = [one.path for one in plan.conflicts]
    _kept, skipped, _note = Scope().split(workspace, paths)
    for path in (one["path"] for one in skipped if one["reason"] == "ignored"):
        if _below_no_dir(plan, path):
            continue  # its directory is a link or a file in the merge: nothing can be kept beneath it
        first = next(name for name in names if plan.sides[name][path] != plan.base[path])
        plan.outcomes[path] = Outcome(path, plan.sides[first][path], IGNORED, (first,))
    plan.__dict__.pop("changed", None)  # a cached_property: the outcomes just changed


def _below_no_dir(plan: Plan, path: str) -> bool:
    """Whether a directory above ``path`` is, in the merge, something that holds no entries (a symlink,
    a file): another input's file there would be written through it (parents are reached in order,
    so one made a link by this override is seen)."""
    head = path
    while "/" in head:
        head = head.rpartition("/")[0]
        parent = plan.outcomes.get(head)
        if parent is not None and parent.state is not None and parent.state.kind not in (None, "dir"):
            return True
    return False
