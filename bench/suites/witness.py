"""``python bench/run.py witness``: witnesses beside tar, promotion beside cp + sync.

- Witness creation throughput (MB/s of blob data) for a capsule whose exec read 200 MB
  (200 files of 1 MiB), with ``include_blobs``, beside ``tar --zstd -cf`` of the same
  files in the same run.  Target: at least 0.8x tar's throughput.
- Replay of that witness (verify while reading, rebuild the 200 MB base, re-run the
  exec, compare), beside ``tar --zstd -xf`` of the same archive into a fresh directory:
  the part of a replay that any tool must do.  ``bench/against.py witness REV`` compares
  it (and the rest) with an earlier revision in one run.
- Promotion of 1,000 changed files (temp files made durable by one syncfs, journaled,
  renamed into place, the renames made durable by a second syncfs), beside ``cp`` of the
  same files followed by ``sync -f`` (syncfs of the same filesystem).  Both start with
  no dirty data and write into the same filesystem, in alternating order.  Target: at
  most 2x.
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

from bench.common import Call, Report, Row, in_process_tools

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




async def _time_promote(call: Call, capsule_id: str) -> float:
    _sh("sync")  # the exec's own writes are not the promotion's to flush
    start = time.perf_counter()
    promoted = await call("capsule_promote", {"capsule_id": capsule_id})
    elapsed = time.perf_counter() - start
    assert promoted["promoted"] and len(promoted["applied"]) >= PROMOTE_FILES, promoted["policy_report"]
    return elapsed


def _time_copy(source: Path, dest: Path) -> float:
    _sh("sync")
    start = time.perf_counter()
    # sync -f: syncfs of the one filesystem, as promotion does; a bare sync would also
    # wait for every other filesystem's dirty data.
    _sh(f"cp {source}/*.txt {dest}/ && sync -f {dest}")
    return time.perf_counter() - start


async def _measure(root: Path, repeat: int, promote_rounds: int) -> dict[str, list[float]]:
    ws = root / "ws"
    ws.mkdir()
    _make_tree(ws)
    out: dict[str, list[float]] = {"witness": [], "tar": [], "promote": [], "cp_sync": [], "replay": [], "untar": []}
    async with in_process_tools(root / "state") as tools:
        await _witness_rounds(tools.call, root, ws, repeat, out)
        for i in range(promote_rounds):
            await _promote_round(tools.call, root, i, out)
    return out


async def _witness_rounds(call: Call, root: Path, ws: Path, repeat: int, out: dict[str, list[float]]) -> None:
    """``capsule_witness`` with blobs after a run that read every file, beside ``tar --zstd``."""
    cap = (await call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
    ran = await call("capsule_exec",
                     {"capsule_id": cap, "cmd": ["sh", "-c", "cat data*.bin > /dev/null; echo x > note.txt"]})
    assert ran["exit_code"] == 0 and ran["touched"]["read"] is not None and len(ran["touched"]["read"]) >= FILES
    for i in range(repeat):
        _sh("sync")
        start = time.perf_counter()
        made = await call("capsule_witness", {"capsule_id": cap, "include_blobs": True})
        out["witness"].append(time.perf_counter() - start)
        if i < repeat - 1:
            os.unlink(made["path"])
        target = root / f"tar{i}.tar.zst"
        _sh("sync")
        start = time.perf_counter()
        _sh(f"tar --zstd -cf {target} -C {ws} .")
        out["tar"].append(time.perf_counter() - start)
        target.unlink()
    await call("capsule_destroy", {"capsule_id": cap})
    await _replay_rounds(call, root, Path(made["path"]), repeat, out)


async def _replay_rounds(call: Call, root: Path, witness: Path, repeat: int, out: dict[str, list[float]]) -> None:
    """``capsule_replay`` of the last witness, beside ``tar --zstd -xf`` of it into a fresh directory."""
    for i in range(repeat):
        _sh("sync")
        start = time.perf_counter()
        replayed = await call("capsule_replay", {"path": str(witness)})
        out["replay"].append(time.perf_counter() - start)
        assert replayed["replay_ok"], replayed["mismatches"]
        target = root / f"untar{i}"
        target.mkdir()
        _sh("sync")
        start = time.perf_counter()
        _sh(f"tar --zstd -xf {witness} -C {target}")
        out["untar"].append(time.perf_counter() - start)
        shutil.rmtree(target)
    os.unlink(witness)


async def _promote_round(call: Call, root: Path, i: int, out: dict[str, list[float]]) -> None:
    """One promotion of PROMOTE_FILES new files, beside ``cp`` + ``sync -f`` of the same files."""
    cap = (await call("capsule_create", {"workspace": str(root / "ws")}))["capsule_id"]
    script = f"mkdir -p gen; for n in $(seq 1 {PROMOTE_FILES}); do echo round {i} file $n > gen/f$n.txt; done"
    assert (await call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", script]}))["exit_code"] == 0
    source = root / f"src{i}"
    source.mkdir()
    for n in range(1, PROMOTE_FILES + 1):
        (source / f"f{n}.txt").write_text(f"round {i} file {n}\n")
    # The copy replaces the previous round's files, as the promotion does: on
    # a journal-less ext4 (these VMs) creating a file skips, one buffer lookup
    # each, every inode of its block group freed in the last ~30 s, so a copy
    # into a fresh directory (placed by ext4 in an untouched group) would not
    # pay what replacing files in a long-lived directory costs.
    dest = root / "dest"
    dest.mkdir(exist_ok=True)
    for old in dest.iterdir():
        old.unlink()
    # Whichever side runs first after this round's deletions pays the most for
    # them, so the order alternates.
    if i % 2 == 0:
        out["promote"].append(await _time_promote(call, cap))
        out["cp_sync"].append(_time_copy(source, dest))
    else:
        out["cp_sync"].append(_time_copy(source, dest))
        out["promote"].append(await _time_promote(call, cap))
    await call("capsule_destroy", {"capsule_id": cap})


def run(quick: bool = False) -> Report:
    """Witness throughput and promotion cost, each beside its baseline."""
    import trio

    report = Report("witness")
    root = Path(tempfile.mkdtemp(prefix="ccw-bench-witness-"))
    try:
        times = trio.run(_measure, root, 1 if quick else 5, 2 if quick else 8)
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
        "capsule_replay of that witness", statistics.median(times["replay"]) * 1000,
        "tar --zstd -xf", statistics.median(times["untar"]) * 1000, "",
    ))
    report.add(Row(
        f"capsule_promote, {PROMOTE_FILES} files", statistics.median(times["promote"]) * 1000,
        "cp + sync -f", statistics.median(times["cp_sync"]) * 1000, "<= 2x",
        {"per-round ratios (ccw/cp, each pair run back to back)":
             " ".join(f"{p / c:.2f}" for p, c in zip(times["promote"], times["cp_sync"], strict=True))},
    ))
    report.notes.append("promotion time includes the policy check (baseline) and the conflict check")
    return report
