"""Mount points the helper makes in a jail's root tree ignore the helper's umask.

The system service runs with UMask=0077; a mount point made 0700 root's under it cannot
be traversed by the unprivileged caller the jail runs as.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox import mounttree


@pytest.fixture
def service_umask() -> Iterator[None]:
    previous = os.umask(0o077)
    yield
    os.umask(previous)


def test_root_tree_mount_points_are_traversable(tmp_path: Path, service_umask: None) -> None:
    root = os.open(tmp_path, os.O_DIRECTORY)
    try:
        mounttree.mountpoint_at(root, "usr")
        mounttree.mountpoint_at(root, "usr/lib")
        mounttree.mountpoint_at(root, "etc-file", is_file=True)
    finally:
        os.close(root)
    assert stat.S_IMODE((tmp_path / "usr").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "usr" / "lib").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "etc-file").stat().st_mode) == 0o644
