"""core/hazards.py: which changes a promotion would carry out that run or escalate on the host."""

from __future__ import annotations

import os
import subprocess
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from mcp_server.capsules import gitrefs
from mcp_server.core import hazards, refmoves
from mcp_server.core.hazards import (
    AUTORUN,
    GIT_DATA,
    KINDS,
    Change,
    ConfigNamed,
    find,
    gitdir_candidates,
    judge,
    report_reasons,
)
from mcp_server.core.policy import CapsuleFacts, CombinedRules, evaluate
from mcp_server.core.refmoves import RefChange, reasons
from mcp_server.fs.changeset import Entry
from mcp_server.fs.view import RootView, Side


def _kinds(change: Change, bare: tuple[str, ...] = (), checked: tuple[str, ...] = ()) -> list[str]:
    return [h.kind for h in find([change], bare, checked_data=checked)]


@pytest.mark.parametrize(("change", "expected"), [
    (Change("s", "write", "file", 0o6755), ["setuid"]),
    (Change("s", "write", "file", 0o2755), ["setuid"]),
    (Change("tool", "chmod", "file", 0o4755, 0o755), ["setuid"]),
    (Change("tool", "write", "file", 0o4755, 0o4755), ["setuid"]),  # new bytes under an old bit are new code
    (Change("shared", "mkdir", "dir", 0o2775), []),  # a setgid directory passes its group on, nothing more
    (Change("shared", "chmod", "dir", 0o2775, 0o775), []),
    (Change("run.sh", "write", "file", 0o755), []),
    (Change("open.sh", "write", "file", 0o777), ["world_writable"]),
    (Change("open.sh", "chmod", "file", 0o666, 0o644), ["world_writable"]),
    (Change("open.sh", "write", "file", 0o666, 0o666), []),  # already so in the workspace
    (Change("drop", "mkdir", "dir", 0o777), ["world_writable"]),
    (Change("tmp", "mkdir", "dir", 0o1777), []),  # sticky: nobody replaces another's files
    (Change("link", "symlink", "symlink"), []),
    (Change("gone", "delete", None), []),
])
def test_mode_bits(change: Change, expected: list[str]) -> None:
    assert _kinds(change) == expected


@pytest.mark.parametrize("path", [
    ".git", ".git/config", ".git/config.worktree", ".git/hooks", ".git/hooks/pre-commit", ".git/info/attributes",
    ".git/commondir", ".git/objects/info/alternates", ".git/objects/info/http-alternates", ".git/modules/x/config",
    ".git/worktrees/w/gitdir", ".git/rebase-merge/git-rebase-todo", ".git/index.lock", "sub/.git",
    "sub/.git/hooks/post-checkout", "a/b/.git/config", ".GIT/config", "sub/.Git",
])
def test_git_control_at_any_depth(path: str) -> None:
    for action, kind in (("write", "file"), ("symlink", "symlink"), ("delete", None)):
        assert _kinds(Change(path, action, kind, 0o644 if kind == "file" else None)) == ["git_control"], (path, action)


@pytest.mark.parametrize("path", [
    ".git/objects", ".git/objects/ab/cdef", ".git/objects/pack/pack-1.pack", ".git/objects/info/commit-graph",
    ".git/refs/heads/main", ".git/logs/HEAD", ".git/logs/refs/heads/main", ".git/index", ".git/HEAD",
    ".git/ORIG_HEAD", ".git/COMMIT_EDITMSG", ".git/packed-refs", ".git/info", ".git/info/exclude",
    "sub/.git/refs/tags/v1", "gitsrc/.gitignore", "src/git/config", "docs/hooks/pre-commit.md",
])
def test_git_data_and_lookalikes_are_not_hazards(path: str) -> None:
    # Object data and packed refs count as data once their bytes were checked (checked_data).
    assert _kinds(Change(path, "write", "file", 0o644), checked=(path,)) == []
    assert _kinds(Change(path, "delete", None)) == []


def test_a_bare_looking_directory_is_a_repository() -> None:
    bare = ("vendor/inner.git",)
    assert _kinds(Change("vendor/inner.git/config", "write", "file", 0o644), bare) == ["git_control"]
    assert _kinds(Change("vendor/inner.git/hooks/update", "write", "file", 0o755), bare) == ["git_control"]
    assert _kinds(Change("vendor/inner.git", "mkdir", "dir", 0o755), bare) == ["git_control"]
    assert _kinds(Change("vendor/inner.git/objects/ab/c", "write", "file", 0o444), bare,
                  ("vendor/inner.git/objects/ab/c",)) == []
    assert _kinds(Change("vendor/inner.git/config", "write", "file", 0o644)) == []  # not bare-looking: a file
    assert _kinds(Change("config", "write", "file", 0o644), ("",)) == ["git_control"]  # the workspace itself


def _git_reads_config_of(cwd: Path) -> str | None:
    """The repository config file git reads when run in ``cwd`` (no parent searched), or None."""
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(cwd.parent), "GIT_CONFIG_GLOBAL": "/dev/null",
           "GIT_CONFIG_NOSYSTEM": "1"}
    found = subprocess.run(["git", "config", "--show-origin", "--get", "planted.key"], cwd=cwd, env=env,
                           capture_output=True, text=True, check=False)
    return found.stdout.split("\t")[0].removeprefix("file:") if found.returncode == 0 else None


def _present(directory: Path) -> Callable[[str], bool]:
    return lambda name: os.path.lexists(directory / name)


def test_a_directory_pointing_at_a_common_dir_and_that_common_dir_are_repositories(tmp_path: Path) -> None:
    # HEAD and commondir in one directory, objects and refs in another: git takes the first
    # for a repository and reads the second's config, though neither holds all three marks.
    pointer, common = tmp_path / "evil", tmp_path / "x"
    for made in (pointer, common / "objects", common / "refs"):
        made.mkdir(parents=True)
    (pointer / "HEAD").write_text("ref: refs/heads/main\n")
    (pointer / "commondir").write_text("../x\n")
    (common / "config").write_text("[planted]\n\tkey = 1\n")
    assert _git_reads_config_of(pointer) == str(common / "config")
    assert hazards.looks_like_gitdir(_present(pointer)) and hazards.looks_like_gitdir(_present(common))
    bare = ("evil", "x")
    assert _kinds(Change("x/config", "write", "file", 0o644), bare) == ["git_control"]
    assert _kinds(Change("evil/commondir", "write", "file", 0o644), bare) == ["git_control"]
    assert _kinds(Change("x/objects/ab/c", "write", "file", 0o444), bare, ("x/objects/ab/c",)) == []


@pytest.mark.parametrize("names", [(), ("HEAD",), ("objects",), ("refs",), ("commondir",), ("HEAD", "objects"),
                                   ("HEAD", "refs"), ("objects", "commondir")])
def test_a_directory_without_either_pair_of_marks_is_no_repository(tmp_path: Path, names: tuple[str, ...]) -> None:
    (tmp_path / "d").mkdir()
    for name in names:  # HEAD and commondir as git writes them, so only the missing marks are missing
        if name == "HEAD":
            (tmp_path / "d" / name).write_text("ref: refs/heads/main\n")
        elif name == "commondir":
            (tmp_path / "d" / name).write_text(".\n")
        else:
            (tmp_path / "d" / name).mkdir()
    (tmp_path / "d" / "config").write_text("[planted]\n\tkey = 1\n")
    assert _git_reads_config_of(tmp_path / "d") is None
    assert not hazards.looks_like_gitdir(_present(tmp_path / "d"))


@pytest.mark.parametrize("path", [".git/objects/info", ".git/objects/ab", ".git/objects/pack/p.pack", ".git/refs/heads",
                                  ".git/refs/heads/main", ".git/logs/refs/heads", ".git/HEAD", ".git/index",
                                  "sub/.git/objects/info", "vendor/inner.git/objects/info"])
def test_a_link_in_a_git_directory_is_git_control_even_where_data_lives(path: str) -> None:
    # .git/objects/info -> ../../alt with alt/alternates in the work tree is objects/info/alternates.
    assert _kinds(Change(path, "symlink", "symlink"), ("vendor/inner.git",)) == ["git_control"]
    assert _kinds(Change(path, "write", "file", 0o644), ("vendor/inner.git",), (path,)) == []


def _object_file(repo: Path, body: bytes, *args: str) -> tuple[str, bytes]:
    """A loose object git writes for ``body`` in a new repository (``args``: git init's): its id and file bytes."""
    subprocess.run(["git", "init", "-q", *args, str(repo)], check=True)
    oid = subprocess.run(["git", "-C", str(repo), "hash-object", "-w", "--stdin"], input=body, check=True,
                         capture_output=True).stdout.decode().strip()
    return oid, (repo / ".git" / "objects" / oid[:2] / oid[2:]).read_bytes()


@pytest.mark.parametrize("init", [(), ("--object-format=sha256",)])
def test_a_loose_object_is_true_only_when_its_bytes_hash_to_its_name(tmp_path: Path, init: tuple[str, ...]) -> None:
    oid, data = _object_file(tmp_path / "repo", b"echo hi\n", *init)
    assert hazards.true_loose_object(oid, data)
    evil = b"echo pwned\n"
    assert not hazards.true_loose_object(oid, zlib.compress(b"blob %d\0" % len(evil) + evil))  # the capsule's swap
    assert not hazards.true_loose_object(oid, data + b"x")  # trailing bytes: git refuses them too
    assert not hazards.true_loose_object(oid, data[:-3])  # cut short
    assert not hazards.true_loose_object(oid, b"not zlib at all")
    assert not hazards.true_loose_object(oid, zlib.compress(b"blob 8\0echo hi\n"[:-1] + b"!"))
    # A header that lies about the size, over 8 MiB of zeros in a few KiB: refused without inflating it all.
    bomb = zlib.compress(b"blob 3\0" + bytes(8 << 20), 9)
    assert len(bomb) < 16 << 10 and not hazards.true_loose_object(oid, bomb)
    big = zlib.compress(b"blob %d\0" % (hazards.MAX_CHECKED_OBJECT + 1), 9)
    assert not hazards.true_loose_object(oid, big)


def test_object_data_not_checked_against_its_name_is_git_control(tmp_path: Path) -> None:
    oid, _ = _object_file(tmp_path / "repo", b"x\n")
    loose = f".git/objects/{oid[:2]}/{oid[2:]}"
    assert hazards.loose_object_id(loose) == oid and hazards.loose_object_id(f"sub/{loose}") == oid
    assert hazards.loose_object_id(f"objects/{oid[:2]}/{oid[2:]}", ("",)) == oid  # a bare repository's
    assert hazards.loose_object_id(f"src/objects/{oid[:2]}/{oid[2:]}") is None  # no git directory
    assert hazards.loose_object_id(f".git/objects/{oid[:2]}/{oid[2:].upper()}") is None  # git reads lowercase
    for path in (loose, ".git/objects/pack/pack-1.pack", ".git/objects/pack/pack-1.idx",
                 ".git/objects/info/commit-graph", ".git/objects/pack/multi-pack-index"):
        assert _kinds(Change(path, "write", "file", 0o444)) == ["git_control"], path
        assert _kinds(Change(path, "chmod", "file", 0o444)) == [], path  # the same bytes
    assert _kinds(Change(loose, "write", "file", 0o444), checked=(loose,)) == []
    assert "other content where no diff shows it" in find([Change(loose, "write", "file", 0o444)])[0].reason


def test_a_replace_ref_loose_or_packed_is_git_control(tmp_path: Path) -> None:
    # refs/replace/OID has git show and check out another object for OID: history rewritten unseen.
    for path in (".git/refs/replace/1083d263a12f8ca0b19827526030ed286669b9df", "sub/.git/refs/replace/x"):
        assert _kinds(Change(path, "write", "file", 0o644), checked=(path,)) == ["git_control"]
    assert "replace ref" in find([Change(".git/packed-refs", "write", "file", 0o644)])[0].reason
    assert _kinds(Change(".git/packed-refs", "delete", None)) == []
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    git = ["git", "-C", str(repo), "-c", "user.name=a", "-c", "user.email=a@b"]
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "one"], check=True)
    subprocess.run([*git, "tag", "-a", "-m", "v", "v1"], check=True)
    subprocess.run([*git, "pack-refs", "--all"], check=True)
    assert hazards.plain_packed_refs((repo / ".git" / "packed-refs").read_bytes())
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "two"], check=True)
    subprocess.run([*git, "replace", "HEAD~1", "HEAD"], check=True)
    subprocess.run([*git, "pack-refs", "--all"], check=True)
    assert not hazards.plain_packed_refs((repo / ".git" / "packed-refs").read_bytes())


def test_what_the_promoting_users_path_would_run_is_autorun() -> None:
    on_path = {"ls": "the workspace comes before /usr/bin on the promoting user's PATH: typing ls would run this"}
    assert [h.kind for h in find([Change("ls", "write", "file", 0o755)], on_path=on_path)] == ["autorun"]
    assert find([Change("ls", "write", "file", 0o755)], on_path=on_path)[0].reason == on_path["ls"]
    assert find([Change("ls", "symlink", "symlink")], on_path=on_path)[0].kind == "autorun"
    assert find([Change("ls", "chmod", "file", 0o755)], on_path=on_path)[0].kind == "autorun"
    assert find([Change("ls", "delete", None)], on_path=on_path) == []
    assert find([Change("ls", "mkdir", "dir", 0o755)], on_path=on_path) == []
    assert find([Change("lsx", "write", "file", 0o755)], on_path=on_path) == []


def test_gitdir_candidates_are_the_ancestors_outside_dot_git() -> None:
    assert gitdir_candidates(["a/b/c", ".git/x", "sub/.git/hooks/y", "top"]) == ["", "a", "a/b", "sub"]


@pytest.mark.parametrize("path", [
    ".envrc", "sub/.envrc", ".env", ".vscode", ".vscode/tasks.json", ".vscode/settings.json", "x.code-workspace",
    ".idea/workspace.xml", ".devcontainer/devcontainer.json", ".devcontainer.json", ".gitmodules", "lib/.gitmodules",
    ".husky/pre-commit", ".husky/_/h", ".pre-commit-config.yaml", ".tool-versions", "mise.toml", ".mise.toml",
    "mise.local.toml", ".mise/tasks/build", ".config/mise/config.toml", ".npmrc", ".yarnrc.yml", ".pnpmfile.cjs",
    ".cargo/config.toml", ".exrc", ".nvim.lua", ".hg/hgrc", ".jj/repo/config.toml", ".ENVRC", ".VSCode/tasks.json",
])
def test_autorun_paths(path: str) -> None:
    assert _kinds(Change(path, "write", "file", 0o644)) == ["autorun"]
    assert _kinds(Change(path, "delete", None)) == ["autorun"]


@pytest.mark.parametrize("path", [
    ".env.example", "src/.envrc.md", "vscode/tasks.json", "x/.cargo/registry/index", "Makefile", "package.json",
    "conftest.py", ".gitattributes", ".gitignore", ".github/workflows/ci.yml", "mise", ".cargo", ".config/other",
])
def test_project_files_are_not_autorun(path: str) -> None:
    assert _kinds(Change(path, "write", "file", 0o644)) == []


@pytest.mark.parametrize("path", [".cargo", "x/.cargo", ".config", ".config/mise", ".jj", ".jj/repo", ".hg"])
def test_a_link_standing_in_for_a_listed_directory(path: str) -> None:
    assert _kinds(Change(path, "symlink", "symlink")) == ["autorun"]
    assert _kinds(Change(path, "mkdir", "dir", 0o755)) == ([] if path not in (".config/mise",) else ["autorun"])


def test_every_autorun_rule_has_a_reason_and_patterns() -> None:
    for rule in AUTORUN:
        assert rule.patterns and rule.reason and len(rule.reason) < 200, rule
    assert all(p == p.casefold() for rule in AUTORUN for p in rule.patterns)
    assert all(p == p.casefold() for p in GIT_DATA)


def test_find_sorts_deduplicates_and_judge_marks_the_allowed() -> None:
    changes = [Change("z", "write", "file", 0o4777), Change(".envrc", "delete", None),
               Change(".envrc", "write", "file", 0o644), Change(".envrc", "write", "file", 0o644)]
    found = find(changes)
    assert [(h.path, h.kind, h.action) for h in found] == [
        (".envrc", "autorun", "delete"), (".envrc", "autorun", "write"), ("z", "setuid", "write"),
        ("z", "world_writable", "write")]
    judged = judge(found, {"setuid", "autorun"})
    assert [h.allowed for h in judged] == [True, True, True, False]
    assert judged[0].to_json() == {"kind": "autorun", "path": ".envrc", "action": "delete",
                                   "reason": judged[0].reason, "allowed": True}


def test_the_report_refuses_names_and_says_how_to_allow() -> None:
    found = find([Change(".git/hooks/pre-commit", "write", "file", 0o755), Change("s", "write", "file", 0o6755)])
    facts = CapsuleFacts(workspace="/w", home="/h", hazards=judge(found, set()))
    report = evaluate(CombinedRules(), facts, [], None)
    assert report["passed"] is False and report["hazards_ok"] is False
    assert [h["path"] for h in report["hazards"]] == [".git/hooks/pre-commit", "s"]
    assert '.git/hooks/pre-commit (git_control), s (setuid)' in report["details"]
    assert 'allow_hazards ["git_control", "setuid"]' in report["details"]
    allowed = evaluate(CombinedRules(), CapsuleFacts("/w", "/h", hazards=judge(found, set(KINDS))), [], None)
    assert allowed["passed"] is True and allowed["hazards_ok"] is True
    assert allowed["details"].startswith("note: 2 hazard(s) allowed") and "never written" in allowed["details"]
    clean = evaluate(CombinedRules(), CapsuleFacts("/w", "/h"), [], None)
    assert clean["hazards"] == [] and clean["hazards_ok"] is True and clean["details"] == "All checks passed"


def test_report_reasons_list_at_most_five_paths() -> None:
    found = find([Change(f".git/hooks/h{i}", "write", "file", 0o755) for i in range(7)])
    failures, notes = report_reasons(found)
    assert notes == [] and len(failures) == 1 and "h4 (git_control), …" in failures[0]
    assert hazards.json_list(["a", "b"]) == '["a", "b"]'


# What the host's git config names, as fs/gitconfig.py passes it in.
INCLUDED = ConfigNamed("tools/gitconfig", "include.path", ".git/config", "git reads it as config")
HOOKS = ConfigNamed(".githooks", "core.hooksPath", ".git/config", "git runs the hooks in it", subtree=True)
FILTER = ConfigNamed("scripts/clean.sh", "filter.x.clean", "/home/u/.gitconfig", "add runs it")


def _named(change: Change, *named: ConfigNamed) -> list[tuple[str, str]]:
    return [(h.kind, h.reason) for h in find([change], (), named or (INCLUDED, HOOKS, FILTER))]


@pytest.mark.parametrize(("change", "named"), [
    (Change("tools/gitconfig", "write", "file", 0o644, 0o644), INCLUDED),
    (Change("tools/gitconfig", "delete", None), INCLUDED),  # removing an include drops what it set
    (Change("tools/gitconfig", "symlink", "symlink"), INCLUDED),
    (Change("Tools/GitConfig", "write", "file", 0o644), INCLUDED),  # the same file on a casefolding filesystem
    (Change("scripts/clean.sh", "chmod", "file", 0o755, 0o644), FILTER),  # made runnable
    (Change(".githooks", "mkdir", "dir", 0o755), HOOKS),
    (Change(".githooks/pre-commit", "write", "file", 0o755), HOOKS),
    (Change(".githooks/lib/common.sh", "write", "file", 0o644), HOOKS),  # what a hook sources
    (Change(".githooks", "symlink", "symlink"), HOOKS),
])
def test_a_change_to_what_the_host_config_names_is_git_control(change: Change, named: ConfigNamed) -> None:
    assert _named(change) == [("git_control", f"the host's git config names it ({named.key} in {named.origin}): "
                                              f"{named.use}")]


def test_a_link_on_the_way_to_a_named_file_counts_and_a_directory_does_not() -> None:
    [(kind, reason)] = _named(Change("tools", "symlink", "symlink"))
    assert kind == "git_control" and reason.startswith("a link on the way to tools/gitconfig, which the host's git "
                                                        "config names (include.path in .git/config)")
    assert _named(Change("scripts", "symlink", "symlink")) != []
    assert _named(Change("tools", "mkdir", "dir", 0o755)) == []  # a directory alone runs nothing
    assert _named(Change("tools/other", "write", "file", 0o644)) == []
    assert _named(Change("tools/gitconfig.bak", "write", "file", 0o644)) == []
    assert _named(Change(".githooks-old/pre-commit", "write", "file", 0o755)) == []
    assert _named(Change("src/tools/gitconfig", "write", "file", 0o644)) == []


def test_named_paths_count_beside_the_other_kinds() -> None:
    husky = ConfigNamed(".husky", "core.hooksPath", ".git/config", "git runs the hooks in it", subtree=True)
    found = find([Change(".husky/pre-commit", "write", "file", 0o777)], (), [husky])
    assert [h.kind for h in found] == ["autorun", "git_control", "world_writable"]
    # A path in .git that the config names too is one git_control hazard, citing the key.
    inside = ConfigNamed(".git/hooks-local", "core.hooksPath", ".git/config", "git runs the hooks in it", True)
    [hazard] = find([Change(".git/hooks-local/post-merge", "write", "file", 0o755)], (), [inside])
    assert hazard.kind == "git_control" and "core.hooksPath" in hazard.reason
    # The workspace itself as a hooks directory: every change is one.
    everything = ConfigNamed("", "core.hooksPath", "the global config", "git runs the hooks in it", True)
    assert _kinds(Change("src/a.py", "write", "file", 0o644)) == []
    assert [h.kind for h in find([Change("src/a.py", "write", "file", 0o644)], (), [everything])] == ["git_control"]


A, B = "a" * 40, "b" * 40


@pytest.mark.parametrize(("ref", "refused"), [
    (RefChange(".git/refs/heads/new", "refs/heads/new", None, A), None),  # git branch, git checkout -b
    (RefChange(".git/refs/tags/v2", "refs/tags/v2", None, A), None),  # git tag
    (RefChange(".git/refs/heads/main", "refs/heads/main", A, B, descends=True), None),  # git commit
    (RefChange(".git/ORIG_HEAD", "ORIG_HEAD", A, None), None),  # deleting an undo point runs nothing
    (RefChange(".git/refs/tags/v1.0", "refs/tags/v1.0", A, B), f"tag v1.0 moved from {A[:12]} to {B[:12]}"),
    (RefChange(".git/refs/heads/main", "refs/heads/main", A, B),
     f"branch main moved from {A[:12]} to {B[:12]}, which does not descend from it"),
    (RefChange(".git/refs/heads/old", "refs/heads/old", A, None), f"branch old deleted (it named {A[:12]})"),
    (RefChange(".git/packed-refs", "refs/tags/v1", A, None), "tag v1 deleted"),
    (RefChange(".git/refs/remotes/origin/main", "refs/remotes/origin/main", A, B),
     f"remote-tracking ref origin/main moved from {A[:12]} at {B[:12]}"),
    (RefChange(".git/refs/remotes/origin/x", "refs/remotes/origin/x", None, A), "remote-tracking ref origin/x made"),
    (RefChange(".git/ORIG_HEAD", "ORIG_HEAD", None, B), f"ORIG_HEAD set to {B[:12]}"),
    (RefChange(".git/ORIG_HEAD", "ORIG_HEAD", A, B, descends=True), None),  # B is in the promoted history
    (RefChange(".git/FETCH_HEAD", "FETCH_HEAD", A, B), f"FETCH_HEAD set to {B[:12]}"),
    (RefChange(".git/refs/heads/main", "refs/heads/main", A, "ref: refs/heads/x"), "branch main moved"),
    (RefChange(".git/refs/stash", "refs/stash", A, B), "ref refs/stash moved"),
])
def test_a_ref_moved_deleted_or_planted_is_git_control_and_a_new_or_forward_one_is_not(
        ref: RefChange, refused: str | None) -> None:
    change = Change(ref.path, "write" if ref.new else "delete", "file" if ref.new else None, 0o644)
    found = find([change], moved=reasons([ref]))
    assert [h.kind for h in found] == ([] if refused is None else ["git_control"])
    assert refused is None or refused in found[0].reason


def test_every_ref_a_packed_refs_file_changes_is_named_on_its_path() -> None:
    refs = [RefChange(".git/packed-refs", "refs/tags/v1", A, B), RefChange(".git/packed-refs", "refs/tags/v2", A, None),
            RefChange(".git/packed-refs", "refs/tags/v3", None, A)]
    found = find([Change(".git/packed-refs", "write", "file", 0o644)], checked_data={".git/packed-refs"},
                 moved=reasons(refs))
    assert [(h.path, h.kind) for h in found] == [(".git/packed-refs", "git_control")]
    assert "tag v1 moved" in found[0].reason and "tag v2 deleted" in found[0].reason and "v3" not in found[0].reason


def _git(repo: Path, *args: str) -> str:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GIT_")}, "GIT_AUTHOR_NAME": "t",
           "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def _entries(live: Path, capsule: Path) -> list[Entry]:
    """Every file whose bytes differ between the two trees, as promotion's change set has it."""
    def files(root: Path) -> dict[str, bytes]:
        return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    old, new = files(live), files(capsule)
    side = Side("file", 0o644)
    return [Entry(path, side if path in old else None, side if path in new else None, path in old and path in new)
            for path in sorted(old.keys() | new.keys()) if old.get(path) != new.get(path)]


def _ref_changes(live: Path, capsule: Path) -> list[RefChange]:
    """The refs promoting the change between the two trees would change (the capsule's loose
    objects that hash to their names read as checked data, as promotion reads them)."""
    entries = _entries(live, capsule)
    checked = {e.path for e in entries if (oid := hazards.loose_object_id(e.path)) and e.new
               and hazards.true_loose_object(oid, (capsule / e.path).read_bytes())}
    with RootView.open(str(capsule)) as view:
        return gitrefs.changes(view, str(live), entries, (), checked)


def _repo(path: Path, text: str) -> None:
    """A repository at ``path`` on branch main, whose one commit c0 holds ``f`` with ``text``."""
    _git(path.parent, "init", "-q", "-b", "main", str(path))
    (path / "f").write_text(text)
    _git(path, "add", "-A")
    _git(path, "commit", "-q", "-m", "c0")


def test_gitrefs_reads_each_moved_ref_and_asks_git_whether_a_branch_moved_forward(tmp_path: Path) -> None:
    live, capsule = tmp_path / "live", tmp_path / "capsule"
    _git(tmp_path, "init", "-q", "-b", "main", str(live))
    for n in range(3):
        _git(live, "commit", "-q", "--allow-empty", "-m", f"c{n}")
    first, second = _git(live, "rev-parse", "HEAD~2"), _git(live, "rev-parse", "HEAD~1")
    for branch in ("rewound", "gone", "behind"):
        _git(live, "branch", branch, "HEAD~1")
    _git(live, "tag", "v1.0", first)
    _git(live, "tag", "packed", first)
    _git(live, "pack-refs", "--all")
    _git(live, "branch", "behind", first, "-f")  # loose, over its packed value
    subprocess.run(["cp", "-a", str(live), str(capsule)], check=True)
    _git(capsule, "commit", "-q", "--allow-empty", "-m", "the agent's")  # main moves forward
    _git(capsule, "branch", "feature")
    _git(capsule, "tag", "v2")
    _git(capsule, "tag", "-f", "v1.0", second)
    _git(capsule, "branch", "-f", "rewound", first)
    _git(capsule, "branch", "-D", "gone")
    _git(capsule, "branch", "-f", "behind", "main~1")  # forward through a commit the host has
    _git(capsule, "tag", "-d", "packed")  # rewrites packed-refs
    refs = _ref_changes(live, capsule)
    judged = {ref.ref: refmoves.reason(ref) for ref in refs}
    assert sorted(judged) == ["refs/heads/behind", "refs/heads/feature", "refs/heads/gone", "refs/heads/main",
                              "refs/heads/rewound", "refs/tags/packed", "refs/tags/v1.0", "refs/tags/v2"]
    assert [ref for ref, why in judged.items() if why is None] == [
        "refs/heads/behind", "refs/heads/feature", "refs/heads/main", "refs/tags/v2"]
    assert judged["refs/tags/v1.0"] == (f"tag v1.0 moved from {first[:12]} to {second[:12]}: who checks out, "
                                        "builds or verifies v1.0 gets another commit")
    assert "branch rewound moved" in str(judged["refs/heads/rewound"])
    assert "branch gone deleted" in str(judged["refs/heads/gone"])
    assert "tag packed deleted" in str(judged["refs/tags/packed"])
    assert {ref.ref: ref.path for ref in refs}["refs/tags/packed"] == ".git/packed-refs"


def test_orig_head_set_inside_the_promoted_history_is_plain_and_outside_it_is_not(tmp_path: Path) -> None:
    live, capsule = tmp_path / "live", tmp_path / "capsule"
    _repo(live, "f\n")
    _git(live, "commit", "-q", "--allow-empty", "-m", "c1")

    def judged(script: list[list[str]]) -> dict[str, str | None]:
        subprocess.run(["rm", "-rf", str(capsule)], check=True)
        subprocess.run(["cp", "-a", str(live), str(capsule)], check=True)
        for args in script:
            _git(capsule, *args)
        refs = _ref_changes(live, capsule)
        return {ref.ref: refmoves.reason(ref) for ref in refs if ref.ref == "ORIG_HEAD"}

    (live / "f").write_text("edited\n")  # a stash needs a change to put away
    stash = judged([["stash", "-q"], ["stash", "pop", "-q"]])
    (live / "f").write_text("f\n")
    assert stash == {"ORIG_HEAD": None}  # the stash reset to HEAD: the host's own commit
    merged = judged([["checkout", "-q", "-b", "feat"], ["commit", "-q", "--allow-empty", "-m", "f1"],
                     ["checkout", "-q", "main"], ["merge", "-q", "--no-ff", "-m", "m", "feat"]])
    assert merged == {"ORIG_HEAD": None}  # the merge's undo point: main before it, an ancestor of the new HEAD
    planted = judged([["checkout", "-q", "-b", "side"], ["commit", "-q", "--allow-empty", "-m", "evil"],
                      ["update-ref", "ORIG_HEAD", "side"], ["checkout", "-q", "main"], ["branch", "-q", "-D", "side"]])
    assert "ORIG_HEAD set to" in str(planted["ORIG_HEAD"])  # a commit nothing promoted leads to


def test_a_squash_of_the_capsules_own_commits_leaves_its_pseudorefs_behind(tmp_path: Path) -> None:
    # An agent squashes its two commits before promotion: ORIG_HEAD names the commit before the
    # rebase (in no history the person promotes) and git 2.39 leaves REBASE_HEAD.  Both stay
    # behind, the host's as they were, and what is left to promote has no hazard in its refs.
    live, capsule = tmp_path / "live", tmp_path / "capsule"
    _repo(live, "1\n")
    subprocess.run(["cp", "-a", str(live), str(capsule)], check=True)
    for line in ("2", "3"):
        (capsule / "f").write_text((capsule / "f").read_text() + f"{line}\n")
        _git(capsule, "commit", "-q", "-am", line)
    subprocess.run(["git", "-C", str(capsule), "-c", "user.name=t", "-c", "user.email=t@t", "rebase", "-q", "-i",
                    "HEAD~2"], check=True, capture_output=True,
                   env={**os.environ, "GIT_SEQUENCE_EDITOR": "sed -i 2s/^pick/squash/", "GIT_EDITOR": "true"})
    refs = _ref_changes(live, capsule)
    behind = refmoves.left_behind(refs, [e.path for e in _entries(live, capsule)])
    assert ".git/ORIG_HEAD" in behind and behind <= {".git/ORIG_HEAD", ".git/REBASE_HEAD"}
    assert (capsule / ".git" / "REBASE_HEAD").exists() == (".git/REBASE_HEAD" in behind)
    assert refmoves.reasons(ref for ref in refs if ref.path not in behind) == {}  # main moved forward
    paths = ["sub/.git/REBASE_HEAD", "REBASE_HEAD", ".git/refs/heads/x", ".git/AUTO_MERGE"]
    assert refmoves.left_behind([], paths) == {"sub/.git/REBASE_HEAD", ".git/AUTO_MERGE"}  # in a git dir only



def test_a_merge_or_cherry_pick_left_unfinished_is_git_control_and_a_finished_one_is_not(tmp_path: Path) -> None:
    # Found in a trial: a capsule that wrote MERGE_HEAD (a commit of its own, on no branch)
    # promoted under the baseline policy, and the person's next plain git commit put that
    # commit, never shown in the diff, into their branch's history.
    live, capsule = tmp_path / "live", tmp_path / "capsule"
    _repo(live, "f\n")
    _git(live, "checkout", "-q", "-b", "side")
    (live / "f").write_text("side\n")
    _git(live, "commit", "-q", "-am", "side")
    _git(live, "checkout", "-q", "main")
    (live / "f").write_text("main\n")
    _git(live, "commit", "-q", "-am", "main")

    def judged(*script: list[str]) -> dict[str, str | None]:
        subprocess.run(["rm", "-rf", str(capsule)], check=True)
        subprocess.run(["cp", "-a", str(live), str(capsule)], check=True)
        for args in script:
            subprocess.run(["git", "-C", str(capsule), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                           check=False, capture_output=True)  # a merge that stops at a conflict exits 1
        refs = _ref_changes(live, capsule)
        return {ref.ref: refmoves.reason(ref) for ref in refs if not ref.ref.startswith("refs/")}

    planted = judged(["checkout", "-q", "--detach"], ["commit", "-q", "--allow-empty", "-m", "evil"],
                     ["checkout", "-q", "main"], ["update-ref", "MERGE_HEAD", "HEAD@{1}"])
    assert "MERGE_HEAD set to" in str(planted["MERGE_HEAD"]), planted
    assert "MERGE_HEAD set to" in str(judged(["merge", "--no-ff", "side"])["MERGE_HEAD"])  # stopped at f
    assert "CHERRY_PICK_HEAD set to" in str(judged(["cherry-pick", "side"])["CHERRY_PICK_HEAD"])
    assert judged(["merge", "-q", "-X", "ours", "--no-ff", "-m", "m", "side"]) == {"ORIG_HEAD": None}  # finished
