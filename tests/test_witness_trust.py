"""fs/witness_trust and ``ccw witness``: the keys a state dir trusts, and what a witness signed elsewhere says
here before, while and after its key is trusted (the replay itself is vm-tests/test_witness_trust.py's)."""

from __future__ import annotations

import io
import json
import os
import secrets
import stat
import tarfile
import threading
from pathlib import Path

import pytest
import zstandard

from mcp_server.cli import main as ccw
from mcp_server.cli import witness as witness_cli
from mcp_server.cli.replay_report import signature_line
from mcp_server.fs import witness as wfmt
from mcp_server.fs.witness_key import Verdict, WitnessKey, hmac_signature
from mcp_server.fs.witness_trust import (
    LOCK_NAME,
    TRUST_NAME,
    fingerprint,
    key_argument,
    public_text,
    trust,
    trusted_keys,
    untrust,
)
from sandbox.errors import CcwError
from tests.support import witness_craft as craft


def _state(root: Path) -> Path:
    root.mkdir(mode=0o700)
    return root


def _witness(key: WitnessKey | None) -> tuple[dict[str, object], bytes]:
    entry, blobs = craft.exec_entry(1, ["echo", "hi"], stdout=b"hi\n")
    made = craft.manifest("/home/u/project", [entry])
    return made, craft.archive(made, blobs, key)


def test_a_key_is_trusted_named_listed_and_untrusted(tmp_path: Path) -> None:
    root = _state(tmp_path / "state")
    own = WitnessKey.of_state_dir(root)
    laptop, ci = WitnessKey(secrets.token_bytes(32)), WitnessKey(secrets.token_bytes(32))
    added = trust(root, laptop.public, "laptop", own.public)
    trust(root, ci.public, None, own.public)  # named from its fingerprint
    listed = trusted_keys(root)
    assert [k.name for k in listed] == ["laptop", listed[1].name] and listed[1].name.startswith("key-")
    assert listed[0] == added and added.json()["key"] == laptop.public_text
    assert added.json()["fingerprint"] == fingerprint(laptop.public)
    info = (root / TRUST_NAME).stat()
    assert stat.S_ISREG(info.st_mode) and not info.st_mode & 0o022
    assert untrust(root, "laptop").raw == laptop.public
    assert untrust(root, ci.public_text).raw == ci.public  # by the key itself too
    assert trusted_keys(root) == []
    with pytest.raises(CcwError) as gone:
        untrust(root, "laptop")
    assert gone.value.code == "NOT_FOUND" and "ccw witness keys" in gone.value.message
    assert sorted(p.name for p in root.iterdir()) == sorted([LOCK_NAME, TRUST_NAME, "witness-ed25519.key"])


def test_trust_refuses_duplicates_its_own_key_and_bad_names(tmp_path: Path) -> None:
    root = _state(tmp_path / "state")
    own = WitnessKey.of_state_dir(root)
    laptop = WitnessKey(secrets.token_bytes(32))
    trust(root, laptop.public, "laptop", own.public)
    cases = [
        ((laptop.public, "other"), "CONFLICT", "trusted already, as 'laptop'"),
        ((WitnessKey(secrets.token_bytes(32)).public, "laptop"), "CONFLICT", "names another trusted key"),
        ((own.public, "me"), "CONFLICT", "this state dir's own key"),
        ((secrets.token_bytes(32), "bad name"), "INVALID_ARGUMENT", "cannot name a key"),
        ((secrets.token_bytes(32), "\x1b[31mred"), "INVALID_ARGUMENT", "cannot name a key"),
    ]
    for (raw, name), code, message in cases:
        with pytest.raises(CcwError, match=message.replace("(", r"\(")) as refused:
            trust(root, raw, name, own.public)
        assert refused.value.code == code, name
    assert [k.name for k in trusted_keys(root)] == ["laptop"]


def test_key_text_and_key_files_are_parsed_strictly(tmp_path: Path) -> None:
    key = WitnessKey(secrets.token_bytes(32))
    assert key_argument(key.public_text) == (key.public, None)
    (tmp_path / "laptop.pub").write_text(f"{key.public_text} laptop-1\n")
    assert key_argument(str(tmp_path / "laptop.pub")) == (key.public, "laptop-1")
    (tmp_path / "odd.pub").write_text(f"{key.public_text} not/a/name\n")
    assert key_argument(str(tmp_path / "odd.pub")) == (key.public, None)
    for text in ("ccw-ed25519:" + "A" * 40, "ccw-ed25519:" + "!" * 44, public_text(b"x" * 31)):
        with pytest.raises(CcwError, match="is not a ccw public key") as bad:
            key_argument(text)
        assert bad.value.code == "INVALID_ARGUMENT"
    (tmp_path / "ssh.pub").write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5 me@host\n")
    with pytest.raises(CcwError, match="is not a ccw public key"):
        key_argument(str(tmp_path / "ssh.pub"))
    with pytest.raises(CcwError) as missing:
        key_argument(str(tmp_path / "nowhere.pub"))
    assert missing.value.code == "NOT_FOUND"


def test_a_list_others_could_write_or_a_link_is_not_used(tmp_path: Path) -> None:
    root = _state(tmp_path / "state")
    own = WitnessKey.of_state_dir(root)
    trust(root, WitnessKey(secrets.token_bytes(32)).public, "laptop", own.public)
    os.chmod(root / TRUST_NAME, 0o666)
    with pytest.raises(CcwError, match="anyone who can write it") as writable:
        WitnessKey.of_state_dir(root)
    assert writable.value.code == "PERMISSION_DENIED"
    assert WitnessKey.of_state_dir(root, trusted=False).public == own.public  # signing reads no list
    os.rename(root / TRUST_NAME, tmp_path / "elsewhere.json")
    os.chmod(tmp_path / "elsewhere.json", 0o644)
    os.symlink(tmp_path / "elsewhere.json", root / TRUST_NAME)
    with pytest.raises(CcwError) as linked:
        trusted_keys(root)
    assert linked.value.code == "PERMISSION_DENIED"  # O_NOFOLLOW
    os.unlink(root / TRUST_NAME)
    (root / TRUST_NAME).write_text('{"format": "ccw-witness-trust/1", "keys": [{"name": "x", "key": "nope"}]}')
    with pytest.raises(CcwError, match="move it away") as damaged:
        trusted_keys(root)
    assert damaged.value.code == "CONFLICT"


def test_trusts_made_at_once_all_land(tmp_path: Path) -> None:
    root = _state(tmp_path / "state")
    own = WitnessKey.of_state_dir(root)
    keys = [WitnessKey(secrets.token_bytes(32)) for _ in range(12)]
    threads = [threading.Thread(target=trust, args=(root, k.public, f"k{i}", own.public)) for i, k in enumerate(keys)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(k.name for k in trusted_keys(root)) == sorted(f"k{i}" for i in range(12))


def test_a_witness_is_unknown_then_valid_by_name_then_unknown_again_and_tampered_is_invalid_everywhere(
        tmp_path: Path) -> None:
    maker, replayer, third = (_state(tmp_path / name) for name in ("maker", "replayer", "third"))
    signer = WitnessKey.of_state_dir(maker)
    _, signed = _witness(signer)
    assert wfmt.verify(io.BytesIO(signed), None, WitnessKey.of_state_dir(maker))["signature"] == "valid"

    def verdict(root: Path, data: bytes) -> dict[str, object]:
        report = wfmt.verify(io.BytesIO(data), None, WitnessKey.of_state_dir(root))
        return {k: report[k] for k in ("signature", "signed_by") if k in report}

    assert verdict(replayer, signed)["signature"] == "unknown key"
    trust(replayer, signer.public, "maker", WitnessKey.of_state_dir(replayer).public)
    assert verdict(replayer, signed) == {"signature": "valid", "signed_by": {
        "own": False, "name": "maker", "key": signer.public_text, "fingerprint": fingerprint(signer.public)}}
    assert verdict(third, signed)["signature"] == "unknown key"
    tampered = _retarred(signed, b'"echo"', b'"exit"')
    for root in (maker, replayer, third):
        assert verdict(root, tampered)["signature"] == "invalid", root
    untrust(replayer, "maker")
    assert verdict(replayer, signed)["signature"] == "unknown key"


def test_a_trusted_keys_manifest_is_checked_as_a_strangers_is(tmp_path: Path) -> None:
    """Trust lets a witness run; it does not make another ccw's writer ours: its schema is checked."""
    maker, replayer = _state(tmp_path / "maker"), _state(tmp_path / "replayer")
    signer = WitnessKey.of_state_dir(maker)
    trust(replayer, signer.public, "maker", WitnessKey.of_state_dir(replayer).public)
    entry, blobs = craft.exec_entry(1, ["echo", "hi"], stdout=b"hi\n")
    made = craft.manifest("/home/u/project", [{**entry, "argv": "echo hi"}])  # a string, where a list is expected
    data = craft.archive(made, blobs, signer)
    assert wfmt.read_signature(io.BytesIO(data), WitnessKey.of_state_dir(maker))[2].own  # ours: not checked
    with pytest.raises(CcwError, match="argv") as refused:
        wfmt.read_signature(io.BytesIO(data), WitnessKey.of_state_dir(replayer))
    assert refused.value.code == "INVALID_ARGUMENT"


def test_an_old_hmac_witness_still_verifies_where_it_was_made(tmp_path: Path) -> None:
    root = _state(tmp_path / "state")
    secret = secrets.token_bytes(32)
    fd = os.open(root / "witness.key", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, secret)
    os.close(fd)
    made, unsigned = _witness(None)
    old = _with_member(unsigned, wfmt.SIGNATURE_MEMBER, json.dumps(hmac_signature(secret, wfmt.root_hash(made))))
    assert wfmt.verify(io.BytesIO(old), None, WitnessKey.of_state_dir(root))["signature"] == "valid"
    other = _state(tmp_path / "other")
    assert wfmt.verify(io.BytesIO(old), None, WitnessKey.of_state_dir(other))["signature"] == "unknown key"


def test_ccw_witness_keys_trust_untrust(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    maker, replayer = tmp_path / "maker", tmp_path / "replayer"
    assert ccw(["--state-dir", str(maker), "witness", "keys", "--public"]) == 0
    line = capsys.readouterr().out
    (tmp_path / "maker.pub").write_text(line)
    assert line.startswith("ccw-ed25519:") and line.split()[0] == WitnessKey.of_state_dir(maker).public_text
    assert ccw(["--state-dir", str(replayer), "witness", "trust", str(tmp_path / "maker.pub"), "--name", "ws"]) == 0
    assert capsys.readouterr().out.startswith("trusted ws: ccw-ed25519:")
    assert ccw(["--state-dir", str(replayer), "--json", "witness", "keys"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [(k["name"], k["key"]) for k in shown["trusted"]] == [("ws", line.split()[0])]
    assert shown == witness_cli.listing(replayer, WitnessKey.of_state_dir(replayer))
    assert ccw(["--state-dir", str(replayer), "witness", "trust", line.split()[0]]) == 1
    assert "trusted already, as 'ws'" in capsys.readouterr().err
    assert ccw(["--state-dir", str(replayer), "witness", "untrust", "ws"]) == 0
    assert capsys.readouterr().out.startswith("no longer trusted: ws")
    assert ccw(["--state-dir", str(replayer), "witness", "keys"]) == 0
    assert "trusted: none" in capsys.readouterr().out


def test_a_replay_prints_whose_signature() -> None:
    key = WitnessKey(secrets.token_bytes(32))
    assert signature_line({"signature": "valid", "signed_by": {"own": False, "name": "ws"}}) == "signature: valid (ws)"
    unknown = Verdict("unknown key", key=key.public_text).report()
    assert signature_line(unknown) == f"signature: unknown key ({fingerprint(key.public)})"
    assert signature_line({"signature": "unsigned"}) == "signature: unsigned"


def _parts(data: bytes) -> tuple[bytes, list[tuple[str, bytes]], dict[str, bytes]]:
    """An archive's manifest bytes, its other members but blobs (the signature), and its blobs by hash."""
    with tarfile.open(fileobj=zstandard.ZstdDecompressor().stream_reader(data), mode="r|") as tar:
        members = [(m.name, handle.read() if (handle := tar.extractfile(m)) else b"") for m in tar]
    blobs = {"blake3:" + n.removeprefix("blobs/"): d for n, d in members if n.startswith("blobs/")}
    return members[0][1], [m for m in members[1:] if not m[0].startswith("blobs/")], blobs


def _retarred(data: bytes, old: bytes, new: bytes) -> bytes:
    """The archive with its manifest's bytes changed after signing, its signature kept."""
    manifest, extra, blobs = _parts(data)
    return craft.raw_archive(manifest.replace(old, new), blobs, extra)


def _with_member(data: bytes, name: str, content: str) -> bytes:
    manifest, extra, blobs = _parts(data)
    return craft.raw_archive(manifest, blobs, [*extra, (name, content.encode())])
