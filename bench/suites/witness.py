"""``python bench/run.py witness``: witnesses beside tar, promotion beside cp + sync.

- Witness creation throughput (MB/s of blob data) for a capsule whose exec read 200 MB
  (200 files of 1 MiB), with ``include_blobs``, beside ``tar --zstd -cf`` of the same
  files in the same run.  Target: at least 0.8x tar's throughput.
- Promotion of 1,000 changed files (each fsynced, renamed into place, directories
  fsynced, journaled), beside ``cp`` of the same files followed by ``sync``.  Target:
  at most 2x.
Needs root (the helper runs privileged).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import Report, Row

FILES = 200
FILE_BYTES = 1 << 20
PROMOTE_FILES = 1000


def _make_tree(root: Path) -> None:
    # Half-compressible content, like source and build artefacts: a random 4 KiB block
    # repeated with a per-file twist.
    block = os.urandom(4096)
    for i in range(FILES):
        data = (block[i % 97 :] + block[: i % 97]) * (FILE_BYTES // 4096)
        (root / f"data{i:03}.bin").write_bytes(data[:FILE_BYTES])


def _sh(command: str) -> None:
    # Blocking on purpose: nothing else runs while a baseline is timed.
    subprocess.run(command, shell=True, check=True)


async def _measure(root: Path, repeat: int) -> dict[str, list[float]]:
    from mcp_server.config import TOOLSETS, Config
    from mcp_server.context import CallContext, Runtime
    from mcp_server.state import State
    from mcp_server.tools.registry import Registry

    ws = root / "ws"
    ws.mkdir()
    _make_tree(ws)
    config = Config.from_env({"CCW_STATE_DIR": str(root / "state")})
    runtime = Runtime(config, State(config.state_dir))
    ctx = CallContext(runtime)
    registry = Registry.load(TOOLSETS)

    async def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
        spec = registry.lookup(name)
        assert spec is not None
        result: dict[str, Any] = await spec.handler(ctx, args)
        return result

    out: dict[str, list[float]] = {"witness": [], "tar": [], "promote": [], "cp_sync": []}
    try:
        cap = (await call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        ran = await call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", "cat data*.bin > /dev/null; echo x > note.txt"]})
        assert ran["exit_code"] == 0 and ran["touched"]["read"] is not None and len(ran["touched"]["read"]) >= FILES
        for i in range(repeat):
            _sh("sync")
            start = time.perf_counter()
            made = await call("capsule_witness", {"capsule_id": cap, "include_blobs": True})
            out["witness"].append(time.perf_counter() - start)
            os.unlink(made["path"])
            target = root / f"tar{i}.tar.zst"
            _sh("sync")
            start = time.perf_counter()
            _sh(f"tar --zstd -cf {target} -C {ws} .")
            out["tar"].append(time.perf_counter() - start)
            target.unlink()
        await call("capsule_destroy", {"capsule_id": cap})
        for i in range(repeat):
            cap = (await call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
            script = f"mkdir -p gen; for n in $(seq 1 {PROMOTE_FILES}); do echo round {i} file $n > gen/f$n.txt; done"
            assert (await call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", script]}))["exit_code"] == 0
            start = time.perf_counter()
            promoted = await call("capsule_promote", {"capsule_id": cap})
            out["promote"].append(time.perf_counter() - start)
            assert promoted["promoted"] and len(promoted["applied"]) >= PROMOTE_FILES, promoted["policy_report"]
            await call("capsule_destroy", {"capsule_id": cap})
            source = root / f"src{i}"
            source.mkdir()
            for n in range(1, PROMOTE_FILES + 1):
                (source / f"f{n}.txt").write_text(f"round {i} file {n}\n")
            dest = root / f"dest{i}"
            dest.mkdir()
            _sh("sync")
            start = time.perf_counter()
            _sh(f"cp {source}/*.txt {dest}/ && sync")
            out["cp_sync"].append(time.perf_counter() - start)
    finally:
        await runtime.aclose()
    return out


def run(quick: bool = False) -> Report:
    """Witness throughput and promotion cost, each beside its baseline."""
    import trio

    report = Report("witness")
    root = Path(tempfile.mkdtemp(prefix="ccw-bench-witness-"))
    try:
        times = trio.run(_measure, root, 1 if quick else 5)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    megabytes = FILES * FILE_BYTES / 1e6
    witness_s = statistics.median(times["witness"])
    tar_s = statistics.median(times["tar"])
    report.add(Row(
        f"capsule_witness, {megabytes:.0f} MB read", witness_s * 1000, "tar --zstd -cf", tar_s * 1000, "<= 1.25x time",
        {"throughput (MB/s)": f"ccw {megabytes / witness_s:.0f}, tar {megabytes / tar_s:.0f}, "
                              f"ccw/tar {tar_s / witness_s:.2f}x (target >= 0.8x)"},
    ))
    report.add(Row(
        f"capsule_promote, {PROMOTE_FILES} files", statistics.median(times["promote"]) * 1000,
        "cp + sync", statistics.median(times["cp_sync"]) * 1000, "<= 2x",
    ))
    report.notes.append("promotion time includes the policy check (baseline) and the conflict check")
    return report
