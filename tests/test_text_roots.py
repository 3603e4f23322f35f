"""MCP roots: whole-component containment, symlinks resolved, relative paths."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mcp_server.core.roots import Located, is_within, locate_lexical
from mcp_server.fs.roots import locate
from sandbox.errors import CcwError


def test_prefix_is_not_containment() -> None:
    assert is_within("/a/allowed", "/a/allowed")
    assert is_within("/a/allowed/x/y", "/a/allowed")
    assert not is_within("/a/allowed_evil", "/a/allowed")
    assert not is_within("/a/allowed_evil/x", "/a/allowed")
    assert not is_within("/a", "/a/allowed")
    assert is_within("/anything", "/")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "allowed" / "src").mkdir(parents=True)
    (tmp_path / "allowed_evil").mkdir()
    (tmp_path / "allowed" / "src" / "a.py").write_text("x\n")
    (tmp_path / "allowed_evil" / "secret").write_text("s\n")
    os.symlink(tmp_path / "allowed_evil", tmp_path / "allowed" / "escape")
    os.symlink("src", tmp_path / "allowed" / "inner")
    return tmp_path


def test_roots_prefix_case_rejected(tree: Path) -> None:
    root = str(tree / "allowed")
    with pytest.raises(CcwError) as info:
        locate(str(tree / "allowed_evil" / "secret"), [root], "")
    assert info.value.code == "PERMISSION_DENIED"
    assert "outside the allowed roots" in info.value.message


def test_symlink_out_of_root_rejected(tree: Path) -> None:
    with pytest.raises(CcwError) as info:
        locate(str(tree / "allowed" / "escape" / "secret"), [str(tree / "allowed")], "")
    assert info.value.details["resolved"] == str((tree / "allowed_evil" / "secret").resolve())


def test_symlink_inside_root_resolved(tree: Path) -> None:
    root = str((tree / "allowed").resolve())
    assert locate(str(tree / "allowed" / "inner" / "a.py"), [root], "") == Located(root, "src/a.py")


def test_relative_paths_and_new_files(tree: Path) -> None:
    root = str((tree / "allowed").resolve())
    assert locate("src/new.py", None, root) == Located(root, "src/new.py")
    assert locate(".", None, root) == Located(root, "")
    with pytest.raises(CcwError):
        locate("../allowed_evil/secret", None, root)


def test_most_specific_root_wins_and_file_uris(tree: Path) -> None:
    outer = str(tree.resolve())
    inner = str((tree / "allowed").resolve())
    assert locate(f"{inner}/src/a.py", [f"file://{outer}", inner], "").root == inner


def test_lexical_locate_for_capsules() -> None:
    assert locate_lexical("/w/src/../a.py", "/w") == Located("/w", "a.py")
    assert locate_lexical("a.py", "/w") == Located("/w", "a.py")
    with pytest.raises(CcwError):
        locate_lexical("/w_evil/a.py", "/w")
    with pytest.raises(CcwError):
        locate_lexical("../x", "/w")


def test_declared_but_empty_roots_allow_nothing(tree: Path) -> None:
    with pytest.raises(CcwError) as info:
        locate(str(tree / "allowed" / "src" / "a.py"), [], str(tree / "allowed"))
    assert info.value.code == "PERMISSION_DENIED" and "add the project directory" in info.value.message
