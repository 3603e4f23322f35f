"""A replay judges what promotion would carry (issue 39): differences in files the witness's
base ignores are set apart, by the rules the witness carries, never the replayer's; content-only
mismatches suggest a volatile glob; strict_outputs and old witnesses compare every file."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import trio

from mcp_server.capsules import promote, witness_ignore
from mcp_server.capsules.replay import ReplayOptions, _ignored
from mcp_server.capsules.replay_steps import Tally, change_mismatches, set_aside
from mcp_server.cli import parse_args
from mcp_server.cli.capsule import tool_call
from mcp_server.cli.replay_report import show_replay
from sandbox.errors import CcwError

GIT_ENV = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "t",
           "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.invalid"}
PATHS = ["coverage/coverage-final.json", "coverage/keep.txt", ".nyc_output/5d0e.json", "src/a.js", "src/b.log",
         "secret.txt", "notes.tmp", "build"]


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=GIT_ENV)


def _repo(tmp_path: Path) -> Path:
    """A checkout: ignored coverage and nyc output, a nested rule, an info/exclude, and a tracked
    file the rules match (git never calls it ignored)."""
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "coverage").mkdir()
    _git(repo, "init", "-q")
    (repo / ".gitignore").write_text("coverage/\n.nyc_output/\nbuild/\n")
    (repo / "src" / ".gitignore").write_text("*.log\n")
    (repo / "src" / "a.js").write_text("1\n")
    (repo / "coverage" / "keep.txt").write_text("kept\n")
    (repo / ".git" / "info" / "exclude").write_text("secret.txt\n")
    _git(repo, "add", ".gitignore", "src")
    _git(repo, "add", "-f", "coverage/keep.txt")
    _git(repo, "commit", "-q", "-m", "base")
    return repo


@pytest.fixture
def maker_excludes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The witness maker's global excludes (core.excludesFile's default place): ``*.tmp``."""
    config = tmp_path / "maker-config"
    (config / "git").mkdir(parents=True)
    (config / "git" / "ignore").write_text("*.tmp\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))


def _judge(rules: dict[str, Any], tmp_path: Path, paths: list[str] = PATHS) -> frozenset[str]:
    scratch = Path(tempfile.mkdtemp(dir=tmp_path))
    return witness_ignore.judge(rules, str(scratch), paths, {"build"})


@pytest.mark.usefixtures("maker_excludes")
def test_the_carried_rules_judge_as_promotion_would(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = _repo(tmp_path)
    rules = witness_ignore.carried_rules(str(repo))
    assert rules is not None and rules["prefix"] == "" and rules["tracked"] == ["coverage/keep.txt"]
    assert [f["path"] for f in rules["files"]] == [".gitignore", "src/.gitignore"]
    # The replayer's own global excludes do not count: they would ignore src/a.js here.
    replayer = tmp_path / "replayer-config"
    (replayer / "git").mkdir(parents=True)
    (replayer / "git" / "ignore").write_text("src/\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(replayer))
    assert _judge(rules, tmp_path) == {"coverage/coverage-final.json", ".nyc_output/5d0e.json", "src/b.log",
                                       "secret.txt", "notes.tmp", "build"}


def test_a_workspace_below_its_work_tree_keeps_the_rules_above_it(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    (repo / "src" / "lib").mkdir()
    rules = witness_ignore.carried_rules(str(repo / "src"))
    assert rules is not None and rules["prefix"] == "src/"
    assert _judge(rules, tmp_path, ["b.log", "a.js", "lib/c.log", "coverage/x"]) == {"b.log", "lib/c.log", "coverage/x"}


def test_no_repository_carries_nothing_and_a_bad_rule_path_is_refused(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    assert witness_ignore.carried_rules(str(plain)) is None
    rules = {"prefix": "", "exclude": "", "tracked": [], "files": [{"path": "../x/.gitignore", "text": "*\n"}]}
    with pytest.raises(CcwError) as refused:
        _judge(rules, tmp_path)
    assert refused.value.code == "INVALID_ARGUMENT" and "strict_outputs" in refused.value.message
    rules["files"] = [{"path": ".git/hooks/.gitignore", "text": "*\n"}]
    with pytest.raises(CcwError):
        _judge(rules, tmp_path)


def _change(path: str, blob: str, mode: int = 0o644) -> dict[str, Any]:
    return {"path": path, "status": "added", "type": "file", "mode": mode, "target": None, "blob": blob}


def test_a_content_only_mismatch_suggests_its_path_as_volatile() -> None:
    recorded = [_change("coverage/coverage-final.json", "b:1"), _change("report.txt", "b:1"), _change("run.sh", "b:1")]
    replayed = [_change("coverage/coverage-final.json", "b:2"), _change("run.sh", "b:2", 0o755)]
    mismatches, _ = change_mismatches({"changes": recorded, "execs": []}, Tally(), replayed, [])
    suggested = {m["path"]: m.get("suggest_volatile") for m in mismatches}
    # Only the bytes differ: volatile; a file gone or whose mode changed is no output rewritten.
    assert suggested == {"coverage/coverage-final.json": ["coverage/coverage-final.json"], "report.txt": None,
                         "run.sh": None}


def test_set_aside_splits_what_promotion_leaves_behind() -> None:
    change = {"kind": "change", "path": "coverage/coverage-final.json", "expected": [], "actual": []}
    kept_change = {**change, "path": "out.txt"}
    written = {"kind": "exec", "exec": 1, "field": "written", "argv": ["nyc"],
               "expected_only": [".nyc_output/3cf8a1b2.json", "out/3cf8a1b2.json"],
               "actual_only": [".nyc_output/90eb77aa.json", "out/90eb77aa.json"],
               "suggest_volatile": [".nyc_output/*.json", "out/*.json"]}
    ignored = frozenset({"coverage/coverage-final.json", ".nyc_output/3cf8a1b2.json", ".nyc_output/90eb77aa.json"})
    kept, apart = set_aside([change, kept_change, written], ignored)
    assert kept == [kept_change, {**written, "expected_only": ["out/3cf8a1b2.json"],
                                  "actual_only": ["out/90eb77aa.json"], "suggest_volatile": ["out/*.json"]}]
    assert apart == [change, {"kind": "exec", "exec": 1, "field": "written", "argv": ["nyc"],
                              "expected_only": [".nyc_output/3cf8a1b2.json"],
                              "actual_only": [".nyc_output/90eb77aa.json"]}]
    assert set_aside([change], None) == ([change], [])  # strict, or an old witness: every file compared


def test_strict_outputs_and_old_witnesses_judge_nothing(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    rules = witness_ignore.carried_rules(str(repo))
    manifest: dict[str, Any] = {"base": {"ignore": rules}, "changes": [_change("coverage/x.json", "b:1")]}
    replayed = [_change("coverage/y.json", "b:2"), {**_change("build", ""), "type": "dir", "blob": None}]
    assert _ignored(manifest, {}, replayed, tmp_path, ReplayOptions()) == {"coverage/x.json", "coverage/y.json",
                                                                           "build"}
    assert _ignored(manifest, {}, replayed, tmp_path, ReplayOptions(strict_outputs=True)) is None
    assert _ignored({"base": {}, "changes": []}, {}, replayed, tmp_path, ReplayOptions()) is None


def test_a_cache_directory_the_capsule_made_is_left_behind_as_promotion_leaves_it(tmp_path: Path) -> None:
    def made(path: str) -> dict[str, Any]:
        return {"path": path, "status": "added", "type": "dir", "mode": 0o755, "target": None, "blob": None}

    blobs = {"b:cache": b"# Created by pytest automatically.\n*\n", "b:logs": b"*.log\n", "b:v": b"[]"}
    changes = [made(".pytest_cache"), _change(".pytest_cache/.gitignore", "b:cache"),
               _change(".pytest_cache/v/cache/nodeids", "b:v"), made("logs"), _change("logs/.gitignore", "b:logs")]
    assert witness_ignore.made_caches(changes, blobs) == {".pytest_cache"}  # a rule of its own is no cache
    rules = witness_ignore.carried_rules(str(_repo(tmp_path)))
    replayed = [_change(".pytest_cache/v/cache/nodeids", "b:w"), _change("logs/run.txt", "b:1")]
    assert _ignored({"base": {"ignore": rules}, "changes": changes}, blobs, replayed, tmp_path, ReplayOptions()) == {
        ".pytest_cache", ".pytest_cache/.gitignore", ".pytest_cache/v/cache/nodeids"}


def test_the_cli_passes_strict_outputs_and_shows_what_was_set_apart(capsys: pytest.CaptureFixture[str]) -> None:
    name, call, _ = tool_call(parse_args(["capsule", "replay", "wit_0123456789abcdef", "--strict-outputs"]))
    assert name == "capsule_replay" and call["strict_outputs"] is True
    _, plain, _ = tool_call(parse_args(["capsule", "replay", "wit_0123456789abcdef"]))
    assert "strict_outputs" not in plain
    apart = {"kind": "change", "path": "coverage/coverage-final.json", "expected": ["file", 0o644, None, "b:1"],
             "actual": ["file", 0o644, None, "b:2"]}
    assert show_replay({"replay_ok": True, "mismatches": [], "ignored_differences": [apart]}, False, False) == 0
    out, err = capsys.readouterr()
    assert out == "replay_ok\n" and "git ignores (not compared; --strict-outputs compares them): 1" in err
    assert "coverage/coverage-final.json: file 0o644 b:1 in the witness, file 0o644 b:2 in the replay" in err


@pytest.mark.parametrize("include_ignored", [False, True])
def test_a_policys_replay_is_strict_when_the_promotion_carries_ignored_files(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, include_ignored: bool) -> None:
    """Promotion with include_ignored writes the ignored files too, so its policy replay must
    judge them: the replay it asks for is strict exactly then."""
    asked: list[ReplayOptions] = []

    async def witnessed(service: Any, capsule_id: str, options: Any) -> dict[str, Any]:
        return {"path": "/nowhere.ccw", "root_hash": "sha256:0"}

    async def replayed(service: Any, path: Path, root: str, options: ReplayOptions) -> dict[str, Any]:
        asked.append(options)
        return {"replay_ok": True, "output_identical": True, "mismatches": [], "output_diffs": []}

    record = SimpleNamespace(spec=SimpleNamespace(env_whitelist=[]), network_spec=None, capsule_id="cap_x")
    monkeypatch.setattr(promote, "make_witness", witnessed)
    monkeypatch.setattr(promote, "replay", replayed)
    service = SimpleNamespace(state=SimpleNamespace(root=tmp_path))  # a state dir with no capsule's secrets
    outcome = trio.run(promote._replay, cast(Any, service), cast(Any, record), ["*.tmp"], include_ignored)
    assert outcome.ok and [(o.strict_outputs, o.volatile, o.witness_volatile) for o in asked] == [
        (include_ignored, ("*.tmp",), False)]
