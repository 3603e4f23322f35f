"""The state dir's witness key: every witness made here is signed with it, and a replay
runs a witness without ``allow_untrusted`` only when it bears a signature that holds
from this key or from one the state dir was told to trust (fs/witness_trust.py).

Choices:

- **Ed25519** (from ``cryptography``), so a signature can be checked by any state dir
  that holds the public key: a CI runner trusts a workstation's key and replays its
  witnesses as that workstation's, named, instead of as "someone's" under
  ``allow_untrusted``.  Before this the key was an HMAC secret, which only the state
  dir that made it could check.
- **What is signed** is the root hash, which covers the canonical manifest and through
  it every blob: ``Ed25519(key, "ccw-witness-signature/2\\0" + root_hash)``.  The
  signature travels as ``signature.json`` beside the manifest (fs/witness.py), so the
  root hash and the archive's plain-tar form are unchanged, and a witness made before
  signing is "unsigned".  The signature names its public key, so a replayer can say
  which key signed a witness it does not trust, and check the signature even then: a
  manifest changed after signing is "invalid" everywhere, not merely "unknown key".
- **Four verdicts**: "valid" (the signature holds, and the key is this state dir's or a
  trusted one: the verdict names it), "unknown key" (it holds, from a key not trusted
  here), "invalid" (it does not hold: the witness or its signature was changed), and
  "unsigned".  Only "valid" replays without ``allow_untrusted``.  Whether the key is
  this state dir's own (``Verdict.own``) is a separate fact: only our own witnesses
  skip the manifest's schema check and the untrusted expansion ratio (fs/witness.py)
  and get their recorded network rules back (capsules/replay.py), because only they
  were written by this very ccw.  A trusted key is a person's word that its witnesses
  may run here, not that they were made by code we ran.
- **The keys** are files in the state dir: ``witness-ed25519.key`` (the 32-byte private
  seed), mode 0600, read with O_NOFOLLOW, made on first use.  It is written to a temp
  file and hard-linked into place, so two servers sharing a state dir that start at
  once agree on one key (the loser reads the winner's), and no reader ever sees a
  half-written key.  A capsule never sees it: a state dir inside a workspace is masked
  in every jail (sandbox/mounts.py).
- **Old witnesses**: the HMAC secret of before (``witness.key``) is still read when it
  exists, never made, so a witness signed with it keeps replaying in the state dir that
  made it; anywhere else its signature is "unknown key" (no one else can check it).
- **A public key's text** (``ccw-ed25519:BASE64``) and the trusted list are
  fs/witness_trust.py's.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from mcp_server.fs.witness_trust import (
    KEY_BYTES,
    fingerprint,
    parse_public,
    public_text,
    trusted_keys,
)
from sandbox.errors import CcwError, wrap_oserror

KEY_NAME = "witness-ed25519.key"
SIGNATURE_FORMAT = "ccw-witness-signature/2"
ALGORITHM = "ed25519"
OWN_NAME = "this state dir"  # what a verdict names our own key
SIGNATURE_STATES = ("valid", "unknown key", "invalid", "unsigned")

# The HMAC witnesses of before (signature format 1): checked, never made.
HMAC_KEY_NAME = "witness.key"
HMAC_FORMAT = "ccw-witness-signature/1"
HMAC_ALGORITHM = "hmac-sha256"


@dataclass(frozen=True)
class Verdict:
    """What a witness's signature says here."""

    state: str  # one of SIGNATURE_STATES
    own: bool = False  # valid, and by this state dir's key (Ed25519, or its old HMAC secret)
    name: str | None = None  # the key's name here: OWN_NAME, or the name it was trusted under
    key: str | None = None  # the public key's text (Ed25519 signatures only)

    def report(self) -> dict[str, Any]:
        """The ``signature`` and ``signed_by`` fields of a verify or replay answer."""
        if self.name is None and self.key is None:
            return {"signature": self.state}
        signer: dict[str, Any] = {"own": self.own}
        if self.name is not None:
            signer["name"] = self.name
        if self.key is not None:
            signer["key"] = self.key
            signer["fingerprint"] = fingerprint(parse_public(self.key))
        return {"signature": self.state, "signed_by": signer}


UNSIGNED = Verdict("unsigned")


def hmac_signature(secret: bytes, root_hash: str) -> dict[str, Any]:
    """An old-style (format 1) signature of ``root_hash`` with an HMAC secret: what ``check`` compares against."""
    key_id = hashlib.sha256(b"ccw witness key id\0" + secret).hexdigest()[:16]
    mac = hmac.new(secret, HMAC_FORMAT.encode() + b"\0" + root_hash.encode(), hashlib.sha256).hexdigest()
    return {"format": HMAC_FORMAT, "alg": HMAC_ALGORITHM, "key_id": key_id, "root_hash": root_hash, "mac": mac}


class WitnessKey:
    """A state dir's signing key, the keys it trusts, and its old HMAC secret if it had one."""

    def __init__(self, seed: bytes, trusted: Mapping[bytes, str] | None = None,
                 hmac_secret: bytes | None = None) -> None:
        self._private = Ed25519PrivateKey.from_private_bytes(seed)
        self.public = self._private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.trusted = dict(trusted or {})  # public key bytes -> the name a person gave it
        self._hmac = hmac_secret

    @classmethod
    def of_state_dir(cls, root: Path, trusted: bool = True) -> WitnessKey:
        """The key of the state dir at ``root`` (made on first use), with (``trusted``) the keys it trusts."""
        seed = load_or_create(root / KEY_NAME, "the witness signing key")
        old = root / HMAC_KEY_NAME
        with wrap_oserror("read the old witness key", str(old), "check the state dir's permissions"):
            try:
                secret: bytes | None = _read(old, "the old (HMAC) witness key")
            except FileNotFoundError:
                secret = None
        return cls(seed, {entry.raw: entry.name for entry in trusted_keys(root)} if trusted else None, secret)

    @property
    def public_text(self) -> str:
        """This state dir's public key, as ``ccw witness trust`` takes it elsewhere."""
        return public_text(self.public)

    def sign(self, root_hash: str) -> dict[str, Any]:
        """``signature.json``'s object for a witness of ``root_hash``."""
        sig = self._private.sign(_message(root_hash))
        return {"format": SIGNATURE_FORMAT, "alg": ALGORITHM, "key": self.public_text, "root_hash": root_hash,
                "sig": base64.b64encode(sig).decode()}

    def check(self, signature: Any, root_hash: str) -> Verdict:
        """What ``signature`` (signature.json's object, or None if unreadable) says of a witness of ``root_hash``."""
        if isinstance(signature, dict) and signature.get("alg") == HMAC_ALGORITHM:
            return self._check_hmac(signature, root_hash)
        if not isinstance(signature, dict) or signature.get("alg") != ALGORITHM:
            return Verdict("invalid")
        try:
            raw = parse_public(str(signature.get("key")))
            sig = base64.b64decode(str(signature.get("sig")), validate=True)
        except (CcwError, binascii.Error, ValueError):
            return Verdict("invalid")
        key_text = public_text(raw)
        own = raw == self.public
        name = OWN_NAME if own else self.trusted.get(raw)
        if signature.get("root_hash") != root_hash or not _holds(raw, sig, root_hash):
            return Verdict("invalid", False, name, key_text)
        return Verdict("valid" if name is not None else "unknown key", own, name, key_text)

    def _check_hmac(self, signature: dict[str, Any], root_hash: str) -> Verdict:
        if self._hmac is None:
            return Verdict("unknown key")
        expected = hmac_signature(self._hmac, root_hash)
        if signature.get("key_id") != expected["key_id"]:
            return Verdict("unknown key")
        mac = signature.get("mac")
        if signature.get("root_hash") != root_hash or not isinstance(mac, str):
            return Verdict("invalid", name=OWN_NAME)
        if not hmac.compare_digest(mac, expected["mac"]):
            return Verdict("invalid", name=OWN_NAME)
        return Verdict("valid", True, OWN_NAME)


def _message(root_hash: str) -> bytes:
    return SIGNATURE_FORMAT.encode() + b"\0" + root_hash.encode()


def _holds(raw: bytes, sig: bytes, root_hash: str) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(raw).verify(sig, _message(root_hash))
    except (InvalidSignature, ValueError):
        return False
    return True


def load_or_create(path: Path, what: str) -> bytes:
    """The 32-byte secret at ``path``, made there first if there is none."""
    with wrap_oserror(f"read {what}", str(path), "check the state dir's permissions"):
        try:
            return _read(path, what)
        except FileNotFoundError:
            _create(path)
            return _read(path, what)


def _read(path: Path, what: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        secret = f.read(KEY_BYTES + 1)
    if len(secret) != KEY_BYTES:
        raise CcwError(
            "CONFLICT",
            f"{what} {str(path)!r} is not {KEY_BYTES} bytes; move it away (witnesses signed with it "
            "will then replay only with allow_untrusted, or where its public key is trusted) and ccw makes a new one",
            {"path": str(path)},
        )
    return secret


def _create(path: Path) -> None:
    """Write a new key beside ``path`` and link it into place unless another process did first."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(KEY_BYTES))
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileExistsError):  # another server made it first: use theirs
            os.link(tmp, path)
    finally:
        os.unlink(tmp)


# The answer's fields as the tools' output schemas name them (witness_verify, capsule_replay).
SIGNATURE_SCHEMA: dict[str, Any] = {"enum": list(SIGNATURE_STATES), "description": (
    "valid: by this state dir's key or a trusted one; unknown key: by a key not trusted here (ccw witness "
    "trust); invalid: changed after signing; unsigned.")}
SIGNED_BY_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["own"], "additionalProperties": False,
    "properties": {"own": {"type": "boolean", "description": "A valid signature of this state dir's key."},
                   "name": {"type": "string", "description": "The key's name here (trusted as), even when invalid."},
                   "key": {"type": "string"}, "fingerprint": {"type": "string"}},
}
