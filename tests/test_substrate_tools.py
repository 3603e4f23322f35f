"""Snapshot and workspace tools called directly, every result checked against its schema."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import jsonschema
import pytest

from mcp_server.config import Config
from mcp_server.fs.fingerprint import compute
from mcp_server.fs.leases import LeaseStore
from mcp_server.state import State
from mcp_server.tools import snapshot, workspace
from mcp_server.tools.registry import Registry
from sandbox.errors import CcwError

SPECS = {spec.name: spec for spec in [*snapshot.TOOLS, *workspace.TOOLS]}


class Ctx:
    """A ToolContext for direct handler calls."""

    def __init__(self, root: Path, state: State) -> None:
        self.config = Config(workspace=str(root), state_dir=str(state.root))
        self.workspace = self.config.workspace
        self.state = state

    async def helper(self) -> Any:
        raise CcwError("UNAVAILABLE", "no helper in these tests")

    async def roots(self) -> list[str] | None:
        return None

    async def progress(self, progress: float, total: float | None = None, message: str | None = None,
                       output: Any = None) -> None:
        return None

    def log(self, message: str) -> None:
        return None


def git(repo: Path, *args: str) -> bytes:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@e", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@e",
               GIT_CONFIG_GLOBAL="/dev/null", GIT_CONFIG_SYSTEM="/dev/null")
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env).stdout


@pytest.fixture
def env(tmp_path: Path) -> Iterator[tuple[Path, Callable[..., dict[str, Any]], State]]:
    repo = tmp_path / "repo"
    (repo / "src" / "pkg").mkdir(parents=True)
    (repo / "src" / "a.py").write_text("alpha = 1\nneedle here\n")
    (repo / "src" / "pkg" / "b.py").write_text("beta\nno match\nneedle needle\n")
    (repo / "docs").mkdir()
    (repo / "docs" / "guide.md").write_text("guide needle\n")
    (repo / "blob.bin").write_bytes(b"needle\0binary")
    (repo / ".gitignore").write_text("ignored.txt\n")
    (repo / "ignored.txt").write_text("needle ignored\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "init")
    (repo / "untracked.txt").write_text("needle untracked\n")
    state = State(tmp_path / "state")
    ctx = Ctx(repo, state)

    def call(name: str, **args: Any) -> dict[str, Any]:
        spec = SPECS[name]
        jsonschema.Draft202012Validator(spec.input_schema).validate(args)
        result = anyio.run(spec.handler, ctx, args, backend="trio")
        jsonschema.Draft202012Validator(spec.output_schema).validate(result)
        if "lease_id" in result:
            assert result["cache_hint"] == "until_dirty"
            assert result["fingerprint"] == compute(str(repo)).to_dict()
        return result

    yield repo, call, state
    state.close()


def error(call: Callable[..., dict[str, Any]], name: str, **args: Any) -> CcwError:
    with pytest.raises(CcwError) as info:
        call(name, **args)
    return info.value


def test_registry_and_aliases() -> None:
    registry = Registry.load(["snapshot", "workspace"], ["mcp_server.tools.snapshot", "mcp_server.tools.workspace"])
    assert registry.lookup("snapshot.create") is registry.lookup("snapshot_create")
    assert registry.lookup("workspace.apply_patch").name == "workspace_apply_patch"  # type: ignore[union-attr]
    assert len(registry.tools) == 11


def test_file_list_and_touched_sets(env: tuple[Path, Any, State]) -> None:
    _repo, call, state = env
    first = call("snapshot_file", path="src/a.py")
    assert first["content"] == "alpha = 1\nneedle here\n" and first["encoding"] == "utf-8"
    lease = first["lease_id"]
    listing = call("snapshot_list", path="src", lease_id=lease)
    assert listing["entries"] == [
        {"path": "src/a.py", "kind": "file", "size": 22},
        {"path": "src/pkg", "kind": "dir"},
    ]
    assert LeaseStore(state).touched(lease) == ["src", "src/a.py", "src/pkg"]
    root = call("snapshot_list")
    assert [e["path"] for e in root["entries"]] == [".gitignore", "blob.bin", "docs", "src", "untracked.txt"]
    binary = call("snapshot_file", path="blob.bin")
    assert binary["content"] == "base64:" + base64.b64encode(b"needle\0binary").decode()
    # snapshot_create without paths captures exactly the touched files.
    snap = call("snapshot_create", lease_id=lease)
    listed = call("snapshot_list", snapshot_id=snap["snapshot_id"], recursive=True)
    assert [e["path"] for e in listed["entries"]] == ["src", "src/a.py"]
    assert call("snapshot_list", snapshot_id=snap["snapshot_id"], path="nowhere") == {
        "path": "nowhere", "entries": [], "truncated": False, "cache_hint": "immutable",
        "snapshot_id": snap["snapshot_id"],
    }


def test_grep_touches_candidates_but_not_binaries_or_ignored(env: tuple[Path, Any, State]) -> None:
    _repo, call, state = env
    result = call("snapshot_grep", pattern="needle")
    assert [(m["path"], m["line"], m["col"]) for m in result["matches"]] == [
        ("docs/guide.md", 1, 7), ("src/a.py", 2, 1), ("src/pkg/b.py", 3, 1), ("src/pkg/b.py", 3, 8),
        ("untracked.txt", 1, 1),
    ]
    touched = LeaseStore(state).touched(result["lease_id"])
    assert touched == [".gitignore", "docs/guide.md", "src/a.py", "src/pkg/b.py", "untracked.txt"]
    limited = call("snapshot_grep", pattern="needle", max_files=2)
    assert limited["truncated"] and limited["files_searched"] == 2
    assert LeaseStore(state).touched(limited["lease_id"]) == [".gitignore", "docs/guide.md"]
    scoped = call("snapshot_grep", pattern="NEEDLE", ignore_case=True, paths=["src/pkg"])
    assert len(scoped["matches"]) == 2
    assert error(call, "snapshot_grep", pattern="(", regex=True).code == "INVALID_ARGUMENT"


def test_snapshot_mode_round_trip(env: tuple[Path, Any, State]) -> None:
    repo, call, _state = env
    snap = call("snapshot_create")
    sid = snap["snapshot_id"]
    assert snap["manifest_stats"]["files"] == 6  # ignored.txt left out
    fp = compute(str(repo))
    assert snap["fingerprint"] == fp.to_dict()
    info = call("snapshot_info", snapshot_id=sid)
    assert info == snap and "lease_id" not in info
    assert call("snapshot_file", snapshot_id=sid, path="src/a.py")["content"].startswith("alpha")
    grep = call("snapshot_grep", snapshot_id=sid, pattern="needle")
    assert grep["cache_hint"] == "immutable" and len(grep["matches"]) == 5
    one = call("snapshot_export", snapshot_id=sid)
    two = call("snapshot_export", snapshot_id=sid)
    assert one == two
    data = base64.b64decode(one["bundle"][7:])
    assert hashlib.sha256(data).hexdigest() == one["sha256"]
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        names = archive.getnames()
        assert names == sorted(names, key=str.encode)
        assert all(m.mtime == 0 and m.uid == 0 for m in archive.getmembers())
        assert archive.extractfile("src/a.py").read() == b"alpha = 1\nneedle here\n"  # type: ignore[union-attr]
    patch = "--- a/src/a.py\n+++ b/src/a.py\n@@ -1,2 +1,2 @@\n-alpha = 1\n+alpha = 2\n needle here\n"
    applied = call("workspace_apply_patch", mode="snapshot", snapshot_id=sid, patch=patch)
    assert applied["applied"] and applied["snapshot_id"] != sid
    assert (repo / "src" / "a.py").read_text().startswith("alpha = 1")  # the worktree is untouched
    changes = call("snapshot_changes", snapshot_id=applied["snapshot_id"], base_snapshot_id=sid)
    assert changes["changes"] == [{"path": "src/a.py", "status": "modified"}]
    diff = call("snapshot_diff", snapshot_id=applied["snapshot_id"], base_snapshot_id=sid)
    assert "-alpha = 1\n+alpha = 2\n" in diff["diff"]
    assert error(call, "snapshot_info", snapshot_id="sha256:" + "0" * 64).code == "NOT_FOUND"


def test_worktree_changes_and_diff(env: tuple[Path, Any, State]) -> None:
    repo, call, state = env
    base = call("snapshot_create")["snapshot_id"]
    (repo / "src" / "a.py").write_text("alpha = 3\n")
    (repo / "docs" / "guide.md").unlink()
    changes = call("snapshot_changes")["changes"]
    assert changes == [
        {"path": "docs/guide.md", "status": "deleted"},
        {"path": "src/a.py", "status": "modified"},
        {"path": "untracked.txt", "status": "untracked"},
    ]
    diff = call("snapshot_diff", base_snapshot_id=base, paths=["src"])
    assert diff["changes"] == [{"path": "src/a.py", "status": "modified"}]
    assert LeaseStore(state).touched(diff["lease_id"]) == ["src"]


def test_apply_patch_worktree_accept_and_reject(env: tuple[Path, Any, State]) -> None:
    repo, call, state = env
    lease = call("snapshot_file", path="src/a.py")["lease_id"]
    bad = (
        "--- a/src/pkg/b.py\n+++ b/src/pkg/b.py\n@@ -1 +1 @@\n-nope\n+x\n"
        "--- a/src/a.py\n+++ b/src/a.py\n@@ -1,2 +1,2 @@\n-alpha = 1\n+alpha = 9\n needle here\n"
        "--- a/docs/guide.md\n+++ b/docs/guide.md\n@@ -1 +1 @@\n-wrong\n+x\n"
    )
    rejected = call("workspace_apply_patch", patch=bad, lease_id=lease)
    assert not rejected["applied"]
    assert [r["path"] for r in rejected["rejects"]] == ["docs/guide.md", "src/pkg/b.py"]
    assert (repo / "src" / "a.py").read_text() == "alpha = 1\nneedle here\n"  # nothing written
    good = (
        "diff --git a/src/a.py b/src/a.py\n--- a/src/a.py\n+++ b/src/a.py\n"
        "@@ -1,2 +1,2 @@\n-alpha = 1\n+alpha = 9\n needle here\n"
        "diff --git a/new/file.sh b/new/file.sh\nnew file mode 100755\n--- /dev/null\n+++ b/new/file.sh\n"
        "@@ -0,0 +1 @@\n+echo hi\n"
        "diff --git a/docs/guide.md b/docs/guide.md\ndeleted file mode 100644\n--- a/docs/guide.md\n+++ /dev/null\n"
        "@@ -1 +0,0 @@\n-guide needle\n"
    )
    applied = call("workspace_apply_patch", patch=good, lease_id=lease)
    assert applied["applied"] and applied["lease_id"] == lease
    assert applied["files"] == ["docs/guide.md", "new/file.sh", "src/a.py"]
    assert (repo / "src" / "a.py").read_text() == "alpha = 9\nneedle here\n"
    assert os.access(repo / "new" / "file.sh", os.X_OK)
    assert not (repo / "docs").exists()
    # The lease follows its holder's own write and stays usable.
    assert call("snapshot_file", path="new/file.sh", lease_id=lease)["content"] == "echo hi\n"
    assert {"docs/guide.md", "new/file.sh", "src/a.py"} <= set(LeaseStore(state).touched(lease))
    assert error(call, "workspace_apply_patch", patch="not a patch").code == "INVALID_ARGUMENT"


WORKTREE_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("snapshot_create", {}),
    ("snapshot_list", {}),
    ("snapshot_file", {"path": "src/a.py"}),
    ("snapshot_grep", {"pattern": "needle"}),
    ("snapshot_diff", {"base_snapshot_id": "BASE"}),
    ("snapshot_changes", {}),
    ("snapshot_export", {}),
    ("workspace_apply_patch", {"patch": "--- a/src/a.py\n+++ b/src/a.py\n@@ -1 +1 @@\n-x\n+y\n"}),
    ("workspace_write_file", {"path": "w.txt", "content": "w"}),
    ("workspace_delete", {"path": "src/a.py"}),
]


@pytest.mark.parametrize(("name", "args"), WORKTREE_CALLS, ids=[c[0] for c in WORKTREE_CALLS])
def test_every_worktree_tool_refuses_a_stale_lease(env: tuple[Path, Any, State], name: str,
                                                   args: dict[str, Any]) -> None:
    repo, call, _state = env
    base = call("snapshot_create")["snapshot_id"]
    args = {k: (base if v == "BASE" else v) for k, v in args.items()}
    lease = call("snapshot_list")["lease_id"]
    # The fingerprint sees status changes: a clean tracked file becoming modified.
    (repo / "docs" / "guide.md").write_text("moved on\n")
    before = (repo / "src" / "a.py").read_bytes()
    err = error(call, name, lease_id=lease, **args)
    assert err.code == "STALE_LEASE"
    assert err.details["fingerprint"] == compute(str(repo)).to_dict()
    assert err.to_dict()["details"]["fingerprint"]["status_hash"]
    assert (repo / "src" / "a.py").read_bytes() == before and not (repo / "w.txt").exists()


def test_write_and_delete_safety(env: tuple[Path, Any, State], tmp_path: Path) -> None:
    repo, call, state = env
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("keep")
    written = call("workspace_write_file", path="made/deep/x.txt",
                   content="base64:" + base64.b64encode(b"\0\1").decode())
    assert (repo / "made" / "deep" / "x.txt").read_bytes() == b"\0\1"
    assert LeaseStore(state).touched(written["lease_id"]) == ["made/deep/x.txt"]
    (repo / "escape").symlink_to(outside)
    for bad in ("../outside/keep", "/etc/passwd", "~/x", "escape/keep", "escape/new", "a/../../x"):
        assert error(call, "workspace_write_file", path=bad, content="pwned").code == "PERMISSION_DENIED", bad
        assert error(call, "workspace_delete", path=bad).code in ("PERMISSION_DENIED", "NOT_FOUND"), bad
    # A directory swapped for an outside symlink between two calls.
    call("workspace_write_file", path="swap/f", content="one")
    for p in (repo / "swap").iterdir():
        p.unlink()
    (repo / "swap").rmdir()
    (repo / "swap").symlink_to(outside)
    assert error(call, "workspace_write_file", path="swap/f", content="two").code == "PERMISSION_DENIED"
    assert error(call, "workspace_delete", path="swap/keep").code == "PERMISSION_DENIED"
    assert sorted(os.listdir(outside)) == ["keep"] and (outside / "keep").read_text() == "keep"
    assert error(call, "workspace_delete", path="src").code == "INVALID_ARGUMENT"
    deleted = call("workspace_delete", path="src", recursive=True)
    assert deleted["deleted"] == ["src/a.py", "src/pkg/b.py"] and not (repo / "src").exists()
    assert call("workspace_delete", path="escape")["deleted"] == ["escape"]
    assert (outside / "keep").exists()


class _FakeHelper:
    """Stands in for the helper: open_root passes an O_PATH descriptor of a directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    async def open_root(self, capsule_id: str) -> int:
        if capsule_id != "cap1":
            raise CcwError("NOT_FOUND", f"no capsule {capsule_id}")
        return os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)


def test_capsule_target_reads_and_writes_through_the_passed_descriptor(tmp_path: Path) -> None:
    capsule = tmp_path / "capsule"
    capsule.mkdir()
    (capsule / "f.txt").write_text("in capsule\n")
    git(capsule, "init", "-q")
    git(capsule, "add", "-A")
    git(capsule, "commit", "-qm", "c")
    state = State(tmp_path / "state")
    ctx = Ctx(tmp_path, state)
    helper = _FakeHelper(capsule)

    async def get_helper() -> Any:
        return helper

    ctx.helper = get_helper  # type: ignore[method-assign]

    def call(name: str, **args: Any) -> dict[str, Any]:
        spec = SPECS[name]
        result = anyio.run(spec.handler, ctx, args, backend="trio")
        jsonschema.Draft202012Validator(spec.output_schema).validate(result)
        return result

    read = call("snapshot_file", capsule_id="cap1", path="f.txt")
    assert read["content"] == "in capsule\n" and read["capsule_id"] == "cap1"
    # git cannot reach a capsule's view (it lives in the helper's mount namespace), so a
    # capsule's fingerprint reads HEAD from .git's files and has no index tree.
    assert read["fingerprint"]["head_oid"] == compute(str(capsule)).head_oid != ""
    assert read["fingerprint"]["index_oid"] == ""
    wrote = call("workspace_write_file", capsule_id="cap1", path="g.txt", content="new\n", lease_id=read["lease_id"])
    assert (capsule / "g.txt").read_text() == "new\n"
    assert wrote["fingerprint"]["head_oid"] == read["fingerprint"]["head_oid"]
    with pytest.raises(CcwError):
        call("snapshot_file", capsule_id="cap1", path="f.txt", lease_id=read["lease_id"] + "x")
    state.close()


def test_patch_through_a_symlinked_directory_writes_nothing(env: tuple[Path, Any, State], tmp_path: Path) -> None:
    repo, call, _state = env
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (repo / "linked").symlink_to("src")  # stays beneath the root, but is a symlink
    patch = (
        "--- a/src/a.py\n+++ b/src/a.py\n@@ -1,2 +1,2 @@\n-alpha = 1\n+alpha = 5\n needle here\n"
        "--- /dev/null\n+++ b/linked/new.py\n@@ -0,0 +1 @@\n+x\n"
    )
    assert error(call, "workspace_apply_patch", patch=patch).code == "PERMISSION_DENIED"
    assert (repo / "src" / "a.py").read_text() == "alpha = 1\nneedle here\n"
    assert not (repo / "src" / "new.py").exists()


def test_create_fails_when_the_tree_moves_during_capture(env: tuple[Path, Any, State],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    repo, call, _state = env
    from mcp_server.substrate import views

    real = views.LiveTarget.fingerprint
    calls = []

    def moving(self: views.LiveTarget) -> Any:
        calls.append(1)
        if len(calls) == 2:  # after the files were read
            (repo / "docs" / "guide.md").write_text("edited meanwhile\n")
        return real(self)

    monkeypatch.setattr(views.LiveTarget, "fingerprint", moving)
    err = error(call, "snapshot_create")
    assert err.code == "REPO_CHANGED"
    assert err.details["fingerprint"] == compute(str(repo)).to_dict()


def test_gc_keeps_what_snapshots_name(env: tuple[Path, Any, State]) -> None:
    _repo, call, state = env
    from mcp_server.fs.blobstore import BlobStore
    from mcp_server.fs.snapshot import SnapshotStore

    sid = call("snapshot_create", paths=["src"])["snapshot_id"]
    store = BlobStore(state.objects_dir)
    orphan = store.put(b"nobody names me")
    removed = store.gc(SnapshotStore(state).live_blobs(), grace_seconds=-1)
    assert removed == [orphan]
    assert call("snapshot_file", snapshot_id=sid, path="src/pkg/b.py")["content"].startswith("beta")
