"""sandbox/access.py, the helper's re-checks, as the registry calls them (no root needed).

The registry asks, for every request: are the caller's ids ones the kernel can hold
(``check_uid_gid``), is the capsule the caller's (``check_owner``), is a directory
argument absolute and outside the helper's state dir (``check_dir_arg``), and, at
create, may the caller use the directory it named, pinned by a descriptor, and where
does it really lead (``pinned_lower``).  Here the caller is this test's own uid, which
``access()`` answers directly; vm-tests/test_access.py checks another uid's rights in
the forked child, and the private dirs, as root.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox import access, hostdirs
from sandbox.errors import CcwError
from sandbox.meta import Capsule
from sandbox.spec import CapsuleSpec
from tests.support.descriptors import naming_under

UID, GID = os.getuid(), os.getgid()


def test_a_rootless_helper_s_caller_is_its_user_on_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    # A rootless helper maps its one user to 0: the rule on capsule directories must see
    # alice (1000), whose own home holds her projects, not root, for whom it is another's.
    monkeypatch.setattr(access.namespaces, "read_id_maps", lambda: ([(0, 1000, 1)], [(0, 1000, 1)]))
    assert access.host_uid(0) == 1000
    assert access.host_uid(65534) == 65534  # unmapped: the overflow uid, which the server refuses anyway
    monkeypatch.setattr(access.namespaces, "read_id_maps", lambda: ([(0, 0, 4294967295)], [(0, 0, 4294967295)]))
    assert access.host_uid(0) == 0 and access.host_uid(1000) == 1000


@pytest.mark.parametrize("uid", [-1, 2**32 - 1, 2**32, True, "0", 1.0, None])
def test_ids_the_kernel_cannot_hold_are_refused(uid: object) -> None:
    # (uid_t)-1 means "unchanged" to setresuid: a caller must never be able to ask for it.
    with pytest.raises(CcwError) as caught:
        access.check_uid_gid(uid, 0)
    assert caught.value.code == "INVALID_ARGUMENT" and "uid must be an integer" in caught.value.message
    with pytest.raises(CcwError, match="gid must be an integer"):
        access.check_uid_gid(0, uid)
    access.check_uid_gid(0, 0)
    access.check_uid_gid(2**32 - 2, 2**32 - 2)


def test_a_capsule_is_its_owners_alone_root_included() -> None:
    capsule = Capsule(capsule_id="c-1", root="/state/capsules/c-1", meta={"owner_uid": 1000},
                      spec=CapsuleSpec(workspace="/ws"))
    access.check_owner(capsule, 1000)
    for other in (0, 1001):
        with pytest.raises(CcwError) as caught:
            access.check_owner(capsule, other)
        assert caught.value.code == "PERMISSION_DENIED"
        assert caught.value.details == {"capsule_id": "c-1"}


def test_a_directory_argument_is_absolute_normalised_and_outside_the_state_dir() -> None:
    state = "/var/lib/ccw"
    assert access.check_dir_arg("workspace", "/srv//proj/./a/../b/", state) == "/srv/proj/b"
    assert access.check_dir_arg("workspace", "//srv/proj", state) == "/srv/proj"  # POSIX's // is /
    # The state dir inside the workspace is allowed (./.ccw-state in a repo).
    assert access.check_dir_arg("workspace", "/var/lib", state) == "/var/lib"
    for inside in ("/var/lib/ccw", "/var/lib/ccw/capsules/x", "/var/lib/ccw/other/../capsules"):
        with pytest.raises(CcwError) as caught:
            access.check_dir_arg("workspace", inside, state)
        assert caught.value.code == "INVALID_ARGUMENT" and "inside the helper's state dir" in caught.value.message
    with pytest.raises(CcwError) as caught:
        access.check_dir_arg("workspace", "relative/dir", state)
    assert caught.value.code == "INVALID_ARGUMENT"
    # A base may be a snapshot the state dir keeps, but never a capsule's own dirs.
    assert (access.check_dir_arg("base", "/var/lib/ccw/snapshots/s1", state, allow_state=True)
            == "/var/lib/ccw/snapshots/s1")
    with pytest.raises(CcwError, match="capsules"):
        access.check_dir_arg("base", "/var/lib/ccw/capsules/c-1/upper", state, allow_state=True)


def test_the_lower_dir_is_pinned_and_reported_as_resolved(tmp_path: Path) -> None:
    workspace, state = tmp_path / "ws", tmp_path / "state"
    workspace.mkdir()
    state.mkdir()
    (tmp_path / "link").symlink_to(workspace)
    with access.pinned_lower(str(tmp_path / "link"), None, UID, GID, str(state)) as (fd, real):
        assert real == str(workspace)  # the symlink followed, from the descriptor
        assert os.readlink(f"/proc/self/fd/{fd}") == str(workspace)
        assert os.path.samestat(os.fstat(fd), os.stat(workspace))
        assert naming_under(tmp_path)  # what it holds is seen by the check below
    assert naming_under(tmp_path) == {}  # both descriptors closed after


def test_a_symlink_into_the_state_dir_is_refused_as_resolved(tmp_path: Path) -> None:
    # The argument passes check_dir_arg (it is not under the state dir by name); where it
    # leads is checked again from the pinned descriptor.
    state = tmp_path / "state"
    (state / "capsules" / "c-1").mkdir(parents=True)
    (tmp_path / "innocent").symlink_to(state / "capsules" / "c-1")
    with pytest.raises(CcwError) as caught, \
            access.pinned_lower(str(tmp_path / "innocent"), None, UID, GID, str(state)):
        pass
    assert caught.value.code == "INVALID_ARGUMENT" and "state dir" in caught.value.message
    assert naming_under(tmp_path) == {}  # what it opened to look is closed


def test_a_base_is_the_lower_dir_and_the_workspace_may_be_gone(tmp_path: Path) -> None:
    # A replay elsewhere: the workspace is only where the jail shows the base.
    base, state = tmp_path / "snapshot", tmp_path / "state"
    base.mkdir()
    state.mkdir()
    with access.pinned_lower(str(tmp_path / "no-such-ws"), str(base), UID, GID, str(state)) as (fd, real):
        assert real == str(base) and os.path.samestat(os.fstat(fd), os.stat(base))
    # Without a base the workspace must exist, and be a directory.
    with (pytest.raises(CcwError) as caught,
          access.pinned_lower(str(tmp_path / "no-such-ws"), None, UID, GID, str(state))):
        pass
    assert caught.value.code == "NOT_FOUND" and "must be an existing directory" in caught.value.message
    (tmp_path / "file").write_text("x")
    with (pytest.raises(CcwError, match="ENOTDIR"),
          access.pinned_lower(str(tmp_path / "file"), None, UID, GID, str(state))):
        pass


def test_a_directory_that_would_show_the_hosts_secrets_is_refused(tmp_path: Path) -> None:
    # hostdirs.check_capsule_dir, as resolved: / by a symlink is still /.
    (tmp_path / "root").symlink_to("/")
    with pytest.raises(CcwError) as caught, \
            access.pinned_lower(str(tmp_path / "root"), None, UID, GID, str(tmp_path / "state")):
        pass
    assert caught.value.code == "PERMISSION_DENIED"
    assert caught.value.details["path"] == "/"


def test_a_shown_dir_must_pass_the_expose_rule_and_be_readable(tmp_path: Path) -> None:
    shown = tmp_path / "toolchain"
    shown.mkdir()
    fd = os.open(shown, os.O_PATH | os.O_DIRECTORY)
    try:
        access.check_shown_dir("expose", fd, str(shown), UID, GID)
    finally:
        os.close(fd)
    fd = os.open("/etc", os.O_PATH | os.O_DIRECTORY)
    try:
        with pytest.raises(CcwError) as caught:
            access.check_shown_dir("expose", fd, "/etc", UID, GID)
        assert caught.value.code == "PERMISSION_DENIED"
    finally:
        os.close(fd)


def test_a_refusal_names_the_caller_the_owner_and_the_ways_forward() -> None:
    # Root (0) is in every /etc/passwd; 47_399 is in none.
    other = hostdirs.refusal("/srv/rootrepo", 47_399, 0, "write")
    assert other.code == "PERMISSION_DENIED" and other.details == {"path": "/srv/rootrepo"}
    assert other.message.startswith("uid 47399 may not write '/srv/rootrepo', owned by uid 0 (root); ")
    assert "clone or copy it to a directory you own" in other.message and "chown" in other.message
    unseen = hostdirs.refusal("/srv/rootrepo", 47_399, None, "write")  # a rootless helper sees no owner
    assert "owned by a user outside the rootless helper's user namespace" in unseen.message
    own = hostdirs.refusal("/ro", 0, 0, "write")
    assert own.message.startswith("uid 0 (root) may not write '/ro', owned by uid 0 (root); ")
    assert "make it writable" in own.message and "clone" not in own.message
    base = hostdirs.refusal("/snap", 47_399, 0, "read")
    assert "have its owner give you read access" in base.message
