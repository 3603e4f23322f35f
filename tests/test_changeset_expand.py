"""fs/changeset.expand over plain directories: the entries it gives, and the base lstats it keeps
for a merge's stat cache (``base_infos``), each entry stat'ed once a tree; state_text's written-out
text of a file's state is canonical_text's."""

from __future__ import annotations

import os
from pathlib import Path

import blake3
import pytest

from mcp_server.core.canonical import canonical_text
from mcp_server.fs import changeset
from mcp_server.fs.view import RootView, Side
from sandbox.replies import Change


def _trees(tmp_path: Path) -> tuple[Path, Path]:
    base, capsule = tmp_path / "base", tmp_path / "capsule"
    for root in (base, capsule):
        (root / "src").mkdir(parents=True)
        (root / "src" / "same.txt").write_text("same\n")
        (root / "src" / "edited.txt").write_text("before\n")
    (capsule / "src" / "edited.txt").write_text("after, longer\n")
    (base / "gone" / "deep").mkdir(parents=True)
    (base / "gone" / "one.txt").write_text("one\n")
    (base / "gone" / "deep" / "two.txt").write_text("two\n")
    os.symlink("src/same.txt", base / "link")
    os.symlink("elsewhere", capsule / "link")
    (capsule / "new.txt").write_text("new\n")
    return base, capsule


CHANGES = [Change("gone", "deleted", "dir"), Change("link", "modified", "symlink", target="elsewhere"),
           Change("new.txt", "added", "file", 0o644, 4), Change("src/edited.txt", "modified", "file", 0o644, 14)]


def _expand(base: Path, capsule: Path, infos: dict[str, os.stat_result] | None) -> list[changeset.Entry]:
    with RootView.open(str(base)) as low, RootView.open(str(capsule)) as view:
        return changeset.expand(CHANGES, low, view, infos)


def test_entries_are_the_same_with_and_without_kept_stats(tmp_path: Path) -> None:
    base, capsule = _trees(tmp_path)
    infos: dict[str, os.stat_result] = {}
    kept, plain = _expand(base, capsule, infos), _expand(base, capsule, None)
    assert kept == plain
    by_path = {entry.path: entry for entry in kept}
    assert list(by_path) == ["gone", "gone/deep", "gone/deep/two.txt", "gone/one.txt", "link", "new.txt",
                             "src/edited.txt"]
    assert by_path["gone"].old == Side("dir", 0o755 & ~_umask()) and by_path["gone"].new is None
    assert by_path["gone/deep/two.txt"].old == Side("file", 0o666 & ~_umask())
    assert by_path["link"].old == Side("symlink", 0o777, "src/same.txt")
    assert by_path["link"].new == Side("symlink", 0o777, "elsewhere")
    assert by_path["new.txt"].old is None and by_path["src/edited.txt"].modified


def test_base_infos_hold_each_regular_base_file_as_lstat_gives_it(tmp_path: Path) -> None:
    base, capsule = _trees(tmp_path)
    infos: dict[str, os.stat_result] = {}
    _expand(base, capsule, infos)
    # Regular files of the base only: not the directories, the symlink, or what the base lacks.
    assert sorted(infos) == ["gone/deep/two.txt", "gone/one.txt", "src/edited.txt"]
    for path, info in infos.items():
        real = os.lstat(base / path)
        assert (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns) == (
            real.st_ino, real.st_size, real.st_mtime_ns, real.st_ctime_ns)


def test_each_base_entry_is_stat_ed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base, capsule = _trees(tmp_path)
    stats: list[str] = []
    real_stat = os.stat

    def counting(path: str | int, *args: object, dir_fd: int | None = None, **kwargs: object) -> os.stat_result:
        if dir_fd is not None and os.readlink(f"/proc/self/fd/{dir_fd}").startswith(str(base)):
            stats.append(str(path))  # the base tree's
        return real_stat(path, *args, dir_fd=dir_fd, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "stat", counting)
    infos: dict[str, os.stat_result] = {}
    _expand(base, capsule, infos)
    # Each base entry once: the deleted directory looked at before its children is not again.
    assert {name: stats.count(name) for name in ("gone", "one.txt", "two.txt", "edited.txt", "new.txt")} == {
        "gone": 1, "one.txt": 1, "two.txt": 1, "edited.txt": 1, "new.txt": 1}, stats


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize(("side", "data", "digest"), [
    (Side("file", 0o644), b"bytes\n", None),
    (Side("file", 0o4755), None, "0f" * 32),
    (Side("file", 0o600), None, 'not "hex"\\'),  # a digest a corrupt cache could give: escaped as canonical JSON
    (Side("symlink", 0o777, 'l\u00e9 "x"'), None, None),
    (Side("dir", 0o700), None, None),
    (None, None, None),
])
def test_state_text_is_the_canonical_json_of_the_state(side: Side | None, data: bytes | None,
                                                       digest: str | None) -> None:
    text = changeset.state_text(side, data, digest)
    if side is None:
        assert text == "absent"
        return
    state: dict[str, object] = {"kind": side.kind, "mode": side.mode}
    if side.kind == "file":
        state["blake3"] = digest if data is None else blake3.blake3(data).hexdigest()
    if side.kind == "symlink":
        state["target"] = side.target
    assert text == canonical_text(state)


def test_a_change_in_more_directories_than_the_descriptor_limit_expands(tmp_path: Path) -> None:
    """A reinstalled node_modules/ changes files in thousands of directories: expand keeps a
    bounded number of them open (DirFds.KEPT), so it answers under a 1024-descriptor limit
    instead of failing with EMFILE halfway."""
    import resource

    base, capsule = tmp_path / "base", tmp_path / "capsule"
    changes = []
    for i in range(600):
        for root in (base, capsule):
            (root / "node_modules" / f"p{i:03d}").mkdir(parents=True)
            (root / "node_modules" / f"p{i:03d}" / "index.js").write_text("old\n")
        (capsule / "node_modules" / f"p{i:03d}" / "index.js").write_text("new\n")
        changes.append(Change(f"node_modules/p{i:03d}/index.js", "modified", "file", 0o644, 4))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 300, hard))
    try:
        with RootView.open(str(base)) as low, RootView.open(str(capsule)) as view:
            entries = changeset.expand(changes, low, view)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert [entry.path for entry in entries] == [change.path for change in changes]
    assert all(entry.modified and entry.old == entry.new == Side("file", 0o644) for entry in entries)
