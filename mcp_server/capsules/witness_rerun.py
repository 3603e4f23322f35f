"""What a capsule's unended services read, for its witness: found by running its runs again.

A witness carries of the base what the runs read (witness_base.py).  A run of a service
is journaled when it ends (capsules/services.py), with its touched sets; while it still
runs, or after the helper lost it, nothing records what it read, and the helper cannot
say: its progress reports name the files a running exec wrote, never those it read
(sandbox/execution.py), and a witness may not end the caller's services to learn it.
Yet a replay starts those services beside the execs that had them, and the execs talk
to them: the files they read (an app's templates, the files an ``http.server`` serves,
a venv's packages) must be in the witness's base.  Carrying the whole base (what a
witness did) is right but often huge: a ``.venv`` is thousands of files.

So the witness runs the capsule's runs again, as its replay will (replay_steps.py): a
new journaled capsule over the capsule's own base, the file-tool writes and the execs
redone in order, each stretch of execs beside the services its rows name, started and
ready before it and stopped after it (service_beside.started), so each service's run ends
and is journaled with what it read to start, to become ready and to serve those execs.
Those rows join the execs' in what the witness carries.

Why over the whole base, and not by replaying a smaller witness and adding what was
missing: an open of a file that is not there gives fanotify nothing, so a re-run over
less than the base cannot see what it lacked.  Why it is sound: the re-run counts only
when it went as recorded, every service ready and every exec ending as its row says
(core/replaydiff.py's fields, as a replay compares them); then what its services read is
what a replay's will read, given the same files.  Otherwise (a flaky command, a variable
whose value this process does not have, a service that did not start) the answer is
None and the witness carries the whole base, as before.  It costs the runs' time again,
and only for a witness made while a service its execs ran beside has not ended.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import trio

from mcp_server.capsules.exec import exec_request
from mcp_server.capsules.replay_steps import Tally, apply_write, stretches
from mcp_server.capsules.service import CapsuleService
from mcp_server.capsules.service_beside import specs_for, started
from mcp_server.core import replaydiff
from mcp_server.journal import CapsuleRecord
from sandbox.errors import CcwError


def _steps(execs: list[dict[str, Any]], writes: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The journal's execs and writes in the form replay_steps.py walks (a manifest's, with blobs
    named by the row they came from)."""
    blobs: dict[str, bytes] = {}
    entries = []
    for ex in execs:
        entry = {**ex, "services": json.loads(ex["services"]) if ex.get("services") else None, "stdin_blob": None}
        if ex.get("stdin_b64") is not None:
            entry["stdin_blob"] = f"stdin {ex['seq']}"
            blobs[entry["stdin_blob"]] = base64.b64decode(ex["stdin_b64"])
        entries.append(entry)
    changes = []
    for write in writes:
        change = {**write, "blob": None}
        if write.get("content_b64") is not None:
            change["blob"] = f"write {write['seq']}"
            blobs[change["blob"]] = base64.b64decode(write["content_b64"])
        changes.append(change)
    return {"execs": entries, "writes": changes}, blobs


async def services_read(service: CapsuleService, record: CapsuleRecord, execs: list[dict[str, Any]],
                        writes: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The journal rows of the services' runs in a re-run of the capsule's runs (see the essay), or
    None when the re-run did not go as recorded, or no service can start in this process."""
    if service.services is None:
        return None
    manifest, blobs = _steps(execs, writes)
    walk = list(stretches(manifest, Tally()))
    # Runs after the last stretch beside services change nothing those services did.
    walk = walk[:1 + max((i for i, (forms, _) in enumerate(walk) if forms), default=-1)]
    rerun_id = (await service.create(record.spec, record.network_spec)).capsule_id
    try:
        for forms, steps in walk:
            async with started(service, rerun_id, specs_for(service, record.capsule_id, forms)) as ready:
                if not ready or not await _redo(service, rerun_id, steps, blobs):
                    return None
        return [ex for ex in service.journal.execs(rerun_id) if ex.get("service") is not None]
    except CcwError:
        return None  # the re-run could not be made: the witness carries the whole base
    finally:
        with trio.CancelScope(shield=True):
            await service.destroy(rerun_id)


async def _redo(service: CapsuleService, capsule_id: str, steps: list[tuple[str, dict[str, Any]]],
                blobs: dict[str, bytes]) -> bool:
    """Redo one stretch's writes and execs; whether every exec ended as recorded."""
    for kind, entry in steps:
        if kind == "write":
            root = await service.open_root(capsule_id)
            await trio.to_thread.run_sync(apply_write, root, entry, blobs)
            continue
        stdin = blobs[entry["stdin_blob"]] if entry["stdin_blob"] else None
        ran = await service.exec(exec_request(capsule_id, entry["argv"], entry["cwd"], entry.get("timeout_ms"), stdin))
        reply = {name: getattr(ran.reply, name) for name in replaydiff.EXEC_FIELDS}
        if replaydiff.exec_mismatches(entry, reply):
            return False
    return True
