"""Which mount API overlay.prepare uses, against a kernel's fsconfig behaviour played by fakes.

Overlayfs before 6.5 (Debian 12's 6.1, found by booting the Vagrant VM) has no parameter
parser: ``fsopen("overlay")`` gives the generic legacy context, which accepts any key and
fails only at ``FSCONFIG_CMD_CREATE``. ccw must then mount with ``mount(2)``.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from sandbox import overlay, syscalls


@dataclass
class FakeKernel:
    """fsopen/fsconfig/fsmount/move_mount/mount as a kernel with or without overlay's parser."""

    parses_keys: bool
    keys: list[str] = field(default_factory=list)
    legacy_mounts: list[str] = field(default_factory=list)
    new_api_mounts: int = 0
    fds: list[int] = field(default_factory=list)

    def fsopen(self, fstype: str, flags: int = 0) -> int:
        read_end, write_end = os.pipe()  # a real fd: the code reads the kernel log from it
        os.close(write_end)
        self.fds.append(read_end)
        return read_end

    def fsconfig(self, fd: int, cmd: int, key: str | None = None, value: str | None = None, aux: int = 0) -> None:
        if cmd == syscalls.FSCONFIG_CMD_CREATE:
            if not self.parses_keys and any(k.startswith("lowerdir+") for k in self.keys):
                raise OSError(errno.EINVAL, "unrecognized mount option")
            return
        if self.parses_keys and key not in {"source", "lowerdir+", "upperdir", "workdir", "redirect_dir",
                                            "metacopy", "index", "nfs_export", "userxattr"}:
            raise OSError(errno.EINVAL, f"Unknown parameter {key}")
        self.keys.append(f"{key}")

    def fsmount(self, fd: int, flags: int = 0, attr_flags: int = 0) -> int:
        self.new_api_mounts += 1
        return os.dup(fd)

    def move_mount(self, *args: object) -> None:
        return None

    def mount(self, source: str | None, target: str, fstype: str | None, flags: int = 0,
              data: str | None = None) -> None:
        self.legacy_mounts.append(data or "")


@pytest.fixture(params=[True, False], ids=["parser-6.5+", "legacy-6.1"])
def kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKernel]:
    fake = FakeKernel(parses_keys=request.param)
    for name in ("fsopen", "fsconfig", "fsmount", "move_mount", "mount"):
        monkeypatch.setattr(syscalls, name, getattr(fake, name))
    yield fake
    for fd in fake.fds:
        try:
            os.close(fd)
        except OSError:
            pass


def test_prepare_uses_mount2_where_overlay_has_no_parser(kernel: FakeKernel) -> None:
    overlay.prepare(["/lower/b", "/lower/a"], "/up", "/work", "/merged", False)
    if kernel.parses_keys:
        assert kernel.new_api_mounts == 1 and kernel.legacy_mounts == []
    else:
        assert kernel.new_api_mounts == 0
        assert kernel.legacy_mounts == ["lowerdir=/lower/b:/lower/a,upperdir=/up,workdir=/work,"
                                         "redirect_dir=off,metacopy=off,index=off,nfs_export=off"]


def test_mechanisms_name_the_api_prepare_uses(kernel: FakeKernel) -> None:
    expected = "fsopen/fsconfig lowerdir+" if kernel.parses_keys else "mount(2)"
    assert overlay.mechanisms()["mount_api"] == expected
