"""Usage without cgroups: the init's rusage report, how it fills a Measurement, and the kernel facts it rests on."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from sandbox import rusage
from sandbox.rusage import Measurement

MIB = 1024  # ru_maxrss is in kB


def _rusage(utime: float = 0.0, stime: float = 0.0, maxrss: int = 0, inblock: int = 0,
            oublock: int = 0) -> resource.struct_rusage:
    fields = [utime, stime, maxrss, 0, 0, 0, 0, 0, 0, inblock, oublock, 0, 0, 0, 0, 0]
    return resource.struct_rusage(fields)


def _rootless_usage() -> Measurement:
    """What exec_cgroup.collect gives when no hierarchy was writable."""
    why = "mkdir of the exec's cgroup failed with EACCES in every hierarchy"
    return Measurement(None, None, 4, 0, False, False,
                 {"cpu_ms": f"no readable cpu usage counter: {why}", "rss_max_kb": f"no memory cgroup: {why}"})


def test_report_round_trips() -> None:
    packed = rusage.pack(_rusage(utime=1.25, stime=0.5, maxrss=40 * MIB, inblock=8, oublock=16), 18 * MIB)
    assert rusage.unpack(packed) == rusage.InitReport(1750, 40 * MIB, 8, 16, 18 * MIB)


@pytest.mark.parametrize("payload", [b"", b"\0" * 39, b"\0" * 41])
def test_malformed_report_is_ignored(payload: bytes) -> None:
    assert rusage.unpack(payload) is None


def test_rootless_usage_takes_cpu_and_largest_process_from_the_init() -> None:
    usage = _rootless_usage()
    rusage.fill(usage, rusage.InitReport(1750, 40 * MIB, 8, 16, 18 * MIB))
    assert (usage.cpu_ms, usage.rss_max_process_kb) == (1750, 40 * MIB)
    assert usage.sources == {"cpu_ms": rusage.INIT_CPU, "rss_max_process_kb": rusage.INIT_RSS}
    # The total stays null, never 0 nor the single process's figure, and says where to look.
    assert usage.rss_max_kb is None and "rss_max_process_kb" in usage.unavailable["rss_max_kb"]
    assert "cpu_ms" not in usage.unavailable


def test_cgroup_figures_are_kept() -> None:
    usage = Measurement(900, 120 * MIB, 0, 0, False, False, sources={"cpu_ms": "cgroup v1 cpuacct.usage"})
    rusage.fill(usage, rusage.InitReport(700, 40 * MIB, 0, 0, 18 * MIB))
    assert (usage.cpu_ms, usage.rss_max_kb, usage.rss_max_process_kb) == (900, 120 * MIB, 40 * MIB)
    assert usage.sources["cpu_ms"] == "cgroup v1 cpuacct.usage"


def test_a_peak_within_the_inherited_image_says_so() -> None:
    usage = _rootless_usage()
    rusage.fill(usage, rusage.InitReport(1, 17 * MIB, 0, 0, 18 * MIB))
    assert usage.rss_max_process_kb == 17 * MIB
    assert f"{18 * MIB} kB of ccw's init image" in usage.sources["rss_max_process_kb"]


def test_a_killed_init_leaves_nulls_with_the_reason() -> None:
    usage = _rootless_usage()
    rusage.fill(usage, None)
    assert usage.cpu_ms is None and usage.rss_max_process_kb is None and usage.io_read_kb == 4
    for figure in ("cpu_ms", "rss_max_process_kb"):
        assert usage.unavailable[figure].endswith(rusage.NO_REPORT)
    assert usage.unavailable["cpu_ms"].startswith("no readable cpu usage counter")
    assert "io_read_kb" not in usage.unavailable and "io_read_kb" not in usage.sources


# --- the kernel's semantics, as rusage.py writes them down ---------------------------

_HOLD = "import sys, time; b = b'x' * (int(sys.argv[1]) << 20); time.sleep(float(sys.argv[2]))"


def _children_maxrss(script: str) -> int:
    """RUSAGE_CHILDREN's ru_maxrss of a fresh process that runs ``script`` and reaps its children."""
    probe = script + "\nimport resource; print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    return int(subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout)


def test_kernel_maxrss_of_children_is_the_largest_single_process_not_a_sum() -> None:
    together = _children_maxrss(
        "import subprocess, sys\n"
        f"ps = [subprocess.Popen([sys.executable, '-c', {_HOLD!r}, str(n), '0.5']) for n in (48, 64)]\n"
        "[p.wait() for p in ps]")
    assert 64 * MIB <= together < (48 + 64) * MIB


def test_kernel_maxrss_counts_the_image_a_process_had_before_exec() -> None:
    # A 96 MiB parent forks a child that at once execs /bin/true: the child reports 96 MiB.
    inherited = _children_maxrss(
        "import os\nb = b'x' * (96 << 20)\npid = os.fork()\n"
        "if pid == 0:\n    os.execv('/bin/true', ['true'])\nos.waitpid(pid, 0)")
    assert inherited >= 96 * MIB
