"""``bench/run.py many`` and ``load`` run to their tables in their ``--quick`` form
(issue 40): apart from test_bench_smoke.py for the workers' sake, these two taking
two minutes each on a loaded 2-core machine."""

from __future__ import annotations

import pytest

from tests.support.bench_smoke import run_quick


@pytest.mark.parametrize("suite", ["many", "load"])
def test_quick_run_prints_its_table(suite: str, root_required: None) -> None:
    assert run_quick(suite)
