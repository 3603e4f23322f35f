"""A race's rows run on a REAPI cluster (capsule_race when ``CCW_REAPI_URL`` is set; issue 39).

A cluster cannot run a command in a live capsule, but it can run one over that capsule's
tree: the base with the capsule's whole change laid over it is an input root, as a
deltamin trial's is (a trial of every unit: capsules/trials.py ``units_from``, sent by
capsules/remote.py's ``ReapiExecutor.run_trial``, which uploads only the blobs the
cluster's CAS misses, so N attempts over one base share it).  What that changes:

- **Nothing is journaled or written in the capsule**: the command ran on a bot, over a
  copy; its writes stay there.  A race asks which attempt passes, and the attempt itself
  is what is compared: its diff and the verdict of its promotion's dry run are taken from
  the capsule, as a local row's are.  A row that must change its capsule races locally.
- **What is measured**: the exit and timeout from the ActionResult; ``duration_ms`` is
  the Action's wall time seen from here (upload and queueing included); no usage (a
  bot's cgroup figures do not come back in an ActionResult).
- **What a bot cannot run** (a capsule with an allowlist network: ``check_trials``)
  races locally, as before; each row says where it ran (``where``).
- The change is read in the capsule's turn (no exec of its lands while it is read),
  with the environment's whitelisted values this server holds, as a trial's are.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import trio

from mcp_server.capsules.exec import exec_request
from mcp_server.capsules.service import CapsuleService
from mcp_server.capsules.trials import Trial, TrialRunner, units_from
from mcp_server.capsules.turns import TakesTurn
from mcp_server.fs import changeset
from mcp_server.fs.view import RootView

READ = TakesTurn("race: read the change")


class Runner(TrialRunner, Protocol):
    """An executor (capsules/executors.py) as a race uses it: trials, and its name for the rows."""

    name: str


async def trial(service: CapsuleService, capsule_id: str, argv: tuple[str, ...], timeout_ms: int | None) -> Trial:
    """The capsule's whole change as one trial of ``argv``, read in its turn."""
    async with service.turn(capsule_id, READ):
        record = service.live_record(capsule_id)
        changes = await service.changes(capsule_id)
        root_fd = await service.open_root(capsule_id)

        def read() -> Trial:
            with RootView.from_fd(root_fd) as capsule, RootView.open(record.base) as base:
                units = units_from(changeset.expand(changes, base, capsule), base, capsule).units
            return Trial(record, {unit.path: unit for unit in units}, exec_request(capsule_id, argv, None, timeout_ms))

        return await trio.to_thread.run_sync(read)


async def run(service: CapsuleService, runner: Runner, made: Trial) -> dict[str, Any]:
    """The trial on the cluster: a row's exit, timeout and duration (no usage: see the module's docstring)."""
    started = time.monotonic()
    ran = await runner.run_trial(service, made)
    return {"exit_code": ran.exit_code, "timed_out": bool(ran.timed_out),
            "duration_ms": int((time.monotonic() - started) * 1000), "usage": {}}
