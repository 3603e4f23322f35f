"""A benchmark suite run in its ``--quick`` form as a smoke test: ``bench/run.py SUITE
--quick`` must exit 0 and print its table, with no warning about its state dir's mode.
No timing is asserted (timings on shared 2-core machines are noise to a test); what is
checked is that the suite still reaches the code it measures and prints every row it
promises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RULE = "-" * 20  # the table's rule under its header (bench/common.py Report.to_text)


def run_quick(suite: str, timeout: float = 600, smoke: bool = False) -> list[str]:
    """The rows of ``suite``'s quick run (``smoke``: its ``--smoke`` run; one line per
    measure, its extras left out); fails the test, with the run's output, unless it
    printed a table with at least one."""
    size = "--smoke" if smoke else "--quick"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), suite, size],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    output = f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, output
    assert "mcp:state-dir" not in proc.stderr, output  # a bench makes its state dirs as ccw does (statedir.py)
    lines = proc.stdout.splitlines()
    assert lines and lines[0] == f"suite {suite}", output
    rule = next((i for i, line in enumerate(lines) if line.startswith(RULE)), None)
    assert rule is not None and lines[rule - 1].startswith("measure"), output
    table = [line for line in lines[rule + 1:] if line and not line.startswith("note: ")]
    rows = [line for line in table if not line.startswith(" ")]
    assert rows, output
    return rows


def assert_rows(rows: list[str], expected: list[tuple[str, str]]) -> None:
    """``rows`` are, in order, the measures ``expected`` names, each with its baseline
    (``""``: a row without one) measured: the table prints ``n/a`` for a baseline without a figure."""
    assert len(rows) == len(expected), rows
    for row, (name, baseline) in zip(rows, expected, strict=True):
        assert row.startswith(f"{name} "), (row, name)
        assert baseline in row[len(name):] and f"{baseline} n/a" not in row, (row, baseline)
