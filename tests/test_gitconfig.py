"""fs/gitconfig.py: which files of a workspace the host's git config names, read without running any of them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from mcp_server.core import hazards
from mcp_server.core.hazards import ConfigNamed
from mcp_server.fs.gitconfig import (
    PATH_KEYS,
    PROGRAM_KEYS,
    Entry,
    command_words,
    key_rule,
    named_paths,
    on_path,
    parse_listing,
    read,
)
from sandbox.errors import CcwError


def test_parse_listing_reads_scope_origin_key_and_value() -> None:
    out = (b"system\0file:/etc/gitconfig\0core.pager\nless -R\0"
           b"local\0file:.git/config\0core.bare\0"  # a key without "=": no value
           b"command\0command line:\0safe.directory\n*\0"
           b"local\0file:.git/../tools/gitconfig\0alias.x\n!./a\nb\0")  # a value's own newline stays in it
    assert parse_listing(out) == [
        Entry("system", "/etc/gitconfig", "core.pager", "less -R"),
        Entry("local", ".git/config", "core.bare", None),
        Entry("command", "", "safe.directory", "*"),
        Entry("local", ".git/../tools/gitconfig", "alias.x", "!./a\nb"),
    ]
    assert parse_listing(b"") == []


@pytest.mark.parametrize(("key", "expected"), [
    ("include.path", ("include.path", "include.path", "path")),
    ("includeif.onbranch:feat/x.path", ("includeif.*.path", "includeIf.onbranch:feat/x.path", "path")),
    ("core.hookspath", ("core.hookspath", "core.hooksPath", "path")),
    ("filter.LFS.clean", ("filter.*.clean", "filter.LFS.clean", "program")),
    ("credential.https://example.com.helper", ("credential.*.helper", "credential.https://example.com.helper",
                                               "program")),
    ("pager.log", ("pager.*", "pager.log", "program")),
    ("alias.st", ("alias.*", "alias.st", "program")),
    ("core.fsmonitor", ("core.fsmonitor", "core.fsmonitor", "program")),
    ("user.name", None), ("filter.lfs.required", None), ("core.attributesfile", None), ("include.other", None),
])
def test_key_rule(key: str, expected: tuple[str, str, str] | None) -> None:
    assert key_rule(key) == expected


def test_every_key_says_what_git_does_with_it() -> None:
    for pattern, (spelled, use, _) in PATH_KEYS.items():
        assert spelled.lower() == pattern and use, pattern
    for pattern, (spelled, use) in PROGRAM_KEYS.items():
        assert spelled.lower() == pattern and use and len(use) < 100, pattern


@pytest.mark.parametrize(("command", "words"), [
    ("./fsmon", [("./fsmon", False)]),
    ("git-lfs clean -- %f", [("clean", True)]),  # the program is on PATH; "clean" counts only if it is a file
    ("python3 tools/conv.py --out=./o %f", [("tools/conv.py", False), ("./o", False)]),
    ("PYTHONPATH=./lib python3 conv.py", [("./lib", False), ("conv.py", True)]),
    ("f() { ./scripts/x.sh \"$1\"; }; f", [("./scripts/x.sh", False)]),
    ("a;./b|c && ~/bin/d", [("./b", False), ("~/bin/d", False)]),
    ("$GIT_DIR/hook arg", [("arg", True)]),  # a variable's value is not known
    ("'./unclosed quote", [("'./unclosed", False), ("quote", True)]),
    ("less -R", []),
])
def test_command_words(command: str, words: list[tuple[str, bool]]) -> None:
    assert command_words(command) == words


def _entries(*items: tuple[str, str, str | None]) -> list[Entry]:
    return [Entry("local", origin, key, value) for origin, key, value in items]


def test_named_paths_resolve_each_kind_of_value(tmp_path: Path) -> None:
    top = tmp_path / "repo"
    (top / "tools").mkdir(parents=True)
    (top / "conv.py").write_text("")
    entries = _entries(
        (".git/config", "include.path", "../tools/gitconfig"),  # relative to .git/
        (".git/../tools/gitconfig", "include.path", "more"),  # relative to tools/
        (".git/config", "core.hookspath", ".githooks"),  # relative to the top
        (".git/config", "filter.x.clean", "./scripts/clean.sh %f"),
        (".git/config", "diff.x.textconv", "python3 conv.py"),  # conv.py is there
        (".git/config", "diff.y.textconv", "python3 absent.py"),  # absent.py is not
        (".git/config", "core.fsmonitor", "true"),  # git's own daemon
        (".git/config", "core.fsmonitor", "./fsmon"),
        (".git/config", "alias.co", "checkout"),  # a git command
        (".git/config", "alias.x", "!./tools/x"),
        (".git/config", "core.sshcommand", "/usr/bin/ssh -i ~/.ssh/k"),  # outside the workspace
        (".git/config", "user.name", "host"),
        (".git/config", "core.bare", None),
    )
    named = named_paths(entries, str(top), str(top))
    assert [(n.path, n.key, n.origin, n.subtree) for n in named] == [
        ("tools/gitconfig", "include.path", ".git/config", False),
        ("tools/more", "include.path", "tools/gitconfig", False),
        (".githooks", "core.hooksPath", ".git/config", True),
        ("scripts/clean.sh", "filter.x.clean", ".git/config", False),
        ("conv.py", "diff.x.textconv", ".git/config", False),
        ("fsmon", "core.fsmonitor", ".git/config", False),
        ("tools/x", "alias.x", ".git/config", False),
    ]
    assert named[2].use.startswith("git runs the hooks in it")


def test_named_paths_are_relative_to_the_workspace_as_given_and_as_resolved(tmp_path: Path) -> None:
    top = tmp_path / "repo"
    (top / "sub" / "conf").mkdir(parents=True)
    (top / "sub" / "tools").symlink_to("conf")  # the live tree's link: tools/gitconfig is conf/gitconfig
    (tmp_path / "ws").symlink_to(top / "sub")  # the workspace as the caller named it
    entries = _entries((".git/config", "include.path", "../sub/tools/gitconfig"),
                       (".git/config", "core.hookspath", "hooks"),  # the top's hooks: outside the workspace
                       (".git/config", "core.pager", str(top / "sub" / "pager")))
    named = named_paths(entries, str(top), str(tmp_path / "ws"))
    assert sorted(n.path for n in named) == ["conf/gitconfig", "pager", "tools/gitconfig"]


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home of its own, so the global config read is the test's."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    return home


def _by_path(named: list[ConfigNamed]) -> dict[str, str]:
    return {n.path: f"{n.key} in {n.origin}" for n in named}


def test_read_asks_the_live_repository_and_runs_nothing(tmp_path: Path, home: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "tools").mkdir(parents=True)
    _git(repo, "init", "-q")
    marker = tmp_path / "ran"
    (repo / "tools" / "gitconfig").write_text(f"[core]\n\tpager = ./pager\n\tfsmonitor = touch {marker}; false\n")
    _git(repo, "config", "include.path", "../tools/gitconfig")
    _git(repo, "config", "core.hooksPath", ".githooks")
    _git(repo, "config", "filter.x.clean", "./scripts/clean.sh %f")
    (repo / "tools" / "feature").write_text("[diff \"y\"]\n\ttextconv = ./feature-conv\n")
    _git(repo, "config", "includeIf.onbranch:feature.path", "../tools/feature")  # not the branch checked out
    (home / ".gitconfig").write_text(f"[core]\n\tsshCommand = {repo}/bin/ssh\n")
    assert _by_path(read(str(repo))) == {
        "tools/gitconfig": "include.path in .git/config",
        "pager": "core.pager in tools/gitconfig",
        ".githooks": "core.hooksPath in .git/config",
        "scripts/clean.sh": "filter.x.clean in .git/config",
        "tools/feature": "includeIf.onbranch:feature.path in .git/config",
        "feature-conv": "diff.y.textconv in tools/feature",  # read on its own, as it will count on that branch
        "bin/ssh": f"core.sshCommand in {home}/.gitconfig",
    }
    assert not marker.exists()
    # A workspace below the top: only what is in it, relative to it.
    assert _by_path(read(str(repo / "tools"))) == {"gitconfig": "include.path in .git/config",
                                                   "feature": "includeIf.onbranch:feature.path in .git/config"}


def test_read_outside_a_repository_sees_the_global_config(tmp_path: Path, home: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    assert read(str(plain)) == []
    (home / ".gitconfig").write_text(f"[core]\n\thooksPath = {plain}/hooks\n")
    assert _by_path(read(str(plain))) == {"hooks": f"core.hooksPath in {home}/.gitconfig"}


def test_git_own_global_config_files_in_the_workspace_are_named(tmp_path: Path, home: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # A workspace of ~/.config/git: its "config" is the user's global config once written, though
    # none is there yet (git lists no file it did not find).
    xdg_git = home / ".config" / "git"
    xdg_git.mkdir(parents=True)
    assert _by_path(read(str(xdg_git))) == {"config": f"global config in {xdg_git}/config"}
    # A dotfiles checkout that ~/.gitconfig links into: the file git reads, named by its resolved path.
    dotfiles = tmp_path / "dotfiles"
    _git(tmp_path, "init", "-q", str(dotfiles))
    (dotfiles / "gitconfig").write_text("[user]\n\tname = me\n")
    (home / ".gitconfig").symlink_to(dotfiles / "gitconfig")
    assert _by_path(read(str(dotfiles))) == {"gitconfig": f"global config in {home}/.gitconfig"}
    # Where XDG_CONFIG_HOME says, not ~/.config.
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    (tmp_path / "xdg" / "git").mkdir(parents=True)
    assert _by_path(read(str(tmp_path / "xdg" / "git"))) == {"config": f"global config in {tmp_path}/xdg/git/config"}
    assert read(str(xdg_git)) == []
    named = read(str(dotfiles))[0]
    assert "global config of every repository" in named.use and hazards.find(
        [hazards.Change("gitconfig", "write", "file", 0o644)], config_named=[named])[0].kind == "git_control"


def test_on_path_names_what_hides_a_later_program_and_links_standing_in(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    ws, system = tmp_path / "ws", tmp_path / "system"
    for made in (ws / "bin", ws / "tools", ws / "deep" / "bin", system / "sudo.d"):
        made.mkdir(parents=True)
    for program in ("sudo", "ls", "notexec"):
        (system / program).write_text("#!/bin/sh\n")
        (system / program).chmod(0o755 if program != "notexec" else 0o644)
    (tmp_path / "linked").symlink_to(ws / "tools")
    path = ":".join([str(ws / "bin"), str(tmp_path / "linked"), "node_modules/.bin", ".", str(system),
                     str(ws / "deep" / "bin")])
    changed = [("bin/sudo", "file"), ("tools/ls", "symlink"), ("bin/mytool", "file"), ("bin/notexec", "file"),
               ("bin/sudo.d", "file"), ("src/ls", "file"), ("deep/bin/ls", "file"), ("deep", "symlink"),
               ("bin", "symlink"), ("src", "symlink")]
    found = on_path(str(ws), changed, path)
    assert sorted(found) == ["bin", "bin/sudo", "deep", "tools/ls"]
    assert found["bin/sudo"] == (f"bin comes before {system} on the promoting user's PATH: typing sudo would run "
                                 f"this instead of {system}/sudo")
    assert "standing in" in found["deep"] and "standing in" in found["bin"]
    # A capsule of the PATH directory itself; and this process's PATH when none is given.
    assert list(on_path(str(ws / "bin"), [("ls", "file")], f"{ws}/bin:{system}")) == ["ls"]
    monkeypatch.setenv("PATH", f"{ws}/bin:{system}")
    assert list(on_path(str(ws), [("bin/ls", "file")])) == ["bin/ls"]
    assert on_path(str(ws), [("bin/ls", "file")], f"{system}:{ws}/bin") == {}  # found first in system: hides nothing


def test_a_config_git_cannot_read_refuses_rather_than_guesses(tmp_path: Path, home: Path) -> None:
    repo = tmp_path / "repo"
    _git(repo.parent, "init", "-q", str(repo))
    with open(repo / ".git" / "config", "a") as config:
        config.write("[core\n")
    with pytest.raises(CcwError) as caught:
        read(str(repo))
    assert caught.value.code == "INVALID_ARGUMENT" and "git config --list failed" in caught.value.message


def test_without_git_nothing_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no git on it
    assert read(str(tmp_path)) == []
