"""``bench/run.py realproject`` and ``scaleout`` run to their tables in their ``--smoke``
form (issue 40): a real project in capsules (a one-line check of it in place of its
pytest runs), and deltamin on a local REAPI cluster (a 4-file change); every row's code
and its baseline reached, no timing asserted.  Apart from test_bench_smoke.py for the
workers' sake: the cluster's own start is most of a minute on a loaded machine."""

from __future__ import annotations

import pytest

from tests.support.bench_smoke import assert_rows, run_quick
from tests.support.reapi_cluster import require_cluster_prerequisites


def test_realproject_smoke_run_prints_suite_deltamin_and_replay(root_required: None) -> None:
    assert_rows(run_quick("realproject", smoke=True), [
        ("more-itertools-10.5.0 full suite (smoke check of chunked)", "same command on the host"),
        ("deltamin, scenario: 3 edits in 2 files: wall time", "textbook ddmin"),
        ("capsule_replay of the loop's witness (3 execs)", "the original runs"),
    ])


def test_scaleout_smoke_run_prints_every_row(root_required: None, request: pytest.FixtureRequest) -> None:
    require_cluster_prerequisites(request.config)
    change = "deltamin, narrow (smoke): 1 culprit of 4 files"
    assert_rows(run_quick("scaleout", smoke=True), [
        (f"{change}, 1 bot(s): wall time", "1 bot"),
        (f"{change}, 2 bot(s): wall time", "1 bot"),
        ("2 deltamins at once (narrow), 2 bots", "1 bot"),
        ("trivial trial through the cluster", "local scratch capsule"),
        ("a lease's input root (10 dirs, 20 files, one changed)", "laid out afresh from the host's cache"),
        ("repeated deltamin (narrow, 2 bots): wall time", "first run"),
    ])
