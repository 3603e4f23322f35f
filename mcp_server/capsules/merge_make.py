"""The capsule holding a merge (capsule_merge ``into``): made, its bytes read where needed, and written.

capsules/merge.py says what the capsule is (a fork of the first input with the others' layers
stacked over it, or where that cannot be, a fork or a new capsule with their changes written)
and why; capsules/merge_write.py writes and journals it.
"""

from __future__ import annotations

import trio

from mcp_server.capsules import merge_write
from mcp_server.capsules.merge3 import State
from mcp_server.capsules.merge_plan import Plan, SideRead, read_unread, unread
from mcp_server.capsules.service import CapsuleService
from mcp_server.journal_records import CapsuleRecord
from sandbox.checks import MAX_DONORS
from sandbox.errors import CcwError


def of_input(capsule_id: str, exc: CcwError) -> CcwError:
    """``exc``, raised while one input was listed or read, naming that input: a merge asks several,
    and an error such as a file name that is not UTF-8 says "the capsule's" without saying which."""
    if exc.details.get("capsule_id") == capsule_id:
        return exc
    named = CcwError(exc.code, f"capsule {capsule_id}: {exc.message}", {"capsule_id": capsule_id, **exc.details})
    named.__cause__ = exc
    return named


async def make(service: CapsuleService, records: list[CapsuleRecord], generations: dict[str, int],
               ancestor: CapsuleRecord | None, plan: Plan, recorded: dict[str, str],
               inputs: tuple[str, ...]) -> CapsuleRecord:
    """A journaled capsule holding the merge: a fork of the first input with the others' layers stacked
    over it (``_forked``), else of the common ancestor, or a new one over the base; ``generations``:
    the inputs' as their changes were read; ``inputs`` journaled as what it merged (promoting it
    judges their runs, as an into-live merge does)."""
    made, donors = await _forked(service, records)
    start: dict[str, State] | tuple[str, tuple[str, ...]] = plan.base
    if made is not None:  # the capsules whose layers it lies on, first
        start = (records[0].capsule_id, donors) if donors else plan.sides[records[0].capsule_id]
        shown = [records[0].capsule_id, *donors]
    else:
        made = await (service.fork(ancestor.capsule_id, in_turn=True) if ancestor is not None else
                      service.create(records[0].spec, records[0].network_spec, records[0].volatile))
        shown = [ancestor.capsule_id] if ancestor is not None else []
    try:
        for record in records[: 1 + len(donors)] if start is not plan.base else ():
            if service.journal.generation(record.capsule_id) != generations[record.capsule_id]:
                raise CcwError("CONFLICT", f"{record.capsule_id} changed while it was merged (a command or a file "
                               "tool wrote to it): nothing was made; merge again", {"capsule_id": record.capsule_id})
        if not donors:  # not stacked: what the capsule does not show is written, so its bytes are read
            await _filled(service, plan, records[0].capsule_id if start is not plan.base else None)
        root_fd = await service.open_root(made.capsule_id)
        kept = plan.mtimes.get(records[0].capsule_id, {}) if start is not plan.base else {}
        await trio.to_thread.run_sync(merge_write.write, service.state, made.capsule_id, root_fd, plan, recorded,
                                      start, kept, inputs, shown)
    except BaseException:
        with trio.CancelScope(shield=True):
            await service.destroy(made.capsule_id)
        raise
    return made


async def _filled(service: CapsuleService, plan: Plan, shown: str | None) -> None:
    """Read the merged files whose bytes the lazy reads left in their inputs' views (merge_plan's
    ``unread``), but those of ``shown``, the input the capsule was forked from (it shows them)."""
    wanted: dict[str, set[str]] = {}
    for path, outcome in plan.outcomes.items():
        if outcome.state is not None and unread(outcome.state) and outcome.sides[0] != shown:
            wanted.setdefault(outcome.sides[0], set()).add(path)
    for name, paths in wanted.items():
        read = SideRead({}, {}, {}, {})
        try:
            await trio.to_thread.run_sync(read_unread, await service.open_root(name), read, paths)
        except CcwError as exc:
            raise of_input(name, exc) from None
        for path in paths:
            plan.sides[name][path] = plan.outcomes[path].state = read.states[path]
            plan.mtimes.setdefault(name, {})[path] = read.mtimes[path]


async def _forked(service: CapsuleService, records: list[CapsuleRecord]) -> tuple[CapsuleRecord | None,
                                                                                   tuple[str, ...]]:
    """A fork of the first input with the other inputs' layers stacked over it, in order (the helper's
    ForkRequest ``donors``), and those donors; where the helper cannot stack them (another base
    under one, a layer shared by two, too many layers: UNSUPPORTED or TOO_LARGE), a fork of the
    first alone; (None, ()) where that cannot be made either, or the first runs services (a fork would
    freeze them).  An input running services is no donor (it would be frozen too)."""
    first, others = records[0].capsule_id, tuple(record.capsule_id for record in records[1:])
    running = service.services.running if service.services is not None else (lambda capsule_id: False)
    if running(first):
        return None, ()
    tries = [others, ()] if others and len(others) <= MAX_DONORS and not any(map(running, others)) else [()]
    for donors in tries:
        try:
            return await service.fork(first, donors, in_turn=True), donors  # merge._read took the turns
        except CcwError as exc:
            if exc.code not in ("TOO_LARGE", "UNSUPPORTED"):
                raise
    return None, ()
