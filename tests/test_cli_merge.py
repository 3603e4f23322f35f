"""mcp_server/cli/merge.py: ``ccw capsule merge`` prints the new capsule's id alone on stdout, the
report on stderr, as create and fork do; a merge that made no capsule prints its report on stdout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from mcp_server.cli import frontclient, main, merge
from mcp_server.tools.merge import TOOLS

FIRST, SECOND, BASE, MERGED = "cap_1_a", "cap_2_b", "cap_0_base", "cap_3_merged"
REPORT = {
    "merged": True, "base": {"capsule_id": BASE},
    "files": [{"path": "app.js", "how": "lines merged", "capsules": [FIRST, SECOND]}],
    "counts": {"lines merged": 1}, "conflicts": [],
    "pairs": [{"capsules": [FIRST, SECOND], "verdict": "commute", "conflicts": [], "shared": 1}],
}
CONFLICT = {"path": "app.js", "how": "conflict: overlapping lines changed on both sides", "capsules": [FIRST, SECOND],
            "base": "file", "ours": "file", "theirs": "file",
            "hunks": [{"line": 3, "base": "v1\n", "ours": "v2\n", "theirs": "v3\n"}]}


def _merge(result: dict[str, Any], argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
           capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``ccw capsule merge ARGV`` answered ``result`` (checked against capsule_merge's output schema)."""
    jsonschema.Draft202012Validator(TOOLS[0].output_schema).validate(result)

    async def call_tool(config: Any, name: str, args: dict[str, Any], *rest: Any, **options: Any) -> dict[str, Any]:
        assert name == "capsule_merge" and args["capsule_ids"] == [FIRST, SECOND]
        return result

    monkeypatch.setenv("CCW_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(frontclient, "call_tool", call_tool)
    monkeypatch.setattr("mcp_server.cli.helperctl.ensure", lambda *args, **kwargs: None)  # no helper is asked
    status = main(["capsule", "merge", FIRST, SECOND, *argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_a_merge_into_a_new_capsule_prints_its_id_alone_on_stdout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    made = {**REPORT, "written": True, "capsule_id": MERGED}
    status, out, err = _merge(made, [], tmp_path, monkeypatch, capsys)
    assert (status, out) == (0, f"{MERGED}\n")  # M=$(ccw capsule merge F1 F2) holds the id
    assert err.startswith(f"merge of {FIRST}, {SECOND} against capsule {BASE}\n  app.js: lines merged"), err
    assert err.endswith(f"merged into new capsule {MERGED}\n"), err
    assert err == merge.text(made, {"capsule_ids": [FIRST, SECOND]})  # the report, whole


def test_a_merge_that_made_no_capsule_prints_its_report_on_stdout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    dry = _merge({**REPORT, "written": False}, ["--dry-run"], tmp_path, monkeypatch, capsys)
    assert dry[0] == 0 and dry[1].endswith("dry run: clean; nothing was made\n") and dry[2] == "", dry
    refused = {**REPORT, "merged": False, "written": False, "conflicts": [CONFLICT]}
    status, out, err = _merge(refused, [], tmp_path, monkeypatch, capsys)
    assert status == 1 and err == "", err
    assert "  CONFLICT app.js: conflict: overlapping lines changed on both sides\n" in out
    assert out.endswith("refused: 1 conflict(s); nothing was made or written\n"), out


def test_json_is_the_whole_result_on_stdout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    made = {**REPORT, "written": True, "capsule_id": MERGED}
    status, out, err = _merge(made, ["--json"], tmp_path, monkeypatch, capsys)
    assert (status, json.loads(out), err) == (0, made, "")
