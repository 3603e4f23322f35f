"""sandbox/idmap.py on the real kernel: the host's trees shown through a namespace that maps only root.

What a root caller's jail gets (vm-tests/test_devmachine_owners.py runs the jail itself):
the helper's own root, holding every capability, is refused another user's private file
through the root tree and the host binds made for such a jail, while root's own files read
as before; a host tree whose filesystem takes no idmap fails the exec naming itself, and an
exposed one is refused when the capsule is made.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox import idmap, in_force, mounts, mounttree, syscalls
from sandbox.errors import CcwError

OTHER = 4321


@pytest.fixture
def mapping(root_required: None) -> int:
    made = idmap.host_trees()
    assert made is not None, idmap.why_not()
    return made


@pytest.fixture
def private_dir() -> Iterator[Path]:
    """Another uid's 0700 directory under /opt holding a 0600 file, and a root-owned 0600 file beside it."""
    top = Path(tempfile.mkdtemp(prefix="ccw-idmap-", dir="/opt"))
    try:
        top.chmod(0o755)
        (top / "theirs").mkdir(mode=0o700)
        (top / "theirs" / "secret").write_text("theirs\n")
        (top / "theirs" / "secret").chmod(0o600)
        for path in (top / "theirs", top / "theirs" / "secret"):
            os.chown(path, OTHER, OTHER)
        (top / "roots").write_text("root's\n")
        (top / "roots").chmod(0o600)
        yield top
    finally:
        shutil.rmtree(top)


def _read(tree: int, rel: str) -> str:
    fd = os.open(rel, os.O_RDONLY | os.O_CLOEXEC, dir_fd=tree)
    try:
        return os.read(fd, 100).decode()
    finally:
        os.close(fd)


def test_the_root_tree_shows_other_users_files_unmapped(mapping: int, private_dir: Path) -> None:
    rel = f"opt/{private_dir.name}"
    assert _read(syscalls.AT_FDCWD, f"/{rel}/theirs/secret") == "theirs\n"  # we are root, with every capability
    plain, mapped = mounts.build_root(), mounts.build_root(mapping)
    try:
        assert _read(plain, f"{rel}/theirs/secret") == "theirs\n"  # as the jail's four passed it before
        with pytest.raises(PermissionError):
            _read(mapped, f"{rel}/theirs/secret")
        with pytest.raises(PermissionError):
            os.listdir(os.open(f"{rel}/theirs", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=mapped))
        assert os.stat(f"{rel}/theirs", dir_fd=mapped).st_uid == 65534
        assert _read(mapped, f"{rel}/roots") == "root's\n"  # root's own, by its owner bits
        assert os.stat("etc/passwd", dir_fd=mapped).st_uid == 0  # /etc: an overlay over an idmapped layer
        assert _read(mapped, "etc/shadow") == ""  # the mask over it, as ever
    finally:
        os.close(plain)
        os.close(mapped)


def test_a_host_bind_is_idmapped_and_a_capsule_bind_is_not(mapping: int, private_dir: Path) -> None:
    theirs = str(private_dir / "theirs")
    steps = [mounts.MountStep("bind", "/shown", mounts.OLD_ROOT + theirs, host_tree=True),
             mounts.MountStep("bind", "/own", mounts.OLD_ROOT + theirs)]
    placed, fds = mounts.detach_sources(steps, 10, mapping)
    try:
        assert [step.source for step in placed] == ["10", "11"] and all(step.from_fd for step in placed)
        with pytest.raises(PermissionError):
            _read(fds[0], "secret")
        assert _read(fds[1], "secret") == "theirs\n"  # a capsule's own tree keeps the four's reach
    finally:
        for fd in fds:
            os.close(fd)


def test_a_host_tree_that_takes_no_idmap_names_itself(mapping: int) -> None:
    # sysfs has no idmapped mounts (nor have NFS or FUSE): refused whole, the bind named.
    steps = [mounts.MountStep("bind", "/opt/toolchain", mounts.OLD_ROOT + "/sys/kernel", host_tree=True)]
    with pytest.raises(CcwError) as refused:
        mounts.detach_sources(steps, 10, mapping)
    assert refused.value.details["step"] == "bind /.oldroot/sys/kernel -> /opt/toolchain"
    assert "expose a copy on a local filesystem" in refused.value.message
    _, shown = mounts.detach_sources(steps, 10)  # shown as it is to a jail without capabilities
    for fd in shown:
        os.close(fd)
    assert len(shown) == 1
    with pytest.raises(OSError):
        os.close(mounttree.clone("/sys/kernel", 0, idmap=mapping))


def test_isolation_says_the_host_trees_are_idmapped(mapping: int) -> None:
    report = in_force.isolation()["host_trees"]
    assert report["idmapped"] is True and report["maps"] == "uid 0 and gid 0 only", report
    assert "capsule's trees" in report["effect"]


def test_a_root_capsule_may_not_expose_a_directory_that_takes_no_idmap(tools: Any, tmp_path: Path) -> None:
    # ramfs stands for NFS and FUSE here: no idmapped mounts.  Refused at create, naming the way out.
    toolchain = tmp_path / "toolchain"
    toolchain.mkdir()
    subprocess.run(["mount", "-t", "ramfs", "-o", "mode=0755", "ccw-test", str(toolchain)], check=True)
    try:
        ws = tmp_path / "ws"
        ws.mkdir()

        async def scenario(t: Any) -> None:
            await t.call("capsule_create", {"workspace": str(ws), "expose": [str(toolchain)], "auto_expose": False})

        with pytest.raises(CcwError) as refused:
            tools.run(scenario)
        assert refused.value.code == "UNSUPPORTED" and refused.value.details["path"] == str(toolchain)
        assert "Expose a copy on a local filesystem" in refused.value.message
    finally:
        subprocess.run(["umount", str(toolchain)], check=True)
