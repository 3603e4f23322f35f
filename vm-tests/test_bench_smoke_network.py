"""``bench/run.py network --quick`` runs to its table (issue 40).  Apart from
test_bench_smoke.py: it puts a veth on netfixtures' fixed addresses, so it runs on the
worker of the other vm-tests that do (vm-tests/conftest.py SHARED)."""

from __future__ import annotations

from tests.support.bench_smoke import run_quick


def test_network_quick_run_prints_its_table(root_required: None) -> None:
    assert run_quick("network")
