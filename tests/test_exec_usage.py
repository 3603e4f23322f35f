"""sandbox/exec_usage.py on fake cgroup directories: each figure, its source or its reason (no root needed)."""

from __future__ import annotations

from pathlib import Path

from sandbox.cgroups import CgroupLayout, Hierarchy
from sandbox.exec_usage import ExecDirs, measure, why_none
from sandbox.rusage import INIT_RSS
from sandbox.usage_words import REFUSED, mechanism, refusal_head


def _v2(tmp_path: Path, files: dict[str, str]) -> ExecDirs:
    hier = Hierarchy(2, frozenset({"memory", "pids", "cpu", "io"}), str(tmp_path), str(tmp_path))
    exec_dir = tmp_path / "ccw" / "x@1"
    exec_dir.mkdir(parents=True)
    for name, text in files.items():
        (exec_dir / name).write_text(text)
    return ExecDirs(CgroupLayout((hier,)), {hier: str(exec_dir)}, lambda path: Path(path).read_text())


V2_FILES = {"cpu.stat": "usage_usec 3000\nuser_usec 2000\n", "memory.peak": "4194304\n",
            "memory.events": "low 0\nhigh 0\nmax 1\noom 1\noom_kill 1\n", "pids.events": "max 3\n",
            "io.stat": "254:0 rbytes=8192 wbytes=16384 rios=2 wios=4 dbytes=0 dios=0\n",
            "memory.stat": "anon 0\nfile_dirty 0\nfile_writeback 0\n"}


class _Rusage:
    ru_inblock = 8  # 512-byte units
    ru_oublock = 40


def test_v2_figures_each_name_their_source(tmp_path: Path) -> None:
    usage = measure(_v2(tmp_path, V2_FILES), {}, cpu_limited=True)
    assert (usage.cpu_ms, usage.rss_max_kb, usage.io_read_kb, usage.io_write_kb) == (3, 4096, 8, 16)
    assert usage.oom_killed and usage.pids_limited and usage.cpu_limited
    assert set(usage.sources) == {"cpu_ms", "rss_max_kb", "io_read_kb", "io_write_kb"}
    assert "cpu.stat usage_usec" in usage.sources["cpu_ms"] and usage.unavailable == {}


def test_unwritten_pages_leave_the_write_figure_null_with_the_amount(tmp_path: Path) -> None:
    dirty = dict(V2_FILES, **{"memory.stat": "file_dirty 8192\nfile_writeback 4096\n"})
    usage = measure(_v2(tmp_path, dirty), {}, cpu_limited=False)
    assert usage.io_write_kb is None and usage.io_read_kb == 8
    assert usage.unavailable["io_write_kb"].startswith("12 kB written by the exec were still in the page cache")


def test_the_jails_rusage_is_the_io_source_when_given(tmp_path: Path) -> None:
    usage = measure(_v2(tmp_path, V2_FILES), {}, cpu_limited=False, rusage=_Rusage())
    assert (usage.io_read_kb, usage.io_write_kb) == (4, 20)
    assert usage.sources["io_write_kb"].startswith("wait4 rusage")


def test_v1_blkio_that_saw_no_device_is_a_reason_not_a_zero(tmp_path: Path) -> None:
    hier = Hierarchy(1, frozenset({"blkio"}), str(tmp_path), str(tmp_path))
    (tmp_path / "blkio.throttle.io_service_bytes").write_text("Total 0\n")
    where = ExecDirs(CgroupLayout((hier,)), {hier: str(tmp_path)}, lambda path: Path(path).read_text())
    usage = measure(where, {}, cpu_limited=False)
    assert usage.io_read_kb is None and usage.io_write_kb is None
    assert "cannot be told from unmeasured" in usage.unavailable["io_read_kb"]
    assert "kernel flusher" in usage.unavailable["io_write_kb"]


def test_refusals_alike_in_every_hierarchy_read_as_one_line() -> None:
    refused = {f"/sys/fs/cgroup/{name}": f"mkdir('/sys/fs/cgroup/{name}/ccw') failed: EACCES (Permission denied)"
               for name in ("memory", "pids")}
    reason = why_none(refused)
    assert reason.startswith("mkdir of the exec's cgroup failed with EACCES (Permission denied) in every hierarchy")
    assert "(memory, pids)" in reason
    assert why_none({}) == "no cgroup hierarchy on this host provides it"
    usage = measure(ExecDirs(CgroupLayout(), {}, lambda path: ""), refused, cpu_limited=False)
    assert usage.unavailable["rss_max_kb"] == f"no memory cgroup: {reason}"


def test_a_standing_refusal_is_told_by_its_head_and_a_source_by_its_mechanism(tmp_path: Path) -> None:
    refused = {"/sys/fs/cgroup/memory": "mkdir('/sys/fs/cgroup/memory/ccw') failed: EACCES (Permission denied)"}
    usage = measure(ExecDirs(CgroupLayout(), {}, lambda path: ""), refused, cpu_limited=False)
    assert {figure: refusal_head(figure, why) for figure, why in usage.unavailable.items()} == REFUSED
    assert refusal_head("rss_max_kb", "this kernel has no memory.peak (added in Linux 5.19)") is None
    assert refusal_head("io_write_kb", "12 kB written by the exec were still in the page cache") is None
    assert refusal_head("rss_max_kb", f"{REFUSED['oom_killed']}: x") is None  # another figure's head
    measured = measure(_v2(tmp_path, V2_FILES), {}, cpu_limited=False)
    assert {figure: mechanism(source) for figure, source in measured.sources.items()} == {
        "cpu_ms": "cgroup v2 cpu.stat usage_usec", "rss_max_kb": "cgroup v2 memory.peak",
        "io_read_kb": "cgroup v2 io.stat of the exec's cgroup",
        "io_write_kb": "cgroup v2 io.stat of the exec's cgroup (writeback done)"}
    assert mechanism(f"{INIT_RSS}; no process peaked above 18 kB") == "wait4 rusage of the jail's init; " \
        "no process peaked above 18 kB"
