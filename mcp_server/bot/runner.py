"""ccw-bot's leases: each one run in a capsule (issue 17; the command is bot/__main__.py).

``ccw-bot --reapi grpc://HOST:PORT [--capacity N] [--property k=v ...]`` serves a
cluster's Remote Workers API (mcp_server.reapi.worker's session loop) beside a ccw
helper: the one at ``CCW_HELPER_SOCKET``, else an embedded one it starts, as ccw-mcp
does.  Its own state dir (``CCW_STATE_DIR`` or ``--state-dir``) keeps the capsules'
journal, so each run is witnessed as a local exec is.

For each lease:

- The Command and input root are fetched from the CAS into a lease directory, every
  file a hard link into the bot's cache of blobs (``reapi-cas`` in its state dir), so a
  lease reads from the CAS only what the host has not seen (trials over one base: the
  few files their subset changed).  Past ``--cache-max-mb`` (default 10 GiB) the least
  recently used files go (inputs.BlobCache).  The bot keeps as many laid-out roots as
  its capacity (``reapi-roots``) and brings one to the next lease's tree by what differs
  (inputs.InputRoots): a real project's tree is not laid out again for every trial.
- The input root becomes a capsule's base, shown at the workspace path the client's
  ``CCW_REAPI_CAPSULE`` variable names (capsules/remote.py; the variable is taken out
  of the environment first), or at the lease directory itself for any other REAPI
  client.  The command runs there with exactly the Command's environment, in the jail,
  under the limits the client asked for, with every file it touched recorded.
- stdout, stderr, the declared outputs that exist (files, and directories as a
  ``Tree`` each), and the run's witness (as the
  output file ``.ccw-witness.ccwz``) go to the CAS; the ActionResult names them.  A
  run that hit the action's timeout reports DEADLINE_EXCEEDED; a lease the server
  withdraws cancels the run (the capsule is destroyed, which ends its processes).
- A replay lease (``CCW_REAPI_CAPSULE`` with ``replay``) carries a witness instead:
  the bot replays it (replays.replay, in its own capsules) and answers with the result
  as JSON on stdout, so replay_ok is judged by the same code as a local replay's.  The
  witness is not signed by the bot's key, so it replays with ``allow_untrusted``, which
  is safe because the replay takes nothing of the bot's: its commands get the Command's
  variables only, no network, no live base (a witness without blobs is refused) and
  none of the host directories its capsule exposed.

A bot killed mid-lease loses nothing: the server requeues the lease after the
session's keepalive (worker.py); the capsule it left is removed by the helper's
recovery when a helper starts on that state dir again.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path

import trio

from mcp_server.bot.marker import Marker, check_command_paths, witness_file
from mcp_server.capsules.exec import exec_request
from mcp_server.capsules.remote import CAPSULE_VAR
from mcp_server.capsules.replay import ReplayOptions, replay
from mcp_server.capsules.service import CapsuleService
from mcp_server.capsules.witness import WitnessOptions, make_witness
from mcp_server.fs import changeset
from mcp_server.fs.view import RootView
from mcp_server.reapi.client import ReapiClient
from mcp_server.reapi.inputs import BlobCache, InputRoots
from mcp_server.reapi.merkle import (
    DirEntry,
    Entry,
    FileEntry,
    SymlinkEntry,
    build_tree,
    digest_bytes,
    key,
    output_tree,
)
from mcp_server.reapi.protos import code_pb2, re_pb2
from mcp_server.reapi.worker import LeaseOutcome
from sandbox.errors import CcwError
from sandbox.replies import ExecReply
from sandbox.spec import CapsuleSpec

WITNESS_OUTPUT = ".ccw-witness.ccwz"
CAS_CACHE = "reapi-cas"  # in the state dir: input files by digest, hard-linked into each lease
INPUT_ROOTS = "reapi-roots"  # in the state dir: input roots kept laid out between leases
CACHE_MAX_MB = 10240  # past this, the least recently used cached input files go
CANCEL_POLL_S = 0.1  # how soon a withdrawn lease's run is stopped


@dataclass
class _Ran:
    """What a lease's capsule gave: the helper's reply, the witness file, the outputs' bytes."""

    reply: ExecReply
    witness: Path
    outputs: dict[str, tuple[bytes, bool]]  # relative to the working directory: (bytes, executable)
    directories: dict[str, dict[str, Entry]]  # output directories: their files and symlinks


def _read_outputs(root_fd: int, cwd: str,
                  command: re_pb2.Command) -> tuple[dict[str, tuple[bytes, bool]], dict[str, dict[str, Entry]]]:
    """The declared outputs the run made: files (bytes, executable), and directories (their entries).

    A declared path may be either (``output_paths``; or the older ``output_files`` and
    ``output_directories``).
    """
    files: dict[str, tuple[bytes, bool]] = {}
    directories: dict[str, dict[str, Entry]] = {}
    with RootView.from_fd(root_fd) as view:
        for relative in dict.fromkeys([*command.output_paths, *command.output_files, *command.output_directories]):
            path = os.path.normpath(os.path.join(cwd, relative)) if cwd else os.path.normpath(relative)
            side = changeset.lstat(view, path)
            if side is not None and side.kind == "file":
                files[relative] = (view.read_bytes(path), bool(side.mode & 0o111))
            elif side is not None and side.kind == "dir":
                directories[relative] = _directory_entries(view, path)
    return files, directories


def _directory_entries(view: RootView, top: str) -> dict[str, Entry]:
    """The files, symlinks and empty subdirectories under ``top``, relative to it (a REAPI Tree's contents)."""
    entries: dict[str, Entry] = {}
    top = "" if top in ("", ".") else top

    def visit(path: str, below: str) -> None:
        listed = view.listdir(path)
        if not listed and below:  # an empty directory is a node of its own; others follow from their contents
            entries[below] = DirEntry()
        for name, kind in listed:
            inner, where = "/".join(filter(None, (path, name))), "/".join(filter(None, (below, name)))
            if kind == "dir":
                visit(inner, where)
            elif kind == "file":
                entries[where] = FileEntry(data=view.read_bytes(inner),
                                           executable=bool(view.stat(inner).st_mode & 0o111))
            elif kind == "symlink":
                entries[where] = SymlinkEntry(view.readlink(inner))

    visit(top, "")
    return entries


class CapsuleRunner:
    """worker.Runner that runs each lease in a capsule of ``service`` (its calls go to the trio loop)."""

    def __init__(self, service: CapsuleService, token: trio.lowlevel.TrioToken, scratch: Path, bot_id: str,
                 cache_max_mb: int = CACHE_MAX_MB, capacity: int = 1) -> None:
        self.service = service
        self.token = token
        self.bot_id = bot_id
        self.cache = BlobCache(scratch.parent / CAS_CACHE, cache_max_mb * 1024 * 1024 if cache_max_mb > 0 else None)
        self.roots = InputRoots(scratch.parent / INPUT_ROOTS, self.cache, keep=capacity)

    def __call__(self, client: ReapiClient, action: re_pb2.Action, cancelled: threading.Event) -> LeaseOutcome:
        """Fetch, run in a capsule (or replay), upload; the ActionResult (a lease thread).

        What the lease names is checked first (marker.py); a bad lease is answered with
        a status, never followed.
        """
        command = re_pb2.Command.FromString(client.read_blob(action.command_digest))
        env = {variable.name: variable.value for variable in command.environment_variables}
        try:
            marker = Marker.parse(env.pop(CAPSULE_VAR, None))
            cwd = check_command_paths(command)
        except CcwError as error:
            return _refused(error, code_pb2.INVALID_ARGUMENT)
        # None: ExecRequest's default
        timeout_ms = action.timeout.ToMilliseconds() if action.HasField("timeout") else None
        with self.roots.checkout(client, action.input_root_digest) as root:
            if marker.replay is not None:
                try:
                    witness = witness_file(root, marker.replay)
                except CcwError as error:
                    return _refused(error, code_pb2.FAILED_PRECONDITION)
                return self._replay(client, witness, marker.expected_root, env)
            ran = trio.from_thread.run(self._run, root, command, cwd, env, marker, timeout_ms, cancelled,
                                       trio_token=self.token)  # fmt: skip
            if ran is None:
                return LeaseOutcome(re_pb2.ActionResult(), code_pb2.CANCELLED, "lease withdrawn")
            return self._report(client, ran)

    async def _run(self, root: Path, command: re_pb2.Command, cwd: str, env: dict[str, str], marker: Marker,
                   timeout_ms: int | None, cancelled: threading.Event) -> _Ran | None:  # fmt: skip
        """The command in a journaled capsule over ``root``; None when the lease was withdrawn.

        The lease root is always the capsule's lower layer; the marker's workspace is
        only where the jail shows it.
        """
        workspace = marker.workspace or str(root)
        spec = CapsuleSpec(workspace=workspace, given_base=None if workspace == str(root) else str(root),
                           clock_offset_sec=marker.clock_offset_sec, limits=marker.limits)  # fmt: skip
        record = await self.service.create(spec)
        try:
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_cancel_when, cancelled, scope)
                    ran = await self.service.exec(exec_request(
                        record.capsule_id, command.arguments, os.path.join(workspace, cwd) if cwd else workspace,
                        timeout_ms, env=env))  # fmt: skip
                    nursery.cancel_scope.cancel()
            if scope.cancelled_caught:
                return None
            witness = await make_witness(self.service, record.capsule_id, WitnessOptions("zstd", True))
            root_fd = await self.service.open_root(record.capsule_id)
            outputs, directories = await trio.to_thread.run_sync(_read_outputs, root_fd, cwd, command)
            return _Ran(ran.reply, Path(witness["path"]), outputs, directories)
        finally:
            with trio.CancelScope(shield=True):
                await self.service.destroy(record.capsule_id)

    def _report(self, client: ReapiClient, ran: _Ran) -> LeaseOutcome:
        reply = ran.reply
        exit_code = reply.exit_code if reply.exit_code is not None else _signalled(reply.signal)
        blobs: dict[tuple[str, int], bytes | Path] = {}
        result = re_pb2.ActionResult(exit_code=exit_code, stdout_digest=digest_bytes(reply.stdout),
                                     stderr_digest=digest_bytes(reply.stderr))  # fmt: skip
        blobs[key(result.stdout_digest)] = reply.stdout
        blobs[key(result.stderr_digest)] = reply.stderr
        for path, (data, executable) in sorted({**ran.outputs,
                                                WITNESS_OUTPUT: (ran.witness.read_bytes(), False)}.items()):
            digest = digest_bytes(data)
            blobs[key(digest)] = data
            result.output_files.add(path=path, digest=digest, is_executable=executable)
        for path, entries in sorted(ran.directories.items()):
            tree = build_tree(entries)
            blobs.update(tree.blobs)
            message = output_tree(tree).SerializeToString(deterministic=True)
            tree_digest = digest_bytes(message)
            blobs[key(tree_digest)] = message
            result.output_directories.add(path=path, tree_digest=tree_digest)
        result.execution_metadata.worker = self.bot_id
        client.upload({k: v for k, v in blobs.items() if k[1] > 0})
        if reply.timed_out:
            return LeaseOutcome(result, code_pb2.DEADLINE_EXCEEDED, "the action's timeout hit")
        return LeaseOutcome(result)

    def _replay(self, client: ReapiClient, witness: Path, expected_root: str | None,
                env: dict[str, str]) -> LeaseOutcome:
        """Replay a client's witness: untrusted here (the bot's key is its own; the client
        decided whether it may replay), so it gets only ``env``, the values the client sent
        (never the bot's own environment), no network, no live base and none of the host
        directories its capsule exposed."""
        options = ReplayOptions(env=env, allow_untrusted=True, expose_recorded=False)
        try:
            answer = trio.from_thread.run(replay, self.service, witness, expected_root, options, trio_token=self.token)
            stdout, stderr, code = json.dumps(answer, sort_keys=True).encode(), b"", 0
        except CcwError as error:
            failed = {"code": error.code, "message": error.message, "details": error.details}
            stdout, stderr, code = b"", json.dumps(failed, sort_keys=True, default=str).encode(), 1
        result = re_pb2.ActionResult(exit_code=code, stdout_digest=digest_bytes(stdout),
                                     stderr_digest=digest_bytes(stderr))  # fmt: skip
        result.execution_metadata.worker = self.bot_id
        client.upload({key(digest_bytes(data)): data for data in (stdout, stderr) if data})
        return LeaseOutcome(result)


def _refused(error: CcwError, code: int) -> LeaseOutcome:
    """A lease that names what it may not: ``code`` (PERMISSION_DENIED when that was the refusal)."""
    code = code_pb2.PERMISSION_DENIED if error.code == "PERMISSION_DENIED" else code
    return LeaseOutcome(re_pb2.ActionResult(), code, f"refused: {error.message}")


def _signalled(name: str | None) -> int:
    """A shell's exit status for a command a signal ended (128 + its number)."""
    try:
        return 128 + signal.Signals[name or ""].value
    except KeyError:
        return 128


async def _cancel_when(cancelled: threading.Event, scope: trio.CancelScope) -> None:
    """Cancel ``scope`` when the lease is withdrawn (the nursery's own cancel ends this wait).

    A poll, not a thread blocked in ``cancelled.wait``: an abandoned thread keeps its
    token of trio's thread limiter, and after 40 leases every ``to_thread`` call of
    the bot (the witness, the outputs) would wait for a token forever.
    """
    while not cancelled.is_set():  # noqa: ASYNC110 (a threading.Event, set by the session's thread)
        await trio.sleep(CANCEL_POLL_S)
    scope.cancel()
