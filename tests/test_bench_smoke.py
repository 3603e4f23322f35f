"""The benchmark suites that need no privilege run to their tables in their ``--quick``
form (issue 40: nothing ran the benches, so two crashed unnoticed); the others run in
vm-tests/test_bench_smoke*.py."""

from __future__ import annotations

from tests.support.bench_smoke import run_quick


def test_substrate_quick_run_prints_both_comparisons() -> None:
    rows = run_quick("substrate")
    assert [row.split("  ")[0] for row in rows] == [
        "snapshot_grep literal (worktree)", "snapshot_create whole tree (fresh store)"]


def test_text_quick_run_prints_transport_and_in_process_rows() -> None:
    rows = run_quick("text")
    names = [row.split("  ")[0].rstrip() for row in rows]
    assert "read 10000 lines: unchanged (socket)" in names and "read 10000 lines: unchanged (stdio)" in names
    assert names[-2:] == ["read 10000 lines: unchanged (in process)", "edit 1 of 10000 lines (in process)"]
