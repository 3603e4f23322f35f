"""Substrate core: paths, fingerprints, snapshot ids, blob store, leases, fsview."""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_server.core import paths as P
from mcp_server.core.blobid import blob_id_of
from mcp_server.core.fingerprint import Fingerprint
from mcp_server.core.manifest import Entry, manifest_bytes, snapshot_id
from mcp_server.fs.blobstore import BlobStore
from mcp_server.fs.fingerprint import compute
from mcp_server.fs.leases import LeaseStore
from mcp_server.fs.snapshot import SnapshotStore
from mcp_server.fs.view import RootView
from mcp_server.state import State
from sandbox.errors import CcwError


def git(repo: Path, *args: str) -> bytes:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@e", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@e",
               GIT_CONFIG_GLOBAL="/dev/null", GIT_CONFIG_SYSTEM="/dev/null")
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env).stdout


def make_repo(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q")
    (root / "src").mkdir()
    (root / "src" / "a.py").write_text("print('a')\n")
    (root / "README").write_text("hello\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "init")
    return root


# --- paths ---------------------------------------------------------------------------

segments = st.sampled_from(["a", "b", "src", ".", "..", "", "~", "~x", "x~", "é", "a b", "\\"])
raw_paths = (st.lists(segments, max_size=6).map("/".join)
             | st.lists(segments, max_size=4).map(lambda s: "/" + "/".join(s)))


def reference_normalize(path: str) -> str | str:
    """A model of §1.2 built on posixpath: 'DENIED' or the normal form."""
    if path.startswith("/"):
        return "DENIED"
    comps = path.split("/")
    if ".." in comps or any(c.startswith("~") for c in comps):
        return "DENIED"
    norm = posixpath.normpath(path) if path else "."
    return norm


@given(raw_paths)
def test_paths_match_the_reference_model(path: str) -> None:
    expected = reference_normalize(path)
    try:
        got = P.normalize(path)
    except CcwError as exc:
        assert exc.code == "PERMISSION_DENIED"
        got = "DENIED"
    assert got == expected
    if got != "DENIED":
        assert P.normalize(got) == got


@given(st.lists(st.text(alphabet="ab/é_Z-.", min_size=1), max_size=8))
def test_sort_paths_is_byte_order(items: list[str]) -> None:
    assert P.sort_paths(items) == sorted(set(items), key=lambda s: s.encode())


def test_path_rules() -> None:
    assert P.normalize("src/") == P.normalize("src") == P.normalize("./src//") == "src"
    assert P.normalize(".") == P.normalize("") == "."
    assert P.normalize("foo~") == "foo~"
    for bad in ("../x", "a/../b", "/etc/passwd", "~/x", "~root"):
        with pytest.raises(CcwError) as info:
            P.normalize(bad)
        assert info.value.code == "PERMISSION_DENIED"
    with pytest.raises(CcwError) as info:
        P.normalize("a\x00b")
    assert info.value.code == "INVALID_ARGUMENT"
    assert P.parents("a/b/c") == ["a", "a/b"]


# --- fingerprint ---------------------------------------------------------------------


def tree_digest(path: Path) -> dict[str, str]:
    out = {}
    for p in sorted(path.rglob("*")):
        if p.is_file():
            out[str(p.relative_to(path))] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[str(p.relative_to(path))] = "dir"
    return out


def test_fingerprint_matches_git_and_writes_nothing(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    (repo / "src" / "a.py").write_text("changed\n")
    (repo / "new.txt").write_text("staged\n")
    git(repo, "add", "new.txt")
    (repo / "untracked").write_text("u\n")
    # Make the index stat info stale, so a refreshing git would rewrite it.
    os.utime(repo / "README", (1, 1))
    before = tree_digest(repo / ".git")
    fp = compute(str(repo))
    assert tree_digest(repo / ".git") == before
    assert fp.head_oid == git(repo, "rev-parse", "HEAD").decode().strip()
    copy = tmp_path / "copy"
    shutil.copytree(repo, copy, symlinks=True)
    assert fp.index_oid == git(copy, "write-tree").decode().strip()
    status = git(repo, "--no-optional-locks", "status", "--porcelain=v1", "-z")
    assert b"untracked" in status
    assert fp.status_hash == hashlib.sha256(status).hexdigest()
    assert tree_digest(repo / ".git") == before


def test_fingerprint_unborn_and_unmerged(tmp_path: Path) -> None:
    repo = tmp_path / "unborn"
    repo.mkdir()
    git(repo, "init", "-q")
    fp = compute(str(repo))
    assert fp.head_oid == ""
    assert fp.index_oid == "4b825dc642cb6eb9a060e54bf8d69288fbee4904"  # the empty tree
    conflict = make_repo(tmp_path / "conflict")
    git(conflict, "checkout", "-qb", "other")
    (conflict / "README").write_text("other\n")
    git(conflict, "commit", "-qam", "other")
    git(conflict, "checkout", "-q", "-")
    (conflict / "README").write_text("mine\n")
    git(conflict, "commit", "-qam", "mine")
    subprocess.run(["git", "-C", str(conflict), "merge", "-q", "other"], capture_output=True, check=False)
    fp = compute(str(conflict))
    assert fp.index_oid == "" and fp.head_oid != ""


def test_not_a_repository_is_invalid(tmp_path: Path) -> None:
    with pytest.raises(CcwError) as info:
        compute(str(tmp_path))
    assert info.value.code == "INVALID_ARGUMENT"


# --- snapshot ids and the blob store --------------------------------------------------


def test_snapshot_id_follows_the_spec_formula(tmp_path: Path) -> None:
    fp = {"head_oid": "a" * 40, "index_oid": "b" * 40, "status_hash": "c" * 64}
    files = {"src/b.ts": b"B", "src/a.ts": b"A", "Z": b"z"}
    blobs = {p: "sha256:" + hashlib.sha256(d).hexdigest() for p, d in files.items()}
    manual = json.dumps(
        {"entries": [{"blob": blobs[p], "path": p} for p in sorted(files)]}, separators=(",", ":")
    ).encode()
    assert manifest_bytes(blobs) == manual
    fp_json = json.dumps(fp, sort_keys=True, separators=(",", ":")).encode()
    expected = "sha256:" + hashlib.sha256(fp_json + b"\n" + manual).hexdigest()
    assert snapshot_id(fp, manual) == expected
    state = State(tmp_path / "state")
    store = SnapshotStore(state)
    snap = store.save(fp, [Entry(p, blobs[p], 1) for p in files])
    assert snap.snapshot_id == expected
    assert [e.path for e in store.load(expected).entries] == ["Z", "src/a.ts", "src/b.ts"]
    state.close()


def test_blob_store_round_trip_and_gc(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "objects")
    keep = store.put(b"keep me")
    drop = store.put(b"drop me")
    assert keep == blob_id_of(b"keep me") and store.get(keep, verify=True) == b"keep me"
    assert store.put(b"keep me") == keep
    assert not os.access(store.path(keep), os.W_OK) or os.geteuid() == 0
    assert store.gc({keep}, grace_seconds=3600) == []  # too young
    assert store.gc({keep}, grace_seconds=-1) == [drop]
    assert store.has(keep) and not store.has(drop)
    with pytest.raises(CcwError) as info:
        store.get(drop)
    assert info.value.code == "NOT_FOUND"
    os.chmod(store.path(keep), 0o644)
    store.path(keep).write_bytes(store.path(keep).read_bytes()[:-3])
    with pytest.raises(CcwError) as info:
        store.get(keep)
    assert info.value.code == "INTERNAL"


# --- leases --------------------------------------------------------------------------


def test_leases_validate_go_stale_persist_and_expire(tmp_path: Path) -> None:
    now = [1000.0]
    state = State(tmp_path / "state")
    store = LeaseStore(state, ttl=60, clock=lambda: now[0])
    fp1 = Fingerprint("a" * 40, "b" * 40, "c" * 64)
    fp2 = Fingerprint("a" * 40, "b" * 40, "d" * 64)
    lease = store.issue("worktree:/r", fp1)
    store.touch(lease.lease_id, ["b", "a", "a"])
    assert store.validate(lease.lease_id, "worktree:/r", fp1).fingerprint == fp1
    with pytest.raises(CcwError) as info:
        store.validate(lease.lease_id, "worktree:/r", fp2)
    assert info.value.code == "STALE_LEASE"
    assert info.value.details["fingerprint"] == fp2.to_dict()
    with pytest.raises(CcwError) as info:
        store.validate(lease.lease_id, "worktree:/other", fp1)
    assert info.value.code == "INVALID_ARGUMENT"
    state.close()
    state = State(tmp_path / "state")
    again = LeaseStore(state, ttl=60, clock=lambda: now[0])
    assert again.touched(lease.lease_id) == ["a", "b"]
    now[0] += 61
    with pytest.raises(CcwError) as info:
        again.validate(lease.lease_id, "worktree:/r", fp1)
    assert info.value.code == "NOT_FOUND"
    assert again.expire() == 1
    state.close()


# --- fsview --------------------------------------------------------------------------


def test_rootview_refuses_escapes_and_a_swapped_symlink(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "d").mkdir(parents=True)
    outside.mkdir()
    (outside / "f").write_text("secret")
    (root / "d" / "f").write_text("inside")
    (root / "link_in").symlink_to("d")
    (root / "link_out").symlink_to(outside)
    with RootView.open(str(root)) as view:
        assert view.read_bytes("d/f") == b"inside"
        assert view.read_bytes("link_in/f") == b"inside"  # stays beneath: fine to read
        view.write_bytes("d/f", b"first")
        # Swap d for a symlink pointing outside between two calls.
        shutil.rmtree(root / "d")
        (root / "d").symlink_to(outside)
        for action in (
            lambda: view.read_bytes("d/f"),
            lambda: view.write_bytes("d/f", b"second"),
            lambda: view.unlink("d/f"),
            lambda: view.read_bytes("link_out/f"),
            lambda: view.read_bytes("../outside/f"),
            lambda: view.read_bytes("/etc/hostname"),
            lambda: view.write_bytes("link_in/g", b"x"),
            lambda: view.makedirs("d/sub"),
        ):
            with pytest.raises(CcwError) as info:
                action()
            assert info.value.code == "PERMISSION_DENIED"
        assert (outside / "f").read_text() == "secret"
        assert sorted(os.listdir(outside)) == ["f"]
        assert view.listdir("") == [("d", "symlink"), ("link_in", "symlink"), ("link_out", "symlink")]
