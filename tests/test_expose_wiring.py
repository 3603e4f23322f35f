"""Exposed toolchains, the front end's part: what capsule_create puts in the spec
(capsules/exposure.plan) and what a replay of an untrusted witness may show (replayable).
The helper's re-check is tests/test_exposed.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mcp_server.capsules import exposure
from mcp_server.core.expose import Need
from sandbox.errors import CcwError
from sandbox.homes import Home

UID = 1000


def _machine(tmp_path: Path) -> tuple[Path, Path, tuple[Home, ...]]:
    """A home with a pyenv-style prefix, an nvm-style node and key stores, and a project whose
    .venv was made from the pyenv interpreter."""
    home = tmp_path / "home/ann"
    prefix = home / ".pyenv/versions/3.12.1"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin/python3").write_text("")
    (home / ".nvm/versions/node/v20.1.0/bin").mkdir(parents=True)
    (home / ".ssh").mkdir()
    (home / ".aws").mkdir()
    project = home / "proj"
    (project / ".venv/bin").mkdir(parents=True)
    (project / ".venv/pyvenv.cfg").write_text(f"home = {prefix}/bin\n")
    (project / ".venv/bin/python").symlink_to(prefix / "bin/python3")
    return home, project, (Home("ann", UID, str(home)),)


def test_plan_joins_asked_and_found_dirs_sorted_with_reasons(tmp_path: Path) -> None:
    home, project, homes = _machine(tmp_path)
    node = f"{home}/.nvm/versions/node/v20.1.0"
    env = {"PATH": f"{node}/bin:/usr/bin", "HOME": str(home)}
    needs = exposure.plan(str(project), [node], True, env, UID, homes)
    # Asked first, so its reason wins over the PATH entry's.
    assert needs == [Need(node, "asked"), Need(f"{home}/.pyenv/versions/3.12.1", "pyvenv.cfg home of .venv")]


def test_plan_without_auto_shows_only_what_was_asked(tmp_path: Path) -> None:
    home, project, homes = _machine(tmp_path)
    env = {"PATH": f"{home}/.nvm/versions/node/v20.1.0/bin", "HOME": str(home)}
    assert exposure.plan(str(project), [], False, env, UID, homes) == []


def test_plan_refuses_an_asked_secret_but_drops_a_found_one(tmp_path: Path) -> None:
    home, project, homes = _machine(tmp_path)
    env = {"PATH": f"{home}/.ssh:{home}/.aws", "HOME": str(home)}
    (project / ".venv/pyvenv.cfg").write_text(f"home = {home}/.ssh\n")  # a planted pointer
    assert [need.path for need in exposure.plan(str(project), [], True, env, UID, homes)] == [
        f"{home}/.pyenv/versions/3.12.1"]  # only the real interpreter's prefix (.venv/bin/python)
    for secret in (".ssh", ".aws"):
        with pytest.raises(CcwError) as raised:
            exposure.plan(str(project), [f"{home}/{secret}"], True, env, UID, homes)
        assert raised.value.code == "PERMISSION_DENIED"


def test_replay_shows_only_what_the_replayer_allows(tmp_path: Path) -> None:
    home, _project, homes = _machine(tmp_path)
    prefix = f"{home}/.pyenv/versions/3.12.1"
    recorded = [f"{home}/.ssh", prefix, f"{home}/.pyenv/versions/3.9.0", "/root/.gnupg"]
    used, dropped = exposure.replayable(recorded, UID, (*homes, Home("root", 0, "/root")))
    assert used == [prefix]
    assert [item["path"] for item in dropped] == [f"{home}/.ssh", f"{home}/.pyenv/versions/3.9.0", "/root/.gnupg"]
    assert "keys and credentials" in dropped[0]["reason"]
    assert dropped[1]["reason"] == "not a directory on this machine"


def test_a_foreign_witness_has_toolchains_only_at_their_managers_places(tmp_path: Path) -> None:
    # Any readable directory a stranger's witness named was shown: its commands read
    # ~/other-project/.env, and the replay's report, which the replayer shares, printed it.
    home, _project, homes = _machine(tmp_path)
    other, served = home / "other-project", tmp_path / "srv" / "app"
    for place in (other, served):
        place.mkdir(parents=True)
    prefix, node = f"{home}/.pyenv/versions/3.12.1", f"{home}/.nvm/versions/node/v20.1.0"
    recorded = [str(other), str(served), prefix, node, f"{home}/.pyenv/versions"]
    used, dropped = exposure.replayable(recorded, UID, homes)
    assert used == sorted([prefix, node]), used
    assert [item["path"] for item in dropped] == [str(other), str(served), f"{home}/.pyenv/versions"]
    assert all(item["reason"] == exposure.FOREIGN_EXPOSE for item in dropped), dropped
    # A link at a manager's place into another directory is judged where it leads too.
    (home / ".nvm/versions/node/v0.0.1").symlink_to(other)
    assert exposure.replayable([f"{home}/.nvm/versions/node/v0.0.1"], UID, homes)[0] == []
    # This state dir's own witness has what its capsule had.
    assert exposure.replayable(recorded[:4], UID, homes, foreign=False)[0] == sorted(recorded[:4])


def test_plan_guards_the_callers_home_even_when_passwd_names_another(tmp_path: Path) -> None:
    home, project, _homes = _machine(tmp_path)
    env = {"PATH": f"{home}/.ssh", "HOME": str(home)}
    (project / ".venv/pyvenv.cfg").write_text(f"home = {home}/.aws\n")
    # No login home covers it: $HOME's stores are refused all the same.
    assert [need.path for need in exposure.plan(str(project), [], True, env, UID, ())] == [
        f"{home}/.pyenv/versions/3.12.1"]
    with pytest.raises(CcwError) as raised:
        exposure.plan(str(project), [f"{home}/.ssh"], True, env, UID, ())
    assert raised.value.code == "PERMISSION_DENIED"


def test_cli_expose_flags_map_onto_the_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import jsonschema

    from mcp_server.cli import parse_args
    from mcp_server.cli.capsule import tool_call
    from mcp_server.config import TOOLSETS
    from mcp_server.tools.registry import Registry

    monkeypatch.chdir(tmp_path)
    argv = ["capsule", "create", str(tmp_path), "--expose", "tools", "--expose", "/opt/x", "--no-auto-expose"]
    name, call, _ = tool_call(parse_args(argv))
    assert call == {"workspace": str(tmp_path), "expose": [str(tmp_path / "tools"), "/opt/x"], "auto_expose": False}
    spec = Registry.load(TOOLSETS).lookup(name)
    assert spec is not None
    jsonschema.Draft202012Validator(spec.input_schema).validate(call)


def test_a_venv_naming_a_link_to_its_toolchain_exposes_the_link_too(tmp_path: Path) -> None:
    # uv's minor-version directory: the venv names the link, so patch upgrades carry over.
    home, project, homes = _machine(tmp_path)
    pythons = home / ".local/share/uv/python"
    real = pythons / "cpython-3.12.8-linux-x86_64-gnu"
    (real / "bin").mkdir(parents=True)
    (real / "bin/python3.12").write_text("")
    link = pythons / "cpython-3.12-linux-x86_64-gnu"
    link.symlink_to(real.name)
    (project / ".venv/pyvenv.cfg").write_text(f"home = {link}/bin\n")
    (project / ".venv/bin/python").unlink()
    (project / ".venv/bin/python").symlink_to(link / "bin/python3.12")
    needs = exposure.plan(str(project), [], True, {"HOME": str(home)}, UID, homes)
    assert needs == [Need(str(link), f"pyvenv.cfg home of .venv (a link to {real})"),
                     Need(str(real), "pyvenv.cfg home of .venv")]
    # A link into a key store is judged where it leads, and dropped.
    (project / ".venv/pyvenv.cfg").write_text(f"home = {pythons}/evil/bin\n")
    (pythons / "evil").symlink_to(home / ".ssh")
    (project / ".venv/bin/python").unlink()
    assert exposure.plan(str(project), [], True, {"HOME": str(home)}, UID, homes) == []
    # A replay keeps the link's path where this replayer allows it.
    assert exposure.replayable([str(link), f"{pythons}/evil"], UID, homes)[0] == [str(link)]


def test_a_bin_dirs_shebangs_are_read_again_once_it_changes(tmp_path: Path) -> None:
    bin_dir = tmp_path / "ws" / "node_modules" / ".bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "tape").write_text("#!/opt/node-a/bin/node\n")
    st = os.stat(bin_dir)
    first = exposure._shebangs(str(bin_dir), (st.st_dev, st.st_ino, st.st_mtime_ns))
    assert first == (("tape", "/opt/node-a/bin/node"),)
    (bin_dir / "tape.new").write_text("#!/opt/node-b/bin/node\n")
    os.rename(bin_dir / "tape.new", bin_dir / "tape")  # as npm replaces a script
    os.utime(bin_dir, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # coarse clocks: a new mtime for sure
    st = os.stat(bin_dir)
    assert (exposure._shebangs(str(bin_dir), (st.st_dev, st.st_ino, st.st_mtime_ns))
            == (("tape", "/opt/node-b/bin/node"),))
