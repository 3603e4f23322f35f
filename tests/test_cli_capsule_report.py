("""What `ccw capsule create|exec|diff|promote|deltamin|list` print for a person: exposed dirs, git dirs, """
 """hints, capsule names as text, the smallest failing change, what holds a capsule frozen.""")

from __future__ import annotations

import pytest

from mcp_server.cli.capsule import (
    _git_lines,
    _show_create,
    _show_deltamin,
    _show_list,
    _show_promote,
    shown_diff,
)
from mcp_server.cli.exec_report import show_exec


def test_create_names_what_it_shows_and_why_git_will_not_work(capsys: pytest.CaptureFixture[str]) -> None:
    _show_create({"capsule_id": "cap_1", "git": {"gitdir": "/srv/repo/.git"},
                  "exposed": [{"path": "/home/u/.pyenv/versions/3.12.1", "reason": "pyvenv.cfg home of .venv"}]},
                 False, False)
    out, err = capsys.readouterr()
    assert out == "cap_1\n"
    assert "shown read-only: /home/u/.pyenv/versions/3.12.1 (pyvenv.cfg home of .venv)" in err
    assert "git dir shown copy-on-write: /srv/repo/.git" in err
    _show_create({"capsule_id": "cap_2", "git": {"note": "git will not work in this capsule: refused"}}, False, False)
    assert "ccw: git will not work in this capsule: refused" in capsys.readouterr().err


def test_exec_prints_its_hints(capsys: pytest.CaptureFixture[str]) -> None:
    ran = {"stdout": "", "stderr": "ccw: .venv/bin/python: No such file or directory\n", "exit_code": 127,
           "truncated": {"stdout": False, "stderr": False}, "hints": ["expose /home/u/.pyenv/versions/3.12.1"]}
    assert show_exec(ran, False, False) == 127
    assert capsys.readouterr().err.endswith("expose /home/u/.pyenv/versions/3.12.1\n")


def test_git_lines_count_refs_and_moves() -> None:
    lines = _git_lines([{"gitdir": "/srv/repo/.git", "count": 7, "refs": ["refs/heads/wt"],
                         "promoted_refs": [{"ref": "refs/heads/wt", "old": "a" * 40, "new": "b" * 40}]}])
    assert lines == ["git dir /srv/repo/.git: 7 changed paths (refs/heads/wt)",
                     "  refs/heads/wt aaaaaaaaaaaa -> bbbbbbbbbbbb"]


def test_promotion_writes_the_names_a_capsule_made_as_text(capsys: pytest.CaptureFixture[str]) -> None:
    esc = "\x1b]0;owned\x07\x9b2J"
    refused = {"applied": [], "promoted": False, "dry_run": False,
               "skipped": [{"path": f"s{esc}", "reason": "ignored"}],
               "policy_report": {"passed": False, "policies": ["baseline"], "test_failures": [],
                                 "denied": [{"path": f"evil{esc}.sh", "how": ["written"], "glob": "*.sh"}],
                                 "resource_violations": [], "details": "paths denied"}}
    assert _show_promote(refused, False, False) == 1
    done = {"applied": [f"a{esc}.txt"], "promoted": True, "dry_run": False,
            "policy_report": {"passed": True, "policies": ["baseline"], "test_failures": [], "resource_violations": [],
                              "details": "all checks passed"}}
    assert _show_promote(done, False, False) == 0
    out, err = capsys.readouterr()
    assert "\x1b]" not in out + err.replace("\x1b[3", "") and "\x07" not in out + err and "\x9b" not in out + err
    assert out == "a\\x1b]0;owned\\x07\\x9b2J.txt\n" and "paths: evil\\x1b]0;owned" in err


def test_a_diff_on_a_terminal_cannot_hide_its_lines() -> None:
    diff = "+++ b/x\n@@ -0,0 +1,2 @@\n+rm -rf ~\n+\x1b[1A\x1b[2K\tok\rfine\n"
    shown = shown_diff(diff, terminal=True)
    assert shown == "+++ b/x\n@@ -0,0 +1,2 @@\n+rm -rf ~\n+\\x1b[1A\\x1b[2K\tok\\x0dfine\n"
    assert shown_diff(diff, terminal=False) == diff  # a patch for git apply stays exact


def test_deltamin_prints_the_patch_and_says_how_far_to_trust_it(capsys: pytest.CaptureFixture[str]) -> None:
    patch = ("diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-n\n+n + 1\n"
             "@@ -9 +9 @@\n-a\n+b\n")
    found = {"minimal_patch": patch, "units": ["m.py"], "trials": 6, "cache_hits": 1, "elapsed_ms": 20391,
             "one_minimal": True, "replay_ok": True, "root_hash": "blake3:00", "executor": {"kind": "local"}}
    assert _show_deltamin(found, False, False) == 0
    out, err = capsys.readouterr()
    assert out == patch  # git apply takes it as it is
    assert err == ("deltamin: the smallest change that still fails: 2 hunks in 1 file (m.py); "
                   "6 trials (1 from cache) in 20.4 s\n")
    assert _show_deltamin({**found, "one_minimal": False, "replay_ok": False}, False, False) == 0
    err = capsys.readouterr().err
    assert "budget ran out" in err and "may be flaky" in err


def test_a_timeout_is_told_in_the_commands_words(capsys: pytest.CaptureFixture[str]) -> None:
    from mcp_server.capsules.exec import timeout_hint

    ran = {"stdout": "start\n", "stderr": "", "exit_code": None, "signal": "SIGKILL", "timed_out": True,
           "truncated": {"stdout": False, "stderr": False}, "hints": [timeout_hint(300_000, "timeout_ms")]}
    assert show_exec(ran, False, False) == 124
    out, err = capsys.readouterr()
    assert out == "start\n" and "timeout_ms" not in err and "SIGKILL" not in err
    assert err == ("ccw: timed out: killed at the 300 s limit (the default); give a larger --timeout-ms "
                   "(milliseconds, at most 86400000: 24 h)\n")
    assert show_exec(ran, False, False, timeout_ms=600_000) == 124  # the limit the command asked for
    assert "killed at the 600 s limit; give a larger --timeout-ms" in capsys.readouterr().err


def test_a_cut_stream_says_how_much_was_lost_and_how_to_keep_it(capsys: pytest.CaptureFixture[str]) -> None:
    # Found in a new-user trial: 23.9 MB of stdout piped on printed 1 MiB and "ccw: output truncated".
    ran = {"stdout": "x" * 10, "stderr": "", "exit_code": 0, "stdout_bytes": 23_939_000, "stderr_bytes": 0,
           "truncated": {"stdout": True, "stderr": False}}
    assert show_exec(ran, False, False) == 0
    out, err = capsys.readouterr()
    assert out == "x" * 10
    assert err == ("ccw: stdout cut after its first 1 MiB of 22.8 MiB (the rest is not kept: send it to a file "
                   "in the capsule, CMD > out.log, and read that)\n")


def test_list_says_what_holds_a_capsule_frozen_and_what_a_merge_merged(capsys: pytest.CaptureFixture[str]) -> None:
    common = {"workspace": "/w", "created_at": "t", "execs": 0, "generation": 0}
    _show_list({"capsules": [
        {**common, "capsule_id": "cap_a", "parent": None, "state": "frozen", "held_by": ["cap_m"]},
        {**common, "capsule_id": "cap_b", "parent": None, "state": "paused"},
        {**common, "capsule_id": "cap_m", "parent": "cap_a", "state": "ready", "merged_from": ["cap_a", "cap_b"]},
    ]}, False, False)
    assert capsys.readouterr().out.splitlines() == [
        "cap_a  t  execs=0  generation=0  /w (frozen: held by cap_m)",
        "cap_b  t  execs=0  generation=0  paused  /w",
        "cap_m  t  execs=0  generation=0  /w (fork of cap_a) (merge of cap_a, cap_b)",
    ]
