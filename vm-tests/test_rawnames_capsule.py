"""A capsule command that makes a file name that is not UTF-8, through ``ccw`` as a person runs
it (each ``ccw`` its own process, one state dir, as root; sandbox/rawnames.py's rules).

The exec answers (exit, output, the UTF-8 names it touched) and is journaled, the name shown
escaped beside its touched sets; diff shows the rest and names it apart, witness and promote
refuse naming it, and promote writes nothing; the rename the refusal offers, run in the
capsule, makes all of them work.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox import rawnames
from tests.support.cli_process import ccw

BAD = os.fsdecode(b"n\xff.txt")
MAKE = 'printf x > "$(printf "n\\377.txt")"; echo done; echo b > b.txt; exit 3'


@pytest.fixture
def state(tmp_path: Path, root_required: None) -> Iterator[Path]:
    state_dir = tmp_path / "state"
    yield state_dir
    assert ccw(state_dir, "helper", "stop", check=False).returncode == 0


def test_a_name_that_is_not_utf8_loses_no_reply_and_blocks_promotion_until_renamed(state: Path,
                                                                                    tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "a.txt").write_text("a\n")
    capsule = ccw(state, "capsule", "create", str(workspace), "--no-auto-expose").stdout.strip()

    made = ccw(state, "capsule", "exec", "--json", capsule, "--", "sh", "-c", MAKE, check=False)
    assert made.returncode == 3, made.stderr
    ran = json.loads(made.stdout)
    assert (ran["exit_code"], ran["stdout"], ran["touched"]["written"]) == (3, "done\n", ["b.txt"])
    assert ran["touched"]["not_utf8"] == {"count": 1, "written": 1, "names": ["n\\xff.txt"]}
    assert "printf" in ran["touched_unavailable"]["not_utf8"] and "n\\xff.txt" in ran["touched_unavailable"]["not_utf8"]
    runs = json.loads(ccw(state, "capsule", "log", capsule, "--json").stdout)["runs"]
    assert [(r["exit_code"], r["writes"], r["generation"], r["generation_out"]) for r in runs] == [(3, 1, 0, 1)]
    plain = ccw(state, "capsule", "exec", capsule, "--", "sh", "-c", 'printf x > "$(printf "n\\377.txt")"')
    assert "n\\xff.txt" in plain.stderr and "mv --" in plain.stderr, plain.stderr  # told without --json too

    shown = ccw(state, "capsule", "diff", capsule)  # the rest of the change, that name named apart
    assert "b/b.txt" in shown.stdout and "n.txt" not in shown.stdout and "1 added" in shown.stderr, shown.stderr
    assert "not UTF-8, not shown: 1 name(s) the capsule changed, n\\xff.txt" in shown.stderr, shown.stderr
    assert "ccw capsule promote refuses the whole promotion" in shown.stderr and "mv --" in shown.stderr
    for verb in ("witness", "promote"):
        refused = ccw(state, "capsule", verb, capsule, check=False)
        assert refused.returncode != 0 and "INVALID_ARGUMENT" in refused.stderr, (verb, refused.stderr)
        assert "n\\xff.txt" in refused.stderr and "mv --" in refused.stderr, (verb, refused.stderr)
    assert sorted(os.listdir(workspace)) == ["a.txt"]  # promote wrote nothing

    argv = rawnames.rename_argv(BAD)
    argv[2] = argv[2].replace("NEW_NAME", "n.txt")
    assert ccw(state, "capsule", "exec", capsule, "--", *argv).returncode == 0
    diff = ccw(state, "capsule", "diff", capsule).stdout
    assert "b/n.txt" in diff and "b/b.txt" in diff
    ccw(state, "capsule", "witness", capsule)
    ccw(state, "capsule", "promote", capsule)
    assert sorted(os.listdir(workspace)) == ["a.txt", "b.txt", "n.txt"]
    assert (workspace / "n.txt").read_text() == "x"


def test_a_deleted_directory_holding_such_a_name_is_refused_by_promote_and_kept(state: Path, tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    (workspace / "d").mkdir(parents=True)
    (workspace / "d" / BAD).write_text("y")
    capsule = ccw(state, "capsule", "create", str(workspace), "--no-auto-expose").stdout.strip()
    ccw(state, "capsule", "exec", capsule, "--", "rm", "-rf", "d")

    shown = ccw(state, "capsule", "diff", capsule)
    assert '"a/d/n\\377.txt"' in shown.stdout  # git's quoting of the bytes
    assert "not UTF-8, shown in git's quoting: 1 path(s) of a directory the capsule deleted, d/n\\xff.txt" \
        in shown.stderr and "in the workspace itself" in shown.stderr, shown.stderr
    refused = ccw(state, "capsule", "promote", capsule, check=False)
    assert refused.returncode == 1 and "INVALID_ARGUMENT" in refused.stderr, refused.stderr
    assert "d/n\\xff.txt" in refused.stderr and "in the workspace itself" in refused.stderr
    assert os.listdir(workspace / "d") == [BAD]
    witnessed = ccw(state, "capsule", "witness", capsule, check=False)  # the deleted children are walked there
    assert witnessed.returncode == 1 and "INVALID_ARGUMENT" in witnessed.stderr, witnessed.stderr
    assert "d/n\\xff.txt" in witnessed.stderr and "in the workspace itself" in witnessed.stderr
