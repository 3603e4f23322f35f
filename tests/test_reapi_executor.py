"""The reapi executor's pieces that need no cluster: the trial's tree, settings, flags (issue 17)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from mcp_server.bot.runner import _signalled
from mcp_server.capsules.executors import LocalExecutor, executor_for
from mcp_server.capsules.remote import (
    ReapiExecutor,
    _digested_base,
    _relative,
    overlay,
    platform_from,
)
from mcp_server.capsules.trials import Unit
from mcp_server.cli import parse_args, serve_env
from mcp_server.config import Config
from mcp_server.reapi.inputs import BlobCache, InputRoots, fetch_input_root
from mcp_server.reapi.merkle import (
    DirEntry,
    Entry,
    FileEntry,
    SymlinkEntry,
    build_tree,
    digest_bytes,
    tree_of_directory,
)
from mcp_server.reapi.worker import parse_properties
from sandbox.errors import CcwError
from tests.support.memory_cas import MemoryCas


def _base(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "pkg" / "sub").mkdir(parents=True)
    (ws / "pkg" / "a.py").write_text("A = 1\n")
    (ws / "pkg" / "sub" / "b.py").write_text("B = 1\n")
    (ws / "run.sh").write_text("#!/bin/sh\n")
    (ws / "only").mkdir()
    (ws / "only" / "gone.txt").write_text("x\n")
    return ws


def test_overlay_lays_units_over_the_base(tmp_path: Path) -> None:
    base = _digested_base(str(_base(tmp_path)))
    files = {
        "pkg/a.py": Unit("pkg/a.py", "write", mode=0o644, content=b"A = 2\n"),
        "new/dir/c.py": Unit("new/dir/c.py", "write", mode=0o755, content=b"C\n"),
        "pkg/sub": Unit("pkg/sub", "delete"),
        "only/gone.txt": Unit("only/gone.txt", "delete"),
        "run.sh": Unit("run.sh", "chmod", mode=0o755),
        "link": Unit("link", "symlink", target="pkg/a.py"),
    }
    entries = overlay(base, files)
    assert entries["pkg/a.py"] == FileEntry(data=b"A = 2\n", executable=False)
    assert entries["new/dir/c.py"] == FileEntry(data=b"C\n", executable=True)
    assert "pkg/sub/b.py" not in entries
    assert entries["only"] == DirEntry()  # emptied, kept (as a capsule keeps it)
    run = entries["run.sh"]
    assert isinstance(run, FileEntry) and run.executable and run.digest == digest_bytes(b"#!/bin/sh\n")
    assert entries["link"] == SymlinkEntry("pkg/a.py")
    assert base["pkg/a.py"] != entries["pkg/a.py"]  # the base is not changed


def test_empty_overlay_is_the_directory_tree(tmp_path: Path) -> None:
    ws = _base(tmp_path)
    assert build_tree(overlay(_digested_base(str(ws)), {})).root == tree_of_directory(ws).root


def test_writing_into_an_emptied_directory_drops_its_empty_marker(tmp_path: Path) -> None:
    base = _digested_base(str(_base(tmp_path)))
    entries = overlay(base, {"only/gone.txt": Unit("only/gone.txt", "delete"),
                             "only/new.txt": Unit("only/new.txt", "write", mode=0o644, content=b"n\n")})
    assert "only" not in entries and "only/new.txt" in entries


def test_platform_and_properties() -> None:
    assert platform_from("") == {"OSFamily": "linux"}
    assert platform_from("OSFamily=linux, pool=big") == {"OSFamily": "linux", "pool": "big"}
    with pytest.raises(CcwError):
        platform_from("nonsense")
    assert parse_properties(["pool=big"]) == {"OSFamily": "linux", "pool": "big"}
    with pytest.raises(CcwError):
        parse_properties(["=x"])


def test_relative_cwd_and_signal_status() -> None:
    assert _relative("/w/ws", "/w/ws") == ""
    assert _relative("/w/ws/.hidden/x", "/w/ws") == ".hidden/x"
    assert _signalled("SIGKILL") == 137 and _signalled(None) == 128


def test_settings_choose_the_executor() -> None:
    config = Config.from_env({"CCW_REAPI_URL": "grpc://127.0.0.1:1", "CCW_REAPI_PARALLEL": "8"})
    assert config.reapi_url == "grpc://127.0.0.1:1" and config.reapi_parallel == 8
    with pytest.raises(CcwError):
        Config.from_env({"CCW_REAPI_PARALLEL": "0"})
    assert isinstance(executor_for(""), LocalExecutor)
    assert config.reapi_platform == "OSFamily=linux"
    remote = executor_for("grpc://127.0.0.1:1", 8, "pool=big")  # a channel connects lazily: no traffic here
    try:
        assert remote.name == "reapi" and remote.parallelism == 8 and remote.summary()["executed"] == 0
        assert isinstance(remote, ReapiExecutor) and remote.platform == {"pool": "big"}
    finally:
        remote.close()
    assert serve_env(parse_args(["serve", "--reapi", "grpc://127.0.0.1:9"]))["CCW_REAPI_URL"] == "grpc://127.0.0.1:9"


def test_fetch_through_the_cache_links_files_and_reads_each_blob_once(tmp_path: Path) -> None:
    ws = _base(tmp_path)
    (ws / "run.sh").chmod(0o755)
    (ws / "same.txt").write_text("A = 1\n")  # the bytes of pkg/a.py: one blob
    tree = tree_of_directory(ws)
    cas = MemoryCas(tree.blobs)
    cache = BlobCache(tmp_path / "cas")
    first, second = tmp_path / "lease1", tmp_path / "lease2"
    first.mkdir()
    second.mkdir()
    assert fetch_input_root(cas, tree.root, first, cache) == 5  # type: ignore[arg-type]
    assert len(cas.read) == 4  # distinct file contents
    assert fetch_input_root(cas, tree.root, second, cache) == 5  # type: ignore[arg-type]
    assert len(cas.read) == 4  # nothing read again
    assert tree_of_directory(second).root == tree.root
    assert os.stat(second / "pkg" / "a.py").st_ino == os.stat(first / "same.txt").st_ino
    assert os.stat(second / "run.sh").st_mode & 0o777 == 0o755
    assert (second / "only").is_dir()
    plain = tmp_path / "plain"
    plain.mkdir()
    fetch_input_root(cas, tree.root, plain)  # type: ignore[arg-type]
    assert tree_of_directory(plain).root == tree.root and os.stat(plain / "pkg" / "a.py").st_nlink == 1


def _entries_of(root: Path) -> dict[str, Any]:
    """What a laid-out tree holds: kind and bytes or target, the executable bit, empty directories."""
    seen: dict[str, Any] = {}
    for path in sorted(root.rglob("*")):
        where = str(path.relative_to(root))
        if path.is_symlink():
            seen[where] = ("link", os.readlink(path))
        elif path.is_file():
            seen[where] = ("file", path.read_bytes(), bool(path.stat().st_mode & 0o100))
        elif not any(path.iterdir()):
            seen[where] = ("empty dir",)
    return seen


def test_a_kept_input_root_is_synced_to_the_next_tree(tmp_path: Path) -> None:
    """Every kind of difference (edited, new, gone, x bit, symlink retargeted, a name changing
    kind, subtrees gone and new): the synced root holds exactly the new tree, reads only the
    new blobs, and keeps the unchanged files' links."""
    first: dict[str, Entry] = {
        "keep/a.py": FileEntry(data=b"A = 1\n"), "keep/deep/b.py": FileEntry(data=b"B = 1\n"),
        "edit.txt": FileEntry(data=b"old\n"), "gone.txt": FileEntry(data=b"gone\n"),
        "run.sh": FileEntry(data=b"#!/bin/sh\n"), "link": SymlinkEntry("edit.txt"),
        "becomes_dir": FileEntry(data=b"file\n"), "becomes_file/x": FileEntry(data=b"x\n"),
        "old_tree/sub/c.txt": FileEntry(data=b"c\n"), "empty": DirEntry(),
    }
    second: dict[str, Entry] = {
        "keep/a.py": FileEntry(data=b"A = 1\n"), "keep/deep/b.py": FileEntry(data=b"B = 2\n"),
        "edit.txt": FileEntry(data=b"new\n"), "new.txt": FileEntry(data=b"gone\n"),
        "run.sh": FileEntry(data=b"#!/bin/sh\n", executable=True), "link": SymlinkEntry("new.txt"),
        "becomes_dir/inside": FileEntry(data=b"inside\n"), "becomes_file": FileEntry(data=b"now a file\n"),
        "new_tree/sub/empty": DirEntry(), "empty": DirEntry(),
    }
    trees = [build_tree(first), build_tree(second)]
    cas = MemoryCas({k: v for tree in trees for k, v in tree.blobs.items()})
    roots = InputRoots(tmp_path / "roots", BlobCache(tmp_path / "cas"), keep=1)
    with roots.checkout(cas, trees[0].root) as laid:  # type: ignore[arg-type]
        assert tree_of_directory(laid).root == trees[0].root
        kept_inode = os.stat(laid / "keep" / "a.py").st_ino
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    fetch_input_root(cas, trees[1].root, fresh)  # type: ignore[arg-type]
    reads = len(cas.read)
    with roots.checkout(cas, trees[1].root) as synced:  # type: ignore[arg-type]
        # new contents: b.py, edit.txt, inside, becomes_file; run.sh's bytes, new as executable
        assert len(cas.read) - reads == 5
        assert synced == laid and roots.reused == 1
        assert tree_of_directory(synced).root == trees[1].root
        assert _entries_of(synced) == _entries_of(fresh)
        assert os.stat(synced / "keep" / "a.py").st_ino == kept_inode
    # back to the first tree, through the same root
    with roots.checkout(cas, trees[0].root) as again:  # type: ignore[arg-type]
        assert tree_of_directory(again).root == trees[0].root and roots.reused == 2


def test_input_roots_are_not_shared_and_a_failed_lease_is_not_kept(tmp_path: Path) -> None:
    tree = build_tree({"a.txt": FileEntry(data=b"a\n")})
    cas = MemoryCas(tree.blobs)
    roots = InputRoots(tmp_path / "roots", BlobCache(tmp_path / "cas"), keep=2)
    with roots.checkout(cas, tree.root) as one, roots.checkout(cas, tree.root) as two:  # type: ignore[arg-type]
        assert one != two and roots.reused == 0
    with roots.checkout(cas, tree.root) as three:  # type: ignore[arg-type]
        assert three in (one, two) and roots.reused == 1
    with pytest.raises(RuntimeError), roots.checkout(cas, tree.root) as failed:  # type: ignore[arg-type]
        raise RuntimeError("the lease failed")
    assert not failed.exists()
    assert sorted(p.name for p in (tmp_path / "roots").iterdir()) == sorted({one.name, two.name} - {failed.name})
    # a bot that restarts starts from no kept roots
    InputRoots(tmp_path / "roots", BlobCache(tmp_path / "cas"))
    assert list((tmp_path / "roots").iterdir()) == []


def test_the_cache_evicts_the_least_recently_used_files_but_never_under_a_lease(tmp_path: Path) -> None:
    from mcp_server.reapi.merkle import digest_bytes

    blobs = [bytes([i]) * 1000 for i in range(6)]
    digests = [digest_bytes(b) for b in blobs]
    cache = BlobCache(tmp_path / "cas", max_bytes=3500)
    leases = [tmp_path / f"lease{i}" for i in range(6)]
    with cache.lease():
        for i in range(4):
            cache.store(digests[i], False, blobs[i])
        assert cache.size == 4000  # over the cap, but a lease is laying out: nothing goes
    # past the cap once the lease is done: the oldest go, down to 90% of it
    assert not cache.has(digests[0], False) and cache.has(digests[1], False) and cache.size == 3000
    with cache.lease():
        leases[2].mkdir()
        cache.link(digests[2], False, leases[2] / "f")  # used: now the most recent
        cache.store(digests[4], False, blobs[4])
        cache.store(digests[5], False, blobs[5])
    assert [cache.has(d, False) for d in digests] == [False, False, True, False, True, True]
    assert cache.evicted == 3
    assert (leases[2] / "f").read_bytes() == blobs[2]
    # a bot that restarts finds what is on disk; a half-written file is cleared
    (tmp_path / "cas" / ".part-x").write_bytes(b"half")
    again = BlobCache(tmp_path / "cas", max_bytes=3500)
    assert again.size == cache.size and not (tmp_path / "cas" / ".part-x").exists()


def test_a_remote_replay_is_admitted_here_before_anything_is_sent(tmp_path: Path) -> None:
    import trio

    from mcp_server.capsules.replay import ReplayOptions
    from mcp_server.core.netrules import parse_network
    from mcp_server.state import State
    from tests.support import witness_craft as craft

    entry, blobs = craft.exec_entry(1, ["true"])
    unsigned = craft.write(tmp_path / "unsigned.tar.zst", craft.manifest("/w", [entry]), blobs)
    blobless = craft.write(tmp_path / "blobless.tar.zst", craft.manifest("/w", [entry], include_blobs=False), blobs)
    beside = {**entry, "services": [{"name": "web", "argv": ["python3", "server.py"], "ready": {"port": 8765}}]}
    with_services = craft.write(tmp_path / "services.tar.zst", craft.manifest("/w", [beside]), blobs)
    state = State(tmp_path / "state")
    service: Any = type("Service", (), {"state": state})()
    remote = ReapiExecutor("grpc://127.0.0.1:1")  # a channel connects lazily: nothing reaches it here
    cases = [
        (unsigned, ReplayOptions(), "PERMISSION_DENIED"),  # this state dir's trust decides, not the bot's
        (unsigned, ReplayOptions(allow_untrusted=True, network=parse_network(["pypi.org:443"])), "UNSUPPORTED"),
        (blobless, ReplayOptions(allow_untrusted=True, workspace=str(tmp_path)), "UNSUPPORTED"),
        (with_services, ReplayOptions(allow_untrusted=True), "UNSUPPORTED"),  # a bot cannot start them
    ]
    try:
        for path, options, code in cases:
            with pytest.raises(CcwError) as refused:
                trio.run(remote.replay, service, path, None, options)
            assert refused.value.code == code, (path, options, refused.value)
        assert remote.summary()["executed"] == 0 and remote.uploaded_blobs == 0
    finally:
        remote.close()
        state.close()


@pytest.mark.parametrize("named", ["../../escaped", "/tmp/escaped", "ab/../../escaped", "A" * 64, ""])
def test_a_file_digest_that_is_no_sha256_is_refused_before_the_cache_names_a_file(
        tmp_path: Path, named: str) -> None:
    # A REAPI client's Directory names its files' digests; an empty blob is never read from the
    # CAS (client.read_blob), so nothing there checks its hash, which the cache makes a file name.
    from mcp_server.reapi.protos import re_pb2

    named = named.replace("/tmp", str(tmp_path))  # an absolute path, in this test's own directory
    hostile = re_pb2.Digest(hash=named, size_bytes=0)
    listing = re_pb2.Directory(files=[re_pb2.FileNode(name="a.txt", digest=hostile)])
    blob = listing.SerializeToString(deterministic=True)
    root = digest_bytes(blob)
    cas = MemoryCas({(root.hash, root.size_bytes): blob, (named, 0): b""})
    (tmp_path / "cache" / "cas").mkdir(parents=True)
    lease = tmp_path / "lease"
    lease.mkdir()
    with pytest.raises(CcwError) as refused:
        fetch_input_root(cas, root, lease, BlobCache(tmp_path / "cache" / "cas"))  # type: ignore[arg-type]
    assert refused.value.code == "INVALID_ARGUMENT" and "not a SHA-256 digest" in refused.value.message
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["cache", "cas", "lease"] and cas.read == []
