"""The state dir's witness key: every witness made here is signed with it, and a replay
trusts a witness only when that signature holds.

Choices:

- **HMAC-SHA256, not ed25519.** No dependency of ccw provides ed25519 (the Python
  standard library has none; ``cryptography`` is not among pyproject's dependencies,
  and adding one is not this module's call), and nothing needs a public key: the only
  party that checks a signature is the state dir that made it.  "Valid" means exactly
  "made with this state dir's key", which a MAC says; a witness carried to another
  machine is "foreign" there however it was made, and is replayed only when its
  replayer says so (``allow_untrusted``).
- **What is signed** is the root hash, which covers the canonical manifest and through
  it every blob: ``HMAC(key, "ccw-witness-signature/1\\0" + root_hash)``.  The
  signature travels as ``signature.json`` beside the manifest (fs/witness.py), so the
  root hash and the archive's plain-tar form are unchanged, and a witness made before
  signing is "unsigned".
- **The key** is 32 random bytes in ``<state dir>/witness.key``, mode 0600, made on
  first use.  It is written to a temp file and hard-linked into place, so two servers
  sharing a state dir that start at once agree on one key (the loser reads the
  winner's), and no reader ever sees a half-written key.  A capsule never sees it: a
  state dir inside a workspace is masked in every jail (sandbox/mounts.py).
- **key_id** (16 hex digits of a hash of the key) names the key in a signature, so a
  witness signed elsewhere is told apart from one whose signature is wrong; both are
  "foreign" to a replay.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
from pathlib import Path
from typing import Any

from sandbox.errors import CcwError, wrap_oserror

KEY_NAME = "witness.key"
KEY_BYTES = 32
SIGNATURE_FORMAT = "ccw-witness-signature/1"
ALGORITHM = "hmac-sha256"
SIGNATURE_STATES = ("valid", "unsigned", "foreign")


class WitnessKey:
    """A state dir's signing key."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret
        self.key_id = hashlib.sha256(b"ccw witness key id\0" + secret).hexdigest()[:16]

    @classmethod
    def of_state_dir(cls, root: Path) -> WitnessKey:
        """The key of the state dir at ``root``, made on first use."""
        path = root / KEY_NAME
        with wrap_oserror("read the witness key", str(path), "check the state dir's permissions"):
            try:
                return cls(_read(path))
            except FileNotFoundError:
                _create(path)
                return cls(_read(path))

    def _mac(self, root_hash: str) -> str:
        return hmac.new(self._secret, SIGNATURE_FORMAT.encode() + b"\0" + root_hash.encode(), hashlib.sha256).hexdigest()

    def sign(self, root_hash: str) -> dict[str, Any]:
        """``signature.json``'s object for a witness of ``root_hash``."""
        return {"format": SIGNATURE_FORMAT, "alg": ALGORITHM, "key_id": self.key_id, "root_hash": root_hash,
                "mac": self._mac(root_hash)}

    def check(self, signature: Any, root_hash: str) -> str:
        """"valid" when ``signature`` is this key's for ``root_hash``, else "foreign"."""
        if not isinstance(signature, dict) or signature.get("key_id") != self.key_id:
            return "foreign"
        mac = signature.get("mac")
        if signature.get("root_hash") != root_hash or not isinstance(mac, str):
            return "foreign"
        return "valid" if hmac.compare_digest(mac, self._mac(root_hash)) else "foreign"


def _read(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        secret = f.read(KEY_BYTES + 1)
    if len(secret) != KEY_BYTES:
        raise CcwError(
            "CONFLICT",
            f"the witness key {str(path)!r} is not {KEY_BYTES} bytes; move it away (witnesses signed with it "
            "will then replay only with allow_untrusted) and ccw makes a new one",
            {"path": str(path)},
        )
    return secret


def _create(path: Path) -> None:
    """Write a new key beside ``path`` and link it into place unless another process did first."""
    tmp = path.with_name(f".{KEY_NAME}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
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
