"""capsule_promote as_branch's pure parts and its git plumbing on a real repository (no capsule):
the index edits git's rules make (capsules/branch_tree.py), the target's refusals and the
commit on a temporary index, with a plain directory standing in for the capsule's view
(capsules/branch.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from mcp_server.capsules import branch, branch_tree
from mcp_server.capsules.branch_base import base_commit, recorded_commit
from mcp_server.fs.promote import Op
from mcp_server.journal import Journal
from mcp_server.state import State
from sandbox.errors import CcwError
from sandbox.spec import CapsuleSpec
from tests.support.journal_rows import capsule_record, exec_entry

ENV = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1",
       "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
       "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}
ZERO = "0" * 40


def git(ws: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(ws), *args], env=ENV, check=True, capture_output=True).stdout.decode()


def test_edits_follow_git_rules_for_modes_links_deletions_and_git_dirs() -> None:
    base = {"a.py": "100644", "tool": "100755", "old/x": "100644", "old/y/z": "100644", "f": "100644",
            "keep": "100644"}
    ops = [Op("write", "a.py", 0o644), Op("chmod", "tool", 0o6755), Op("delete", "old"),
           Op("delete", "f"), Op("mkdir", "f", 0o755), Op("write", "f/inner", 0o700),
           Op("symlink", "out", target="/etc/shadow"), Op("mkdir", "empty", 0o755),
           Op("write", ".git/hooks/pre-commit", 0o755), Op("write", "sub/.GIT/config", 0o644)]
    kinds = {"a.py": "file", "tool": "file", "f": "dir", "f/inner": "file", "out": "symlink", "empty": "dir",
             ".git/hooks/pre-commit": "file", "sub/.GIT/config": "file"}
    got = branch_tree.edits(base, ops, kinds)
    assert got.remove == ["old/x", "old/y/z", "f"]  # "old" itself is a directory: no entry of its own
    assert got.add == [("a.py", "100644"), ("f/inner", "100755"), ("out", "120000"), ("tool", "100755")]
    assert got.left_out == [".git/hooks/pre-commit", "sub/.GIT/config"]
    info = branch_tree.index_info(got, {p: "1" * 40 for p, _ in got.add}, ZERO)
    records = info.split(b"\0")
    assert records[0].startswith(b"0 " + ZERO.encode() + b"\t")  # removals first
    assert f"120000 {'1' * 40}\tout".encode() in records


def test_a_change_inside_a_submodule_is_refused_and_a_delete_then_rewrite_is_kept() -> None:
    with pytest.raises(CcwError) as raised:
        branch_tree.edits({"vendor/lib": "160000"}, [Op("write", "vendor/lib/x.c", 0o644)], {"vendor/lib/x.c": "file"})
    assert raised.value.code == "UNSUPPORTED" and "submodule 'vendor/lib'" in raised.value.message
    got = branch_tree.edits({"p": "100644"}, [Op("delete", "p"), Op("symlink", "p", target="q")], {"p": "symlink"})
    assert got.remove == ["p"] and got.add == [("p", "120000")]
    assert branch_tree.parse_ls_tree(b"100644 blob " + b"a" * 40 + b"\tx y\0" + b"160000 commit " + b"b" * 40
                                     + b"\tsub\0") == {"x y": "100644", "sub": "160000"}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / "pkg" / "mod.py").write_text("def f():\n    return 1\n")
    (ws / "gone.txt").write_text("bye\n")
    (ws / "run.sh").write_text("#!/bin/sh\n")
    git(ws, "init", "-q", "-b", "main")
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", "initial")
    return ws


def _fingerprint(ws: Path) -> tuple[str, bytes, str]:
    files = sorted(p for p in ws.rglob("*") if ".git" not in p.parts and p.is_file())
    digest = hashlib.sha256(b"".join(p.relative_to(ws).as_posix().encode() + p.read_bytes() for p in files))
    return git(ws, "status", "--porcelain"), (ws / ".git" / "index").read_bytes(), digest.hexdigest()


def test_the_target_refuses_plainly(repo: Path, tmp_path: Path) -> None:
    recorded = base_commit(str(repo))
    assert recorded == {"head_oid": git(repo, "rev-parse", "HEAD").strip()}
    assert recorded_commit(recorded) == recorded["head_oid"] and recorded_commit(None) is None
    assert base_commit(str(repo / "pkg")) is None  # a subdirectory is no worktree's top
    git(repo, "branch", "taken")
    git(repo, "branch", "deep/er")
    cases = {"taken": "CONFLICT", "taken/below": "CONFLICT", "deep": "CONFLICT", "bad..name": "INVALID_ARGUMENT",
             "@{-1}": "INVALID_ARGUMENT", "-x": "INVALID_ARGUMENT", "HEAD": "INVALID_ARGUMENT"}
    for name, code in cases.items():
        with pytest.raises(CcwError) as raised:
            branch.target(str(repo), name, recorded)
        assert raised.value.code == code, (name, raised.value)
    with pytest.raises(CcwError) as raised:
        branch.target(str(repo), "fine", None)
    assert raised.value.code == "UNSUPPORTED" and "unknown" in raised.value.message
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(CcwError) as raised:
        branch.target(str(plain), "fine", recorded)
    assert raised.value.code == "UNSUPPORTED" and "not the top of a git repository" in raised.value.message
    assert branch.target(str(repo), "ccw/fine", recorded).ref == "refs/heads/ccw/fine"


def test_a_repository_git_does_not_trust_is_refused_as_such(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Root's git over a user's checkout ("dubious ownership"), simulated as git's own tests do:
    # it once said "not the top of a git repository" and told the caller to promote instead.
    real = branch._git
    monkeypatch.setattr(branch, "_git", lambda workspace, *args, **kw: real(
        workspace, *args, **kw, env={"GIT_TEST_ASSUME_DIFFERENT_OWNER": "1"}))
    with pytest.raises(CcwError) as raised:
        branch.target(str(repo), "fine", base_commit(str(repo)))
    assert raised.value.code == "PERMISSION_DENIED" and "another uid owns" in raised.value.message
    assert "safe.directory" in raised.value.details["git"] and "not the top" not in raised.value.message


def test_the_commit_holds_exactly_the_change_and_leaves_the_tree_and_index(repo: Path, tmp_path: Path) -> None:
    found = branch.target(str(repo), "ccw/try", base_commit(str(repo)))
    git(repo, "commit", "-q", "--allow-empty", "-m", "the host moves on")  # the branch still starts at the base
    (repo / "pkg" / "mod.py").write_text("def f():\n    return 2  # uncommitted\n")  # a live edit, not carried
    before = _fingerprint(repo)
    view = tmp_path / "capsule"  # stands in for the capsule's view: its files as the capsule has them
    (view / "pkg").mkdir(parents=True)
    (view / "pkg" / "mod.py").write_text("def f():\n    return 3\n")
    (view / "new.bin").write_bytes(b"\x00\xff" * 10)
    os.chmod(view / "new.bin", 0o755)
    os.symlink("/etc/hostname", view / "link")
    ops = [Op("write", "pkg/mod.py", 0o644), Op("write", "new.bin", 0o755),
           Op("symlink", "link", target="/etc/hostname"), Op("delete", "gone.txt"),
           Op("write", ".git/objects/xx", 0o444)]
    kinds = {"pkg/mod.py": "file", "new.bin": "file", "link": "symlink", ".git/objects/xx": "file"}
    record = dataclasses.replace(capsule_record("cap_t"), spec=CapsuleSpec(workspace=str(repo)))
    made = branch._commit(record, found, os.open(view, os.O_RDONLY | os.O_DIRECTORY), ops, kinds,
                          {"link": "/etc/hostname"}, "the message\n")
    assert _fingerprint(repo) == before
    assert made.paths == ["gone.txt", "link", "new.bin", "pkg/mod.py"] and made.left_out == [".git/objects/xx"]
    assert git(repo, "rev-parse", "ccw/try^").strip() == found.base
    assert git(repo, "diff", "--name-status", found.base, "ccw/try").split("\n") == [
        "D\tgone.txt", "A\tlink", "A\tnew.bin", "M\tpkg/mod.py", ""]
    tree = git(repo, "ls-tree", "-r", "ccw/try")
    assert "120000 blob" in tree.split("\tlink")[0].splitlines()[-1]
    assert "100755 blob" in tree.split("\tnew.bin")[0].splitlines()[-1]
    assert git(repo, "show", "ccw/try:link") == "/etc/hostname"  # the target, never what it points at
    assert git(repo, "show", "ccw/try:pkg/mod.py") == "def f():\n    return 3\n"
    assert git(repo, "log", "-1", "--format=%an|%B", "ccw/try") == "ccw capsule cap_t|the message\n\n"
    # The same name again: refused, the branch left as it is.
    with pytest.raises(CcwError) as raised:
        branch._commit(record, found, os.open(view, os.O_RDONLY | os.O_DIRECTORY), ops, kinds, {}, "again\n")
    assert raised.value.code == "CONFLICT" and git(repo, "rev-parse", "ccw/try").strip() == made.commit


def test_the_message_lists_runs_and_verdicts() -> None:
    lines = branch.verdict_lines({"passed": False, "policies": ["baseline"], "tests_ok": True, "hazards_ok": False,
                                  "replay_ok": None, "hazards": [{"kind": "setuid", "path": "s", "allowed": True}],
                                  "details": "hazard: .envrc"})
    assert lines == ["Policies (baseline): failed", "  tests_ok: true, hazards_ok: false, replay_ok: null",
                     "  hazard allowed: setuid s", "  hazard: .envrc"]
    entry = {**exec_entry({}), "seq": 3, "argv": ["sh", "-c", "echo hi"], "exit_code": 2}
    assert branch.run_line("cap_a", entry) == "#3 cap_a: exit 2: sh -c 'echo hi'"
    assert branch.run_line("cap_a", {**entry, "timed_out": 1}).startswith("#3 cap_a: timed out:")
    assert branch.run_line("cap_a", {**entry, "argv": ["printf", "a\nb\x1b[2J"]}) == \
        "#3 cap_a: exit 2: printf 'a\\nb\\x1b[2J'"
    assert len(branch.run_line("cap_a", {**entry, "argv": ["x" * 500]})) < 200


def test_the_message_of_a_merged_capsule_lists_its_inputs_runs_as_the_policies_judged_them(
        state_dir: Path) -> None:
    # Made by ccw capsule merge A C: a fork of A (from P) holding C's change too; the policies
    # judge C's runs (promote.judged_capsules), so the message lists them, once each.
    journal = Journal(State(state_dir))
    for capsule_id, parent in (("cap_p", None), ("cap_a", "cap_p"), ("cap_c", "cap_p"), ("cap_m", "cap_a")):
        journal.add_capsule(dataclasses.replace(capsule_record(capsule_id), parent=parent))
        journal.add_exec(capsule_id, {**exec_entry({}), "argv": ["run", capsule_id]})
    journal.add_writes("cap_m", [("t.txt", "write", b"c", None, 0o644, None)], merged_from=["cap_a", "cap_c"])
    record = journal.capsule("cap_m")
    assert record is not None
    message = branch.commit_message(SimpleNamespace(journal=journal), record,  # type: ignore[arg-type]
                                    {"passed": True, "policies": ["baseline"]}, SimpleNamespace(base="b0"))  # type: ignore[arg-type]
    runs = message.split("Runs (")[1].split("\n\n")[0].splitlines()
    assert runs == ["4):", "  #1 cap_p: exit 0: run cap_p", "  #1 cap_a: exit 0: run cap_a",
                    "  #1 cap_m: exit 0: run cap_m", "  #1 cap_c: exit 0: run cap_c"]


def test_a_shortened_line_is_cut_at_a_word_boundary_with_an_ellipsis() -> None:
    words = "the quick brown fox wählt größe " * 10
    entry = {**exec_entry({}), "seq": 1, "argv": ["sh", "-c", f"echo {words}"], "exit_code": 0}
    command = branch.run_line("cap_a", entry).split(": ", 2)[2]
    assert command.endswith("…") and len(command) <= branch.RUN_MAX
    assert f"sh -c 'echo {words}".startswith(command[:-1] + " ")  # whole words, the cut at a space
    assert branch.shortened("größe wählt", 10) == "größe…" and branch.shortened("größe", 5) == "größe"
    assert branch.shortened("ab cd", 4) == "ab…"  # the space at the cut ends the word before it
    assert branch.shortened("e\u0301e\u0301e\u0301", 4) == "e\u0301…"  # one word: never a mark without its letter
    assert branch.shortened("x" * 10, 5) == "xxxx…"
    subject = branch.shortened("ccw: the change of capsule cap_" + "a" * 60, branch.SUBJECT_MAX)
    assert subject == "ccw: the change of capsule…"


def test_the_command_asks_promote_for_a_branch_and_says_what_became_of_it(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from mcp_server.cli import branch as cli_branch

    parser = argparse.ArgumentParser()
    cli_branch.add_parser(parser.add_subparsers(dest="verb"), argparse.ArgumentParser(add_help=False))
    args = parser.parse_args(["branch", "cap_a", "ccw/x", "--allow-hazard", "setuid", "--exclude", "docs/**"])
    assert cli_branch.tool_call(args) == {"capsule_id": "cap_a", "as_branch": "ccw/x", "dry_run": False,
                                          "allow_hazards": ["setuid"], "exclude": ["docs/**"]}
    report = {"passed": True, "policies": ["baseline"], "hazards": [], "details": "", "test_failures": [],
              "resource_violations": []}
    made = {"promoted": True, "applied": ["a.py"], "policy_report": report, "skipped": [],
            "branch": {"name": "ccw/x", "parent": "b" * 40, "commit": "c" * 40}}
    assert cli_branch.show(made, False) == 0
    out, err = capsys.readouterr()
    assert out == "c" * 40 + "\n" and f"committed {'c' * 12} on ccw/x (parent {'b' * 12}): 1 paths" in err
    refused = {**made, "promoted": False, "policy_report": {**report, "passed": False}, "branch": {"name": "ccw/x"}}
    assert cli_branch.show(refused, False) == 1
    out, err = capsys.readouterr()
    assert out == "" and "no branch made: policy baseline failed" in err
    # A project's caches are many ignored files: counted on one line, as promote counts them.
    caches = [{"path": f"pkg/__pycache__/m{i}.pyc", "reason": "ignored"} for i in range(40)]
    assert cli_branch.show({**made, "skipped": [*caches, {"path": ".git/HEAD", "reason": "git dir"}]}, False) == 0
    out, err = capsys.readouterr()
    assert err.splitlines()[1:] == [
        "  left out 40 ignored files: pkg/__pycache__/m0.pyc, pkg/__pycache__/m1.pyc, pkg/__pycache__/m2.pyc, … "
        "(use --include-ignored)", "  left out (git dir): .git/HEAD"], err
