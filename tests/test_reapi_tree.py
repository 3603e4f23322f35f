"""REAPI input trees, Actions, URLs and the cluster's pure parts, without a server."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest

from mcp_server.devcluster.cluster import bgd_config, find_server_python
from mcp_server.reapi.action import CommandSpec, build_action
from mcp_server.reapi.client import parse_url
from mcp_server.reapi.merkle import (
    DirEntry,
    FileEntry,
    SymlinkEntry,
    build_tree,
    digest_bytes,
    key,
    tree_of_directory,
)
from mcp_server.reapi.protos import re_pb2
from sandbox.errors import CcwError


def _directory(tree_blobs: dict[tuple[str, int], bytes | Path], digest: re_pb2.Digest) -> re_pb2.Directory:
    data = tree_blobs[key(digest)]
    assert isinstance(data, bytes)
    return re_pb2.Directory.FromString(data)


def test_digest_is_sha256_and_size() -> None:
    digest = digest_bytes(b"hello")
    assert digest.hash == hashlib.sha256(b"hello").hexdigest() and digest.size_bytes == 5


def test_tree_is_canonical_and_shares_subtrees() -> None:
    tree = build_tree({
        "b.txt": FileEntry(data=b"B"), "a.txt": FileEntry(data=b"A", executable=True),
        "sub/x": FileEntry(data=b"X"), "other/x": FileEntry(data=b"X"),
        "link": SymlinkEntry("a.txt"), "empty": DirEntry(),
    })  # fmt: skip
    root = _directory(tree.blobs, tree.root)
    assert [f.name for f in root.files] == ["a.txt", "b.txt"]
    assert root.files[0].is_executable and not root.files[1].is_executable
    assert [d.name for d in root.directories] == ["empty", "other", "sub"]
    assert [(s.name, s.target) for s in root.symlinks] == [("link", "a.txt")]
    other, sub = root.directories[1].digest, root.directories[2].digest
    assert other == sub  # same contents, one blob
    assert root.directories[0].digest == digest_bytes(b"")
    assert tree.blobs[key(tree.root)] == root.SerializeToString(deterministic=True)


def test_order_of_entries_does_not_change_the_root() -> None:
    entries = {f"d{i % 3}/f{i}": FileEntry(data=str(i).encode()) for i in range(30)}
    reversed_entries = dict(reversed(list(entries.items())))
    assert build_tree(entries).root == build_tree(reversed_entries).root


def test_one_changed_file_changes_its_path_only() -> None:
    base = {"a/b/c.txt": FileEntry(data=b"1"), "z/y.txt": FileEntry(data=b"2")}
    before = build_tree(base)
    after = build_tree({**base, "a/b/c.txt": FileEntry(data=b"changed")})
    new = set(after.blobs) - set(before.blobs)
    assert len(new) == 4  # the file, b, a and the root
    z_dir = [d for d in _directory(after.blobs, after.root).directories if d.name == "z"]
    assert key(z_dir[0].digest) in before.blobs


def test_directory_scan_matches_entries(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("x = 1\n")
    (tmp_path / "tool").write_text("#!/bin/sh\n")
    (tmp_path / "tool").chmod(0o755)
    (tmp_path / "empty").mkdir()
    (tmp_path / "to_pkg").symlink_to("pkg")
    scanned = tree_of_directory(tmp_path)
    expected = build_tree({
        "pkg/m.py": FileEntry(data=b"x = 1\n"), "tool": FileEntry(data=b"#!/bin/sh\n", executable=True),
        "empty": DirEntry(), "to_pkg": SymlinkEntry("pkg"),
    })  # fmt: skip
    assert scanned.root == expected.root


def test_fifo_and_bad_paths_are_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(CcwError, match="neither a file"):
        tree_of_directory(tmp_path)
    for where in ("/abs", "a/../b", "./a"):
        with pytest.raises(CcwError, match="relative and normalised"):
            build_tree({where: FileEntry(data=b"")})
    with pytest.raises(CcwError, match="both a file"):
        build_tree({"a": FileEntry(data=b""), "a/b": FileEntry(data=b"")})


def test_action_key_follows_what_runs() -> None:
    root = digest_bytes(b"root")
    spec = CommandSpec(argv=["pytest", "-q"], env={"B": "2", "A": "1"}, cwd="src",
                       platform={"OSFamily": "linux", "ISA": "x86-64"})  # fmt: skip
    built = build_action(spec, root, timeout_s=1.5)
    assert [v.name for v in built.command.environment_variables] == ["A", "B"]
    assert [p.name for p in built.action.platform.properties] == ["ISA", "OSFamily"]
    assert built.action.timeout.ToNanoseconds() == 1_500_000_000
    assert built.action.input_root_digest == root
    assert key(built.action.command_digest) in built.blobs and key(built.action_digest) in built.blobs
    same = build_action(CommandSpec(argv=["pytest", "-q"], env={"A": "1", "B": "2"}, cwd="src",
                                    platform={"ISA": "x86-64", "OSFamily": "linux"}), root, timeout_s=1.5)  # fmt: skip
    assert same.action_digest == built.action_digest
    assert build_action(spec, root, timeout_s=1.5, do_not_cache=True).action_digest != built.action_digest
    assert build_action(spec, digest_bytes(b"other"), timeout_s=1.5).action_digest != built.action_digest
    with pytest.raises(CcwError):
        build_action(CommandSpec(argv=["x"], cwd="../up"), root)


def test_parse_url() -> None:
    assert parse_url("grpc://127.0.0.1:50051") == ("127.0.0.1:50051", False, "")
    assert parse_url("grpcs://reapi.example:443/main") == ("reapi.example:443", True, "main")
    assert parse_url("localhost:1") == ("localhost:1", False, "")
    with pytest.raises(CcwError):
        parse_url("http://x:1")


def test_bgd_config_is_loopback_and_fast_polling() -> None:
    text = bgd_config(5000, "postgresql+psycopg://bgd@127.0.0.1:5432/bgd", match_keys=["ccw"])
    assert 'address: "127.0.0.1:5000"' in text
    assert "proactive-fetch-to-capacity: false" in text
    assert text.count("0.2") >= 3 and 'match-property-keys: ["ccw"]' in text


def test_no_server_python_says_how_to_get_one(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path)}
    with pytest.raises(CcwError, match=r"needs Python >= 3\.13") as raised:
        find_server_python(env)
    assert raised.value.code == "UNSUPPORTED" and "CCW_BGD_PYTHON" in str(raised.value)
    if sys.version_info < (3, 13):
        with pytest.raises(CcwError, match=r"is not a Python >= 3\.13"):
            find_server_python({**env, "CCW_BGD_PYTHON": sys.executable})
