"""Promotion scope (mcp_server/fs/gitignore.py): git's ignore rules of the live workspace, and path globs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from mcp_server.fs import gitignore
from mcp_server.fs.gitignore import (
    CACHEDIR_SIGNATURE,
    NOT_A_REPOSITORY,
    Scope,
    compile_glob,
    declares_cache,
    ignored,
)
from mcp_server.fs.view import RootView
from sandbox.errors import CcwError


def _repo(root: Path) -> Path:
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / ".gitignore").write_text("build/\n__pycache__/\n.pytest_cache/\n*.so\n")
    (root / "src").mkdir()
    (root / "src" / "kept.so").write_bytes(b"tracked anyway")
    subprocess.run(["git", "-C", str(root), "add", "-f", ".gitignore", "src/kept.so"], check=True)
    return root


def test_ignored_asks_the_live_workspace_and_spares_tracked_files(tmp_path: Path) -> None:
    root = _repo(tmp_path / "ws")
    paths = ["src/a.py", "build/x.o", "build", "src/__pycache__/a.cpython-311.pyc", ".pytest_cache/v/x",
             "src/kept.so", "src/new.so", "caf\udce9.py"]
    assert ignored(str(root), paths, dirs={"build"}) == {"build/x.o", "build", "src/__pycache__/a.cpython-311.pyc",
                                         ".pytest_cache/v/x", "src/new.so"}
    assert ignored(str(root), []) == frozenset()
    assert ignored(str(root), ["build"]) == frozenset()  # not said to be a directory, and none in the workspace


def test_a_repository_git_does_not_trust_names_each_way_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Root's git over a user's checkout, simulated as git's own tests do.  The capsule's diff
    # asks too, and was told to "promote with include_ignored".
    root = _repo(tmp_path / "ws")
    real = gitignore.git_env
    monkeypatch.setattr(gitignore, "git_env", lambda: real({"GIT_TEST_ASSUME_DIFFERENT_OWNER": "1"}))
    with pytest.raises(CcwError) as refused:
        ignored(str(root), ["build/x.o"])
    assert refused.value.code == "PERMISSION_DENIED" and "dubious ownership" in refused.value.message
    assert refused.value.message.endswith("trust the repository as git says, or skip the check: include_ignored "
                                          "for capsule_promote, ignored for capsule_diff (capsule_merge has no "
                                          "such switch: promote each attempt by itself)")


def test_a_workspace_outside_git_ignores_nothing(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    assert ignored(str(tmp_path / "plain"), ["build/x.o"]) == NOT_A_REPOSITORY


def test_the_repository_fsmonitor_does_not_run(tmp_path: Path) -> None:
    root = _repo(tmp_path / "ws")
    marker = tmp_path / "ran"
    subprocess.run(["git", "-C", str(root), "config", "core.fsmonitor", f"touch {marker}; false"], check=True)
    assert ignored(str(root), ["build/x.o"]) == {"build/x.o"}
    assert not marker.exists()


@pytest.mark.parametrize(("pattern", "path", "matches"), [
    ("*.py", "a.py", True), ("*.py", "src/a.py", False), ("src/*.py", "src/a/b.py", False),
    ("src/**", "src/a/b.py", True), ("**/*.py", "b.py", True), ("**/*.py", "src/a/b.py", True),
    ("build", "build/x.o", True), ("build", "builder/x", False), ("[!a]*", "b/c", True), ("[!a]*", "a", False),
    ("?.txt", "a.txt", True), ("?.txt", "/.txt", False), ("a+b(c)", "a+b(c)", True),
])
def test_globs(pattern: str, path: str, matches: bool) -> None:
    assert bool(compile_glob(pattern).match(path)) is matches


def test_an_empty_glob_is_refused() -> None:
    with pytest.raises(CcwError) as err:
        compile_glob("/")
    assert err.value.code == "INVALID_ARGUMENT"


def test_scope_split_reports_each_reason(tmp_path: Path) -> None:
    root = str(_repo(tmp_path / "ws"))
    paths = ["src/a.py", "src/b.py", "docs/x.md", "build/x.o", "src/__pycache__/a.pyc"]
    kept, skipped, note = Scope(paths=("src/**", "build"), exclude=("src/b.py",)).split(root, paths)
    assert kept == ["src/a.py"] and note is None
    assert skipped == [{"path": "src/b.py", "reason": "excluded"}, {"path": "docs/x.md", "reason": "not in paths"},
                       {"path": "build/x.o", "reason": "ignored"},
                       {"path": "src/__pycache__/a.pyc", "reason": "ignored"}]
    kept, skipped, note = Scope(include_ignored=True).split(root, paths)
    assert kept == paths and skipped == [] and note is None
    kept, skipped, note = Scope().split(str(tmp_path), paths)
    assert kept == paths and note == NOT_A_REPOSITORY


def _empty(tmp_path: Path) -> RootView:
    """A capsule view that holds no cache markers."""
    (tmp_path / "capsule").mkdir(exist_ok=True)
    return RootView.open(str(tmp_path / "capsule"))


def test_directories_follow_their_contents(tmp_path: Path) -> None:
    from mcp_server.capsules.promote import _scoped
    from mcp_server.fs.changeset import Entry, promote_ops
    from mcp_server.fs.view import Side

    root = str(_repo(tmp_path / "ws"))
    d, f = Side("dir", 0o755), Side("file", 0o644)
    entries = [Entry("new", None, d, False), Entry("new/a.py", None, f, False), Entry("new/b.py", None, f, False),
               Entry("old", d, None, False), Entry("old/a.py", f, None, False), Entry("old/b.py", f, None, False),
               Entry("build", None, d, False), Entry("build/x.o", None, f, False)]
    kept, skipped, _ = _scoped(entries, root, Scope(exclude=("new/b.py", "old/b.py")), _empty(tmp_path))
    # new/ is made for new/a.py; old/ is not removed, since old/b.py stays in it.
    assert [op.path for op in promote_ops(kept)] == ["new", "new/a.py", "old/a.py"]
    assert skipped == [{"path": "new/b.py", "reason": "excluded"}, {"path": "old", "reason": "excluded"},
                       {"path": "old/b.py", "reason": "excluded"}, {"path": "build", "reason": "ignored"},
                       {"path": "build/x.o", "reason": "ignored"}]
    kept, skipped, _ = _scoped(entries, root, Scope(paths=("new/a.py",)), _empty(tmp_path))
    assert [e.path for e in kept] == ["new", "new/a.py"]


def test_a_made_directory_whose_contents_are_all_skipped_is_skipped(tmp_path: Path) -> None:
    from mcp_server.capsules.promote import _scoped
    from mcp_server.fs.changeset import Entry
    from mcp_server.fs.view import Side

    root = _repo(tmp_path / "ws")
    (root / ".git" / "info" / "exclude").write_text("*.pyc\n")
    d, f = Side("dir", 0o755), Side("file", 0o644)
    entries = [Entry("src/__pycache__", None, d, False), Entry("src/__pycache__/a.pyc", None, f, False),
               Entry("empty", None, d, False)]
    kept, skipped, _ = _scoped(entries, str(root), Scope(), _empty(tmp_path))
    assert [e.path for e in kept] == ["empty"]  # made empty on purpose: kept
    assert [s["path"] for s in skipped] == ["src/__pycache__", "src/__pycache__/a.pyc"]


@pytest.mark.parametrize(("gitignore", "tag", "cache"), [
    (b"# Created by pytest automatically.\n*\n", None, True),
    (b"*", None, True),
    (None, CACHEDIR_SIGNATURE + b"\n# This file is a cache directory tag.\n", True),
    (b"*\n!keep.py\n", None, False),  # more than "ignore me": the capsule's own rules do not count
    (b"*.pyc\n", None, False),
    (b"", None, False),
    (None, b"Signature: something else", False),
    (None, None, False),
])
def test_a_made_directory_declares_itself_a_cache(gitignore: bytes | None, tag: bytes | None, cache: bool) -> None:
    assert declares_cache(gitignore, tag) is cache


def test_a_self_declared_cache_is_ignored_unless_everything_is_asked(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    paths = [".pytest_cache", ".pytest_cache/.gitignore", ".pytest_cache/v/cache/nodeids", ".pytest_cache_not", "a.py"]
    kept, skipped, _ = Scope().split(str(root), paths, {".pytest_cache"}, [".pytest_cache"])
    assert kept == [".pytest_cache_not", "a.py"]
    assert {s["path"] for s in skipped} == {".pytest_cache", ".pytest_cache/.gitignore",
                                            ".pytest_cache/v/cache/nodeids"}
    kept, skipped, _ = Scope(include_ignored=True).split(str(root), paths, {".pytest_cache"}, [".pytest_cache"])
    assert kept == paths and skipped == []


def test_promotion_reads_the_markers_in_the_capsule(tmp_path: Path) -> None:
    from mcp_server.capsules.promote import _scoped
    from mcp_server.fs.changeset import Entry
    from mcp_server.fs.view import Side

    root = tmp_path / "ws"
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    capsule = tmp_path / "capsule"
    (capsule / ".pytest_cache" / "v").mkdir(parents=True)
    (capsule / ".pytest_cache" / ".gitignore").write_text("# Created by pytest automatically.\n*\n")
    (capsule / "big").mkdir()
    (capsule / "big" / ".gitignore").write_text("*\n" + "#" * 5000)  # past MAX_MARKER: not read
    (capsule / "lib").mkdir()
    (capsule / "lib" / ".gitignore").symlink_to(capsule / ".pytest_cache" / ".gitignore")  # a link is no marker
    d, f = Side("dir", 0o755), Side("file", 0o644)
    entries = [Entry(".pytest_cache", None, d, False), Entry(".pytest_cache/.gitignore", None, f, False),
               Entry(".pytest_cache/v", None, d, False), Entry("big", None, d, False),
               Entry("big/.gitignore", None, f, False), Entry("lib", None, d, False),
               Entry("lib/.gitignore", None, Side("symlink", 0o777), False)]
    with RootView.open(str(capsule)) as view:
        kept, skipped, _ = _scoped(entries, str(root), Scope(), view)
    assert [e.path for e in kept] == ["big", "big/.gitignore", "lib", "lib/.gitignore"]
    assert {s["path"]: s["reason"] for s in skipped} == {".pytest_cache": "ignored",
                                                         ".pytest_cache/.gitignore": "ignored",
                                                         ".pytest_cache/v": "ignored"}


def test_a_reinstalled_node_modules_is_one_skipped_entry_not_one_per_file(tmp_path: Path) -> None:
    """capsule_promote's ``skipped`` of a capsule that reinstalled node_modules/ named every one
    of its tens of thousands of files (a 10 MB answer); past SKIPPED_LISTED a skipped directory
    stands for what below it was skipped for the same reason, and the rest is as it was."""
    import trio

    from mcp_server.capsules.promote import _scoped
    from mcp_server.fs.changeset import Entry
    from mcp_server.fs.view import Side
    from mcp_server.tools import promote as promote_tool

    root = _repo(tmp_path / "ws")
    (root / ".gitignore").write_text("node_modules/\n")
    d, f = Side("dir", 0o755), Side("file", 0o644)
    entries = [Entry("node_modules", d, d, False)]
    for i in range(400):
        entries += [Entry(f"node_modules/p{i}", None, d, False)] + [
            Entry(f"node_modules/p{i}/{n}.js", None, f, False) for n in range(3)]
    entries += [Entry("src", d, d, False), Entry("src/a.js", f, f, True), Entry("src/b.js", f, f, True)]
    entries.sort(key=lambda e: e.path.encode())
    kept, skipped, _ = _scoped(entries, str(root), Scope(exclude=("src/b.js",)), _empty(tmp_path))
    assert [e.path for e in kept] == ["src", "src/a.js"] and len(skipped) == 1 + 400 * 4 + 1

    async def promote(_service: object, _request: object) -> dict[str, object]:
        return {"promoted": True, "dry_run": False, "applied": ["src/a.js"], "skipped": skipped}

    class Ctx:
        capsules = state = None

    recorded: list[object] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(promote_tool, "promote", promote)
        patch.setattr(promote_tool, "record_outcome", lambda *args: recorded.append(args))
        answer = trio.run(promote_tool.capsule_promote, Ctx(), {"capsule_id": "cap_1"})
    assert answer["skipped"] == [{"path": "node_modules", "reason": "ignored"},
                                 {"path": "src/b.js", "reason": "excluded"}]
    assert answer["applied"] == ["src/a.js"] and recorded
    small = skipped[:promote_tool.SKIPPED_LISTED]
    assert promote_tool.compact_skipped(small) == small
