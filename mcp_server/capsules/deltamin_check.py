"""Deltamin's final check: the minimal change re-run in a journaled capsule, and witnessed.

deltamin.py searches with trials in scratch capsules, which nobody journals; its answer
is then run once more where it can be witnessed: a new journaled capsule over the
capsule's base with the minimal change written in (each write journaled), the target
command run there, its witness made (``root_hash``), the capsule destroyed.  The search's
last question is often "does this result fail?", so ``FinalCheck`` lets the search ask
it of this run instead of running the same subset twice.

Services: when the target command ran beside services (deltamin.py says which), the
check starts them in its capsule as ``capsule_service_start`` would (service_beside.py),
each ready before the command, and stops them after it, before the witness: so the
command's row names them, their runs are journaled, and the witness replays them
(replay_steps.py).  A service that does not become ready leaves the command unrun and
the check UNRESOLVED (it does not fail again), as a trial's would be; the witness still
holds the service's exec, whose output says why.
"""

from __future__ import annotations

from typing import Any

import trio

from mcp_server.capsules.exec import exec_request
from mcp_server.capsules.service import CapsuleService
from mcp_server.capsules.service_beside import started
from mcp_server.capsules.service_spec import ServiceSpec
from mcp_server.capsules.trials import Judge, Material, Trials, Unit, apply_units, file_contents
from mcp_server.capsules.witness import WitnessOptions, make_witness
from mcp_server.core.deltamin import FAIL, UNRESOLVED
from mcp_server.journal_records import CapsuleRecord


class FinalCheck:
    """deltamin's final check (``verify``), run early when the search's last question is its result.

    ``run`` answers that question with the journaled, witnessed run the final check makes
    anyway; ``answer`` hands it back when the search did end there.
    """

    def __init__(self, service: CapsuleService, record: CapsuleRecord, trials: Trials) -> None:
        self.service, self.record, self.trials = service, record, trials
        self._last: tuple[Material, tuple[int, ...], dict[str, Any]] | None = None

    async def run(self, material: Material, subset: tuple[int, ...]) -> str:
        # as a trial runs it (same command, judge, timeout and services), so it can stand for one
        trials = self.trials
        verified = await verify(self.service, self.record, file_contents(material, subset), trials.argv,
                                trials.judge, trials.timeout_ms, trials.services)
        self._last = (material, tuple(subset), verified)
        return str(verified["outcome"])

    def answer(self, material: Material, result: tuple[int, ...]) -> dict[str, Any] | None:
        if self._last is not None and self._last[0] is material and self._last[1] == tuple(result):
            return self._last[2]
        return None


async def verify(service: CapsuleService, record: CapsuleRecord, files: dict[str, Unit], argv: list[str],
                 judge: Judge, timeout_ms: int | None = None, services: tuple[ServiceSpec, ...] = ()) -> dict[str, Any]:
    """Re-run the minimal change in a journaled capsule, beside ``services``; witness that run."""
    capsule_id = (await service.create(record.spec, record.network_spec)).capsule_id
    try:
        root = await service.open_root(capsule_id)
        await trio.to_thread.run_sync(apply_units, root, files, service.journal, capsule_id)
        outcome = UNRESOLVED
        async with started(service, capsule_id, services) as ready:  # stopped before the witness
            if ready:
                ran = await service.exec(exec_request(capsule_id, argv, None, timeout_ms))
                outcome = judge(ran.reply)
        made = await make_witness(service, capsule_id, WitnessOptions("zstd", True))
        return {"fails_again": outcome == FAIL, "outcome": outcome, "root_hash": made["root_hash"]}
    finally:
        with trio.CancelScope(shield=True):
            await service.destroy(capsule_id)

