"""Witnesses: building, storing, finding and verifying them (seed 003 §4; replaying is replay.py).

A witness packages what a capsule did (see fs/witness.py for the format).  Choices:

- ``witness_id`` is ``wit_`` + the first 16 hex digits of the root hash: the same capsule
  gives the same witness bytes, hence the same id and file.
- The base entries named in the manifest (files, directories, symlinks) are what the
  runs need to start again: see witness_base.py.  With ``include_blobs`` the files'
  bytes travel in the witness, capped by ``max_base_mb``.
- Each exec's stdout and stderr travel as blobs (as the journal kept them: the first
  ``OUTPUT_KEEP_BYTES`` of each stream, the cap recorded beside them), so a replay can
  show the lines that differ; the archive is zstd-compressed as a whole.
- A replay (replay.py) rebuilds the base from the blobs into a scratch directory and
  mounts a fresh capsule over it *at the recorded workspace path*, or, without blobs,
  over a directory the replayer names.  Witnesses record variable names only, never
  values (which may be secrets); a replay's values are the ones its replayer passes.
- An exec that ran beside services (capsules/services.py) carries their specs in
  ``services`` (the journal's witness form: variable names, never values), and a
  replay starts them before it (replay_steps.py).  Each exec of a service is an entry
  too, marked ``service`` (its name): a reader sees what the service did, and its reads
  bring the base files it used (the server's own script) into the witness.  A service
  whose run has not ended when the witness is made (still running, or lost) has no row
  yet: the witness asks the helper what each such service has opened so far (its
  ``run_reads`` op, which reads the capsule's fanotify queue first, so every file the
  service opened before the call is named, and leaves it running), and carries those
  files beside the execs'.  That is all a replay's service needs: it serves the same
  execs from the same files, and what the live one read since (another client's
  requests) is more, never less.  Nothing runs again, so no side effect happens twice.
  When the helper cannot say (the service was lost, its reads were not traced, too many
  for one reply), the witness carries the whole base, as for a run whose reads were not
  traced (``read_sets_complete: false``), and its result says why (``unknown_reads``).
- Every witness is signed with the state dir's Ed25519 key (fs/witness_key.py);
  ``verify_file`` says whether a witness bears a signature that holds from this state
  dir's key or a trusted one ("valid", naming it), one that holds from a key not
  trusted here ("unknown key"), one that does not hold ("invalid"), or none ("unsigned").
- An archive is written to ``witnesses/.<witness_id>.<pid>.<random>.tmp``, fsynced, then
  renamed to its final name, so a crash mid-write never leaves a partial witness under
  the final name; ``remove_stale_temps`` (run at server start) deletes temp files whose
  writer pid is gone.  ``CCW_TEST_WITNESS_CRASH_AFTER=partial`` (tests only) makes the
  process SIGKILL itself after the first bytes of the temp file are written.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import os
import signal
import stat
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import trio

from mcp_server.capsules import netlive, replay_secrets
from mcp_server.capsules.service import CapsuleService
from mcp_server.capsules.witness_base import DEFAULT_MAX_BASE_MB, Needs, base_entries, base_top
from mcp_server.capsules.witness_ignore import carried_rules
from mcp_server.core import hostpaths, paths
from mcp_server.fs import changeset
from mcp_server.fs import witness as wfmt
from mcp_server.fs.view import RootView
from mcp_server.fs.witness_key import Verdict, WitnessKey
from mcp_server.journal import Journal
from mcp_server.journal_records import CapsuleRecord
from mcp_server.state import State
from sandbox import rawnames
from sandbox.errors import CcwError, from_oserror
from sandbox.ops import RunReadsRequest
from sandbox.replies import Change
from sandbox.syscalls import pid_alive

_DDL = """
CREATE TABLE IF NOT EXISTS witnesses (
    witness_id TEXT PRIMARY KEY,
    capsule_id TEXT NOT NULL,
    path TEXT NOT NULL,
    root_hash TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    compress TEXT NOT NULL,
    include_blobs INTEGER NOT NULL,
    created_at TEXT NOT NULL
);
"""

CRASH_ENV = "CCW_TEST_WITNESS_CRASH_AFTER"  # tests only: "partial" kills us mid-write

_EXEC_FIELDS = (
    "seq", "argv", "cwd", "env_keys", "exit_code", "signal", "timed_out", "oom_killed",
    "stdout_blake3", "stderr_blake3", "stdout_bytes", "stderr_bytes", "duration_ms", "usage", "touched", "timeout_ms",
)


def _table(state: State) -> State:
    state.ensure_schema("witnesses", _DDL)
    return state


# --- building a witness ------------------------------------------------------------


_RENAME_IN_WORKSPACE = "rename it in the workspace itself to a UTF-8 name, then make the witness again"


class _Sources:
    """Where each blob's bytes can be read again while the archive is written."""

    def __init__(self, base: RootView, capsule: RootView) -> None:
        self.base = base
        self.capsule = capsule
        self.where: dict[str, tuple[str, str]] = {}  # blob -> (view name, path) or ("bytes", b64)
        self.inline: dict[str, bytes] = {}

    def add_file(self, view: str, path: str) -> str:
        return self.add_sized(view, path)[0]

    def add_sized(self, view: str, path: str) -> tuple[str, int]:
        data = (self.base if view == "base" else self.capsule).read_bytes(path)
        name = wfmt.blob_hash(data)
        # A changed file with a base file's bytes is read again from the capsule: without
        # blobs only the capsule's sources are kept (capsule_witness), and a base source
        # would leave the change's blob unreadable.
        if view == "capsule" or name not in self.where:
            self.where[name] = (view, path)
        return name, len(data)

    def add_bytes(self, data: bytes) -> str:
        name = wfmt.blob_hash(data)
        self.inline[name] = data
        return name

    def read(self, name: str) -> bytes:
        if name in self.inline:
            return self.inline[name]
        view, path = self.where[name]
        return (self.base if view == "base" else self.capsule).read_bytes(path)


def _exec_entry(ex: dict[str, Any], sources: _Sources,
                outputs: dict[tuple[int, str], tuple[bytes, int]]) -> dict[str, Any]:
    entry = {key: ex[key] for key in _EXEC_FIELDS}
    stdin = ex.get("stdin_b64")
    entry["stdin_blob"] = sources.add_bytes(base64.b64decode(stdin)) if stdin is not None else None
    kept = {}
    for stream in ("stdout", "stderr"):
        if (ex["seq"], stream) in outputs:
            data, cap = outputs[ex["seq"], stream]
            kept[stream] = {"blob": sources.add_bytes(data), "kept_bytes": len(data), "cap": cap}
    entry["output"] = kept or None  # None: made before outputs were kept
    entry["written_mtimes"] = ex.get("written_mtimes")  # None: not traced, or made before mtimes were kept
    # Only when there are some: a witness without services stays as before.
    if ex.get("services"):
        entry["services"] = json.loads(ex["services"])  # the specs of those that ran beside it (no values)
    if ex.get("service") is not None:
        entry["service"] = ex["service"]  # a run of that service: shown, never re-run
    if ex.get("console"):  # an interactive exec: how its stdin went in (a terminal's is replayed on one)
        entry["console"] = json.loads(ex["console"])
    return entry


def _services_unended(execs: list[dict[str, Any]]) -> list[str]:
    """The services some exec ran beside whose run the journal does not hold yet (still running, or
    lost): an exec of a service is journaled when it ends, after the execs beside it."""
    unended = set()
    for ex in execs:
        for spec in json.loads(ex["services"]) if ex.get("services") else ():
            if not any(later.get("service") == spec["name"] and later["seq"] > ex["seq"] for later in execs):
                unended.add(spec["name"])
    return sorted(unended)


def _write_entry(write: dict[str, Any], sources: _Sources, held: Mapping[str, RootView]) -> dict[str, Any]:
    content = write.get("content_b64")
    data = base64.b64decode(content) if content is not None else held[write["source"]].read_bytes(
        write["path"]) if write.get("source") else None  # a merge's: in the input it came from (frozen)
    return {
        "seq": write["seq"],
        "path": write["path"],
        "action": write["action"],
        "blob": sources.add_bytes(data) if data is not None else None,
        "target": write.get("target"),
        "mode": write.get("mode"),
        "mtime_ns": write.get("mtime_ns"),  # None: recorded before mtimes were kept
    }


def _refuse_sessions(record: CapsuleRecord, execs: list[dict[str, Any]]) -> None:
    """UNSUPPORTED when a run was an interactive session: what was typed is not kept."""
    sessions = [ex["seq"] for ex in execs if ex.get("terminal")]
    if sessions:
        raise CcwError("UNSUPPORTED", f"capsule {record.capsule_id} had interactive terminal sessions (runs "
                       f"{sessions}, ccw capsule shell): what was typed in them is not kept, so no replay can "
                       "repeat them; fork it (capsule_fork, ccw capsule fork CAP): the fork starts from "
                       "these files and its own runs can be a witness; or redo the session's steps with "
                       "ccw capsule exec",
                       {"capsule_id": record.capsule_id, "terminal_runs": sessions})


def build_manifest(
    record: CapsuleRecord, execs: list[dict[str, Any]], changes: Sequence[Change],
    base: RootView, capsule: RootView, include_blobs: bool, writes: list[dict[str, Any]] | None = None,
    outputs: dict[tuple[int, str], tuple[bytes, int]] | None = None,
    max_base_bytes: int = DEFAULT_MAX_BASE_MB << 20,
    carry_all: bool = False,
    service_runs: list[dict[str, Any]] | None = None, held: Mapping[str, RootView] | None = None,
) -> tuple[dict[str, Any], _Sources]:
    """The manifest of a capsule's witness, and where to read each blob it names (``held``: a merge's inputs)."""
    _refuse_sessions(record, execs)
    sources = _Sources(base, capsule)
    entries = changeset.expand(changes, base, capsule)
    changed = [e.path for e in entries] + [w["path"] for w in writes or []]
    # ``service_runs``, rows standing for the unended services' runs so far (``_services_so_far``), count
    # as needs and are no entries; without them, what the unended services read is not known.
    needs = Needs.from_journal(record.workspace, execs + (service_runs or []), changed)
    needs.unknown = needs.unknown or (service_runs is None and bool(_services_unended(execs)))
    base_files = base_entries(base, record.workspace, needs, lambda path: sources.add_sized("base", path),
                              max_base_bytes if include_blobs else None, carry_all)
    unknown_reads = needs.unknown
    change_items = []
    for entry in entries:
        new = entry.new
        item = {
            "path": entry.path,
            "status": "added" if entry.old is None else "deleted" if new is None else "modified",
            "type": new.kind if new else None,
            "mode": new.mode if new else None,
            "target": new.target if new and new.kind == "symlink" else None,
            "blob": sources.add_file("capsule", entry.path) if new and new.kind == "file" else None,
        }
        change_items.append(item)
    manifest = {
        "format": wfmt.FORMAT,
        "workspace": record.workspace,
        "include_blobs": include_blobs,
        "base": {
            "fingerprint": record.base_fingerprint,
            "read_sets_complete": not unknown_reads,
            "carried": "all" if unknown_reads or carry_all else "used",
            "top": base_top(base),
            "files": base_files,
        },
        "capsule": {
            "clock": record.clock,
            "clock_offset_sec": record.clock_offset_sec,
            "env_whitelist": record.env_whitelist,
            "limits": record.limits,
            "network": record.network,
            # Only when set: a witness of a capsule without volatile globs stays as before.
            **({"volatile": list(record.volatile)} if record.volatile else {}),
            **({"expose": list(record.spec.expose)} if record.spec.expose else {}),
            # Named, never carried: a replay runs without them (replay.py says so in its report).
            **({"gitdirs": list(record.spec.gitdirs)} if record.spec.gitdirs else {}),
        },
        "execs": [_exec_entry(ex, sources, outputs or {}) for ex in execs],
        "writes": [_write_entry(w, sources, held or {}) for w in writes or []],
        "changes": change_items,
    }
    return manifest, sources


def _write(state: State, capsule_id: str, manifest: dict[str, Any], sources: _Sources, compress: str) -> dict[str, Any]:
    root = wfmt.root_hash(manifest)
    witness_id = "wit_" + root.split(":", 1)[1][:16]
    suffix = ".tar.zst" if compress == "zstd" else ".tar"
    final = state.witnesses_dir / f"{witness_id}{suffix}"
    fd, tmp = tempfile.mkstemp(dir=state.witnesses_dir, prefix=f".{witness_id}.{os.getpid()}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            sink: Any = _CrashAfterFirstWrite(out) if os.environ.get(CRASH_ENV) == "partial" else out
            written = wfmt.write_archive(manifest, sources.read, sink, compress, witness_key(state, trusted=False))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    _table(state).execute(
        "INSERT OR REPLACE INTO witnesses VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (witness_id, capsule_id, str(final), written.root_hash, written.size_bytes, compress,
         int(bool(manifest["include_blobs"])), now),
    )
    return {"witness_id": witness_id, "path": str(final), "root_hash": written.root_hash,
            "size_bytes": written.size_bytes}


class _CrashAfterFirstWrite:
    """Test hook: flush the first write to the temp file, then die as kill -9 would."""

    def __init__(self, out: Any) -> None:
        self._out = out

    def write(self, data: Any) -> int:
        count: int = self._out.write(data)
        self._out.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        return count

    def __getattr__(self, name: str) -> Any:
        return getattr(self._out, name)


def remove_stale_temps(state: State) -> list[str]:
    """Delete witness temp files left by a writer that died (its pid no longer runs)."""
    removed = []
    for path in sorted(state.witnesses_dir.glob(".wit_*.tmp")):
        parts = path.name.split(".")  # "", witness_id, pid, random, "tmp"
        # A temp file named with our own pid is a leftover of an earlier process that had
        # this pid; one named with another live pid is another ccw-mcp sharing the state
        # dir, still writing it.
        if len(parts) == 5 and parts[2].isdigit() and int(parts[2]) != os.getpid() and pid_alive(int(parts[2])):
            continue
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        removed.append(path.name)
    return removed


def _base_summary(manifest: dict[str, Any], unknown_reads: str | None = None) -> dict[str, Any]:
    """How much of the base the witness carries, and why that much (for the agent)."""
    counts = {"file": 0, "dir": 0, "symlink": 0}
    for entry in manifest["base"]["files"]:
        counts[entry["type"]] += 1
    return {"carried": manifest["base"]["carried"], "read_sets_complete": manifest["base"]["read_sets_complete"],
            "files": counts["file"], "dirs": counts["dir"], "symlinks": counts["symlink"],
            **({"unknown_reads": unknown_reads} if unknown_reads else {})}


async def _services_so_far(service: CapsuleService, record: CapsuleRecord,
                           execs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]] | None, str | None]:
    """What each service the execs ran beside whose run has not ended has touched so far (the
    helper's ``run_reads``), as rows ``Needs.from_journal`` reads (its spec's argv and cwd); or
    None and why, when one of them is not known (the witness then carries the whole base)."""
    specs = {spec["name"]: spec for ex in execs for spec in (json.loads(ex["services"]) if ex.get("services") else ())}
    rows = []
    for name in _services_unended(execs):
        try:
            reply = await service.call(RunReadsRequest(record.capsule_id, name))
        except CcwError as exc:  # lost (NOT_FOUND), or a helper without the op
            return None, f"what service {name!r} read is not known: {exc.message}"
        if reply.touched is None:
            return None, f"what service {name!r} read is not known: {reply.unavailable}"
        spec = specs[name]
        rows.append({"argv": spec["argv"], "cwd": spec.get("cwd") or record.workspace,
                     "touched": reply.touched.to_args()})
    return rows, None


@dataclass(frozen=True)
class WitnessOptions:
    """How a witness is made: compression, and how much of the base travels."""

    compress: str = "zstd"  # zstd | none
    include_blobs: bool = True  # carry the bytes of the base files the runs used
    max_base_mb: int = DEFAULT_MAX_BASE_MB
    carry_all: bool = False  # the whole base (.git aside), not only what the runs used


async def make_witness(service: CapsuleService, capsule_id: str, options: WitnessOptions) -> dict[str, Any]:
    """Build and store the witness of a capsule (capsule_witness, promotion, deltamin's check).

    The caller holds the capsule's turn, so the witness holds every run sent before it whole.
    """
    record = service.live_record(capsule_id)
    journal = service.journal
    own = journal.execs(capsule_id)
    execs, writes, outputs = lineage_steps(journal, record)
    changes = await service.changes(capsule_id)
    root_fd = await service.open_root(capsule_id)
    running, unknown_reads = None, None
    if _services_unended(own) and not options.carry_all:
        running, unknown_reads = await _services_so_far(service, record, own)
    held: dict[str, RootView] = {}  # a merge's inputs whose files its writes name (frozen under it)
    try:
        for source in sorted({w["source"] for w in writes if w.get("source")}):
            held[source] = RootView.from_fd(await service.open_root(source))
    except BaseException:
        for view in [RootView.from_fd(root_fd), *held.values()]:
            view.close()
        raise

    def work() -> dict[str, Any]:
        with RootView.from_fd(root_fd) as capsule, RootView.open(record.base) as base, contextlib.ExitStack() as stack:
            for view in held.values():
                stack.enter_context(view)
            manifest, sources = build_manifest(record, execs, changes, base, capsule, options.include_blobs, writes,
                                               outputs, options.max_base_mb << 20, options.carry_all, running, held)
            # The helper's change list refuses names that are not UTF-8 (replies.ChangesReply), but the
            # children of a directory the capsule deleted, and the base files carried, are walked here.
            rawnames.refuse([change["path"] for change in manifest["changes"]], "changes", rawnames.IN_WORKSPACE)
            rawnames.refuse([entry["path"] for entry in manifest["base"]["files"]], "base files the witness carries",
                            _RENAME_IN_WORKSPACE)
            netlive.mark_witness(manifest, service.state, record, execs)  # the rules each exec ran under
            replay_secrets.mark_witness(manifest, service.state.root, capsule_id)  # names and hosts, no value
            ignore = carried_rules(record.workspace)  # what promotion leaves behind, for a replay to judge
            if ignore is not None:
                manifest["base"]["ignore"] = ignore
            if not options.include_blobs:
                # Only the changed files' blobs travel; base files are named by hash.
                sources.where = {k: v for k, v in sources.where.items() if v[0] == "capsule"}
            written = _write(service.state, capsule_id, manifest, sources, options.compress)
            return {**written, "base": _base_summary(manifest, unknown_reads)}

    return await trio.to_thread.run_sync(work)


def lineage_steps(journal: Journal, record: CapsuleRecord) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                                     dict[tuple[int, str], tuple[bytes, int]]]:
    """The execs, file-tool writes and outputs a witness of ``record`` replays: its parents' first.

    A fork starts from its parent's view, whose change the fork's own journal does not hold,
    and a replay starts from the base: a fork's witness replayed without them found the
    parent's files absent and the fork's reads of them different.  Its parents are frozen
    while it lives, so their journals are whole.  Each capsule numbers its own runs, so the
    steps are numbered again in one sequence, parents' first (a fork's own run 1 may be the
    witness's 3).  A merged capsule journals its whole merge from the base
    (capsules/merge_write.py): its line stops there.  So does it below a parent with a
    terminal session (``ccw capsule shell``), whose typing is not kept: such a fork's
    witness is made, as the session's refusal offers, without what the session did."""
    line = [record]
    while line[-1].parent and not journal.merged_from(line[-1].capsule_id):
        parent = journal.capsule(line[-1].parent)
        if parent is None or any(ex.get("terminal") for ex in journal.execs(parent.capsule_id)):
            break
        line.append(parent)
    execs: list[dict[str, Any]] = []
    writes: list[dict[str, Any]] = []
    outputs: dict[tuple[int, str], tuple[bytes, int]] = {}
    offset = 0
    for capsule in reversed(line):
        own_execs, own_writes = journal.execs(capsule.capsule_id), journal.writes(capsule.capsule_id)
        execs += [{**ex, "seq": ex["seq"] + offset} for ex in own_execs]
        writes += [{**write, "seq": write["seq"] + offset} for write in own_writes]
        outputs.update({(seq + offset, stream): kept
                        for (seq, stream), kept in journal.outputs(capsule.capsule_id).items()})
        offset += max((step["seq"] for step in (*own_execs, *own_writes)), default=0)
    return execs, writes, outputs


# --- reading witnesses ---------------------------------------------------------------


def locate(state: State, witness_id: str | None, path: str | None) -> tuple[Path, str | None]:
    """The file of a witness named by id (with its recorded root hash) or by path (None)."""
    if witness_id:
        rows = _table(state).execute("SELECT path, root_hash FROM witnesses WHERE witness_id = ?", (witness_id,))
        if not rows:
            raise CcwError(
                "NOT_FOUND",
                f"no witness {witness_id}; call witness_list, or pass `path` to a witness file",
                {"witness_id": witness_id},
            )
        return Path(rows[0]["path"]), rows[0]["root_hash"]
    if path:
        paths.encoded(path, "witness path")
        return Path(hostpaths.absolute(path, "path")), None
    raise CcwError("INVALID_ARGUMENT", "give witness_id (from capsule_witness or witness_list) or path")


def witness_key(state: State, trusted: bool = True) -> WitnessKey:
    """The key this state dir signs its witnesses with (made on first use), and (with ``trusted``) the keys it
    trusts: signing reads no list, so a list someone broke stops replays, never the making of witnesses."""
    return WitnessKey.of_state_dir(state.root, trusted)


def open_witness(path: Path) -> BinaryIO:
    """The witness file at ``path``, opened for reading; refused unless it is a regular file.

    O_NONBLOCK: a path naming a FIFO must not hang the call before it can be refused.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise CcwError("NOT_FOUND", f"witness file {str(path)!r} does not exist; check the path") from None
    except OSError as exc:
        raise from_oserror(exc, "opening witness file", str(path),
                           "give the path of a .tar.zst from capsule_witness") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CcwError("INVALID_ARGUMENT", f"{str(path)!r} is not a regular file; give the path of a witness "
                                           "file (.tar.zst) from capsule_witness", {"path": str(path)})
    return os.fdopen(fd, "rb")


def verify_file(path: Path, expected: str | None, key: WitnessKey | None, keep_blobs: bool = False,
                admit: Callable[[dict[str, Any], Verdict], None] | None = None) -> dict[str, Any]:
    """Recompute every hash of the witness at ``path``, and check its signature: fs/witness.py's report.

    ``admit`` may refuse the witness once its manifest and signature are read (before any blob).
    """
    with open_witness(path) as f:
        return wfmt.verify(f, expected, key, keep_blobs, admit)


def signature_of(path: Path, key: WitnessKey) -> tuple[dict[str, Any], str, Verdict]:
    """(manifest, root hash, signature verdict) of the witness at ``path``, from its head alone."""
    with open_witness(path) as f:
        return wfmt.read_signature(f, key)


def stored_witnesses(state: State, capsule_id: str | None = None) -> list[dict[str, Any]]:
    """Witnesses made on this state dir (of one capsule, if given), newest first."""
    rows = _table(state).execute("SELECT * FROM witnesses ORDER BY created_at DESC, witness_id")
    return [
        {
            "witness_id": r["witness_id"], "capsule_id": r["capsule_id"], "path": r["path"],
            "root_hash": r["root_hash"], "size_bytes": r["size_bytes"], "compress": r["compress"],
            "include_blobs": bool(r["include_blobs"]), "created_at": r["created_at"],
        }
        for r in rows
        if capsule_id is None or r["capsule_id"] == capsule_id
    ]
