"""The benchmark suites that need privilege (capsules, the helper, jails) run to their
tables in their ``--quick`` form (issue 40); tests/test_bench_smoke.py runs the others,
test_bench_smoke_network.py and test_bench_smoke_services.py those that share a fixed
address or port with other vm-tests.  The longest are in files of their own
(test_bench_smoke_load.py, test_bench_smoke_projects.py), so that the two workers of
``./dev test`` share them (a file stays on one worker)."""

from __future__ import annotations

import pytest

from tests.support.bench_smoke import run_quick

SUITES = ("capsule", "mcp", "surface", "witness", "unotify", "deltamin")


@pytest.mark.parametrize("suite", SUITES)
def test_quick_run_prints_its_table(suite: str, root_required: None) -> None:
    assert run_quick(suite)
