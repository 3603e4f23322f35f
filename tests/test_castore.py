"""fs/castore: the state dir's TLS CA kept 0600, made again when its hosts change or it nears its end,
and never read through a symlink or from a file someone else could read or write."""

from __future__ import annotations

import datetime as dt
import os
import stat
from pathlib import Path

import pytest

from mcp_server.core.tlsca import CA_LIFETIME, CA_RENEW
from mcp_server.fs.castore import CA_NAME, load_or_make
from sandbox.errors import CcwError

NOW = dt.datetime.now(dt.UTC)


def test_made_once_private_and_kept_while_the_hosts_are_the_same(tmp_path: Path) -> None:
    first = load_or_make(tmp_path, ["git.test", "pypi.test"], NOW)
    info = os.stat(tmp_path / CA_NAME)
    assert stat.S_IMODE(info.st_mode) == 0o600 and stat.S_ISREG(info.st_mode)
    again = load_or_make(tmp_path, ["pypi.test", "git.test", "git.test"], NOW + dt.timedelta(days=1))
    assert again.cert == first.cert and os.stat(tmp_path / CA_NAME).st_ino == info.st_ino
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_made_again_when_the_hosts_change_or_it_nears_its_end(tmp_path: Path) -> None:
    first = load_or_make(tmp_path, ["git.test"], NOW)
    wider = load_or_make(tmp_path, ["git.test", "models.test"], NOW)
    assert wider.cert != first.cert and wider.hosts == {"git.test", "models.test"}
    assert wider.key.private_numbers() != first.key.private_numbers()  # a new key, not a re-signed one
    late = NOW + CA_LIFETIME - CA_RENEW + dt.timedelta(minutes=1)
    renewed = load_or_make(tmp_path, ["git.test", "models.test"], late)
    assert renewed.cert != wider.cert and renewed.not_after > wider.not_after


def test_a_symlink_is_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.pem"
    load_or_make(tmp_path, ["git.test"], NOW)
    os.rename(tmp_path / CA_NAME, target)
    os.symlink(target, tmp_path / CA_NAME)
    with pytest.raises(CcwError) as caught:
        load_or_make(tmp_path, ["git.test"], NOW)
    assert caught.value.code == "PERMISSION_DENIED" and "symlink" in caught.value.message


def test_a_file_others_may_read_is_refused_not_repaired(tmp_path: Path) -> None:
    load_or_make(tmp_path, ["git.test"], NOW)
    os.chmod(tmp_path / CA_NAME, 0o644)
    with pytest.raises(CcwError, match=r"mode 0644.*not repaired"):
        load_or_make(tmp_path, ["git.test"], NOW)
    assert stat.S_IMODE(os.stat(tmp_path / CA_NAME).st_mode) == 0o644


def test_a_file_that_is_not_our_ca_is_refused(tmp_path: Path) -> None:
    fd = os.open(tmp_path / CA_NAME, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"-----BEGIN PRIVATE KEY-----\nnot a key\n")
    os.close(fd)
    with pytest.raises(CcwError) as caught:
        load_or_make(tmp_path, ["git.test"], NOW)
    assert caught.value.code == "CONFLICT" and "move it away" in caught.value.message


def test_a_state_dir_others_may_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(CcwError, match="chmod 700"):
        load_or_make(shared, ["git.test"], NOW)
    assert not (shared / CA_NAME).exists()
