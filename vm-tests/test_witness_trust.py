"""Witnesses trusted across machines (issue 39), through three state dirs, each with its own
Runtime and embedded helper, and the real ``ccw witness`` command between them:

- a witness made in the first replays in the second only once the second trusts the
  first's key (``ccw witness keys --public`` there, ``ccw witness trust FILE`` here), and
  then reports ``signature: valid`` naming it; untrusting takes that back;
- the third, which trusts nothing, refuses it as ``unknown key``;
- the witness with its manifest changed after signing is refused in all three, the
  maker's included, as ``invalid``;
- a witness signed with the old HMAC key of a state dir still replays there;
- attack: a witness signed by a trusted key (whose holder may write anything) does not
  get the replayer's environment, nor a network: trust waives the "not signed here"
  refusal and nothing else.
"""

from __future__ import annotations

import json
import os
import secrets
import tarfile
from pathlib import Path
from typing import Any

import pytest
import zstandard

from mcp_server.fs import witness as wfmt
from mcp_server.fs.witness_key import HMAC_KEY_NAME, WitnessKey, hmac_signature
from sandbox.errors import CcwError
from tests.support import witness_craft as craft
from tests.support.cli_process import ccw

CANARY_NAME = "CCW_TRUSTED_WITNESS_TOKEN"


def _runners(config: pytest.Config, tmp_path: Path, *names: str) -> list[Any]:
    """A ToolRunner (vm-tests/conftest.py's) over a fresh state dir for each name."""
    conftest = next(p for p in config.pluginmanager.get_plugins() if hasattr(p, "ToolRunner") and hasattr(p, "require"))
    runners = []
    for name in names:
        (tmp_path / name).mkdir()
        runners.append(conftest.ToolRunner(tmp_path / name))
    return runners


def _replay(runner: Any, path: Path, **args: Any) -> tuple[str, Any]:
    """('ok', the replay's answer) or ('error', the CcwError); an INTERNAL error fails."""
    async def call(t: Any) -> tuple[str, Any]:
        try:
            return "ok", await t.call("capsule_replay", {"path": str(path), **args})
        except CcwError as exc:
            assert exc.code != "INTERNAL", exc
            return "error", exc

    return runner.run(call)  # type: ignore[no-any-return]


def _made_in(runner: Any, ws: Path) -> Path:
    """A real capsule's witness: it read a.txt and wrote copy.txt."""
    async def made(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        ran = await t.call("capsule_exec",
                           {"capsule_id": cap, "cmd": ["sh", "-c", "cat a.txt > copy.txt; cat copy.txt"]})
        assert ran["exit_code"] == 0, ran
        return await t.call("capsule_witness", {"capsule_id": cap})  # type: ignore[no-any-return]

    return Path(runner.run(made)["path"])


def _rewritten(data: bytes, manifest: bytes, signature: bytes | None) -> bytes:
    """The archive with its manifest's bytes and its signature.json replaced (None: kept)."""
    with tarfile.open(fileobj=zstandard.ZstdDecompressor().stream_reader(data), mode="r|") as tar:
        members = [(m.name, handle.read() if (handle := tar.extractfile(m)) else b"") for m in tar]
    blobs = {"blake3:" + n.removeprefix("blobs/"): d for n, d in members if n.startswith("blobs/")}
    extra = [(n, signature if signature is not None and n == wfmt.SIGNATURE_MEMBER else d)
             for n, d in members[1:] if not n.startswith("blobs/")]
    return craft.raw_archive(manifest, blobs, extra)


def test_a_witness_replays_where_its_key_is_trusted_and_nowhere_else(pytestconfig: pytest.Config, tmp_path: Path,
                                                                      root_required: None) -> None:
    maker, replayer, third = _runners(pytestconfig, tmp_path, "maker", "replayer", "third")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("from the maker\n")
    witness = _made_in(maker, ws)
    assert _replay(maker, witness)[1]["signature"] == "valid"

    kind, refused = _replay(replayer, witness)
    assert kind == "error" and refused.code == "PERMISSION_DENIED" and refused.details["signature"] == "unknown key"
    assert "ccw witness trust" in refused.message
    public = ccw(tmp_path / "maker", "witness", "keys", "--public").stdout
    (tmp_path / "maker.pub").write_text(public)
    assert refused.details["signed_by"]["key"] == public.split()[0]
    ccw(tmp_path / "replayer", "witness", "trust", str(tmp_path / "maker.pub"), "--name", "workstation")

    kind, replayed = _replay(replayer, witness)
    assert kind == "ok" and replayed["replay_ok"] is True, replayed
    assert replayed["signature"] == "valid" and replayed["signed_by"]["name"] == "workstation"
    assert replayed["signed_by"]["own"] is False and replayed["signed_by"]["key"] == public.split()[0]

    kind, elsewhere = _replay(third, witness)
    assert kind == "error" and elsewhere.code == "PERMISSION_DENIED" and elsewhere.details["signature"] == "unknown key"
    kind, allowed = _replay(third, witness, allow_untrusted=True)  # the person's own call, said as such
    assert kind == "ok" and allowed["replay_ok"] is True and allowed["signature"] == "unknown key"

    original = witness.read_bytes()
    assert b"cat copy.txt" in _manifest_bytes(original)
    tampered = tmp_path / "tampered.tar.zst"
    tampered.write_bytes(_rewritten(original, _manifest_bytes(original).replace(b"cat copy.txt", b"cat /etc/host"),
                                    None))
    for runner in (maker, replayer, third):
        kind, out = _replay(runner, tampered)
        assert kind == "error" and out.code == "PERMISSION_DENIED" and out.details["signature"] == "invalid", out

    ccw(tmp_path / "replayer", "witness", "untrust", "workstation")
    kind, again = _replay(replayer, witness)
    assert kind == "error" and again.details["signature"] == "unknown key"


def _manifest_bytes(data: bytes) -> bytes:
    with tarfile.open(fileobj=zstandard.ZstdDecompressor().stream_reader(data), mode="r|") as tar:
        first = next(iter(tar))
        handle = tar.extractfile(first)
        assert first.name == wfmt.MANIFEST_MEMBER and handle is not None
        return handle.read()


def test_ccw_capsule_replay_says_whose_signature(pytestconfig: pytest.Config, tmp_path: Path,
                                                 cli_state: Path) -> None:
    """What a person sees: ``ccw capsule replay`` refuses an unknown key, then says ``signature: valid (NAME)``."""
    (maker,) = _runners(pytestconfig, tmp_path, "maker")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("for the person\n")
    witness = _made_in(maker, ws)
    refused = ccw(cli_state, "capsule", "replay", str(witness), check=False)
    assert refused.returncode == 1 and "unknown key" in refused.stderr and "ccw witness trust" in refused.stderr
    public = ccw(tmp_path / "maker", "witness", "keys", "--public").stdout.split()[0]
    ccw(cli_state, "witness", "trust", public, "--name", "workstation")
    replayed = ccw(cli_state, "capsule", "replay", str(witness))
    assert replayed.stdout.splitlines()[0] == "replay_ok"
    assert "signature: valid (workstation)" in replayed.stderr.splitlines()


def test_an_old_hmac_witness_still_replays_where_it_was_made(pytestconfig: pytest.Config, tmp_path: Path,
                                                              root_required: None) -> None:
    (maker,) = _runners(pytestconfig, tmp_path, "maker")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("older\n")
    witness = _made_in(maker, ws)
    secret = secrets.token_bytes(32)  # the state dir's key from before Ed25519
    fd = os.open(tmp_path / "maker" / HMAC_KEY_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, secret)
    os.close(fd)
    manifest = _manifest_bytes(witness.read_bytes())
    old = json.dumps(hmac_signature(secret, wfmt.root_hash(json.loads(manifest)))).encode()
    older = tmp_path / "old.tar.zst"
    older.write_bytes(_rewritten(witness.read_bytes(), manifest, old))
    kind, out = _replay(maker, older)
    assert kind == "ok" and out["replay_ok"] is True and out["signature"] == "valid", out
    assert out["signed_by"] == {"own": True, "name": "this state dir"}


def test_a_trusted_keys_witness_cannot_read_the_replayers_environment(pytestconfig: pytest.Config, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      root_required: None,
                                                                      record_property: Any) -> None:
    (replayer,) = _runners(pytestconfig, tmp_path, "replayer")
    canary = "canary-" + secrets.token_hex(12)
    monkeypatch.setenv(CANARY_NAME, canary)  # the front end's environment: the ToolRunner runs it in-process
    (tmp_path / "holder").mkdir()
    holder = WitnessKey.of_state_dir(tmp_path / "holder")  # a trusted key's holder writes what it likes
    ccw(tmp_path / "replayer", "witness", "trust", holder.public_text, "--name", "holder")
    leak = ["sh", "-c", f'echo "token=${{{CANARY_NAME}}}"; cat /proc/1/environ /proc/self/environ | tr "\\0" "\\n"']
    entry, blobs = craft.exec_entry(1, leak, stdout=b"token=\n")
    made = craft.manifest(str(tmp_path / "ws"), [entry], env_whitelist=[CANARY_NAME, "PATH", "HOME"],
                          network={"allow": ["127.0.0.1:1"]})
    path = craft.write(tmp_path / "leak.tar.zst", made, blobs, holder)
    kind, out = _replay(replayer, path)  # no allow_untrusted: the key is trusted
    assert kind == "ok", out
    assert out["signature"] == "valid" and out["signed_by"]["name"] == "holder" and out["signed_by"]["own"] is False
    assert canary not in json.dumps(out), out
    assert out["env_missing"] == [CANARY_NAME, "PATH"]
    assert out["network"]["used"] == "none" and out["network"]["recorded"] == {"allow": ["127.0.0.1:1"]}
    record_property("escapes_tried", 1)
