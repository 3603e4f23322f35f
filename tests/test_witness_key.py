"""fs/witness_key: one key per state dir, made once (mode 0600), and signatures valid only under it."""

from __future__ import annotations

import os
import secrets
import stat
import threading
from pathlib import Path

import pytest

from mcp_server.fs.witness_key import KEY_NAME, WitnessKey
from sandbox.errors import CcwError

ROOT = "blake3:" + "ab" * 32


def test_the_key_is_made_once_private_and_kept(tmp_path: Path) -> None:
    first = WitnessKey.of_state_dir(tmp_path)
    path = tmp_path / KEY_NAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.stat().st_size == 32
    assert WitnessKey.of_state_dir(tmp_path).key_id == first.key_id
    assert [p.name for p in tmp_path.iterdir()] == [KEY_NAME]  # no temp file left


def test_servers_starting_at_once_agree_on_one_key(tmp_path: Path) -> None:
    ids: list[str] = []
    threads = [threading.Thread(target=lambda: ids.append(WitnessKey.of_state_dir(tmp_path).key_id))
               for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(ids) == 16 and len(set(ids)) == 1


def test_a_signature_is_valid_only_for_its_key_and_root() -> None:
    key, other = WitnessKey(secrets.token_bytes(32)), WitnessKey(secrets.token_bytes(32))
    signed = key.sign(ROOT)
    assert key.check(signed, ROOT) == "valid"
    assert other.check(signed, ROOT) == "foreign"
    assert key.check(signed, "blake3:" + "cd" * 32) == "foreign"
    assert key.check({**signed, "mac": "0" * 64}, ROOT) == "foreign"
    forged = {**other.sign(ROOT), "key_id": key.key_id}  # claims our key, signed with another
    assert key.check(forged, ROOT) == "foreign"
    for junk in (None, [], "x", {"key_id": key.key_id}, {**signed, "mac": 5}):
        assert key.check(junk, ROOT) == "foreign"


def test_a_damaged_key_file_says_how_to_recover(tmp_path: Path) -> None:
    (tmp_path / KEY_NAME).write_bytes(b"short")
    with pytest.raises(CcwError, match="move it away") as damaged:
        WitnessKey.of_state_dir(tmp_path)
    assert damaged.value.code == "CONFLICT"
    os.unlink(tmp_path / KEY_NAME)
    os.symlink("/etc/passwd", tmp_path / KEY_NAME)
    with pytest.raises(CcwError) as linked:
        WitnessKey.of_state_dir(tmp_path)
    assert linked.value.code == "PERMISSION_DENIED"  # O_NOFOLLOW: ELOOP
