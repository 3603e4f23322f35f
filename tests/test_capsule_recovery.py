"""sandbox/recovery.py and capsule_mounts.remove on a capsules dir built by hand: what a dead
helper left is taken back or removed, with nothing mounted (no root needed)."""

from __future__ import annotations

import os
from pathlib import Path

from sandbox import capsule_mounts, meta, recovery
from sandbox.spec import CapsuleSpec

KEPT, FORK, ORPHAN, BROKEN = (f"cap_0000000000001_0000000{n}" for n in range(4))


def _capsule(capsules: Path, capsule_id: str, parent: str | None, workspace: Path) -> None:
    root = capsules / capsule_id
    (root / "upper").mkdir(parents=True)
    lowers = [str(workspace)] if parent is None else [str(capsules / parent / "upper"), str(workspace)]
    record = {"capsule_id": capsule_id, "owner_uid": os.getuid(), "owner_gid": os.getgid(), "lowers": lowers,
              "ancestors": [] if parent is None else [parent], "parent": parent, "disk_mb": None,
              "created_at": "2026-01-01T00:00:00Z"}
    meta.save(str(root / "meta.json"), record, CapsuleSpec.from_json({"workspace": str(workspace)}))


def test_recovery_keeps_whole_capsules_and_removes_the_rest(tmp_path: Path) -> None:
    capsules, workspace = tmp_path / "capsules", tmp_path / "w"
    workspace.mkdir()
    _capsule(capsules, KEPT, None, workspace)
    _capsule(capsules, FORK, KEPT, workspace)
    _capsule(capsules, ORPHAN, "cap_0000000000000_00000009", workspace)  # its parent is gone
    (capsules / BROKEN).mkdir()  # no meta.json
    for half_made in (".new-cap_x", ".dead-cap_y"):
        (capsules / half_made / "upper").mkdir(parents=True)
    (capsules / "not-ours").mkdir()

    found, removed = recovery.recover_capsules(str(capsules), rootless=True)

    assert sorted(found) == [KEPT, FORK]
    assert found[KEPT].children == {FORK} and not found[FORK].children
    assert not any(capsule.mounted for capsule in found.values())
    assert sorted(removed) == sorted([".new-cap_x", ".dead-cap_y", ORPHAN, BROKEN])
    assert sorted(os.listdir(capsules)) == sorted([KEPT, FORK, "not-ours"])
    for capsule_id in (KEPT, FORK):  # the mount point and the overlay's work dir, made again
        assert (capsules / capsule_id / "merged").is_dir() and (capsules / capsule_id / "work").is_dir()


def test_remove_goes_through_a_dead_name_and_leaves_nothing(tmp_path: Path) -> None:
    capsules = tmp_path / "capsules"
    root = capsules / KEPT
    (root / "upper" / "deep").mkdir(parents=True)
    (root / "upper" / "deep" / "file").write_text("x")
    capsule_mounts.remove(str(capsules), str(root), KEPT)
    assert os.listdir(capsules) == []
    capsule_mounts.remove(str(capsules), str(root), KEPT)  # already gone: nothing to do
    assert os.listdir(capsules) == []


def test_the_ids_recovery_knows_are_the_ones_the_helper_makes() -> None:
    assert recovery.ID_RE.fullmatch(KEPT)
    assert not recovery.ID_RE.fullmatch("cap_1_0") and not recovery.ID_RE.fullmatch(".new-" + KEPT)
