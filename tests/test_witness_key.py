"""fs/witness_key: one Ed25519 key per state dir, made once (mode 0600), and what a signature says here:
valid (own or trusted, named), unknown key, invalid, unsigned; old HMAC signatures valid where they were made."""

from __future__ import annotations

import base64
import os
import secrets
import stat
import threading
from pathlib import Path

import pytest

from mcp_server.fs.witness_key import (
    HMAC_KEY_NAME,
    KEY_NAME,
    OWN_NAME,
    Verdict,
    WitnessKey,
    hmac_signature,
)
from mcp_server.fs.witness_trust import fingerprint, public_text
from sandbox.errors import CcwError

ROOT = "blake3:" + "ab" * 32
OTHER_ROOT = "blake3:" + "cd" * 32


def test_the_key_is_made_once_private_and_kept(tmp_path: Path) -> None:
    first = WitnessKey.of_state_dir(tmp_path)
    path = tmp_path / KEY_NAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.stat().st_size == 32
    assert WitnessKey.of_state_dir(tmp_path).public == first.public
    assert [p.name for p in tmp_path.iterdir()] == [KEY_NAME]  # no temp file left, no HMAC key made
    assert first.public_text.startswith("ccw-ed25519:") and len(first.public_text) == len("ccw-ed25519:") + 44


def test_servers_starting_at_once_agree_on_one_key(tmp_path: Path) -> None:
    keys: list[bytes] = []
    threads = [threading.Thread(target=lambda: keys.append(WitnessKey.of_state_dir(tmp_path).public))
               for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(keys) == 16 and len(set(keys)) == 1


def test_a_signature_is_valid_for_its_own_key_and_trusted_ones_named() -> None:
    mine, theirs = secrets.token_bytes(32), secrets.token_bytes(32)
    signer = WitnessKey(theirs)
    signed = signer.sign(ROOT)
    assert signed["alg"] == "ed25519" and signed["key"] == signer.public_text and signed["root_hash"] == ROOT
    assert signer.check(signed, ROOT) == Verdict("valid", True, OWN_NAME, signer.public_text)
    stranger = WitnessKey(mine)
    assert stranger.check(signed, ROOT) == Verdict("unknown key", False, None, signer.public_text)
    trusting = WitnessKey(mine, {signer.public: "laptop"})
    assert trusting.check(signed, ROOT) == Verdict("valid", False, "laptop", signer.public_text)
    assert trusting.check(signed, ROOT).report() == {"signature": "valid", "signed_by": {
        "own": False, "name": "laptop", "key": signer.public_text, "fingerprint": fingerprint(signer.public)}}


def test_a_signature_that_does_not_hold_is_invalid_for_every_key() -> None:
    signer = WitnessKey(secrets.token_bytes(32))
    signed = signer.sign(ROOT)
    trusting = WitnessKey(secrets.token_bytes(32), {signer.public: "laptop"})
    stranger = WitnessKey(secrets.token_bytes(32))
    other = WitnessKey(secrets.token_bytes(32))
    sig = base64.b64decode(signed["sig"])
    flipped = base64.b64encode(bytes([sig[0] ^ 1]) + sig[1:]).decode()
    cases = {
        "another root": (signed, OTHER_ROOT),  # the manifest changed after signing
        "root field moved": ({**signed, "root_hash": OTHER_ROOT}, OTHER_ROOT),
        "a bit flipped": ({**signed, "sig": flipped}, ROOT),
        "claims a key that did not sign": ({**other.sign(ROOT), "key": signer.public_text}, ROOT),
    }
    for why, (signature, root) in cases.items():
        for key in (signer, trusting, stranger):
            assert key.check(signature, root).state == "invalid", why
    for junk in (None, [], "x", {"alg": "ed25519"}, {**signed, "sig": 5}, {**signed, "key": "ssh-ed25519 AAAA"},
                 {**signed, "sig": "not base64!"}, {**signed, "alg": "rsa"}):
        assert signer.check(junk, ROOT).state == "invalid", junk


def test_an_old_hmac_signature_is_valid_only_in_the_state_dir_that_made_it(tmp_path: Path) -> None:
    secret = secrets.token_bytes(32)
    old = hmac_signature(secret, ROOT)
    (tmp_path / HMAC_KEY_NAME).write_bytes(secret)
    os.chmod(tmp_path / HMAC_KEY_NAME, 0o600)
    here = WitnessKey.of_state_dir(tmp_path)
    assert here.check(old, ROOT) == Verdict("valid", True, OWN_NAME)
    assert here.check(old, OTHER_ROOT).state == "invalid"
    assert here.check({**old, "mac": "0" * 64}, ROOT).state == "invalid"
    assert here.check(hmac_signature(secrets.token_bytes(32), ROOT), ROOT).state == "unknown key"
    (tmp_path / "elsewhere").mkdir()
    elsewhere = WitnessKey.of_state_dir(tmp_path / "elsewhere")
    assert elsewhere.check(old, ROOT).state == "unknown key"  # no one else has the secret to check it with
    assert here.sign(ROOT)["alg"] == "ed25519"  # new witnesses are signed with the Ed25519 key only


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
    os.unlink(tmp_path / KEY_NAME)
    os.symlink("/etc/passwd", tmp_path / HMAC_KEY_NAME)  # the old key is read the same way
    with pytest.raises(CcwError) as old_linked:
        WitnessKey.of_state_dir(tmp_path)
    assert old_linked.value.code == "PERMISSION_DENIED"


def test_the_public_texts_round_trip() -> None:
    key = WitnessKey(secrets.token_bytes(32))
    assert public_text(key.public) == key.public_text
    assert fingerprint(key.public).startswith("SHA256:") and len(fingerprint(key.public)) == len("SHA256:") + 43
