"""Services beside runs that nobody journals: a replay's command, a deltamin trial's.

An exec's journal row names the services that ran beside it (capsules/services.py:
``beside``), and a witness carries their specs without any value.  To re-run that exec
faithfully, a replay (or a trial of part of its change) starts the same services in its
scratch capsule first and waits until each is ready, as ``capsule_service_start`` would;
then it runs the command; then the services end with the block, each gone (the helper
says so) before the block is left.  Their runs are not
journaled (the scratch capsule is not), their output goes to a ring in the state dir's
tmp dir that goes with them, and nothing restarts them: a service that exits during the
block is simply gone, and the command's outcome will say so.  A service that does not
become ready fails the block (TIMEOUT, with its last lines), before the command runs.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import AsyncIterator, Sequence
from typing import Any

import trio

from mcp_server.capsules.service_log import LogRing
from mcp_server.capsules.service_ready import TAIL_LINES
from mcp_server.capsules.service_run import ServiceRun
from mcp_server.capsules.service_spec import ServiceSpec
from mcp_server.capsules.services import OUTPUT_CAP, PROGRESS_MS, Services
from sandbox.errors import CcwError
from sandbox.spec import CapsuleSpec

END_GRACE_MS = 1000  # as a destroyed capsule's services get (Services.stop_all)
END_WAIT_S = 30.0  # the most the block's end waits for the helper's answers, even when cancelled


@contextlib.asynccontextmanager
async def running(services: Services, capsule_id: str, capsule: CapsuleSpec, network: Any,
                  specs: Sequence[ServiceSpec]) -> AsyncIterator[list[ServiceRun]]:
    """``specs`` started in the scratch capsule ``capsule_id`` (made from ``capsule``, with the
    allowlist ``network``), each ready before the block; all ended after it."""
    logs = services.state.tmp_dir / "services" / capsule_id
    try:
        async with trio.open_nursery() as nursery:
            runs: list[ServiceRun] = []
            try:
                for spec in specs:
                    run = ServiceRun(spec.in_capsule(capsule_id), LogRing(logs, spec.name))
                    runs.append(run)
                    nursery.start_soon(_serve, services, run, capsule, network)
                    answer = await services.await_ready(run)
                    if not answer["ready"]:
                        raise CcwError("TIMEOUT", f"service {spec.name!r} did not become ready for the run: "
                                       f"{answer.get('why')}; its last lines:\n{run.log.read(tail=TAIL_LINES).text}",
                                       {"service": spec.name, "state": run.state})
                yield runs
            finally:
                # A closed connection alone ends a service only when the helper next looks, after
                # the next run began: a replay's exec past the stretch still reached the server.
                with trio.move_on_after(END_WAIT_S, shield=True):
                    for run in reversed(runs):
                        if not run.finished.is_set():
                            await services.end(run, END_GRACE_MS)
                nursery.cancel_scope.cancel()  # one the helper did not answer: its closed connection ends it
    finally:
        shutil.rmtree(logs, ignore_errors=True)


async def _serve(services: Services, run: ServiceRun, capsule: CapsuleSpec, network: Any) -> None:
    request = run.spec.request(capsule, PROGRESS_MS, OUTPUT_CAP)
    run.starting()
    try:
        reply = await services.call_helper(network, request, run)
    except CcwError as exc:
        run.set_state("failed", exc.message)
    else:
        run.exit_code, run.signal = reply.exit_code, reply.signal
        run.set_state("exited")
    finally:
        run.finished.set()
