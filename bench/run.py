"""Run a benchmark suite: ``python bench/run.py SUITE [--json] [--quick]``.

Each suite is ``bench/suites/<SUITE>.py`` with ``run(quick: bool) -> Report``; it measures
ccw and its baseline in the same run and reports medians and ratios.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import bench.suites  # noqa: E402


def main() -> int:
    suites = sorted(m.name for m in pkgutil.iter_modules(bench.suites.__path__))
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("suite", choices=suites)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")
    args = parser.parse_args()
    module = importlib.import_module(f"bench.suites.{args.suite}")
    report = module.run(quick=args.quick)
    print(report.to_json() if args.json else report.to_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
