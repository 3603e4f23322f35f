"""upperscan.collect_changes and friends on fake upper/lower dirs built by hand (no mount, no root).

Whiteouts are char 0:0 devices, which unprivileged users may create since Linux 5.8;
opaque dirs use ``user.overlay.opaque`` (the userxattr spelling), which a file's owner
may set without privileges.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sandbox import checks, execution, mountinfo, overlay, recovery, spec, upperscan
from sandbox.errors import CcwError
from sandbox.manager import CapsuleManager
from sandbox.replies import Change, ListReply
from sandbox.spec import CapsuleSpec


def whiteout(path: Path) -> None:
    os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(0, 0))


def opaque(path: Path) -> None:
    os.setxattr(path, "user.overlay.opaque", b"y")


def write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


@pytest.fixture
def layers(tmp_path: Path) -> tuple[Path, Path]:
    lower, upper = tmp_path / "lower", tmp_path / "upper"
    lower.mkdir()
    upper.mkdir()
    write(lower / "keep.txt", "keep")
    write(lower / "mod.txt", "old")
    write(lower / "same.txt", "same")
    write(lower / "chmod.txt", "bits")
    write(lower / "gone.txt", "bye")
    write(lower / "gonedir" / "inner.txt", "x")
    write(lower / "opq" / "old.txt", "o")
    write(lower / "f2d", "file")
    write(lower / "f2s", "file")
    write(lower / "d2f" / "x", "x")
    write(lower / "deep" / "er" / "x.txt", "x")
    os.symlink("keep.txt", lower / "link")
    os.symlink("keep.txt", lower / "samelink")
    return lower, upper


def kinds(changes: list[Change]) -> dict[str, dict[str, object]]:
    return {c.path: c.to_args() for c in changes}


def test_every_kind_of_change(layers: tuple[Path, Path]) -> None:
    lower, upper = layers
    write(upper / "added.txt", "new!")
    write(upper / "mod.txt", "new")
    write(upper / "same.txt", "same")  # copied up, bytes and mode equal: not a change
    write(upper / "chmod.txt", "bits", 0o600)
    whiteout(upper / "gone.txt")
    whiteout(upper / "gonedir")
    (upper / "opq").mkdir()
    opaque(upper / "opq")
    write(upper / "opq" / "fresh.txt", "f")
    (upper / "f2d").mkdir()
    opaque(upper / "f2d")
    os.symlink("../elsewhere", upper / "f2s")
    write(upper / "d2f", "now a file")
    os.symlink("mod.txt", upper / "link")
    os.symlink("keep.txt", upper / "samelink")
    write(upper / "deep" / "er" / "new.txt", "n")  # deep/ and deep/er/ copied up only
    write(upper / "newdir" / "a" / "b.txt", "b")
    whiteout(upper / "never-existed")  # a whiteout over nothing says nothing

    found = kinds(upperscan.collect_changes(str(upper), [str(lower)]))
    assert found == {
        "added.txt": {"path": "added.txt", "kind": "added", "type": "file", "mode": 0o644, "size": 4},
        "chmod.txt": {"path": "chmod.txt", "kind": "mode_changed", "type": "file", "mode": 0o600, "size": 4},
        "d2f": {"path": "d2f", "kind": "type_changed", "type": "file", "mode": 0o644, "size": 10},
        "deep/er/new.txt": {"path": "deep/er/new.txt", "kind": "added", "type": "file", "mode": 0o644, "size": 1},
        "f2d": {"path": "f2d", "kind": "type_changed", "type": "dir", "mode": 0o755},
        "f2s": {"path": "f2s", "kind": "type_changed", "type": "symlink", "target": "../elsewhere"},
        "gone.txt": {"path": "gone.txt", "kind": "deleted", "type": "file"},
        "gonedir": {"path": "gonedir", "kind": "deleted", "type": "dir"},
        "link": {"path": "link", "kind": "modified", "type": "symlink", "target": "mod.txt"},
        "mod.txt": {"path": "mod.txt", "kind": "modified", "type": "file", "mode": 0o644, "size": 3},
        "newdir": {"path": "newdir", "kind": "added", "type": "dir", "mode": 0o755},
        "newdir/a": {"path": "newdir/a", "kind": "added", "type": "dir", "mode": 0o755},
        "newdir/a/b.txt": {"path": "newdir/a/b.txt", "kind": "added", "type": "file", "mode": 0o644, "size": 1},
        "opq": {"path": "opq", "kind": "opaque", "type": "dir", "mode": 0o755},
        "opq/fresh.txt": {"path": "opq/fresh.txt", "kind": "added", "type": "file", "mode": 0o644, "size": 1},
    }


def test_sorted_by_path_bytes(tmp_path: Path) -> None:
    lower, upper = tmp_path / "l", tmp_path / "u"
    lower.mkdir()
    for name in ("b", "a-b", "a/z", "a.x", "B", "é"):
        write(upper / name, "x")
    paths = [c.path for c in upperscan.collect_changes(str(upper), [str(lower)])]
    assert paths == sorted(paths, key=os.fsencode)
    assert paths == ["B", "a", "a-b", "a.x", "a/z", "b", "é"]


def test_symlink_is_never_followed(tmp_path: Path) -> None:
    lower, upper = tmp_path / "l", tmp_path / "u"
    lower.mkdir()
    upper.mkdir()
    os.symlink("/etc/shadow", upper / "evil")
    os.symlink("/", upper / "rootlink")
    found = kinds(upperscan.collect_changes(str(upper), [str(lower)]))
    assert found["evil"] == {"path": "evil", "kind": "added", "type": "symlink", "target": "/etc/shadow"}
    assert set(found) == {"evil", "rootlink"}  # nothing from behind the link


def test_dir_mode_change_and_same_size_different_bytes(layers: tuple[Path, Path]) -> None:
    lower, upper = layers
    (upper / "opq").mkdir()
    (upper / "opq").chmod(0o700)
    write(upper / "keep.txt", "KEEP")  # same size, other bytes
    found = kinds(upperscan.collect_changes(str(upper), [str(lower)]))
    assert found["opq"]["kind"] == "mode_changed" and found["opq"]["mode"] == 0o700
    assert found["keep.txt"]["kind"] == "modified"


def test_fork_layers_compose(layers: tuple[Path, Path], tmp_path: Path) -> None:
    lower, parent = layers
    child = tmp_path / "child"
    child.mkdir()
    write(parent / "p.txt", "parent added")
    write(parent / "mod.txt", "parent")
    whiteout(parent / "gone.txt")
    write(parent / "pdir" / "x", "x")
    # the child deletes what the parent added, restores nothing, adds its own
    whiteout(child / "p.txt")
    write(child / "c.txt", "child")
    (child / "pdir").mkdir()
    opaque(child / "pdir")  # replaced a dir that exists only in the parent
    write(child / "pdir" / "y", "y")
    found = kinds(upperscan.collect_changes([str(child), str(parent)], [str(lower)]))
    assert sorted(found) == ["c.txt", "gone.txt", "mod.txt", "pdir", "pdir/y"]
    assert found["pdir"]["kind"] == "added"  # relative to the base, which never had it
    assert found["gone.txt"]["kind"] == "deleted"
    # the parent alone still reports its own view
    assert sorted(kinds(upperscan.collect_changes(str(parent), [str(lower)]))) == [
        "gone.txt", "mod.txt", "p.txt", "pdir", "pdir/x"]


def test_opaque_in_parent_hides_base_for_child(layers: tuple[Path, Path], tmp_path: Path) -> None:
    lower, parent = layers
    child = tmp_path / "child"
    child.mkdir()
    (parent / "opq").mkdir()
    opaque(parent / "opq")
    write(child / "opq" / "c.txt", "c")  # child's dir is a plain copy-up of the parent's
    found = kinds(upperscan.collect_changes([str(child), str(parent)], [str(lower)]))
    assert found["opq"]["kind"] == "opaque"
    assert found["opq/c.txt"]["kind"] == "added"


def test_entries_under_a_base_file_or_a_second_lower_are_looked_up_per_directory(
        layers: tuple[Path, Path], tmp_path: Path) -> None:
    """collect_changes looks entries up through each lower's directory, opened once: a directory the
    capsule made where the base has a file holds only added entries (the file hides the rest of the
    stack, as ENOTDIR stops lower_lookup), and a lower that lacks a directory hands its names on to
    the next, whose files are compared byte for byte."""
    lower, upper = layers
    second = tmp_path / "second"
    write(second / "only" / "same.txt", "same")
    write(second / "only" / "other.txt", "abc")
    write(second / "f2d" / "hidden.txt", "never seen")
    (upper / "f2d").mkdir()
    write(upper / "f2d" / "hidden.txt", "new")
    write(upper / "only" / "same.txt", "same")  # copied up, bytes unchanged: not listed
    write(upper / "only" / "other.txt", "xyz")  # same size, other bytes
    found = kinds(upperscan.collect_changes([str(upper)], [str(lower), str(second)]))
    assert found == {
        "f2d": {"path": "f2d", "kind": "type_changed", "type": "dir", "mode": found["f2d"]["mode"]},
        "f2d/hidden.txt": {"path": "f2d/hidden.txt", "kind": "added", "type": "file", "mode": 0o644, "size": 3},
        "only/other.txt": {"path": "only/other.txt", "kind": "modified", "type": "file", "mode": 0o644, "size": 3},
    }, found


def test_lower_lookup_and_signature(layers: tuple[Path, Path]) -> None:
    lower, upper = layers
    whiteout(upper / "keep.txt")
    assert overlay.lower_lookup([str(upper), str(lower)], "keep.txt") is None
    assert overlay.lower_lookup([str(upper), str(lower)], "mod.txt") is not None
    assert overlay.lower_lookup([str(lower)], "keep.txt/under") is None
    before = execution.upper_signature(str(upper))
    write(upper / "deep" / "new.txt", "n")
    after = execution.upper_signature(str(upper))
    moved = execution.upper_diff(before, after, [str(lower)])
    assert moved == ["deep/new.txt"]  # deep/ exists below: a copy-up, not a creation
    (upper / "brandnew").mkdir()
    os.unlink(upper / "keep.txt")
    again = execution.upper_signature(str(upper))
    assert execution.upper_diff(after, again, [str(lower)]) == ["brandnew", "keep.txt"]


def test_parse_mountinfo_unescapes() -> None:
    text = (
        "36 35 98:0 /mnt1 /mnt/with\\040space rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n"
        "40 27 0:39 / /st/capsules/cap_1/merged rw,relatime shared:5 - overlay ccw rw,lowerdir+=/w\n"
        "garbage line\n"
    )
    assert [(m.mount_point, m.fstype) for m in mountinfo.parse(text)] == [
        ("/mnt/with space", "ext3"), ("/st/capsules/cap_1/merged", "overlay")]


def test_option_escaping_for_mount2() -> None:
    assert overlay._escape_option("/a,b:c\\d", ":,") == "/a\\,b\\:c\\\\d"


def test_ids_are_unique_and_sorted(state_dir: Path) -> None:
    manager = CapsuleManager(str(state_dir), rootless=True)
    ids = [manager._new_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    assert all(recovery.ID_RE.fullmatch(i) for i in ids)


def test_argument_checks() -> None:
    for bad_argv in ([], ["a\0b"], "ls", [1]):
        with pytest.raises(CcwError):
            checks.argv("argv", bad_argv)
    assert spec.resolve_cwd(None, "/w") == "/w"
    assert spec.resolve_cwd("sub/../x", "/w") == "/w/x"
    with pytest.raises(CcwError):
        spec.resolve_cwd("../../etc", "/w")
    with pytest.raises(CcwError):
        checks.limits("limits", {"memory_mb": 0})
    with pytest.raises(CcwError):
        checks.limits("limits", {"disk": 1})
    assert CapsuleSpec.from_json({"workspace": "/w", "env_whitelist": ["B", "A", "B"]}).env_whitelist == ("A", "B")


def test_create_refuses_bad_workspaces(state_dir: Path, tmp_path: Path) -> None:
    manager = CapsuleManager(str(state_dir), rootless=True)
    uid, gid = os.getuid(), os.getgid()
    for bad in ("relative/path", str(state_dir), str(state_dir / "capsules"), "/nonexistent/ccw"):
        with pytest.raises(CcwError) as err:
            manager.create(uid, gid, CapsuleSpec.from_json({"workspace": bad}))
        assert err.value.code in ("INVALID_ARGUMENT", "NOT_FOUND"), bad
    with pytest.raises(CcwError) as err:  # / holds every system directory (hostdirs.check_capsule_dir)
        manager.create(uid, gid, CapsuleSpec.from_json({"workspace": "/"}))
    assert err.value.code == "PERMISSION_DENIED" and "contains /etc" in err.value.message
    (tmp_path / "file").write_text("x")
    with pytest.raises(CcwError) as err:
        manager.create(uid, gid, CapsuleSpec.from_json({"workspace": str(tmp_path / "file")}))
    assert err.value.code == "NOT_FOUND"
    with pytest.raises(CcwError) as err:
        manager.create(uid, gid, CapsuleSpec.from_json({"workspace": str(tmp_path), "env_whitelist": ["NOT A NAME"]}))
    assert err.value.code == "INVALID_ARGUMENT"
    # a symlink that leads into the state dir is refused after resolution
    os.symlink(state_dir, tmp_path / "sneaky")
    with pytest.raises(CcwError) as err:
        manager.create(uid, gid, CapsuleSpec.from_json({"workspace": str(tmp_path / "sneaky")}))
    assert err.value.code == "INVALID_ARGUMENT"
    assert os.listdir(state_dir / "capsules") == []


def test_unknown_and_malformed_ids(state_dir: Path) -> None:
    manager = CapsuleManager(str(state_dir), rootless=True)
    with pytest.raises(CcwError) as err:
        manager.changes("cap_0000000000000_00000000", os.getuid())
    assert err.value.code == "NOT_FOUND"
    with pytest.raises(CcwError) as err:
        manager.destroy("../../etc", os.getuid())
    assert err.value.code == "INVALID_ARGUMENT"
    assert manager.list(os.getuid()) == ListReply(())
