"""The helper's re-check of a capsule's exposed directories (sandbox/exposed.py): at create
each is resolved and held to check_expose_dir and the caller's access; at every exec again,
so a directory swapped for a key store since create refuses the exec."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox import access, exposed, mounts
from sandbox.errors import CcwError
from sandbox.homes import Home
from sandbox.meta import Capsule
from sandbox.spec import CapsuleSpec


@pytest.fixture
def helper_homes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home with toolchains and a key store, the helper's only login home (the caller: this uid)."""
    home = tmp_path / "home/ann"
    for tree in (".pyenv/versions/3.12.1/bin", ".nvm/versions/node/v20.1.0/bin", ".ssh", "proj/.venv"):
        (home / tree).mkdir(parents=True)
    monkeypatch.setattr("sandbox.homes.login_homes", lambda: (Home("ann", os.getuid(), str(home)),))
    monkeypatch.setattr(access, "host_uid", lambda uid: uid)
    return home


def test_helper_resolves_and_checks_each_expose(helper_homes: Path, tmp_path: Path) -> None:
    home = helper_homes
    prefix = home / ".pyenv/versions/3.12.1"
    (home / ".pyenv/versions/3.12").symlink_to(prefix)
    workspace = str(home / "proj")
    uid, gid = os.getuid(), os.getgid()
    # Kept where it was named (a link is where a venv looks), and bound from where it leads.
    link = f"{home}/.pyenv/versions/3.12"
    assert exposed.check((link, f"{link}/"), workspace, uid, gid) == (link,)
    capsule = Capsule("cap_1", str(tmp_path / "cap"), {}, CapsuleSpec(workspace=workspace, expose=(link,)))
    assert exposed.binds(capsule, uid, gid) == (mounts.Bind(str(prefix), link, exact=True),)
    # Where the jail would show it is held to the rule too: no toolchain at a key store's path.
    (home / ".ssh/tools").symlink_to(prefix)
    with pytest.raises(CcwError) as raised:
        exposed.check((f"{home}/.ssh/tools",), workspace, uid, gid)
    assert raised.value.code == "PERMISSION_DENIED"
    for path, code in ((f"{home}/.ssh", "PERMISSION_DENIED"), (str(home), "PERMISSION_DENIED"),
                       (f"{home}/proj/.venv", "INVALID_ARGUMENT"), (f"{home}/gone", "NOT_FOUND")):
        with pytest.raises(CcwError) as raised:
            exposed.check((path,), workspace, uid, gid)
        assert raised.value.code == code, path
    # A symlink to a key store is judged where it leads.
    (tmp_path / "innocent").symlink_to(home / ".ssh")
    with pytest.raises(CcwError) as raised:
        exposed.check((str(tmp_path / "innocent"),), workspace, uid, gid)
    assert raised.value.code == "PERMISSION_DENIED"


def test_helper_binds_again_at_exec_and_refuses_a_swapped_dir(helper_homes: Path, tmp_path: Path) -> None:
    home = helper_homes
    prefix = home / ".pyenv/versions/3.12.1"
    node = home / ".nvm/versions/node/v20.1.0"
    spec = CapsuleSpec(workspace=str(home / "proj"), expose=(str(node), str(prefix)))
    capsule = Capsule("cap_1", str(tmp_path / "cap"), {"owner_uid": os.getuid()}, spec)
    uid, gid = os.getuid(), os.getgid()
    assert exposed.binds(capsule, uid, gid) == (mounts.Bind(str(node), str(node), exact=True),
                                               mounts.Bind(str(prefix), str(prefix), exact=True))
    # A toolchain removed since create is left out (the command fails as on the host) ...
    os.rmdir(node / "bin")
    os.rmdir(node)
    assert exposed.binds(capsule, uid, gid) == (mounts.Bind(str(prefix), str(prefix), exact=True),)
    # ... and one replaced by a symlink to a key store refuses the exec.
    os.symlink(home / ".ssh", node)
    with pytest.raises(CcwError) as raised:
        exposed.binds(capsule, uid, gid)
    assert raised.value.code == "PERMISSION_DENIED"


def test_exposed_binds_are_planned_exact_and_pinned(tmp_path: Path) -> None:
    # An exact bind's source is the path the helper checked, not resolved again (a swap in
    # between would be followed), and the jail reaches it without following any symlink.
    merged, tmp, home = (tmp_path / name for name in ("merged", "tmp", "home"))
    binds = (mounts.Bind("/srv/tools/py", "/srv/tools/py", exact=True), mounts.Bind(str(tmp_path), "/g"))
    steps = mounts.prepare(merged_dir=str(merged), workspace="/ws", tmp_dir=str(tmp), home="/home/ccw",
                           home_dir=str(home), binds=binds)
    by_target = {step.target: step for step in steps if step.action == "bind"}
    assert (by_target["/srv/tools/py"].source, by_target["/srv/tools/py"].data) == (
        mounts.OLD_ROOT + "/srv/tools/py", "nofollow")
    assert by_target["/g"].data == ""
