"""Run a benchmark suite: ``python bench/run.py SUITE [--json] [--quick | --smoke]``.

Each suite is ``bench/suites/<SUITE>.py`` with ``run(quick: bool) -> Report``; it measures
ccw and its baseline in the same run and reports medians and ratios.  ``--smoke`` is CI's
smoke test: the smallest sizes that still reach every row's code and its baseline, one
or two repetitions, figures that mean nothing.  A suite whose ``--quick`` already runs in
seconds has no smaller size; the others take ``run(quick, smoke)``.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
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
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--quick", action="store_true", help="fewer repetitions")
    sizes.add_argument("--smoke", action="store_true",
                       help="the smallest run that reaches every row (CI's smoke test; its figures mean nothing)")
    args = parser.parse_args()
    module = importlib.import_module(f"bench.suites.{args.suite}")
    if args.smoke and "smoke" in inspect.signature(module.run).parameters:
        report = module.run(quick=True, smoke=True)
    else:
        report = module.run(quick=args.quick or args.smoke)
    print(report.to_json() if args.json else report.to_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
