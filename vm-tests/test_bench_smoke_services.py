"""``bench/run.py services --quick`` runs to its table (issue 40).  Apart from
test_bench_smoke.py: it serves ``python3 -m http.server 8765`` in capsules and on the
host, which test_services_tools.py looks for on the whole host, so it runs on that
file's worker (vm-tests/conftest.py SHARED).

The bench finds its servers by reading every process's argv, other tests' among them;
one of those once held a byte that is not UTF-8 and the bench crashed on it, so the run
here has such a process beside it."""

from __future__ import annotations

import subprocess

from tests.support.bench_smoke import run_quick


def test_services_quick_run_prints_its_table(root_required: None) -> None:
    stranger = subprocess.Popen([b"sleep\xff-not-utf8", "600"], executable="/bin/sleep")
    try:
        assert run_quick("services")
    finally:
        stranger.kill()
        stranger.wait()
