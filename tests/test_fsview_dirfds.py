"""DirFds: the per-phase directory cache answers exactly as the uncached calls do,
refuses the same symlinks, and never resolves a name out of its directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mcp_server.fs.view import DirFds, RootView, lstat, open_name
from sandbox.errors import CcwError


def _tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "a.py").write_text("a\n")
    (root / "src" / "pkg" / "b.py").write_text("b\n")
    os.chmod(root / "src" / "a.py", 0o751)
    (root / "src" / "link").symlink_to("a.py")
    (root / "via").symlink_to("src")
    os.mkfifo(root / "src" / "fifo")
    (root / "top.txt").write_text("top\n")
    (tmp_path / "secret").write_text("outside\n")
    (root / "src" / "escape").symlink_to(tmp_path / "secret")
    return root


PATHS = [
    "top.txt", "src", "src/a.py", "src/link", "src/fifo", "src/pkg", "src/pkg/b.py", "src/escape",
    "via", "via/a.py", "via/pkg/b.py", "missing", "missing/x", "top.txt/x", "src/nope",
]


def test_lstat_through_the_cache_equals_lstat(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    with RootView.open(str(root)) as view, DirFds(view) as dirs:
        for path in PATHS + PATHS:  # twice: answers from the cache, absent dirs included
            assert dirs.lstat(path) == lstat(view, path), path


def test_read_regular_reads_files_only_and_never_follows_a_link(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    with RootView.open(str(root)) as view, DirFds(view) as dirs:
        assert dirs.read_regular("src/pkg/b.py") == b"b\n"
        assert dirs.read_regular("src/pkg/b.py", missing_ok=False) == b"b\n"
        for path in ("src/link", "src/escape", "via/a.py", "src/fifo", "src/pkg", "missing/x", "src/nope"):
            assert dirs.read_regular(path) is None, path
        with pytest.raises(CcwError) as info:
            dirs.read_regular("src/escape", missing_ok=False)
        assert info.value.code == "PERMISSION_DENIED"
        with pytest.raises(CcwError) as info:
            dirs.read_regular("via/a.py", missing_ok=False)
        assert info.value.code == "PERMISSION_DENIED"
        with pytest.raises(CcwError) as info:
            dirs.read_regular("src/nope", missing_ok=False)
        assert info.value.code == "NOT_FOUND"


def test_get_refuses_a_symlinked_directory(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    with RootView.open(str(root)) as view, DirFds(view) as dirs:
        with pytest.raises(CcwError) as info:
            dirs.get("via")
        assert info.value.code == "PERMISSION_DENIED"
        assert dirs.find("via") is None


def test_a_directory_created_after_a_miss_is_found_after_forget(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    with RootView.open(str(root)) as view, DirFds(view) as dirs:
        assert dirs.lstat("later/x") is None
        (root / "later").mkdir()
        (root / "later" / "x").write_text("x")
        assert dirs.lstat("later/x") is None  # the miss is cached for the phase
        dirs.forget()
        side = dirs.lstat("later/x")
        assert side is not None and side.kind == "file"


def test_open_name_never_leaves_the_directory(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    with RootView.open(str(root)) as view, DirFds(view) as dirs:
        src = dirs.get("src")
        for name in ("..", "../top.txt", "pkg/../../top.txt"):
            with pytest.raises(OSError):
                os.close(open_name(src, name, os.O_RDONLY | os.O_NOFOLLOW))
        with pytest.raises(OSError):
            open_name(src, "escape", os.O_RDONLY | os.O_NOFOLLOW)
        fd = open_name(src, "a.py", os.O_RDONLY | os.O_NOFOLLOW)
        try:
            assert os.read(fd, 10) == b"a\n"
        finally:
            os.close(fd)


def test_a_sparse_file_over_the_read_cap_is_refused_unread(tmp_path: Path) -> None:
    """A capsule makes a file of any size for no disk (``truncate -s``); read whole, it would fill
    the front end's memory, and past Linux's largest single read it came back cut short."""
    from mcp_server.fs import view as view_mod

    root = tmp_path / "root"
    root.mkdir()
    with open(root / "huge.bin", "wb") as f:
        f.truncate(3 << 30)
    (root / "small.bin").write_bytes(b"x" * 10)
    with RootView.open(str(root)) as view, DirFds(view) as dirs:
        for read in (lambda: view.read_regular("huge.bin"), lambda: dirs.read_stat("huge.bin")):
            with pytest.raises(CcwError) as caught:
                read()
            assert caught.value.code == "TOO_LARGE" and caught.value.details == {
                "path": "huge.bin", "size": 3 << 30, "limit": view_mod.MAX_READ_BYTES}, caught.value
        assert view.read_regular("small.bin") == b"x" * 10


def test_at_most_kept_directories_stay_open_and_answers_do_not_change(tmp_path: Path) -> None:
    root = tmp_path / "root"
    names = [f"d{i:03d}" for i in range(DirFds.KEPT * 3)]
    for name in names:
        (root / name).mkdir(parents=True)
        (root / name / "f").write_text(name)
    before = len(os.listdir("/proc/self/fd"))
    with RootView.open(str(root)) as view, DirFds(view) as dirs:
        for name in names + names:  # the second pass reopens what was closed
            assert dirs.lstat(f"{name}/f") == lstat(view, f"{name}/f")
            assert dirs.read_regular(f"{name}/f") == name.encode()
            assert len(os.listdir("/proc/self/fd")) <= before + 1 + DirFds.KEPT
        assert os.stat("f", dir_fd=dirs.get(names[0])).st_size == 4
    assert len(os.listdir("/proc/self/fd")) == before
