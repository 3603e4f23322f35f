"""fs/privatefile: private files of the state dir read without following links and replaced whole; the
state dir made 0700 by whichever path makes it first, its database 0600, whatever the umask."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import trio

from mcp_server import launcher
from mcp_server.fs.privatefile import (
    locked,
    read_private,
    remove_private,
    replace_private,
    state_dir_fd,
)
from mcp_server.state import State
from mcp_server.statedir import make_state_dir
from sandbox.errors import CcwError


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _no_helper(*args: object, **kwargs: object) -> None:
    raise OSError("not starting a helper in this test")


def test_a_state_dir_made_first_by_the_helpers_launcher_is_private_under_umask_022(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The CLI starts the helper before anything opens the database: the launcher makes
    # <state>/helper, and with it the state dir, which must not get the umask's 0755.
    monkeypatch.setattr(launcher.subprocess, "Popen", _no_helper)
    monkeypatch.setattr(launcher, "spawn_detached", _no_helper)
    old = os.umask(0o022)
    try:
        with pytest.raises(CcwError, match="cannot start the embedded helper"):
            trio.run(launcher.spawn_embedded, str(tmp_path / "embedded" / "state"))
        with pytest.raises(OSError, match="not starting a helper"):
            launcher.start_detached(str(tmp_path / "detached" / "state"))
        state = State(tmp_path / "embedded" / "state")
        try:
            state.execute("CREATE TABLE t (x)")  # the -wal and -shm exist while it is open
            state.execute("INSERT INTO t VALUES (1)")
            files = [state.db_path.parent / f"{state.db_path.name}{suffix}" for suffix in ("", "-wal", "-shm")]
            assert [_mode(path) for path in files] == [0o600] * 3
        finally:
            state.close()
    finally:
        os.umask(old)
    for made in ("embedded", "detached"):
        assert _mode(tmp_path / made / "state") == 0o700
        assert _mode(tmp_path / made / "state" / "helper") == 0o700
        assert _mode(tmp_path / made) == 0o755  # a parent is not ours to decide: the umask's


def test_a_state_dir_an_older_ccw_left_readable_is_tightened_and_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "state"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    for name in ("ccw.sqlite3", "ccw.sqlite3-wal"):
        (root / name).write_bytes(b"")
        os.chmod(root / name, 0o644)
    state = State(root)
    try:
        assert _mode(root) == 0o700
        assert [_mode(root / name) for name in ("ccw.sqlite3", "ccw.sqlite3-wal")] == [0o600, 0o600]
    finally:
        state.close()
    said = [r.getMessage() for r in caplog.records if r.name == "ccw.mcp" and r.levelname == "WARNING"]
    assert said == [f"mcp:state-dir {root} had mode 0755 (left so by an older ccw, or made by hand): other users "
                    "could read its journal and what was typed into capsules; made it 0700"]
    make_state_dir(root)  # private already: nothing to say
    assert len([r for r in caplog.records if r.name == "ccw.mcp"]) == 1


def test_a_state_dir_others_may_write_is_not_tightened_but_refused(tmp_path: Path) -> None:
    # What a writable dir holds may be someone else's already: making it 0700 would adopt it.
    root = tmp_path / "state"
    root.mkdir()
    os.chmod(root, 0o777)
    make_state_dir(root)
    assert _mode(root) == 0o777
    with pytest.raises(CcwError, match="chmod 700"), state_dir_fd(root):
        pass


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
