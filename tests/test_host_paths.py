"""Host paths a caller names (mcp_server/core/hostpaths.py): ``ccw`` (cli/capsule.py) makes
them absolute and refuses one whose real name is not UTF-8 by name, with the way out, in
capsule_create's words (tests/test_capsule_create.py), before a helper is started;
replay's workspace and witness path hold to the same rules over MCP."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from mcp_server.capsules.replay import _live_dir
from mcp_server.capsules.witness import locate
from mcp_server.cli import parse_args
from mcp_server.cli.capsule import tool_call
from mcp_server.core import hostpaths
from sandbox.errors import CcwError
from tests.support.cli_process import CCW, ROOT, ccw, cli_env


def _not_utf8(tmp_path: Path) -> str:
    """A directory whose name holds the byte 0xff, as Python names it (surrogateescape)."""
    made = os.fsencode(tmp_path) + b"/w\xff"
    os.mkdir(made)
    return os.fsdecode(made)


def test_the_command_makes_paths_absolute_and_refuses_what_the_front_end_would(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    name, call, _ = tool_call(parse_args(["capsule", "create", ".", "--base", "b", "--expose", "t"]))
    assert name == "capsule_create"
    assert (call["workspace"], call["base"], call["expose"]) == (str(tmp_path), f"{tmp_path}/b", [f"{tmp_path}/t"])
    bad = _not_utf8(tmp_path)
    with pytest.raises(CcwError) as served:  # what capsule_create answers (tests/test_capsule_create.py)
        hostpaths.utf8(bad, "workspace")
    for argv in (["capsule", "create", bad], ["capsule", "create", "w\udcff"]):
        with pytest.raises(CcwError) as refused:
            tool_call(parse_args(argv))
        assert (refused.value.code, refused.value.message, refused.value.details) == (
            served.value.code, served.value.message, served.value.details)
    with pytest.raises(CcwError) as replayed:
        tool_call(parse_args(["capsule", "replay", "wit_x", "--workspace", bad]))
    assert replayed.value.details == {"argument": "workspace", "path": f"{tmp_path}/w\\xff"}


def test_ccw_says_so_before_starting_a_helper(tmp_path: Path) -> None:
    bad = _not_utf8(tmp_path)
    state = tmp_path / "state"
    try:
        done = subprocess.run([*CCW, "capsule", "create", bad], capture_output=True, env=cli_env(state), cwd=ROOT,
                              timeout=60)
        assert done.returncode == 1, done.stderr
        assert done.stderr.decode().startswith(f"ccw: INVALID_ARGUMENT: workspace '{tmp_path}/w\\xff' is not UTF-8")
        assert not state.exists()  # no helper, no front end started for a call that cannot succeed
    finally:
        if state.exists():  # one started after all: stopped, not left running
            ccw(state, "helper", "stop", check=False)


def test_replay_holds_its_workspace_and_witness_path_to_the_same_rules(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(CcwError) as refused:
        _live_dir(_not_utf8(tmp_path))
    assert refused.value.details == {"argument": "workspace", "path": f"{tmp_path}/w\\xff"}
    with pytest.raises(CcwError) as relative_dir:
        _live_dir("w\udcff")  # as capsule_create answers a relative workspace
    assert relative_dir.value.details == {"argument": "workspace", "path": "w\\xff"}
    (tmp_path / "w.tar.zst").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CcwError) as relative:
        locate(None, None, "w.tar.zst")  # type: ignore[arg-type]  # a path needs no state
    assert relative.value.code == "INVALID_ARGUMENT" and relative.value.details["argument"] == "path"
    assert locate(None, None, str(tmp_path / "w.tar.zst")) == (tmp_path / "w.tar.zst", None)  # type: ignore[arg-type]


def test_shown_writes_each_byte_that_is_not_utf8_and_keeps_the_rest() -> None:
    assert hostpaths.shown("/a/é/w\udcff\udcfe") == "/a/é/w\\xff\\xfe"
    assert hostpaths.shown("/a/\ud800") == "/a/\\ud800"  # a JSON escape that stands for no byte
    assert hostpaths.is_utf8("/a/é") and not hostpaths.is_utf8("/a/\udcff")
    assert hostpaths.absolute("/a", "x") == hostpaths.utf8("/a", "x") == "/a"
