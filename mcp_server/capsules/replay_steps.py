"""A replay's steps: the recorded execs re-run in the replay capsule beside the services they
ran beside, the file-tool writes redone between them, in sequence, and each exec compared.

replay.py verifies the witness, rebuilds its base and makes the capsule; this module runs
what the witness recorded in it.  Some facts about the services a witness names
(capsules/services.py runs them, capsules/witness.py records them):

- An exec's entry names the services that ran beside it (``services``: their specs, with
  variable names and never values).  A service's own run is an entry too (``service``,
  its name): it lasted as long as the service did, from before the first exec that used
  it to after the last, and what it printed depends on when it was stopped.  So it is
  not re-run as a command: the replay starts the service from its spec, beside the execs
  that name it, and reports each such entry as not compared (``services.not_compared``).
- Consecutive execs usually name the same services (one run of the app beside a test
  suite run three times).  The replay keeps them running across such a stretch, the
  file-tool writes recorded within it included, and ends them when an exec names
  another set (or none): one start per stretch, as the recorded capsule had one run.
  A service keeps state between requests (a database's rows, a server's cache), so
  starting it afresh before each exec would replay something the capsule never did.
  When the set changes, all of the old set end and the new set starts, even a service
  named in both: the recorded one kept running there.  Services start together in one
  block (service_scratch.running), and blocks end in the reverse order they began, so
  one service cannot end while a later one goes on; a set that changes between execs
  is rare, and the exec after the change sees a freshly started service.
- Each service of a stretch is ready (its recorded readiness) before the stretch's first
  exec, or the replay stops with TIMEOUT and the service's last lines.  Its variables'
  values are the replayer's (``ReplayOptions.env``), as the execs' are: every value the
  replayer passed, never one of this process.  Nothing restarts a service that ends.
- Only a process that runs services can start them: a CapsuleService without them (a
  ccw-bot's) refuses with UNSUPPORTED, and so does a REAPI executor (capsules/remote.py),
  for a replay of such a witness and for deltamin's trials of such a capsule.

An interactive exec's input (its ``stdin_blob``) is fed as its stdin at once, unless it
ran on a terminal (its ``console`` says ``tty``): then it runs on a terminal again, the
input typed in the recorded steps, each after the output that came before it
(capsules/console.py says how, and why a program asking on /dev/tty needs it).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from mcp_server.capsules.console import Console
from mcp_server.capsules.exec import exec_request, whitelisted
from mcp_server.capsules.networks import Traced
from mcp_server.capsules.notes import restore_mtimes
from mcp_server.capsules.service import CapsuleService
from mcp_server.capsules.service_scratch import running
from mcp_server.capsules.service_spec import ServiceSpec
from mcp_server.core import replaydiff, volatile
from mcp_server.core.netrules import NetworkSpec
from mcp_server.fs import witness as wfmt
from mcp_server.fs.promote import make_symlink, remove_tree
from mcp_server.fs.view import RootView
from sandbox.errors import CcwError
from sandbox.ops import ExecRequest
from sandbox.replies import ExecReply, Touched
from sandbox.spec import CapsuleSpec

if TYPE_CHECKING:
    from mcp_server.capsules.services import Services


def apply_write(root_fd: int, write: dict[str, Any], blobs: dict[str, bytes]) -> None:
    """Redo one recorded file-tool change inside a capsule (through its root fd)."""
    with RootView.from_fd(root_fd) as view:
        path = write["path"]
        parent = path.rpartition("/")[0]
        if write["action"] in ("write", "symlink") and parent:
            view.makedirs(parent)
        if write["action"] == "write":
            view.write_bytes(path, blobs[write["blob"]], write.get("mode"), write.get("mtime_ns"))
        elif write["action"] == "symlink":
            make_symlink(view, write["target"], path)
        elif write["action"] == "delete":
            remove_tree(view, path)
        elif write["action"] == "chmod" and write.get("mode") is not None:
            view.chmod(path, write["mode"])


# --- services beside a scratch capsule's runs ----------------------------------------


def services_of(service: CapsuleService) -> Services:
    """This process's services, or UNSUPPORTED: without them, nothing can start a witness's services."""
    if service.services is None:
        raise CcwError("UNSUPPORTED", "this process runs no services (a ccw-bot's replay, or a test's), so it cannot "
                                      "start the services the runs had beside them: replay it (or run deltamin) "
                                      "with ccw itself, locally")
    return service.services


@contextlib.asynccontextmanager
async def beside(service: CapsuleService, capsule_id: str, spec: CapsuleSpec, network: NetworkSpec | None,
                 specs: Sequence[ServiceSpec]) -> AsyncIterator[None]:
    """``specs`` started and ready in the scratch capsule ``capsule_id`` (made from ``spec``) for the
    block, ended after it; nothing at all without specs."""
    if not specs:
        yield
        return
    try:
        async with running(services_of(service), capsule_id, spec, network, specs):
            yield
    except BaseExceptionGroup as group:  # its nursery wraps what the start or the block raised
        sole = _sole_error(group)
        if sole is None:
            raise
        raise sole from None


def _sole_error(group: BaseExceptionGroup[BaseException]) -> CcwError | None:
    leaves: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending:
        one = pending.pop()
        if isinstance(one, BaseExceptionGroup):
            pending.extend(one.exceptions)
        else:
            leaves.append(one)
    return leaves[0] if len(leaves) == 1 and isinstance(leaves[0], CcwError) else None


def witness_specs(capsule_id: str, forms: Sequence[dict[str, Any]], spec: CapsuleSpec,
                  values: Mapping[str, str]) -> tuple[ServiceSpec, ...]:
    """The services of a witness's exec, for the replay capsule ``capsule_id`` (made from ``spec``):
    their variables are the replayer's ``values``, as its execs' are."""
    env = whitelisted(spec.env_whitelist, values)
    return tuple(dataclasses.replace(ServiceSpec.from_json(capsule_id, form), env=env) for form in forms)


def services_named(manifest: dict[str, Any]) -> bool:
    """Whether some exec of the witness ran beside services (its replay starts them)."""
    return any(ex.get("services") and ex.get("service") is None for ex in manifest["execs"])


def service_env_names(manifest: dict[str, Any]) -> set[str]:
    """The variables the witness's services were given by name (a replay's ``env_missing`` counts them)."""
    return {name for ex in manifest["execs"] for form in ex.get("services") or () for name in form.get("env") or ()}


# --- the steps -----------------------------------------------------------------------


@dataclass
class Tally:
    """What the replayed execs did, gathered as they run."""

    mismatches: list[dict[str, Any]] = field(default_factory=list)
    output_diffs: list[dict[str, Any]] = field(default_factory=list)
    touched: dict[int, Touched] = field(default_factory=dict)  # by exec seq
    cpu_ms: int | None = 0  # None once some exec's figure is unknown
    rss_max_kb: int | None = None
    started: list[dict[str, Any]] = field(default_factory=list)  # each set of services started, and its execs
    not_compared: list[dict[str, Any]] = field(default_factory=list)  # the witness's runs of services

    def add_exec(self, ex: dict[str, Any], reply: ExecReply, blobs: dict[str, bytes],
                 network: list[dict[str, Any]] | None) -> None:
        """Compare one replayed exec with its record (and its connection attempts) and add up its usage."""
        self.mismatches += replaydiff.exec_mismatches(ex, {name: getattr(reply, name)
                                                           for name in replaydiff.EXEC_FIELDS})
        reached = replaydiff.network_mismatch(ex, network)
        if reached is not None:
            self.mismatches.append(reached)
        self.touched[ex["seq"]] = reply.touched
        kept = ex.get("output") or {}
        for stream, data in (("stdout", reply.stdout), ("stderr", reply.stderr)):
            recorded = (blobs[kept[stream]["blob"]], kept[stream]["cap"]) if stream in kept else None
            diff = replaydiff.output_diff(ex, stream, wfmt.blob_hash(data), data, recorded)
            if diff is not None:
                self.output_diffs.append(diff)
        usage = reply.usage
        self.cpu_ms = None if self.cpu_ms is None or usage.cpu_ms is None else self.cpu_ms + usage.cpu_ms
        if usage.rss_max_kb is not None:
            self.rss_max_kb = max(self.rss_max_kb or 0, usage.rss_max_kb)

    def services_report(self) -> dict[str, Any]:
        """``services`` of the replay's result: what it started beside which execs, and what it did not re-run."""
        return {"started": self.started, "not_compared": self.not_compared}


Step = tuple[str, dict[str, Any]]  # ("exec" | "write", its entry)


def stretches(manifest: dict[str, Any], tally: Tally) -> Iterator[tuple[list[dict[str, Any]], list[Step]]]:
    """The recorded steps in sequence, cut where the services beside the execs change: (their
    specs, the steps).  A service's own runs are left out, noted in ``tally`` as not compared."""
    steps = sorted([("exec", ex) for ex in manifest["execs"]] + [("write", w) for w in manifest.get("writes", [])],
                   key=lambda step: step[1]["seq"])
    forms: list[dict[str, Any]] = []
    stretch: list[Step] = []
    for kind, entry in steps:
        if kind == "exec" and entry.get("service") is not None:
            tally.not_compared.append({"exec": entry["seq"], "service": entry["service"], "argv": entry["argv"]})
            continue
        if kind == "exec" and (entry.get("services") or []) != forms:
            if stretch:
                yield forms, stretch
            forms, stretch = entry.get("services") or [], []
        stretch.append((kind, entry))
    if stretch:
        yield forms, stretch


async def rerun(service: CapsuleService, capsule_id: str, spec: CapsuleSpec, manifest: dict[str, Any],
                blobs: dict[str, bytes], network: NetworkSpec | None, values: Mapping[str, str],
                rules: Mapping[int, NetworkSpec] | None = None) -> Tally:
    """Redo the recorded execs and file-tool writes in sequence, beside their services, comparing each exec.
    ``rules``: the rules each exec runs under, by seq (capsules/netlive.py ``replay_rules``), set on the
    replay capsule's session before it runs; without, ``network`` throughout."""
    tally = Tally()
    for forms, steps in stretches(manifest, tally):
        if forms:
            tally.started.append({"services": [form["name"] for form in forms],
                                  "execs": [entry["seq"] for kind, entry in steps if kind == "exec"]})
        async with beside(service, capsule_id, spec, network, witness_specs(capsule_id, forms, spec, values)):
            for kind, entry in steps:
                ruled = (rules or {}).get(entry["seq"]) if kind == "exec" else None
                if ruled is not None:
                    await service.networks.set_rules(capsule_id, ruled, "the replay (the witness's rules)")
                await _step(service, capsule_id, spec, kind, entry, blobs, ruled or network, values, tally)
    return tally


async def _step(service: CapsuleService, capsule_id: str, spec: CapsuleSpec, kind: str, entry: dict[str, Any],
                blobs: dict[str, bytes], network: NetworkSpec | None, values: Mapping[str, str], tally: Tally) -> None:
    if kind == "write":
        root = await service.open_root(capsule_id)
        await trio.to_thread.run_sync(apply_write, root, entry, blobs)
        return
    cut = (entry.get("usage") or {}).get("cut_short")
    if cut:  # its end was never known (capsules/exec.py cut_entry): nothing to compare a re-run with
        tally.mismatches.append({"kind": "exec", "exec": entry["seq"], "field": "cut_short", "expected": cut,
                                 "actual": None, "argv": entry["argv"],
                                 "note": "the recorded run was cut short, so it is not re-run: what it wrote and "
                                         "printed is not known, and no replay can reproduce it"})
        return
    stdin = blobs[entry["stdin_blob"]] if entry.get("stdin_blob") else None
    request = exec_request(capsule_id, entry["argv"], entry["cwd"], entry.get("timeout_ms"), stdin)
    if (entry.get("console") or {}).get("tty"):
        ran = await _on_a_terminal(service, request, spec, network, values, stdin or b"", entry["console"])
    else:
        ran = await service.scratch_exec(request, spec, network, values)
    tally.add_exec(entry, ran.value, blobs, ran.attempts)
    if entry.get("written_mtimes"):  # as the recorded run left them (notes.py: .pyc files, make)
        root = await service.open_root(capsule_id)
        await trio.to_thread.run_sync(restore_mtimes, root, entry["written_mtimes"])


async def _on_a_terminal(service: CapsuleService, request: ExecRequest, spec: CapsuleSpec,
                         network: NetworkSpec | None, values: Mapping[str, str], typed: bytes,
                         record: dict[str, Any]) -> Traced:
    """An interactive exec of a terminal re-run on one, as it ran: what was typed given in its
    recorded steps (capsules/console.py ``Console.replay``), its output the pty's."""
    with Console(terminal=True) as console:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(console.replay, typed, record)
            ran = await service.scratch_exec(request, spec, network, values, console)
            nursery.cancel_scope.cancel()  # a step still waiting when the run ended is never typed
    return ran


def change_mismatches(
    manifest: dict[str, Any], tally: Tally, actual_changes: list[dict[str, Any]], globs: list[str],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Execs whose written files differ from their record, and changes that differ from the recorded ones;
    and the volatile paths left out of both (exec null: a change no compared written set named)."""
    mismatches, apart = [], []
    changed = {c["path"] for c in manifest["changes"]}
    changed_now = {c["path"] for c in actual_changes}
    for ex in manifest["execs"]:
        if ex["seq"] not in tally.touched:  # a service's exec: not re-run, so nothing to compare
            continue
        # The record's touched sets are the journal's form of the reply's (Touched.to_args).
        touched = tally.touched[ex["seq"]].to_args()
        wrote = replaydiff.written_mismatch(ex, touched, changed, changed_now, globs)
        if wrote is not None:
            mismatches.append(wrote)
        apart += replaydiff.volatile_written(ex, touched, changed, changed_now, globs)
    named = {entry["path"] for entry in apart}
    _, volatile_changes = volatile.split(changed | changed_now, globs)
    apart += [{"exec": None, "path": path, "recorded": path in changed, "replayed": path in changed_now}
              for path in sorted(volatile_changes - named)]
    changes = replaydiff.change_mismatches(manifest["changes"], actual_changes, globs)
    return mismatches + [_suggested(m) for m in changes], apart


def _suggested(mismatch: dict[str, Any]) -> dict[str, Any]:
    """A change mismatch, with the glob of its path suggested when only the file's bytes differ: an
    output rewritten on every run (a report with timings), volatile as a random name is."""
    want, got = mismatch["expected"], mismatch["actual"]
    if want is None or got is None or want[0] != "file" or want[:3] != got[:3]:
        return mismatch
    return {**mismatch, "suggest_volatile": [volatile.literal(mismatch["path"])]}


def set_aside(mismatches: list[dict[str, Any]],
              ignored: frozenset[str] | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The file mismatches promotion would carry, and apart from them the differences in paths the
    witness's base ignores (capsules/witness_ignore.py), which promotion leaves behind.  A written-set
    mismatch is split by path, each side keeping its own names; None: nothing is set apart."""
    if ignored is None:
        return mismatches, []
    kept: list[dict[str, Any]] = []
    apart: list[dict[str, Any]] = []
    for mismatch in mismatches:
        if mismatch["kind"] == "change":
            (apart if mismatch["path"] in ignored else kept).append(mismatch)
            continue
        sides = ("expected_only", "actual_only")
        out = {side: [p for p in mismatch[side] if p in ignored] for side in sides}
        rest = {side: [p for p in mismatch[side] if p not in ignored] for side in sides}
        if any(out.values()):
            apart.append({key: value for key, value in {**mismatch, **out}.items() if key != "suggest_volatile"})
        if any(rest.values()):
            kept.append({**mismatch, **rest, "suggest_volatile": volatile.suggest(*rest.values())})
    return kept, apart
