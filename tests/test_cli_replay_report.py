"""``ccw capsule replay`` prints each mismatch as a line a person reads, and says what to declare."""

from __future__ import annotations

from typing import Any

import pytest

from mcp_server.cli.replay_report import mismatch_line as _mismatch_line
from mcp_server.cli.replay_report import show_replay as _show_replay

NYC = {"kind": "exec", "exec": 1, "field": "written", "argv": ["npx", "nyc", "npm", "test"],
       "expected_only": [".nyc_output/3cf8.json", ".nyc_output/processinfo/3cf8.json"],
       "actual_only": [".nyc_output/90eb.json", ".nyc_output/processinfo/90eb.json"],
       "suggest_volatile": [".nyc_output/*.json", ".nyc_output/processinfo/*.json"]}


def test_each_kind_of_mismatch_reads_as_a_sentence() -> None:
    assert _mismatch_line(NYC) == ("exec 1 (npx nyc npm test) written: only in the witness .nyc_output/3cf8.json, "
                                   ".nyc_output/processinfo/3cf8.json; only in the replay .nyc_output/90eb.json, "
                                   ".nyc_output/processinfo/90eb.json")
    change = {"kind": "change", "path": "out.txt", "expected": ["file", 0o644, None, "blake3:" + "ab" * 32],
              "actual": None}
    assert _mismatch_line(change) == "out.txt: file 0o644 blake3:abababababab in the witness, absent in the replay"
    code = {"kind": "exec", "exec": 2, "field": "exit_code", "expected": 0, "actual": 1, "argv": ["make", "a b"]}
    assert _mismatch_line(code) == "exec 2 (make 'a b') exit_code: 0 in the witness, 1 in the replay"


def test_the_report_names_the_volatile_flags_to_pass(capsys: pytest.CaptureFixture[str]) -> None:
    result: dict[str, Any] = {"replay_ok": False, "mismatches": [NYC], "output_diffs": []}
    assert _show_replay(result, False, False) == 1
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == "replay MISMATCH" and "{" not in out
    assert "--volatile '.nyc_output/*.json' --volatile '.nyc_output/processinfo/*.json'" in err
    ok = {"replay_ok": True, "mismatches": [], "output_diffs": [],
          "volatile": {"globs": [".nyc_output/**"], "paths": [{"exec": 1, "path": ".nyc_output/a.json"}] * 3}}
    assert _show_replay(ok, False, False) == 0
    out, err = capsys.readouterr()
    assert out == "replay_ok\n" and "left out as volatile: 3 path(s) matching .nyc_output/**" in err


def test_owners_a_replayer_could_not_restore_are_said(capsys: pytest.CaptureFixture[str]) -> None:
    result = {"replay_ok": True, "mismatches": [], "output_diffs": [],
              "owners": {"recorded": 12, "restored": 3, "reason": "not root"}}
    assert _show_replay(result, False, False) == 0
    assert "owners: 3 of 12 restored (not root)" in capsys.readouterr().err


def test_a_hostile_witness_cannot_drive_the_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    esc = "\x1b]0;owned\x07\x9b2J"
    result: dict[str, Any] = {
        "replay_ok": False, "env_missing": [f"A{esc}"],
        "mismatches": [{**NYC, "argv": [f"npx{esc}"], "suggest_volatile": [f"o/{esc}*.json"]},
                       {"kind": "change", "path": f"x{esc}.txt", "expected": ["symlink", None, f"/t{esc}", None],
                        "actual": None}],
        "volatile": {"globs": [f"g{esc}"], "paths": [{"exec": 1, "path": "a"}]},
        "output_diffs": [{"exec": 1, "stream": "stdout", "lines": [f"-ok{esc}", f"+no{esc}"]}],
    }
    assert _show_replay(result, False, False) == 1
    out, err = capsys.readouterr()
    assert "\x1b" not in out + err and "\x07" not in out + err and "\x9b" not in out + err
    assert "x\\x1b]0;owned\\x07\\x9b2J.txt" in out and "+no\\x1b]0;owned" in err


def test_an_untrusted_replay_says_so_once_in_words(capsys: pytest.CaptureFixture[str]) -> None:
    result: dict[str, Any] = {"replay_ok": True, "mismatches": [], "output_diffs": [], "signature": "unknown key",
                              "signed_by": {"fingerprint": "SHA256:abc"}}
    assert _show_replay(result, False, False) == 0
    assert capsys.readouterr().err.splitlines() == [
        "signature: unknown key (SHA256:abc)",
        "ccw: no trusted signature (the line above); replayed as --allow-untrusted asked"]


def test_a_toolchain_this_replay_does_not_show_is_named_beside_the_failure(capsys: pytest.CaptureFixture[str]) -> None:
    # A .venv whose interpreter lives where no toolchain manager keeps one, replayed from another
    # state dir: the run fails with 127, and the line says why without --json.
    code = {"kind": "exec", "exec": 1, "field": "exit_code", "expected": 0, "actual": 127, "argv": ["pytest"]}
    why = "not at a toolchain's known place (pyenv, uv, nvm, ...): a witness from elsewhere names no other"
    _show_replay({"replay_ok": False, "mismatches": [code], "output_diffs": [],
                  "expose": {"used": [], "dropped": [{"path": "/home/u/pyhome", "reason": why}]}}, False, False)
    assert f"not shown here: /home/u/pyhome ({why})" in capsys.readouterr().err.splitlines()
