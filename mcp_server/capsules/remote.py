"""Trials and replays on a REAPI cluster (issue 17): the ``reapi`` executor.

A trial becomes an Action:

- The input root is the capsule's base, scanned once per base (each file digested once
  per path, size and mtime, so a deltamin's trials and a repeated deltamin hash only
  what changed), with the trial's subset laid over it: writes and hunks as file
  contents, deletes as absences (a directory left empty stays, as it does in a local
  scratch capsule), symlinks, mode changes.  Trials share almost every blob, so after
  the first only the few files a subset changes (and the Directories above them) are
  missing from the CAS and uploaded.
- The Command carries argv, the environment a local run would get (sandbox.spec.exec_env but
  HOME: the env whitelist's values from this server, PATH with the workspace's .venv), the
  working directory relative to the workspace, and one variable ``CCW_REAPI_CAPSULE``
  (JSON: the workspace path the bot mounts the input root at, the clock offset, the
  limits) that ccw-bot takes out again before the command sees its environment.  The
  absolute workspace path matters: tools installed in a .venv name it in their shebangs.
- The Action carries the timeout and platform properties (``CCW_REAPI_PLATFORM``,
  ``k=v,k=v``; default OSFamily=linux).  Confirmation runs set ``skip_cache_lookup``
  and ``do_not_cache``: a flaky command must be seen to flake, and not be remembered.

A server that loses blobs (an in-memory CAS restarted, an evicted blob) answers
FAILED_PRECONDITION, and one that restarts drops the Execute stream (UNAVAILABLE):
both are retried for up to a minute, each time after FindMissingBlobs and re-uploading
what is gone.

The answer is judged as a local reply: exit code, stdout and stderr from the
ActionResult; the operation's DEADLINE_EXCEEDED status is "timed out".  Any other
failed status is the cluster's failure, not the command's, and is raised, so it never
counts as FAIL or PASS.

A replay becomes one Action too: the witness file as the input root, and ccw-bot runs
replays.replay over it in its capsules and answers with the result as JSON on stdout,
so replay_ok is judged by the same code as a local replay's (and a repeated replay of
the same witness is an action-cache hit).  Whether the witness may replay at all is
decided here, by this state dir's key (replays.admit, on the archive's head only): the
bot's key is its own, so it replays with ``allow_untrusted``, and the answer's
``signature`` is ours.  The values of the replayer's ``env`` travel in the Command's
environment (as a trial's whitelisted values do), and the bot gives the commands those
and nothing of its own.  A replay with an allowlist network, or of a witness without
blobs (whose base is a directory on this machine), runs locally only (UNSUPPORTED).

Network: a capsule with an allowlist network is refused here (UNSUPPORTED): a bot has
no egress policy of the capsule's to enforce.

Services: a bot runs one command per Action and cannot start services beside it, so
trials of a capsule whose target command ran beside services, and replays of a witness
whose execs did, are refused here too (UNSUPPORTED, before anything is sent): they run
locally (capsules/replay_steps.py says how).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from mcp_server.capsules.exec import whitelisted
from mcp_server.capsules.replay import ReplayOptions, admit
from mcp_server.capsules.replay_steps import services_named
from mcp_server.capsules.service import CapsuleService
from mcp_server.capsules.service_spec import ServiceSpec
from mcp_server.capsules.trials import Finished, Trial, Unit
from mcp_server.capsules.witness import signature_of, witness_key
from mcp_server.journal_records import CapsuleRecord
from mcp_server.reapi.action import CommandSpec, build_action
from mcp_server.reapi.client import Executed, ReapiClient, TrioReapi
from mcp_server.reapi.merkle import (
    DirEntry,
    Entry,
    FileEntry,
    SymlinkEntry,
    build_tree,
    digest_file,
    scan_directory,
)
from mcp_server.reapi.protos import code_pb2, re_pb2
from sandbox.errors import CcwError
from sandbox.spec import exec_env, resolve_cwd

CAPSULE_VAR = "CCW_REAPI_CAPSULE"  # taken out of the environment by ccw-bot
DEFAULT_PARALLEL = 4
REPLAY_ARGV = ["ccw-bot", "replay"]  # run by ccw-bot itself, not exec'd
RETRY_WINDOW_S = 60.0  # how long one Execute is retried while the server is away or lost its inputs
RETRY_S = 1.0
_RETRIED = ("UNAVAILABLE", "FAILED_PRECONDITION")  # gRPC statuses worth another upload and Execute
QUEUE_SLACK_S = 600.0  # how long Execute may wait beyond the action's timeout (queueing, a requeue)

# (path, size, mtime_ns, ino) -> digest: a base's files are hashed once per process.
_DIGESTS: dict[tuple[str, int, int, int], re_pb2.Digest] = {}


@dataclass(frozen=True)
class RemoteRun:
    """An ActionResult as a failure predicate sees a run."""

    exit_code: int | None
    timed_out: bool
    stdout: bytes
    stderr: bytes


def platform_from(text: str) -> dict[str, str]:
    """``k=v,k=v`` platform properties (CCW_REAPI_PLATFORM); OSFamily=linux when empty."""
    pairs = [p.split("=", 1) for p in text.split(",") if p.strip()]
    if any(len(p) != 2 for p in pairs):
        raise CcwError("INVALID_ARGUMENT", f"CCW_REAPI_PLATFORM={text!r}: want name=value[,name=value]")
    return {k.strip(): v.strip() for k, v in pairs} or {"OSFamily": "linux"}


def _digested_base(base: str) -> dict[str, Entry]:
    entries = scan_directory(Path(base))
    out: dict[str, Entry] = {}
    for where, entry in entries.items():
        if isinstance(entry, FileEntry) and entry.path is not None:
            info = entry.path.stat()
            stamp = (str(entry.path), info.st_size, info.st_mtime_ns, info.st_ino)
            digest = _DIGESTS.get(stamp)
            if digest is None:
                digest = _DIGESTS[stamp] = digest_file(entry.path)
            entry = FileEntry(path=entry.path, executable=entry.executable, digest=digest)
        out[where] = entry
    return out


def overlay(base: dict[str, Entry], files: dict[str, Unit]) -> dict[str, Entry]:
    """The base's entries with a trial's whole-path units laid over them (trials.apply_units' tree)."""
    entries = dict(base)

    def remove(path: str) -> None:
        for where in [w for w in entries if w == path or w.startswith(path + "/")]:
            del entries[where]
        parent = path.rpartition("/")[0]
        if parent and not any(w.startswith(parent + "/") for w in entries):
            entries[parent] = DirEntry()  # the emptied directory stays, as in a capsule

    for path in sorted(files, key=lambda p: (p.count("/"), p)):
        unit = files[path]
        if unit.action in ("write", "symlink"):
            remove(path)
            entries[path] = (FileEntry(data=unit.content or b"", executable=bool((unit.mode or 0o644) & 0o111))
                             if unit.action == "write" else SymlinkEntry(unit.target or ""))  # fmt: skip
            parts = path.split("/")
            for depth in range(1, len(parts)):  # an ancestor marked empty is not empty now
                if isinstance(entries.get("/".join(parts[:depth])), DirEntry):
                    del entries["/".join(parts[:depth])]
        elif unit.action == "delete":
            remove(path)
        elif unit.action == "chmod" and isinstance(entries.get(path), FileEntry):
            old = entries[path]
            assert isinstance(old, FileEntry)
            entries[path] = FileEntry(old.data, old.path, bool((unit.mode or 0) & 0o111), old.digest)
    return entries


def _relative(path: str, workspace: str) -> str:
    """``path`` (absolute, inside the workspace) relative to it; "" for the workspace itself."""
    relative = os.path.relpath(path, workspace)
    return "" if relative == "." else relative


def _judged(executed: Executed, client: ReapiClient) -> RemoteRun:
    status = executed.response.status
    if status.code not in (code_pb2.OK, code_pb2.DEADLINE_EXCEEDED):
        raise CcwError("UNAVAILABLE", f"the cluster could not run the trial: {status.message or status.code}",
                       {"rpc_code": status.code})
    stdout, stderr = client.outputs(executed.result)
    return RemoteRun(executed.result.exit_code, status.code == code_pb2.DEADLINE_EXCEEDED, stdout, stderr)


_UPLOAD_LOCKS: dict[str, trio.Lock] = {}  # by cluster URL, shared by the executors of one process


class ReapiExecutor:
    """Trials and replays as Actions on the REAPI server at ``url``."""

    name = "reapi"

    def __init__(self, url: str, parallelism: int | None = None, platform: dict[str, str] | None = None) -> None:
        self.url = url
        self.client = ReapiClient(url)
        self.reapi = TrioReapi(self.client)
        self.parallelism = parallelism or DEFAULT_PARALLEL
        self.platform = platform if platform is not None else platform_from("")
        self.cache_hits = 0
        self.executed = 0  # actions a bot ran
        self.uploaded_blobs = 0
        self.uploaded_bytes = 0
        self.retried = 0  # Executes sent again: the server went away or lost inputs meanwhile
        self._bases: dict[str, dict[str, Entry]] = {}
        self._lock = trio.Lock()
        # One upload at a time per cluster: the first round's trials all find the whole
        # base missing and, run side by side, each uploaded it (4x the bytes at 4
        # slots, seen on a real project's 40 MB base; two deltamins at once, twice).
        # In turn, the first uploads it and the others only their subsets' files (a
        # FindMissingBlobs each, milliseconds).
        self._upload_lock = _UPLOAD_LOCKS.setdefault(url, trio.Lock())

    async def _base(self, base: str) -> dict[str, Entry]:
        async with self._lock:  # one scan, however many trials start at once
            if base not in self._bases:
                self._bases[base] = await trio.to_thread.run_sync(_digested_base, base)
            return self._bases[base]

    async def _execute(self, spec: CommandSpec, entries: dict[str, Entry], timeout_s: float,
                       fresh: bool) -> Executed:  # fmt: skip
        """Upload what the CAS misses, Execute; again (re-uploading) when the server lost
        blobs or went away meanwhile (a restart empties an in-memory CAS)."""
        tree = await trio.to_thread.run_sync(build_tree, entries)
        built = build_action(spec, tree.root, timeout_s=timeout_s, do_not_cache=fresh)
        give_up = trio.current_time() + RETRY_WINDOW_S
        while True:
            try:
                async with self._upload_lock:
                    report = await self.reapi.upload_tree(tree, built.blobs)
                self.uploaded_blobs += report.blobs
                self.uploaded_bytes += report.bytes
                executed = await self.reapi.execute(built.action_digest, skip_cache_lookup=fresh,
                                                    timeout_s=timeout_s + QUEUE_SLACK_S)  # fmt: skip
            except CcwError as error:
                if trio.current_time() > give_up or error.details.get("grpc_status") not in _RETRIED:
                    raise
                self.retried += 1
                await trio.sleep(RETRY_S)
                continue
            if executed.response.status.code != code_pb2.FAILED_PRECONDITION or trio.current_time() > give_up:
                break
            self.retried += 1
            await trio.sleep(RETRY_S)  # inputs missing at run time: upload them again
        if executed.response.cached_result:
            self.cache_hits += 1
        else:
            self.executed += 1
        return executed

    def check_trials(self, service: CapsuleService, record: CapsuleRecord, services: tuple[ServiceSpec, ...]) -> None:
        """UNSUPPORTED for what a bot cannot give a trial: the capsule's allowlist network, services beside it."""
        if record.network_spec is not None:
            raise CcwError("UNSUPPORTED", "trials of a capsule with an allowlist network run locally only: "
                                          "unset CCW_REAPI_URL for this capsule")  # fmt: skip
        if services:
            raise CcwError("UNSUPPORTED", "the target command ran beside services "
                                          f"({', '.join(s.name for s in services)}), which a cluster's bot cannot "
                                          "start: run deltamin locally (unset CCW_REAPI_URL for it)",
                           {"services": [s.name for s in services]})

    async def run_trial(self, service: CapsuleService, trial: Trial) -> Finished:
        """The trial as an Action; its ActionResult as a run."""
        record = trial.record
        self.check_trials(service, record, trial.services)
        entries = overlay(await self._base(record.base), trial.files)
        workspace = record.workspace.rstrip("/")
        cwd = resolve_cwd(trial.request.cwd, workspace)
        # The whole environment a local run's jail gets but HOME (the bot's capsule's own).
        env = {k: v for k, v in exec_env(workspace, whitelisted(record.spec.env_whitelist)).items() if k != "HOME"}
        env[CAPSULE_VAR] = json.dumps({"workspace": workspace, "clock_offset_sec": record.spec.clock_offset_sec},
                                      sort_keys=True)  # fmt: skip
        spec = CommandSpec(argv=trial.request.argv, env=env, cwd=_relative(cwd, workspace),
                           platform=self.platform)  # fmt: skip
        timeout_s = trial.request.timeout_ms / 1000
        executed = await self._execute(spec, entries, timeout_s, trial.fresh)
        return await trio.to_thread.run_sync(_judged, executed, self.client)

    async def replay(self, service: CapsuleService, path: Path, expected_root: str | None,
                     options: ReplayOptions) -> dict[str, Any]:
        """The witness replayed by a bot (replays.replay there), once this state dir admits it; its answer."""
        key = await trio.to_thread.run_sync(witness_key, service.state)
        manifest, _, signature = await trio.to_thread.run_sync(signature_of, path, key)
        if services_named(manifest):
            raise CcwError("UNSUPPORTED", "the witness's execs ran beside services, which a cluster's bot cannot "
                                          "start: replay it locally (unset CCW_REAPI_URL for it)")  # fmt: skip
        if options.network is not None or not manifest["include_blobs"] or options.volatile:
            raise CcwError("UNSUPPORTED", "a replay with an allowlist network or volatile globs, or of a witness "
                                          "made without blobs (its base is a directory here), runs locally only: "
                                          "unset CCW_REAPI_URL for it")  # fmt: skip
        admit(manifest, signature, options)
        name = "witness.ccwz"
        env = {**options.env, CAPSULE_VAR: json.dumps({"replay": name, "expected_root": expected_root}, sort_keys=True)}
        spec = CommandSpec(argv=[*REPLAY_ARGV, name], env=env, platform=self.platform)
        executed = await self._execute(spec, {name: FileEntry(path=path)}, QUEUE_SLACK_S, False)
        run = await trio.to_thread.run_sync(_judged, executed, self.client)
        if run.exit_code != 0:
            failed = json.loads(run.stderr or b"{}")
            raise CcwError(failed.get("code", "INTERNAL"),
                           f"replay on the cluster: {failed.get('message', run.stderr)}",
                           failed.get("details"))  # fmt: skip
        result: dict[str, Any] = json.loads(run.stdout)
        result.pop("signed_by", None)  # the bot's keys are not ours: what it read of the signature is not ours
        result.update(signature.report())
        return result

    def summary(self) -> dict[str, Any]:
        """The kind, and what the cluster did: runs, action-cache hits, uploads."""
        return {"kind": self.name, "executed": self.executed, "action_cache_hits": self.cache_hits,
                "uploaded_blobs": self.uploaded_blobs, "uploaded_bytes": self.uploaded_bytes, "retried": self.retried}

    def close(self) -> None:
        """Close the channel."""
        self.client.close()
