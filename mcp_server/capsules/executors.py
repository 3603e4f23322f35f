"""Where deltamin's trials and witness replays run: local capsules, or a REAPI cluster (issue 17).

One interface, two implementations:

- ``LocalExecutor`` (the default) is what ccw always did: a trial is a scratch capsule
  over the capsule's base with a subset of the change written into it, the target
  command run there; a replay is replays.replay.  Its parallelism is this machine's.
- ``ReapiExecutor`` (capsules/remote.py; ``CCW_REAPI_URL``, ``ccw serve --reapi URL``)
  sends the same trial to a Remote Execution API cluster as an Action over a Merkle
  tree of the base with the subset laid over it, and judges the ActionResult as a
  local reply is judged.  Its parallelism is the cluster's capacity.

A trial (trials.Trial) returns what a predicate judges (trials.Finished): exit code, timed
out, stdout and stderr; so FAIL/PASS/UNRESOLVED are decided by the same code either way.

Services a trial's command ran beside start in a local trial's scratch capsule, ready
before the command (replay_steps.beside, as a replay starts a witness's); one that does
not become ready makes the trial UNRESOLVED.  A cluster's bot cannot start them, so the
REAPI executor refuses such trials before any runs (``check_trials``), and replays of
such witnesses.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any, Protocol

import trio

from mcp_server.capsules.replay import ReplayOptions, replay
from mcp_server.capsules.replay_steps import beside, services_of
from mcp_server.capsules.service import CapsuleService
from mcp_server.capsules.service_spec import ServiceSpec
from mcp_server.capsules.trials import Finished, ServicesNotReady, Trial, TrialRunner, apply_units
from mcp_server.journal_records import CapsuleRecord
from sandbox.errors import CcwError

LOCAL_PARALLEL = 2  # trials at once on this machine: a 2-core VM


class Executor(TrialRunner, Protocol):
    """Runs trials (trials.TrialRunner) and replays; counts what it served from a cache."""

    name: str
    cache_hits: int  # trials answered by the action cache (0 locally)

    async def replay(self, service: CapsuleService, path: Path, expected_root: str | None,
                     options: ReplayOptions) -> dict[str, Any]:
        """capsule_replay's answer for the witness at ``path``, with what its replayer allows."""

    def summary(self) -> dict[str, Any]:
        """What a result reports of the executor (kind, and the cluster's counts)."""

    def close(self) -> None:
        """Let go of what the executor holds (a channel)."""


class LocalExecutor:
    """Trials in scratch capsules on this machine, replays by replays.replay: ccw's own behaviour."""

    name = "local"

    def __init__(self, parallelism: int = LOCAL_PARALLEL) -> None:
        self.parallelism = parallelism
        self.cache_hits = 0

    async def run_trial(self, service: CapsuleService, trial: Trial) -> Finished:
        """A scratch capsule over the base, the subset written in, its services started, the command run there."""
        record = trial.record
        network = record.network_spec
        async with service.scratch(record.spec, network=network) as capsule, contextlib.AsyncExitStack() as stack:
            root = await service.open_root(capsule)
            await trio.to_thread.run_sync(apply_units, root, trial.files)
            try:
                await stack.enter_async_context(beside(service, capsule, record.spec, network, trial.services))
            except CcwError as exc:
                if exc.code == "TIMEOUT" and "service" in exc.details:  # it did not become ready
                    return ServicesNotReady(exc.message)
                raise
            request = dataclasses.replace(trial.request, capsule_id=capsule)
            reply: Finished = (await service.scratch_exec(request, record.spec, network)).value
            return reply

    def check_trials(self, service: CapsuleService, record: CapsuleRecord, services: tuple[ServiceSpec, ...]) -> None:
        """Services need this process's (replay_steps.services_of); nothing else is refused here."""
        if services:
            services_of(service)

    async def replay(self, service: CapsuleService, path: Path, expected_root: str | None,
                     options: ReplayOptions) -> dict[str, Any]:
        """replays.replay, here."""
        return await replay(service, path, expected_root, options)

    def summary(self) -> dict[str, Any]:
        """Only the kind: nothing is cached locally."""
        return {"kind": self.name}

    def close(self) -> None:
        """Nothing to let go of."""


def executor_for(reapi_url: str, parallelism: int = 0, platform: str = "") -> Executor:
    """The executor the settings name: REAPI at ``reapi_url`` (``platform``: ``k=v,k=v``)
    when set, else local capsules."""
    if not reapi_url:
        return LocalExecutor()
    # Imported here: gRPC only when a cluster is used.
    from mcp_server.capsules.remote import ReapiExecutor, platform_from

    return ReapiExecutor(reapi_url, parallelism or None, platform_from(platform))
