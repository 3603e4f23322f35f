"""core/volatile.py and replaydiff with volatile globs: nyc's random coverage names leave replay_ok alone."""

from __future__ import annotations

from typing import Any

import pytest

from mcp_server.core import volatile
from mcp_server.core.replaydiff import change_mismatches, volatile_written, written_mismatch

UUID_A = "0b6c3f4e-8d2a-4c1e-9f3b-2a7d5e6c1b90"
UUID_B = "f1e2d3c4-b5a6-4978-8a9b-0c1d2e3f4a5b"


def test_globs_match_within_and_across_segments() -> None:
    assert volatile.matches(f".nyc_output/{UUID_A}.json", [".nyc_output/*.json"])
    assert not volatile.matches(f".nyc_output/processinfo/{UUID_A}.json", [".nyc_output/*.json"])
    assert volatile.matches(f".nyc_output/processinfo/{UUID_A}.json", [".nyc_output/**"])
    assert volatile.matches("a/b/c/x.log", ["**/*.log"])
    assert not volatile.matches("src/x.json", [".nyc_output/*.json"])
    assert not volatile.matches("x.json", [])


def test_split_sets_the_volatile_paths_apart() -> None:
    kept, apart = volatile.split(["src/a.js", f".nyc_output/{UUID_A}.json"], [".nyc_output/*.json"])
    assert (kept, apart) == ({"src/a.js"}, {f".nyc_output/{UUID_A}.json"})


@pytest.mark.parametrize("bad", [["/etc/*"], ["../x/*"], ["a/../b"], [""], ["a\0b"], "x", [3]])
def test_check_globs_refuses_what_is_not_a_workspace_glob(bad: Any) -> None:
    with pytest.raises(ValueError):
        volatile.check_globs(bad, "volatile")


def test_check_globs_sorts_and_dedups() -> None:
    assert volatile.check_globs(["b/*", "a/**", "b/*"], "volatile") == ["a/**", "b/*"]


@pytest.mark.parametrize(("recorded", "replayed", "glob"), [
    (f".nyc_output/{UUID_A}.json", f".nyc_output/{UUID_B}.json", ".nyc_output/*.json"),
    (f".nyc_output/processinfo/{UUID_A}.json", f".nyc_output/processinfo/{UUID_B}.json",
     ".nyc_output/processinfo/*.json"),
    ("out-3f9a1c.log", "out-a02b7e.log", "out-*.log"),
    ("x.pyc.12345", "x.pyc.67890", "x.pyc.*"),
    ("cache/deadbeef00", "cache/0123456789abcdef", "cache/*"),
    ("we[ird]/abcd1234.tmp", "we[ird]/ffff0000.tmp", "we?ird]/*.tmp"), ("a*b/abcd1234", "a*b/ffff0000", "a[*]b/*"),
])
def test_names_differing_by_a_random_part_suggest_a_glob(recorded: str, replayed: str, glob: str) -> None:
    assert volatile.pair_glob(recorded, replayed) == glob
    assert volatile.matches(recorded, [glob]) and volatile.matches(replayed, [glob])


@pytest.mark.parametrize(("recorded", "replayed"), [
    ("a/report.json", "b/report.json"),  # another directory
    ("out.txt", "other.txt"),  # words, not a random part
    (f".nyc_output/{UUID_A}.json", f".nyc_output/{UUID_B}.js"),  # another extension
    ("a.json", "b.json"),  # too short to look random
    ("same.json", "same.json"),
])
def test_names_that_differ_otherwise_suggest_nothing(recorded: str, replayed: str) -> None:
    assert volatile.pair_glob(recorded, replayed) is None


def test_suggest_gives_one_glob_per_pattern() -> None:
    recorded = [f".nyc_output/{UUID_A}.json", f".nyc_output/processinfo/{UUID_A}.json", "src/out.txt"]
    replayed = [f".nyc_output/{UUID_B}.json", f".nyc_output/processinfo/{UUID_B}.json"]
    assert volatile.suggest(recorded, replayed) == [".nyc_output/*.json", ".nyc_output/processinfo/*.json"]


def _exec(written: list[str]) -> dict[str, Any]:
    return {"seq": 1, "argv": ["npm", "test"], "touched": {"read": ["package.json"], "written": written}}


def _change(path: str, blob: str) -> dict[str, Any]:
    return {"path": path, "status": "added", "type": "file", "mode": 0o644, "target": None, "blob": blob}


def test_a_written_mismatch_of_random_names_suggests_the_glob() -> None:
    rec, rep = f".nyc_output/{UUID_A}.json", f".nyc_output/{UUID_B}.json"
    found = written_mismatch(_exec([rec]), {"read": [], "written": [rep]}, {rec}, {rep})
    assert found is not None
    assert (found["expected_only"], found["actual_only"]) == ([rec], [rep])
    assert found["suggest_volatile"] == [".nyc_output/*.json"]


def test_volatile_globs_leave_the_random_names_out_and_report_them_apart() -> None:
    rec, rep = f".nyc_output/{UUID_A}.json", f".nyc_output/{UUID_B}.json"
    globs = [".nyc_output/*.json"]
    expected, touched = _exec([rec, "out.txt"]), {"read": [], "written": [rep, "out.txt"]}
    assert written_mismatch(expected, touched, {rec, "out.txt"}, {rep, "out.txt"}, globs) is None
    assert volatile_written(expected, touched, {rec, "out.txt"}, {rep, "out.txt"}, globs) == [
        {"exec": 1, "path": rec, "recorded": True, "replayed": False},
        {"exec": 1, "path": rep, "recorded": False, "replayed": True},
    ]
    # What the globs do not cover still counts.
    other = written_mismatch(expected, {"read": [], "written": [rep]}, {rec, "out.txt"}, {rep}, globs)
    assert other is not None and other["expected_only"] == ["out.txt"] and other["suggest_volatile"] == []


def test_change_comparison_leaves_volatile_paths_out() -> None:
    rec, rep = f".nyc_output/{UUID_A}.json", f".nyc_output/{UUID_B}.json"
    want = [_change(rec, "h1"), _change("src/a.js", "h2")]
    got = [_change(rep, "h3"), _change("src/a.js", "h2")]
    assert [m["path"] for m in change_mismatches(want, got)] == [rec, rep]
    assert change_mismatches(want, got, [".nyc_output/*.json"]) == []
    changed = [_change(rep, "h3"), _change("src/a.js", "h4")]
    assert [m["path"] for m in change_mismatches(want, changed, [".nyc_output/*.json"])] == ["src/a.js"]
