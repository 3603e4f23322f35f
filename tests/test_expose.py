"""Finding the toolchains a workspace needs outside it (core/expose, capsules/exposure) and
the rule on what may be exposed (sandbox.hostdirs.check_expose_dir): secrets stay hidden."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from mcp_server.capsules import exposure
from mcp_server.core.expose import (
    Need,
    cover,
    expose_hint,
    link_hint,
    missing_paths,
    off_path_hint,
    shebang_interpreter,
    toolchain_root,
    venv_home,
)
from sandbox.errors import CcwError
from sandbox.homes import Home
from sandbox.hostdirs import EXPOSE_SECRETS, HOME_SECRETS, check_expose_dir
from sandbox.usage_words import BAD_INTERPRETER, NAMED_BY

HOME = "/home/ann"
UID = 1000
HOMES = (Home("ann", UID, HOME), Home("root", 0, "/root"))


def test_venv_home_reads_the_home_key() -> None:
    cfg = "include-system-site-packages = false\nhome = /home/ann/.pyenv/versions/3.12.1/bin\nversion = 3.12.1\n"
    assert venv_home(cfg) == "/home/ann/.pyenv/versions/3.12.1/bin"
    assert venv_home("HOME=/x/./bin/\n") == "/x/bin"
    assert venv_home("home = relative/bin\n") is None
    assert venv_home("version = 3\n") is None


def test_shebang_names_an_absolute_interpreter_but_not_env() -> None:
    assert shebang_interpreter(b"#!/home/ann/p/.venv/bin/python3 -E\nimport x") == "/home/ann/p/.venv/bin/python3"
    assert shebang_interpreter(b"#! /opt/n/bin/node\n") == "/opt/n/bin/node"
    assert shebang_interpreter(b"#!/usr/bin/env node\n") is None
    assert shebang_interpreter(b"#!python\n") is None
    assert shebang_interpreter(b"\x7fELF\x02") is None
    assert shebang_interpreter(b"#!/" + b"a" * 1000) is not None  # cut at 256 bytes, not a crash


@pytest.mark.parametrize(("path", "root"), [
    (f"{HOME}/.pyenv/versions/3.12.1/bin/python3.12", f"{HOME}/.pyenv/versions/3.12.1"),
    (f"{HOME}/.local/share/uv/python/cpython-3.12.3-linux-x86_64-gnu/bin/python3.12",
     f"{HOME}/.local/share/uv/python/cpython-3.12.3-linux-x86_64-gnu"),
    (f"{HOME}/.nvm/versions/node/v20.11.0/bin", f"{HOME}/.nvm/versions/node/v20.11.0"),
    (f"{HOME}/.rustup/toolchains/stable-x86_64-unknown-linux-gnu/bin/cargo",
     f"{HOME}/.rustup/toolchains/stable-x86_64-unknown-linux-gnu"),
    (f"{HOME}/.cargo/bin", f"{HOME}/.cargo/bin"),
    (f"{HOME}/go/bin", f"{HOME}/go/bin"),
    (f"{HOME}/miniconda3/envs/ml/bin/python", f"{HOME}/miniconda3/envs/ml"),
    (f"{HOME}/bin", f"{HOME}/bin"),  # never the home itself
    ("/nix/store/abc-python3-3.12.1/bin/python3", "/nix/store/abc-python3-3.12.1"),
    ("/snap/node/8000/bin/node", "/snap/node/8000"),
    ("/srv/tools/py/bin/python3", "/srv/tools/py"),
    ("/usr/bin/python3", None),
    ("/opt/go/bin", None),
])
def test_toolchain_root_is_the_smallest_dir_holding_the_toolchain(path: str, root: str | None) -> None:
    assert toolchain_root(path, HOME) == root


def test_cover_sorts_dedups_and_drops_nested_and_workspace() -> None:
    needs = [Need("/b/x", "PATH entry"), Need("/a", "asked"), Need("/a/y", "shebang"),
             Need("/b/x", "later"), Need("/w/.venv", "inside"), Need("/", "root")]
    assert cover(needs, "/w") == [Need("/a", "asked"), Need("/b/x", "PATH entry")]


@pytest.mark.parametrize("secret", HOME_SECRETS + EXPOSE_SECRETS)
def test_every_secret_is_refused_inside_at_and_above(secret: str) -> None:
    store = f"{HOME}/{secret}"
    for path in (store, f"{store}/sub", os.path.dirname(store)):
        with pytest.raises(CcwError) as raised:
            check_expose_dir("expose", path, UID, HOMES)
        assert raised.value.code == "PERMISSION_DENIED"


@pytest.mark.parametrize("path", ["/", "/home", HOME, "/root", "/etc", "/etc/ssl", "/proc/1", "/var/log",
                                  f"{HOME}/.cargo", f"{HOME}/.config", f"{HOME}/.local/share"])
def test_homes_system_trees_and_what_holds_a_store_are_refused(path: str) -> None:
    with pytest.raises(CcwError) as raised:
        check_expose_dir("expose", path, UID, HOMES)
    assert raised.value.code == "PERMISSION_DENIED"


@pytest.mark.parametrize("path", [f"{HOME}/.pyenv/versions/3.12.1", f"{HOME}/.cargo/bin",
                                  f"{HOME}/.local/share/uv/python/cpython-3.12", "/nix/store/abc-x",
                                  f"{HOME}/.nvm/versions/node/v20.1.0"])
def test_toolchains_may_be_exposed(path: str) -> None:
    check_expose_dir("expose", path, UID, HOMES)


def _fake_machine(tmp_path: Path) -> tuple[Path, Path, tuple[Home, ...]]:
    """A home with a pyenv Python, an nvm node, a cargo bin and key stores; a project."""
    home = tmp_path / "ann"
    prefix = home / ".pyenv/versions/3.12.1"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin/python3.12").write_text("")
    (prefix / "bin/python3").symlink_to("python3.12")
    node = home / ".nvm/versions/node/v20.1.0/bin"
    node.mkdir(parents=True)
    (home / ".cargo/bin").mkdir(parents=True)
    (home / ".cargo/credentials.toml").write_text("token")
    (home / ".ssh").mkdir()
    project = home / "proj"
    venv_bin = project / ".venv/bin"
    venv_bin.mkdir(parents=True)
    (project / ".venv/pyvenv.cfg").write_text(f"home = {prefix}/bin\n")
    (venv_bin / "python").symlink_to(prefix / "bin/python3")
    (venv_bin / "pytest").write_text(f"#!{project}/.venv/bin/python\nimport pytest\n")
    tool = project / "node_modules/tool/cli.js"
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/usr/bin/env node\n")
    (project / "node_modules/.bin").mkdir()
    (project / "node_modules/.bin/tool").symlink_to("../tool/cli.js")
    return home, project, (Home("ann", UID, str(home)),)


def test_discover_finds_venv_prefix_and_path_entries(tmp_path: Path) -> None:
    home, project, homes = _fake_machine(tmp_path)
    path_env = f"{home}/.nvm/versions/node/v20.1.0/bin:{home}/.cargo/bin:/usr/bin:relative:{home}/missing"
    found = exposure.discover(str(project), path_env, str(home), UID, homes)
    assert found == [
        Need(f"{home}/.cargo/bin", f"PATH entry {home}/.cargo/bin"),
        Need(f"{home}/.nvm/versions/node/v20.1.0", f"PATH entry {home}/.nvm/versions/node/v20.1.0/bin"),
        Need(f"{home}/.pyenv/versions/3.12.1", "pyvenv.cfg home of .venv"),
    ]


def test_discover_drops_planted_secrets(tmp_path: Path) -> None:
    home, project, homes = _fake_machine(tmp_path)
    (project / ".venv/pyvenv.cfg").write_text(f"home = {home}/.ssh/bin\n")
    (project / ".venv/bin/python").unlink()
    (project / ".venv/bin/python").symlink_to(home / ".ssh")
    (project / ".venv/bin/evil").write_text(f"#!{home}/.cargo/credentials.toml\n")
    found = exposure.discover(str(project), f"{home}:{home}/.ssh:{home}/.cargo", str(home), UID, homes)
    assert found == []


def test_asked_entries_are_checked_and_refusals_raise(tmp_path: Path) -> None:
    home, _project, homes = _fake_machine(tmp_path)
    assert exposure.asked([f"{home}/.cargo/bin"], UID, homes) == [Need(f"{home}/.cargo/bin", "asked")]
    for path, code in ((f"{home}/.ssh", "PERMISSION_DENIED"), (str(home), "PERMISSION_DENIED"),
                       (f"{home}/.cargo", "PERMISSION_DENIED"), ("rel/dir", "INVALID_ARGUMENT"),
                       (f"{home}/nothing", "NOT_FOUND")):
        with pytest.raises(CcwError) as raised:
            exposure.asked([path], UID, homes)
        assert raised.value.code == code, path


def test_missing_paths_read_the_shells_and_the_jails_command_not_found() -> None:
    assert missing_paths(127, "ccw: nvmtool: command not found\n") == ["nvmtool"]  # the jail's own exec
    assert missing_paths(127, "sh: 1: mocha: not found\n") == ["mocha"]  # dash, as npm runs a script
    assert missing_paths(127, "bash: line 1: mocha: command not found\n") == ["mocha"]
    assert missing_paths(127, "zsh: command not found: mocha\n") == ["mocha"]
    assert missing_paths(127, "error: module not found in cache\n") == []  # not a shell's words
    assert missing_paths(0, "sh: 1: mocha: not found\n") == []


def test_missing_paths_come_only_from_a_could_not_run_exit() -> None:
    jail = "ccw: .venv/bin/python: No such file or directory\n"
    assert missing_paths(127, jail) == [".venv/bin/python"]
    shell = "bash: ./run: /home/ann/.pyenv/versions/3.12.1/bin/python3: bad interpreter: No such file or directory\n"
    assert missing_paths(126, shell) == ["/home/ann/.pyenv/versions/3.12.1/bin/python3"]
    assert missing_paths(127, "/usr/bin/env: 'node': No such file or directory\n") == ["node"]
    assert missing_paths(1, jail) == []
    assert missing_paths(127, "x: a: No such file or directory\n" * 3 + jail) == ["a", ".venv/bin/python"]
    # The jail's own for a script there whose interpreter is not: the interpreter is missing.
    assert missing_paths(126, _bad_interpreter(".venv/bin/pytest", "/home/ann/.pyenv/versions/3.12.1/bin/python3")) \
        == ["/home/ann/.pyenv/versions/3.12.1/bin/python3"]


def _bad_interpreter(script: str, interpreter: str) -> str:
    """What ccw-jail says for ``script`` whose #! line names ``interpreter``, which the jail lacks."""
    return (f"ccw: {script}: {BAD_INTERPRETER}{interpreter}{NAMED_BY}{script}'s #! line): No such file or "
            "directory; the jail does not show it: expose its directory (...), or recreate the venv ...\n")


def test_expose_hint_names_the_path_and_how_to_expose_it() -> None:
    root = f"{HOME}/.pyenv/versions/3.12.1"
    hint = expose_hint(".venv/bin/python", f"{root}/bin/python3.12", root)
    assert ".venv/bin/python leads to" in hint and f"--expose {root}" in hint and f'expose: ["{root}"]' in hint


def test_exec_hints_name_the_hidden_interpreter_and_its_root(tmp_path: Path) -> None:
    home, project, homes = _fake_machine(tmp_path)
    node = home / ".nvm/versions/node/v20.1.0/bin/node"
    node.write_text("")
    node.chmod(0o755)
    root = f"{home}/.pyenv/versions/3.12.1"
    # The jail's PATH (what env searched) holds no node: the caller's does, and says where it is.
    args = (str(project), str(project), f"{project}/.venv/bin", f"{node.parent}:/usr/bin", str(home), UID, homes)
    hints = exposure.exec_hints(127, "ccw: .venv/bin/python: No such file or directory\n", *args)
    assert hints == [expose_hint(".venv/bin/python", f"{root}/bin/python3.12", root)]
    pytest = _bad_interpreter(".venv/bin/pytest", f"{root}/bin/python3.12")
    assert exposure.exec_hints(126, pytest, *args) == [expose_hint(f"{root}/bin/python3.12", f"{root}/bin/python3.12",
                                                                   root)]
    # A venv's script names the venv's python, a link to the hidden one: followed on the host.
    pytest = _bad_interpreter(".venv/bin/pytest", f"{project}/.venv/bin/python")
    assert exposure.exec_hints(126, pytest, *args) == [expose_hint(f"{project}/.venv/bin/python",
                                                                   f"{root}/bin/python3.12", root)]
    hints = exposure.exec_hints(127, "/usr/bin/env: 'node': No such file or directory\n", *args)
    assert hints == [expose_hint("node", str(node), f"{home}/.nvm/versions/node/v20.1.0", str(node))]
    assert "env_whitelist" in hints[0]  # exposed alone, node would still be off the jail's PATH
    # Missing on the host too, inside the workspace, a secret, or not a could-not-run exit: no hint.
    (project / "ssh-python").symlink_to(home / ".ssh")
    for code, stderr in ((127, "ccw: ./gone: No such file or directory\n"),
                         (127, "ccw: node_modules/.bin/tool: No such file or directory\n"),
                         (127, "ccw: ./ssh-python: No such file or directory\n"),
                         (1, "ccw: .venv/bin/python: No such file or directory\n")):
        assert exposure.exec_hints(code, stderr, *args) == [], stderr


def test_a_program_on_the_callers_path_only_is_hinted_whatever_the_jails_path(tmp_path: Path) -> None:
    # The trial: nvm's bin is exposed (found on the caller's PATH) but the jail's PATH is its own.
    home, project, homes = _fake_machine(tmp_path)
    tool = home / ".nvm/versions/node/v20.1.0/bin/nvmtool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    nvm = f"{home}/.nvm/versions/node/v20.1.0"
    jail_path = f"{project}/.venv/bin:/usr/local/bin:/usr/bin:/bin"
    stderr = "ccw: nvmtool: command not found\n"
    shown = exposure.exec_hints(127, stderr, str(project), str(project), jail_path, f"{tool.parent}:/usr/bin",
                                str(home), UID, homes, (nvm,))
    assert shown == [off_path_hint("nvmtool", str(tool))]
    assert f"run {tool}" in shown[0] and "--env PATH" in shown[0]
    hidden = exposure.exec_hints(127, stderr, str(project), str(project), jail_path, f"{tool.parent}:/usr/bin",
                                 str(home), UID, homes)
    assert hidden == [expose_hint("nvmtool", str(tool), nvm, str(tool))]
    # Judged by the jail's PATH alone (the old way), nothing was found and nothing said.
    assert exposure.exec_hints(127, stderr, str(project), str(project), jail_path, "", str(home), UID, homes) == []


def test_a_workspace_link_out_of_the_workspace_is_named_with_its_target(tmp_path: Path) -> None:
    # A git worktree whose node_modules links to the main checkout's: `npm test` finds no mocha.
    home, _, homes = _fake_machine(tmp_path)
    main, tree = home / "src/webapp", home / "src/webapp-wt"
    mocha = main / "node_modules/mocha/bin/mocha.js"
    mocha.parent.mkdir(parents=True)
    mocha.write_text("#!/usr/bin/env node\n")
    mocha.chmod(0o755)
    (main / "node_modules/.bin").mkdir()
    (main / "node_modules/.bin/mocha").symlink_to("../mocha/bin/mocha.js")
    (tree / "test").mkdir(parents=True)
    (tree / "node_modules").symlink_to("../webapp/node_modules")
    jail_path = f"{tree}/.venv/bin:/usr/bin:/bin"
    for cwd, stderr in ((tree, "sh: 1: mocha: not found\n"), (tree / "test", "sh: 1: mocha: not found\n"),
                        (tree, "ccw: node_modules/.bin/mocha: No such file or directory\n")):
        missing = missing_paths(127, stderr)[0]
        hints = exposure.exec_hints(127, stderr, str(tree), str(cwd), jail_path, "/usr/bin", str(home), UID, homes)
        assert hints == [link_hint(missing, "node_modules", str(main / "node_modules"))], (cwd, stderr)
        assert f"--expose {main}/node_modules" in hints[0]
    # A link out to what may never be shown (a key store) gets no hint.
    (home / ".ssh/bin").mkdir()
    (home / ".ssh/bin/sshtool").write_text("")
    (home / ".ssh/bin/sshtool").chmod(0o755)
    (tree / "keys").symlink_to(home / ".ssh")
    assert exposure.exec_hints(127, "ccw: keys/bin/sshtool: No such file or directory\n", str(tree), str(tree),
                               jail_path, "", str(home), UID, homes) == []


def _fake_pyenv(home: Path) -> Path:
    """A pyenv root as its installer lays it out: bin/pyenv -> ../libexec/pyenv, shims, versions,
    plugins and a cache of downloads, with a global ``version`` file."""
    root = home / ".pyenv"
    for part in ("libexec", "bin", "shims", "plugins/pyenv-virtualenv/shims", "cache"):
        (root / part).mkdir(parents=True, exist_ok=True)
    (root / "libexec/pyenv").write_text("#!/usr/bin/env bash\n")
    (root / "bin/pyenv").symlink_to("../libexec/pyenv")
    (root / "shims/python").write_text(f'#!/usr/bin/env bash\nexec "{root}/libexec/pyenv" exec python "$@"\n')
    for version in ("3.11.7", "3.12.1", "3.12.10", "3.12.9"):
        (root / "versions" / version / "bin").mkdir(parents=True, exist_ok=True)
        (root / "versions" / version / "bin/python").write_text("")
    (root / "cache/Python-3.12.1.tar.xz").write_text("")
    (root / "version").write_text("3.11.7\n")
    return root


def test_pyenv_on_path_shows_its_shims_and_the_selected_version_not_its_whole_root(tmp_path: Path) -> None:
    home, project, homes = _fake_machine(tmp_path)
    pyenv = _fake_pyenv(home)
    path_env = f"{pyenv}/plugins/pyenv-virtualenv/shims:{pyenv}/shims:{pyenv}/bin:/usr/bin"

    def shown(env: dict[str, str] | None = None) -> set[str]:
        return {need.path for need in exposure.discover(str(project), path_env, str(home), UID, homes, env)
                if need.path.startswith(str(pyenv))}

    what_shims_run = {f"{pyenv}/bin", f"{pyenv}/shims", f"{pyenv}/libexec", f"{pyenv}/plugins/pyenv-virtualenv/shims"}
    # The global version, and the venv's interpreter (pyvenv.cfg home: 3.12.1); never ~/.pyenv itself.
    assert shown() == what_shims_run | {f"{pyenv}/versions/3.11.7", f"{pyenv}/versions/3.12.1"}
    (project / ".python-version").write_text("3.12\n")  # a prefix: its latest, as pyenv reads it
    assert shown() == what_shims_run | {f"{pyenv}/versions/3.12.10", f"{pyenv}/versions/3.12.1"}
    assert shown({"PYENV_VERSION": "3.11.7:system"}) == what_shims_run | {f"{pyenv}/versions/3.11.7",
                                                                            f"{pyenv}/versions/3.12.1"}
    reasons = {need.path: need.reason for need in exposure.discover(str(project), path_env, str(home), UID, homes)}
    assert reasons[f"{pyenv}/versions/3.12.10"] == "pyenv version 3.12.10 (.python-version)"
    assert reasons[f"{pyenv}/libexec"] == f"pyenv's libexec (PATH entry {pyenv}/plugins/pyenv-virtualenv/shims)"


def test_the_directory_ccw_runs_from_is_not_shown_unless_asked(tmp_path: Path) -> None:
    home, project, homes = _fake_machine(tmp_path)
    own = os.path.realpath(sys.prefix)  # ccw's venv: the caller's PATH holds its bin to run ccw
    path_env = f"{own}/bin:{home}/.cargo/bin:/usr/bin"
    found = {need.path for need in exposure.discover(str(project), path_env, str(home), UID, homes)}
    assert f"{home}/.cargo/bin" in found and not any(path.startswith(own) for path in found), found
    assert [need.path for need in exposure.asked([own], UID, homes)] == [own]  # asked for by name, it is shown
