"""sandbox/access.py as root, for callers of another uid, whose rights a forked child checks as them.

A root helper creates capsules for callers of any uid.  ``pinned_lower`` must answer
"may this caller write the workspace (and read the base)?" with the caller's rights,
not root's: the helper pins the directory, forks, switches to the caller's uid, gid and
groups, opens the same path (so every ancestor is searched as the caller) and asks
``access()``.  A read-only mount counts for root too.  The private dirs each capsule
keeps are made here with the owners the checks allowed.  tests/test_access.py has the
checks that need no root.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox import access
from sandbox.errors import CcwError

OTHER = 47_312  # no account needed: the child sets the ids by number
GROUP = 47_313
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def public(root_required: None) -> Iterator[Path]:
    """A directory every user can search (pytest's tmp_path is 0700), with a state dir."""
    path = Path(tempfile.mkdtemp(prefix="ccw-access-"))
    path.chmod(0o755)
    (path / "state").mkdir(mode=0o700)
    yield path
    shutil.rmtree(path)


def _lower(workspace: Path, base: Path | None, uid: int, gid: int, public: Path) -> str:
    with access.pinned_lower(str(workspace), str(base) if base else None, uid, gid, str(public / "state")) as (_, real):
        return real


def _denied(call: Callable[[], object]) -> CcwError:
    with pytest.raises(CcwError) as caught:
        call()
    assert caught.value.code == "PERMISSION_DENIED", caught.value
    return caught.value


def test_another_uid_may_create_only_over_a_directory_it_can_write(public: Path) -> None:
    ws = public / "ws"
    ws.mkdir(mode=0o755)  # root's: root may write it, the caller may not
    error = _denied(lambda: _lower(ws, None, OTHER, OTHER, public))
    assert f"uid {OTHER} may not write" in error.message and error.details == {"path": str(ws)}
    assert _lower(ws, None, 0, 0, public) == str(ws)
    os.chown(ws, OTHER, OTHER)
    assert _lower(ws, None, OTHER, OTHER, public) == str(ws)


def test_every_ancestor_is_searched_with_the_callers_rights(public: Path) -> None:
    # The workspace is the caller's own, but it lies under a directory the caller cannot
    # search: root's path walk would reach it, the caller's does not.
    locked = public / "locked"
    locked.mkdir(mode=0o700)
    ws = locked / "ws"
    ws.mkdir(mode=0o755)
    os.chown(ws, OTHER, OTHER)
    _denied(lambda: _lower(ws, None, OTHER, OTHER, public))
    locked.chmod(0o711)  # search, not read: enough to reach it
    assert _lower(ws, None, OTHER, OTHER, public) == str(ws)


def test_the_callers_group_counts(public: Path) -> None:
    ws = public / "ws"
    ws.mkdir()
    os.chown(ws, 0, GROUP)
    ws.chmod(0o770)
    assert _lower(ws, None, OTHER, GROUP, public) == str(ws)
    _denied(lambda: _lower(ws, None, OTHER, OTHER, public))


def test_a_base_must_be_readable_by_the_caller(public: Path) -> None:
    base = public / "snapshot"
    base.mkdir(mode=0o700)
    gone = public / "no-workspace-here"  # a replay: the workspace is only where the base is shown
    error = _denied(lambda: _lower(gone, base, OTHER, OTHER, public))
    assert f"uid {OTHER} may not read" in error.message
    base.chmod(0o755)
    assert _lower(gone, base, OTHER, OTHER, public) == str(base)


def test_with_a_base_the_workspace_is_only_where_it_is_shown(public: Path) -> None:
    # A replay by another user of this host: the recorded workspace is there, the maker's,
    # and the caller may not write it; nothing is written there, so only the base's read counts.
    ws, base = public / "ws", public / "snapshot"
    ws.mkdir(mode=0o755)  # root's
    base.mkdir(mode=0o755)
    assert _lower(ws, base, OTHER, OTHER, public) == str(base)
    _denied(lambda: _lower(ws, None, OTHER, OTHER, public))  # without a base it is written: refused


def test_a_read_only_mount_refuses_even_root(public: Path) -> None:
    # access() asks the kernel, which knows the mount is read-only; a mode check would not.
    ws = public / "ws"
    ws.mkdir()
    subprocess.run(["mount", "--bind", str(ws), str(ws)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(ws)], check=True)
        error = _denied(lambda: _lower(ws, None, 0, 0, public))
        assert "uid 0 (root) may not write" in error.message and "make it writable" in error.message
    finally:
        subprocess.run(["umount", str(ws)], check=True)
    assert _lower(ws, None, 0, 0, public) == str(ws)


def test_a_shown_dir_must_be_readable_by_the_caller(public: Path) -> None:
    shown = public / "toolchain"
    shown.mkdir(mode=0o700)
    fd = os.open(shown, os.O_PATH | os.O_DIRECTORY)
    try:
        error = _denied(lambda: access.check_shown_dir("gitdir", fd, str(shown), OTHER, OTHER))
        assert f"uid {OTHER} may not read" in error.message
        shown.chmod(0o755)
        access.check_shown_dir("gitdir", fd, str(shown), OTHER, OTHER)
    finally:
        os.close(fd)


def test_the_private_dirs_are_a_sticky_tmp_and_the_callers_own_home(public: Path) -> None:
    root = public / "capsule"
    root.mkdir()
    access.make_private_dirs(str(root), OTHER, GROUP)
    tmp, home = os.stat(root / "tmp"), os.stat(root / "home")
    assert (stat.S_IMODE(tmp.st_mode), tmp.st_uid, tmp.st_gid) == (0o1777, 0, 0)
    assert (stat.S_IMODE(home.st_mode), home.st_uid, home.st_gid) == (0o700, OTHER, GROUP)
    with pytest.raises(FileExistsError):
        access.make_private_dirs(str(root), OTHER, GROUP)
    (root / "home" / "kept").write_text("x")  # a capsule's home survives the helper's restart
    access.make_private_dirs(str(root), OTHER, GROUP, exist_ok=True)
    assert (root / "home" / "kept").read_text() == "x"


# A rootless helper: the caller's own user namespace, in which it is 0 and root's files are 65534's.
ROOTLESS_REFUSAL = """
import json, os, sys
sys.path.insert(0, os.getcwd())
from sandbox import access, syscalls
from sandbox.errors import CcwError
uid, gid = os.getuid(), os.getgid()
syscalls.unshare(syscalls.CLONE_NEWUSER)
for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
    with open(f"/proc/self/{name}", "w") as f:
        f.write(text)
try:
    with access.pinned_lower(sys.argv[1], None, 0, 0, sys.argv[2]):
        print(json.dumps({"code": None}))
except CcwError as exc:
    print(json.dumps({"code": exc.code, "message": exc.message}))
"""


def test_a_rootless_refusal_names_the_caller_and_owner_as_the_host_knows_them(
        public: Path, run_as: Callable[..., Any]) -> None:
    ws = public / "rootrepo"
    ws.mkdir(mode=0o755)  # root's, as /srv/rootrepo was in the trial
    out = run_as(OTHER, OTHER, ROOTLESS_REFUSAL, str(ws), str(public / "state"), cwd=str(ROOT))
    assert out["code"] == "PERMISSION_DENIED", out
    # Not "uid 0": that is the caller inside its namespace; the owner is no one the namespace maps.
    assert out["message"].startswith(f"uid {OTHER} may not write {str(ws)!r}, owned by a user outside"), out
    assert "clone or copy it to a directory you own" in out["message"] and "chown" in out["message"]
