"""fs/privatefile: private files of the state dir read without following links and replaced whole."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from mcp_server.fs.privatefile import (
    locked,
    read_private,
    remove_private,
    replace_private,
    state_dir_fd,
)
from sandbox.errors import CcwError


def test_replaced_whole_at_0600_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        with state_dir_fd(tmp_path) as fd, locked(fd, "f.lock", str(tmp_path / "f.lock")):
            replace_private(fd, "f", str(tmp_path / "f"), b"one", "a file")
            first = os.stat(tmp_path / "f").st_ino
            replace_private(fd, "f", str(tmp_path / "f"), b"two", "a file")
            assert read_private(fd, "f", str(tmp_path / "f"), 10, "a file") == b"two"
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "f").st_mode) == 0o600
    assert os.stat(tmp_path / "f").st_ino != first  # a new file renamed in, never rewritten in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f", "f.lock"]


def test_a_symlink_at_the_name_is_replaced_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"untouched")
    os.symlink(victim, tmp_path / "f")
    with state_dir_fd(tmp_path) as fd:
        with pytest.raises(CcwError, match="symlink"):
            read_private(fd, "f", str(tmp_path / "f"), 10, "a file")
        replace_private(fd, "f", str(tmp_path / "f"), b"new", "a file")
    assert victim.read_bytes() == b"untouched" and not os.path.islink(tmp_path / "f")


def test_a_fifo_absent_file_or_oversized_file(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo", 0o600)
    with state_dir_fd(tmp_path) as fd:
        with pytest.raises(CcwError, match="not a regular file"):
            read_private(fd, "fifo", str(tmp_path / "fifo"), 10, "a file")  # O_NONBLOCK: no hang
        assert read_private(fd, "absent", str(tmp_path / "absent"), 10, "a file") is None
        replace_private(fd, "big", str(tmp_path / "big"), b"x" * 11, "a file")
        with pytest.raises(CcwError) as caught:
            read_private(fd, "big", str(tmp_path / "big"), 10, "a file")
        assert caught.value.code == "TOO_LARGE"
        assert remove_private(fd, "big", str(tmp_path / "big"), "a file")
        assert not remove_private(fd, "big", str(tmp_path / "big"), "a file")


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")
def test_a_file_of_another_user_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"chosen by someone else")
    os.chmod(tmp_path / "f", 0o600)
    os.chown(tmp_path / "f", 65534, 65534)
    with state_dir_fd(tmp_path) as fd, pytest.raises(CcwError, match="owned by uid 65534"):
        read_private(fd, "f", str(tmp_path / "f"), 100, "a file")
