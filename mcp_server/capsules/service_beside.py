"""The services beside a capsule's command, for the tools that run that command again.

An exec's journal row names the services that ran beside it (capsules/services.py:
``beside``), in their witness form: names of variables, never values.  A tool that runs
the command again to judge it (deltamin's and commutativity's trials, deltamin's final
check, a witness's re-run of the runs beside unended services) starts the same services
first, each ready before the command, or it judges a command that cannot reach what it
reached when it ran.  Here are the two things they share:

- ``services_beside``: which services to start for a command, those beside its newest
  journaled exec (the one the caller saw: an older one beside other services described
  other conditions); for a command never run in the capsule, those running in it now,
  beside which it would run if it were run there now.  A spec still kept for the capsule
  (capsules/service_spec.py) gives the values its caller set; one since stopped comes back
  from the journal's form, without them.
- ``started``: those services in a new *journaled* capsule (deltamin's final check, a
  witness's re-run), started as ``capsule_service_start`` would, so each one's run is a
  journal row with its touched sets once it is stopped, which the block's end does.
  Trials in scratch capsules start theirs through their executor instead
  (capsules/service_scratch.py), unjournaled.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import trio

from mcp_server.capsules.replay_steps import services_of
from mcp_server.capsules.service import CapsuleService
from mcp_server.capsules.service_spec import ServiceSpec
from mcp_server.journal import Journal
from mcp_server.journal_records import CapsuleRecord
from sandbox.errors import CcwError


def runs_of(journal: Journal, record: CapsuleRecord, argv: list[str]) -> list[dict[str, Any]]:
    """The capsule's journaled execs of ``argv`` as a command (a service's execs are not), in order."""
    return [ex for ex in journal.execs(record.capsule_id) if ex["argv"] == argv and ex.get("service") is None]


def specs_for(service: CapsuleService, capsule_id: str, forms: Sequence[dict[str, Any]]) -> tuple[ServiceSpec, ...]:
    """The specs of the services in witness form ``forms`` (a row's ``services``) of capsule ``capsule_id``:
    the kept spec where one matches (with its values), else the form's own (without them)."""
    kept = {}
    if service.services is not None:
        kept = {json.dumps(spec.for_witness(), sort_keys=True): spec
                for spec, _ in service.services.table.all() if spec.capsule_id == capsule_id}
    return tuple(kept.get(json.dumps(form, sort_keys=True)) or ServiceSpec.from_json(capsule_id, form)
                 for form in forms)


def services_beside(service: CapsuleService, record: CapsuleRecord, argv: list[str]) -> tuple[ServiceSpec, ...]:
    """The services beside the capsule's newest run of ``argv``, or those running in it now if
    ``argv`` never ran there: a trial of that command starts them."""
    runs = runs_of(service.journal, record, argv)
    if runs:
        forms = json.loads(runs[-1]["services"]) if runs[-1].get("services") else []
    else:
        forms = service.services.beside(record.capsule_id) if service.services is not None else []
    return specs_for(service, record.capsule_id, forms)


@contextlib.asynccontextmanager
async def started(service: CapsuleService, capsule_id: str, specs: Sequence[ServiceSpec]) -> AsyncIterator[bool]:
    """``specs`` started in the journaled capsule ``capsule_id``, in order, for the block: whether all
    became ready (the first that did not is the last started).  Stopped in reverse order after the
    block, so their runs end and are journaled before it returns; one whose stop fails is left to the
    capsule's destroy.

    Only for a capsule its caller just made: nobody else knows it, so no call can come between the
    starts and the block, and no turn is taken.
    """
    names: list[str] = []
    try:
        ready = True
        for spec in specs:
            answer = await services_of(service).start(service, spec.in_capsule(capsule_id))
            names.append(spec.name)
            if not answer["ready"]:
                ready = False
                break
        yield ready
    finally:
        with trio.CancelScope(shield=True):
            for name in reversed(names):
                with contextlib.suppress(CcwError):  # the destroy stops what is left
                    await services_of(service).stop(capsule_id, name)
