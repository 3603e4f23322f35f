"""core/replaydiff.py: what makes replay_ok, and the output lines shown where output differs."""

from __future__ import annotations

from typing import Any

from mcp_server.core.replaydiff import (
    MAX_DIFF_LINES,
    change_mismatches,
    exec_mismatches,
    output_diff,
    written_mismatch,
)
from mcp_server.fs.witness import blob_hash

RECORDED = b"collected 3 items\n\ntests/test_a.py ...\n== 3 passed in 0.55s ==\n"
REPLAYED = b"collected 3 items\n\ntests/test_a.py ...\n== 3 passed in 0.61s ==\n"


def _exec(**over: Any) -> dict[str, Any]:
    base = {
        "seq": 2, "argv": ["pytest", "-q"], "exit_code": 0, "signal": None, "timed_out": False,
        "touched": {"read": ["a.py"], "written": ["out.txt"]},
        "stdout_blake3": blob_hash(RECORDED), "stdout_bytes": len(RECORDED),
        "stderr_blake3": blob_hash(b""), "stderr_bytes": 0,
    }
    return {**base, **over}


def test_the_same_ending_and_writes_is_no_mismatch() -> None:
    assert exec_mismatches(_exec(), _exec()) == []


def test_exit_code_signal_and_timeout_are_each_named() -> None:
    got = _exec(exit_code=None, signal="SIGKILL", timed_out=True)
    found = exec_mismatches(_exec(), got)
    assert [(m["exec"], m["field"]) for m in found] == [(2, "exit_code"), (2, "signal"), (2, "timed_out")]
    assert (found[0]["expected"], found[0]["actual"]) == (0, None)


def test_written_sets_compare_the_paths_that_survive() -> None:
    recorded = _exec(touched={"read": [], "written": ["out.txt", "x.pyc", "x.pyc.2"]})
    # The temp name a rename hid from one run and not the other does not count.
    same = written_mismatch(recorded, {"read": [], "written": ["out.txt", "x.pyc", "x.pyc.3"]}, {"out.txt", "x.pyc"},
                            {"out.txt", "x.pyc"})
    assert same is None
    other = written_mismatch(recorded, {"read": [], "written": ["other.txt"]}, {"out.txt"}, {"other.txt"})
    assert other is not None and other["field"] == "written"
    assert (other["expected_only"], other["actual_only"]) == (["out.txt"], ["other.txt"])


def test_written_sets_are_not_compared_across_tracing_modes() -> None:
    # A rootless replay (read unknown) sees writes only through the upper dir.
    assert written_mismatch(_exec(), {"read": None, "written": []}, {"out.txt"}, set()) is None
    rootless = _exec(touched={"read": None, "written": []})
    assert written_mismatch(rootless, {"read": None, "written": ["x"]}, set(), {"x"}) is not None


def test_changes_compare_final_states_and_name_the_path() -> None:
    def change(path: str, status: str, blob: str | None) -> dict[str, Any]:
        return {"path": path, "status": status, "type": None if status == "deleted" else "file", "mode": 0o644,
                "target": None, "blob": blob}

    recorded = [change("out/stamp.txt", "added", "blake3:1"), change("gone", "deleted", None),
                change("m", "modified", "blake3:m")]
    replayed = [change("out/stamp.txt", "added", "blake3:2"), change("gone", "deleted", None),
                change("m", "added", "blake3:m")]
    # "modified" against the full base and "added" against a rebuilt base are one outcome.
    found = change_mismatches(recorded, replayed)
    assert [(m["kind"], m["path"]) for m in found] == [("change", "out/stamp.txt")]
    assert change_mismatches(recorded, replayed[:2])[0]["path"] == "m"


def test_identical_output_has_no_diff() -> None:
    assert output_diff(_exec(), "stdout", blob_hash(RECORDED), RECORDED, (RECORDED, 1 << 20)) is None


def test_a_duration_shows_as_the_one_line_that_differs() -> None:
    diff = output_diff(_exec(), "stdout", blob_hash(REPLAYED), REPLAYED, (RECORDED, 1 << 20))
    assert diff is not None
    assert (diff["exec"], diff["stream"], diff["argv"]) == (2, "stdout", ["pytest", "-q"])
    assert diff["lines"] == ["@@ -4 +4 @@", "-== 3 passed in 0.55s ==", "+== 3 passed in 0.61s =="]
    assert diff["lines_omitted"] == 0 and "note" not in diff


def test_many_differing_lines_are_capped_and_counted() -> None:
    before = b"".join(b"line %d\n" % i for i in range(100))
    after = b"".join(b"LINE %d\n" % i for i in range(100))
    diff = output_diff(_exec(stdout_blake3=blob_hash(before), stdout_bytes=100), "stdout", blob_hash(after), after,
                       (before, 1 << 20))
    assert diff is not None
    assert len(diff["lines"]) == MAX_DIFF_LINES and diff["lines_omitted"] == 201 - MAX_DIFF_LINES


def test_output_past_the_kept_cap_is_compared_on_the_kept_part_and_says_so() -> None:
    recorded = b"a\nb\nc\nd\n"
    diff = output_diff(_exec(stdout_blake3=blob_hash(recorded), stdout_bytes=8), "stdout", blob_hash(b"a\nB\nc\nD\n"),
                       b"a\nB\nc\nD\n", (recorded[:4], 4))
    assert diff is not None
    assert diff["lines"] == ["@@ -2 +2 @@", "-b", "+B"] and "first 4 bytes" in diff["note"]


def test_bytes_that_differ_outside_lines_and_old_witnesses_are_explained() -> None:
    crlf = RECORDED.replace(b"\n", b"\r\n")
    cut = RECORDED.rstrip(b"\n")
    diff = output_diff(_exec(), "stdout", blob_hash(cut), cut, (RECORDED, 1 << 20))
    assert diff is not None and diff["lines"] == [] and "final newline" in diff["note"]
    old = output_diff(_exec(), "stdout", blob_hash(crlf), crlf, None)
    assert old is not None and old["lines"] is None and "older ccw" in old["note"]
