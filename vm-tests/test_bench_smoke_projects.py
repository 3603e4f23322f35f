"""``bench/run.py realproject`` and ``scaleout`` run to their tables in their ``--quick``
form (issue 40): a real project's suite in capsules, and deltamin on a local REAPI
cluster; apart from test_bench_smoke.py for the workers' sake."""

from __future__ import annotations

import pytest

from tests.support.bench_smoke import run_quick


@pytest.mark.parametrize("suite", ["realproject", "scaleout"])
def test_quick_run_prints_its_table(suite: str, root_required: None) -> None:
    assert run_quick(suite)
