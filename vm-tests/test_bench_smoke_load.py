"""``bench/run.py many`` and ``load`` run to their tables in their ``--smoke`` form (issue
40): every row's code and its baseline reached, the sizes cut to a smoke run (no timing
asserted).  Apart from test_bench_smoke.py, so that the two workers of ``./dev test``
share the longest smoke runs (a file stays on one worker)."""

from __future__ import annotations

from tests.support.bench_smoke import assert_rows, run_quick

GIT_MERGE = "git merge of the same branches"


def test_many_smoke_run_prints_forks_race_and_merge(root_required: None) -> None:
    assert_rows(run_quick("many", smoke=True), [
        ("capsule_fork count=1: per fork (10 calls)", ""),
        ("capsule_fork count=2: per fork", "count=1"),
        ("capsule_race of 4 (python, ~0.003 s each)", "one after another"),
        ("capsule_merge of 2 x 100 changed files, into new", GIT_MERGE),
        ("capsule_merge of 2 x 100 changed files, dry run", GIT_MERGE),
    ])


def test_load_smoke_run_prints_both_transports_and_every_abuse(root_required: None) -> None:
    abuses = ("fork bomb", "memory bomb", "output flood", "disk fill")
    assert_rows(run_quick("load", smoke=True), [
        ("socket: 4 clients x 7 mixed requests, p50", ""),
        ("http: 4 clients x 7 mixed requests, p50", ""),
        *((f"exec /bin/true beside a {abuse}", "same, idle server") for abuse in abuses),
    ])
