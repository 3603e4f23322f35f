"""The conflict check of capsule_promote: live states read early (while the helper lists
changes) are used, and a path recorded after that early read is still checked."""

from __future__ import annotations

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
    assert found[0]["actual"] == _state(ws, "src/c") != found[0]["expected"]


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
