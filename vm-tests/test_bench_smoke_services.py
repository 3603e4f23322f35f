"""``bench/run.py services --quick`` runs to its table (issue 40).  Apart from
test_bench_smoke.py: it serves ``python3 -m http.server 8765`` in capsules and on the
host, which test_services_tools.py looks for on the whole host, so it runs on that
file's worker (vm-tests/conftest.py SHARED)."""

from __future__ import annotations

from tests.support.bench_smoke import run_quick


def test_services_quick_run_prints_its_table(root_required: None) -> None:
    assert run_quick("services")
