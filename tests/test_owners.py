"""Owners in witnesses (capsules/owners.py): the schema's bounds, the rebuild's chown, the replay report."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from mcp_server.capsules import owners
from mcp_server.capsules.replay import _rebuild_base
from mcp_server.core.witness_manifest import check
from mcp_server.fs.witness import blob_hash
from sandbox.errors import CcwError
from tests.support import witness_craft as craft

DATA = b"x = 1\n"
# Root gives files to another uid; anyone else can only "restore" its own.
OTHER = 1234 if os.geteuid() == 0 else os.getuid()


def _manifest(**owner: Any) -> dict[str, Any]:
    made = craft.manifest("/home/u/project", [], {"a.txt": b"a\n"})
    made["base"]["files"][0].update(owner)
    return made


@pytest.mark.parametrize("owner", [{"uid": 0, "gid": 0}, {"uid": (1 << 32) - 2, "gid": 1234}, {"uid": 5}, {}])
def test_owners_in_range_pass(owner: dict[str, int]) -> None:
    check(_manifest(**owner))


@pytest.mark.parametrize("owner", [{"uid": -1}, {"gid": (1 << 32) - 1}, {"uid": 1.0}, {"gid": True}, {"uid": "0"},
                                   {"uid": None}])
def test_owners_out_of_range_or_not_integers_are_refused(owner: dict[str, Any]) -> None:
    with pytest.raises(CcwError) as refused:
        check(_manifest(**owner))
    assert refused.value.code == "INVALID_ARGUMENT" and "/base/files/0/" in refused.value.message


def test_a_root_rebuild_gives_each_entry_its_owner_never_through_a_link(tmp_path: Path) -> None:
    into, outside = tmp_path / "base", tmp_path / "outside"
    into.mkdir()
    outside.write_text("host file\n")
    before = outside.stat()
    entries = [
        {"path": "pkg", "type": "dir", "mode": 0o555, "uid": OTHER, "gid": OTHER},
        {"path": "pkg/mod.py", "type": "file", "mode": 0o2755, "blob": blob_hash(DATA), "uid": OTHER, "gid": OTHER},
        {"path": "pkg/out", "type": "symlink", "mode": 0o777, "target": str(outside), "uid": OTHER, "gid": OTHER},
        {"path": "plain.txt", "type": "file", "mode": 0o644, "blob": blob_hash(DATA)},
    ]
    _rebuild_base({"base": {"files": entries}}, {blob_hash(DATA): DATA}, str(into))
    for rel in ("pkg", "pkg/mod.py", "pkg/out"):
        got = os.lstat(into / rel)
        assert (got.st_uid, got.st_gid) == (OTHER, OTHER), rel
    assert (into / "pkg/mod.py").stat().st_mode & 0o7777 == 0o2755  # chown cleared set-group-ID; set again
    assert (into / "pkg").stat().st_mode & 0o777 == 0o555
    assert (into / "plain.txt").stat().st_uid == os.geteuid()  # recorded no owner: the replayer's
    after = outside.stat()
    assert (after.st_uid, after.st_gid, after.st_mode) == (before.st_uid, before.st_gid, before.st_mode)


def test_the_report_counts_and_says_why_not(monkeypatch: pytest.MonkeyPatch) -> None:
    entries = [{"path": "a", "type": "dir", "mode": 0o755, "uid": 1234, "gid": 1234},
               {"path": "a/b", "type": "file", "mode": 0o644, "blob": blob_hash(DATA), "uid": 0, "gid": 0},
               {"path": "old", "type": "file", "mode": 0o644, "blob": blob_hash(DATA)}]
    monkeypatch.setattr(owners.os, "geteuid", lambda: 0)
    assert owners.report(entries, rebuilt=True) == {"recorded": 2, "restored": 2, "reason": None}
    live = owners.report(entries, rebuilt=False)
    assert live["restored"] == 0 and "live directory" in str(live["reason"])
    monkeypatch.setattr(owners.os, "geteuid", lambda: 1234)
    monkeypatch.setattr(owners.os, "getegid", lambda: 1234)
    user = owners.report(entries, rebuilt=True)  # a/ is its own already; a/b is root's
    assert user["restored"] == 1 and "uid 1234, not root" in str(user["reason"])
    assert owners.report(entries[:1], rebuilt=True) == {"recorded": 1, "restored": 1, "reason": None}
    assert owners.report(entries[2:], rebuilt=True) == {"recorded": 0, "restored": 0, "reason": None}


def test_the_top_is_restored_as_an_entry_its_mode_set_last(tmp_path: Path) -> None:
    into = tmp_path / "base"
    into.mkdir(0o755)
    entries = [{"path": "pkg", "type": "dir", "mode": 0o755, "uid": OTHER, "gid": OTHER},
               {"path": "pkg/mod.py", "type": "file", "mode": 0o644, "blob": blob_hash(DATA),
                "uid": OTHER, "gid": OTHER}]
    # Read-only: were it set before the entries, a replayer that is not root could not create them.
    top = {"mode": 0o2551, "uid": OTHER, "gid": OTHER}
    _rebuild_base({"base": {"files": entries, "top": top}}, {blob_hash(DATA): DATA}, str(into))
    got = into.stat()
    assert (got.st_uid, got.st_gid, got.st_mode & 0o7777) == (OTHER, OTHER, 0o2551)
    assert (into / "pkg/mod.py").read_bytes() == DATA
    into.chmod(0o755)  # for tmp_path's removal


def test_a_witness_without_a_recorded_top_leaves_the_top_the_replayers(tmp_path: Path) -> None:
    into = tmp_path / "base"
    into.mkdir(0o755)
    before = into.stat()
    entries = [{"path": "a.txt", "type": "file", "mode": 0o644, "blob": blob_hash(DATA), "uid": OTHER, "gid": OTHER}]
    _rebuild_base({"base": {"files": entries}}, {blob_hash(DATA): DATA}, str(into))
    after = into.stat()
    assert (after.st_uid, after.st_gid, after.st_mode) == (before.st_uid, before.st_gid, before.st_mode)
    assert owners.entries({"files": entries}) == entries


def test_the_top_counts_in_the_report_as_one_more_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    base = {"files": [{"path": "a", "type": "file", "mode": 0o644, "blob": blob_hash(DATA), "uid": 1234, "gid": 1234}],
            "top": {"mode": 0o755, "uid": 0, "gid": 0}}
    assert owners.entries(base)[-1] == {"path": ".", "type": "dir", "mode": 0o755, "uid": 0, "gid": 0}
    monkeypatch.setattr(owners.os, "geteuid", lambda: 0)
    assert owners.report(owners.entries(base), rebuilt=True) == {"recorded": 2, "restored": 2, "reason": None}
    live = owners.report(owners.entries(base), rebuilt=False)  # a live base: nothing rebuilt, nothing restored
    assert (live["recorded"], live["restored"]) == (2, 0) and "live directory" in str(live["reason"])
    monkeypatch.setattr(owners.os, "geteuid", lambda: 1234)
    monkeypatch.setattr(owners.os, "getegid", lambda: 1234)
    user = owners.report(owners.entries(base), rebuilt=True)  # a is its own already; the top is root's
    assert (user["recorded"], user["restored"]) == (2, 1) and "not root" in str(user["reason"])
