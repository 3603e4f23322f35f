"""capsule_replay: re-run a witness in a fresh capsule and compare (seed 003 §5).

The base is rebuilt from the witness's blobs into a scratch directory (files with their
modes and mtimes, directories with their modes, symlinks as links) and mounted at the
recorded workspace path, or, without blobs, taken from the live workspace if every
named base entry still matches.  So a witness replays on a fresh state dir after the
workspace has moved away.  Execs are re-run with the recorded argv, cwd, stdin and
clock offset (the capsule's shift from the real clock, usually none); file-tool writes recorded between them are redone in sequence.  Environment
values come from the replaying server (witnesses record names only).

What is compared, and what ``replay_ok`` and ``output_identical`` mean, is in
core/replaydiff.py.  Each mismatch names the exec and field, or the path.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import trio

from mcp_server.core import replaydiff
from mcp_server.fs import changeset
from mcp_server.fs import witness as wfmt
from mcp_server.fs.view import RootView
from mcp_server.journal import CapsuleRecord
from mcp_server.tools.capsule import exec_env
from mcp_server.tools.registry import ToolContext, ToolSpec
from mcp_server.tools.witness import PROBLEMS, WITNESS_ID, locate, verify_file
from sandbox.errors import CcwError, from_oserror
from sandbox.ops import CreateRequest
from sandbox.spec import CapsuleSpec, Limits


def _rebuild_base(manifest: dict[str, Any], blobs: dict[str, bytes], into: str) -> None:
    """Lay out the witness's base entries under ``into``, never writing through a link.

    The paths come from an archive, so every write resolves beneath ``into`` without
    symlinks (RootView) and creates files exclusively.
    """
    from mcp_server.fs.promote import make_symlink

    dirs: list[tuple[str, int]] = []
    with RootView.open(into) as view:
        for item in manifest["base"]["files"]:
            path = item["path"]
            head = path.rpartition("/")[0]
            if head:
                view.makedirs(head)
            if item["type"] == "dir":
                view.makedirs(path)
                dirs.append((path, item["mode"]))
            elif item["type"] == "symlink":
                make_symlink(view, item["target"], path)
            else:
                _create_file(view, path, blobs[item["blob"]], item["mode"], item.get("mtime_ns"))
        for path, mode in reversed(dirs):  # deepest first: a read-only parent still lets children be set
            view.chmod(path, mode)


def _create_file(view: RootView, path: str, data: bytes, mode: int, mtime_ns: int | None) -> None:
    head, _, name = path.rpartition("/")
    parent = view.open_fd(head or ".", os.O_RDONLY | os.O_DIRECTORY, write=True, what="rebuild")
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=parent)
    except OSError as exc:
        raise from_oserror(exc, "creating a base file of the witness", path,
                           "the witness names this path twice or below a non-directory: make it again") from exc
    finally:
        os.close(parent)
    try:
        _write_all(fd, data)
        os.fchmod(fd, mode)
        if mtime_ns is not None:
            os.utime(fd, ns=(mtime_ns, mtime_ns))  # .pyc files check their source's mtime
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    rest = memoryview(data)
    while rest:
        rest = rest[os.write(fd, rest):]


def apply_write(root_fd: int, write: dict[str, Any], blobs: dict[str, bytes]) -> None:
    """Redo one recorded file-tool change inside a capsule (through its root fd)."""
    from mcp_server.fs.promote import make_symlink, remove_tree

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


def _live_base_mismatches(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    problems = []
    try:
        view = RootView.open(manifest["workspace"])
    except CcwError:
        return [{"path": ".", "problem": "workspace missing"}]
    with view:
        for item in manifest["base"]["files"]:
            side = changeset.lstat(view, item["path"])
            if side is None:
                problems.append({"path": item["path"], "problem": "missing"})
            elif item["type"] == "symlink":
                if side.target != item["target"]:
                    problems.append({"path": item["path"], "problem": "link target differs"})
            elif item["type"] == "dir":
                if side.kind != "dir":
                    problems.append({"path": item["path"], "problem": "no longer a directory"})
            elif side.kind != "file" or wfmt.blob_hash(view.read_bytes(item["path"])) != item["blob"]:
                problems.append({"path": item["path"], "problem": "content differs"})
    return problems


def _replay_changes(changes: list[dict[str, Any]], base_dir: str, root_fd: int) -> list[dict[str, Any]]:
    with RootView.from_fd(root_fd) as capsule, RootView.open(base_dir) as base:
        entries = changeset.expand(changes, base, capsule)
        out = []
        for entry in entries:
            new = entry.new
            out.append({
                "path": entry.path,
                "status": "added" if entry.old is None else "deleted" if new is None else "modified",
                "type": new.kind if new else None,
                "mode": new.mode if new else None,
                "target": new.target if new and new.kind == "symlink" else None,
                "blob": wfmt.blob_hash(capsule.read_bytes(entry.path)) if new and new.kind == "file" else None,
            })
        return out


async def replay(ctx: ToolContext, path: Path, expected_root: str | None) -> dict[str, Any]:
    """Verify, rebuild the base, re-run the execs in a fresh capsule and compare."""
    report = await trio.to_thread.run_sync(verify_file, path, expected_root)
    if not report["ok"]:
        raise CcwError(
            "CONFLICT",
            "the witness failed verification, so it cannot be replayed; see details.problems "
            "(a tampered or truncated file): make the witness again from its capsule",
            {"problems": report["problems"]},
        )
    manifest, blobs = report["manifest"], report["blobs"]
    workspace = manifest["workspace"]
    scratch = Path(tempfile.mkdtemp(prefix="replay-", dir=ctx.state.tmp_dir))
    helper = await ctx.helper()
    capsule_id = None
    try:
        if manifest["include_blobs"]:
            base_dir = str(scratch / "base")
            os.mkdir(base_dir, 0o755)
            await trio.to_thread.run_sync(_rebuild_base, manifest, blobs, base_dir)
        else:
            problems = await trio.to_thread.run_sync(_live_base_mismatches, manifest)
            if problems:
                raise CcwError(
                    "NOT_FOUND",
                    f"the witness carries no blobs and the live workspace no longer matches its base "
                    f"({len(problems)} file(s), first {problems[0]['path']}: {problems[0]['problem']}); "
                    "make the witness with include_blobs: true to replay it anywhere",
                    {"files": problems},
                )
            base_dir = workspace
        spec = manifest["capsule"]
        # The capsule's own offset from the real clock, not "the time the capsule was
        # made": that would shift every replay's clock into the past, and libfaketime
        # (the wall-clock shift) breaks Python's time.sleep under any shift (0.9.10:
        # clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME) gets EINVAL when monotonic is
        # not faked, and lock timeouts hang when it is).  Nothing a replay compares
        # depends on the wall clock's value.
        offset = int(spec.get("clock_offset_sec") or 0)
        capsule_spec = CapsuleSpec(
            workspace=workspace, base=base_dir if base_dir != workspace else None, clock_offset_sec=offset,
            env_whitelist=tuple(spec["env_whitelist"]), limits=Limits(**spec["limits"]), network=spec["network"],
        )
        created = await helper.request("create", CreateRequest(capsule_spec).to_args())
        capsule_id = created["capsule_id"]
        record = CapsuleRecord(
            capsule_id=capsule_id, spec=capsule_spec, parent=None, created_at="", clock=spec["clock"],
            isolation={}, mount="", base_fingerprint=None, destroyed_at=None,
        )
        mismatches: list[dict[str, Any]] = []
        output_diffs: list[dict[str, Any]] = []
        touched_now: dict[int, dict[str, Any]] = {}
        cpu_ms = 0
        cpu_known = True
        rss_max = None
        steps = sorted(
            [("exec", ex) for ex in manifest["execs"]] + [("write", w) for w in manifest.get("writes", [])],
            key=lambda step: step[1]["seq"],
        )
        for kind, ex in steps:
            if kind == "write":
                root = await helper.open_root(capsule_id)
                await trio.to_thread.run_sync(apply_write, root, ex, blobs)
                continue
            run: dict[str, Any] = {
                "capsule_id": capsule_id, "argv": ex["argv"], "cwd": ex["cwd"], "env": exec_env(record),
                "timeout_ms": ex.get("timeout_ms") or 300_000,
            }
            if spec["limits"]:
                run["limits"] = spec["limits"]
            if ex.get("stdin_blob"):
                run["stdin_b64"] = base64.b64encode(blobs[ex["stdin_blob"]]).decode()
            reply = await helper.request("exec", run)
            mismatches += replaydiff.exec_mismatches(ex, reply)
            touched_now[ex["seq"]] = reply["touched"]
            kept = ex.get("output") or {}
            for stream in ("stdout", "stderr"):
                data = base64.b64decode(reply[f"{stream}_b64"])
                recorded = (blobs[kept[stream]["blob"]], kept[stream]["cap"]) if stream in kept else None
                diff = replaydiff.output_diff(ex, stream, wfmt.blob_hash(data), data, recorded)
                if diff is not None:
                    output_diffs.append(diff)
            usage = reply["usage"]
            if usage.get("cpu_ms") is None:
                cpu_known = False
            else:
                cpu_ms += usage["cpu_ms"]
            if usage.get("rss_max_kb") is not None:
                rss_max = max(rss_max or 0, usage["rss_max_kb"])
        changes = (await helper.request("changes", {"capsule_id": capsule_id}))["changes"]
        root_fd = await helper.open_root(capsule_id)
        actual_changes = await trio.to_thread.run_sync(_replay_changes, changes, base_dir, root_fd)
        changed = {c["path"] for c in manifest["changes"]}
        changed_now = {c["path"] for c in actual_changes}
        for ex in manifest["execs"]:
            wrote = replaydiff.written_mismatch(ex, touched_now[ex["seq"]], changed, changed_now)
            if wrote is not None:
                mismatches.append(wrote)
        mismatches += replaydiff.change_mismatches(manifest["changes"], actual_changes)
        mismatches.sort(key=lambda m: (m["kind"] != "exec", m.get("exec", 0), m.get("path", "")))
        return {
            "replay_ok": not mismatches,
            "output_identical": not output_diffs,
            "root_hash": report["root_hash"],
            "execs": len(manifest["execs"]),
            "mismatches": mismatches,
            "output_diffs": output_diffs,
            "metrics": {"cpu_ms": cpu_ms if cpu_known else None, "rss_max_kb": rss_max},
        }
    finally:
        with trio.CancelScope(shield=True):
            if capsule_id is not None:
                with contextlib.suppress(CcwError):
                    await helper.request("destroy", {"capsule_id": capsule_id})
            await trio.to_thread.run_sync(shutil.rmtree, scratch, True)


async def capsule_replay(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Replay a witness and say whether every exec and the change set came out the same."""
    path, expected = locate(ctx.state, args)
    return await replay(ctx, path, expected)


TOOLS = [
    ToolSpec(
        name="capsule_replay",
        family="witness",
        title="Replay witness",
        description=(
            "Re-run a witness's commands in a fresh capsule over its recorded base. replay_ok: the same "
            "exit codes, signals, timeouts, files written and changes (mismatches name the exec or path). "
            "Output is compared apart (output_identical; output_diffs shows the differing lines)."
        ),
        input_schema={
            "type": "object", "additionalProperties": False,
            "properties": {"witness_id": WITNESS_ID, "path": {"type": "string"}},
        },
        output_schema={
            "type": "object", "required": ["replay_ok", "root_hash", "metrics"], "additionalProperties": False,
            "properties": {
                "replay_ok": {"type": "boolean"}, "root_hash": {"type": "string"}, "execs": {"type": "integer"},
                "output_identical": {"type": "boolean"},
                "mismatches": PROBLEMS,
                "output_diffs": {
                    "type": "array",
                    "items": {
                        "type": "object", "required": ["exec", "stream", "lines"],
                        "properties": {
                            "exec": {"type": "integer"}, "stream": {"enum": ["stdout", "stderr"]},
                            "argv": {"type": "array", "items": {"type": "string"}},
                            "lines": {"type": ["array", "null"], "items": {"type": "string"},
                                      "description": "Unified-diff lines, no context: '-' recorded, '+' replayed."},
                            "lines_omitted": {"type": "integer"}, "expected_bytes": {"type": "integer"},
                            "actual_bytes": {"type": "integer"}, "note": {"type": "string"},
                        },
                    },
                },
                "metrics": {
                    "type": "object", "required": ["cpu_ms", "rss_max_kb"], "additionalProperties": False,
                    "properties": {"cpu_ms": {"type": ["integer", "null"]}, "rss_max_kb": {"type": ["integer", "null"]}},
                },
            },
        },
        handler=capsule_replay,
        scope="exec",
        aliases=("capsule/replay",),
        read_only=True,
    ),
]
