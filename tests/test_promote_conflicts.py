"""The conflict check of capsule_promote: live states read early (while the helper lists
changes) are used, and a path recorded after that early read is still checked."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mcp_server.capsules.promote import _conflicts, _read_live_early
from mcp_server.fs import changeset
from mcp_server.fs.view import RootView, Side


class _Record:
    capsule_id = "cap_1"
    parent = None

    def __init__(self, workspace: Path) -> None:
        self.workspace = self.base = str(workspace)


class _Journal:
    """The two reads _conflicts makes of the journal."""

    def __init__(self, states: dict[str, str]) -> None:
        self.states = states

    def base_states(self, capsule_id: str) -> dict[str, str]:
        return dict(self.states)

    def capsule(self, capsule_id: str) -> None:
        return None


def _entry(path: str) -> changeset.Entry:
    return changeset.Entry(path, Side("file", 0o644), Side("file", 0o644), True)


def _state(ws: Path, path: str) -> str:
    with RootView.open(str(ws)) as view:
        return changeset.base_state(view, path)


def test_early_states_and_late_records_are_both_checked(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    for name in ("a", "b", "c"):
        (ws / "src" / name).write_text(f"{name}\n")
    journal = _Journal({"src/a": _state(ws, "src/a"), "src/b": _state(ws, "src/b")})
    record: Any = _Record(ws)
    early = _read_live_early(journal, record)  # type: ignore[arg-type]
    assert sorted(early) == ["src/a", "src/b"]
    # An exec that ends after the early read records src/c, then src/c changes live.
    journal.states["src/c"] = _state(ws, "src/c")
    (ws / "src" / "c").write_text("edited live\n")
    entries = [_entry("src/a"), _entry("src/b"), _entry("src/c"), _entry("src/unrecorded")]
    found = _conflicts(journal, record, entries, early)  # type: ignore[arg-type]
    assert [c["path"] for c in found] == ["src/c"]
    assert found[0]["actual"] == changeset.shown_state(_state(ws, "src/c")) != found[0]["expected"]


def test_a_path_changed_before_the_early_read_conflicts(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "README").write_text("base\n")
    journal = _Journal({"README": _state(ws, "README"), "gone": _state(ws, "gone")})
    (ws / "README").write_text("edited live\n")
    (ws / "gone").write_text("now here\n")
    record: Any = _Record(ws)
    early = _read_live_early(journal, record)  # type: ignore[arg-type]
    found = _conflicts(journal, record, [_entry("README"), _entry("gone")], early)  # type: ignore[arg-type]
    assert [c["path"] for c in found] == ["README", "gone"]
    assert found[1]["expected"] == "absent"


def _put_back(path: Path, data: bytes) -> None:
    """The bytes written again as an editor saves: a new file renamed over, a later mtime."""
    st = path.stat()
    (path.parent / ".save").write_bytes(data)
    os.chmod(path.parent / ".save", st.st_mode & 0o7777)
    os.replace(path.parent / ".save", path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))


def _live_conflicts(ws: Path, journal: _Journal, paths: list[str]) -> list[str]:
    record: Any = _Record(ws)
    found = _conflicts(journal, record, [_entry(p) for p in paths], {})  # type: ignore[arg-type]
    return [c["path"] for c in found]


def test_an_edit_put_back_byte_for_byte_is_no_conflict_and_any_real_change_is(tmp_path: Path) -> None:
    """The check compares contents (blake3), kind, mode and link target, never mtimes or inodes:
    a revert with a new mtime and inode passes; a same-size change whose mtime was set back
    (touch -d), a mode change and a retargeted link are still refused."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_bytes(b"hello\n")
    (ws / "run.sh").write_bytes(b"echo\n")
    (ws / "link").symlink_to("a.txt")
    journal = _Journal({p: _state(ws, p) for p in ("a.txt", "run.sh", "link")})
    paths = sorted(journal.states)
    before = (ws / "a.txt").stat()
    (ws / "a.txt").write_bytes(b"edited, then put back\n")
    (ws / "link").unlink()
    (ws / "link").symlink_to("run.sh")
    _put_back(ws / "a.txt", b"hello\n")
    (ws / "link").unlink()
    (ws / "link").symlink_to("a.txt")
    after = (ws / "a.txt").stat()
    assert (after.st_ino, after.st_mtime_ns) != (before.st_ino, before.st_mtime_ns)
    assert _live_conflicts(ws, journal, paths) == []
    (ws / "a.txt").write_bytes(b"HELLO\n")  # same size, the mtime set back as touch -d would
    os.utime(ws / "a.txt", ns=(after.st_atime_ns, after.st_mtime_ns))
    assert _live_conflicts(ws, journal, paths) == ["a.txt"]
    _put_back(ws / "a.txt", b"hello\n")
    os.chmod(ws / "run.sh", 0o755)  # the same bytes, executable now
    (ws / "link").unlink()
    (ws / "link").symlink_to("b.txt")
    assert _live_conflicts(ws, journal, paths) == ["link", "run.sh"]
