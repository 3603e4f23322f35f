"""The witness keys a state dir trusts (``ccw witness trust``), and a public key's text form.

A trusted key's witnesses replay here without ``allow_untrusted``, their reports naming
the key (fs/witness_key.py says what else trust does and does not give).  Choices:

- **A public key's text** is ``ccw-ed25519:`` + its 32 bytes in base64: one word, which
  says what it is, to copy from ``ccw witness keys`` on one machine into ``ccw witness
  trust`` on another.  A key file holds that word on its first line, optionally followed
  by a name (``ccw witness keys --public`` writes the host's name there).  Its
  fingerprint is ``SHA256:`` + the unpadded base64 of the SHA-256 of the 32 bytes.
- **The list** is ``<state dir>/witness-trust.json``: each key with the name a person
  gave it (unique, a plain word: it is printed in every replay report) and when.  It is
  replaced whole (a temp file renamed over it), under an flock of
  ``witness-trust.lock``, so two ``ccw witness trust`` at once both land and a server
  reading it mid-change sees the list before or after, never half.  It is read with
  O_NOFOLLOW and used only if it is a regular file owned by this user (or root) that no
  one else may write: anyone who could write it could make their own witnesses run
  here.  A server reads it at each replay, so trust (and its withdrawal) holds from the
  next replay on, without a restart.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox.errors import CcwError, wrap_oserror

KEY_BYTES = 32
PUBLIC_PREFIX = "ccw-ed25519:"
TRUST_NAME = "witness-trust.json"
LOCK_NAME = "witness-trust.lock"
TRUST_FORMAT = "ccw-witness-trust/1"
MAX_TRUST_BYTES = 1 << 20  # thousands of keys; past this the file is not ours
MAX_KEY_FILE_BYTES = 4 << 10  # a key file is one line
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}")
NAME_RULE = "1-64 letters, digits, '.', '_', '@', '+' or '-', starting with a letter or digit"


def public_text(raw: bytes) -> str:
    """``ccw-ed25519:BASE64``: a public key as a person copies it."""
    return PUBLIC_PREFIX + base64.b64encode(raw).decode()


def parse_public(text: str) -> bytes:
    """The 32 bytes of a public key given as ``ccw-ed25519:BASE64``; INVALID_ARGUMENT otherwise."""
    word = text.strip()
    raw = b""
    if word.startswith(PUBLIC_PREFIX):
        with contextlib.suppress(binascii.Error, ValueError):
            raw = base64.b64decode(word.removeprefix(PUBLIC_PREFIX), validate=True)
    if len(raw) != KEY_BYTES:
        raise CcwError("INVALID_ARGUMENT", f"{word[:80]!r} is not a ccw public key: expected {PUBLIC_PREFIX}BASE64 "
                       "(44 characters after the colon), as `ccw witness keys` prints it on the machine that made "
                       "the witness", {"key": word[:80]})
    return raw


def fingerprint(raw: bytes) -> str:
    """``SHA256:...`` of a public key's bytes, to compare by eye."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(raw).digest()).decode().rstrip("=")


@dataclass(frozen=True)
class TrustedKey:
    """One entry of the trusted list."""

    name: str
    raw: bytes
    added_at: str

    def json(self) -> dict[str, Any]:
        """As ``ccw witness keys --json`` shows it (and the file stores it, without the fingerprint)."""
        return {"name": self.name, "key": public_text(self.raw), "fingerprint": fingerprint(self.raw),
                "added_at": self.added_at}


def key_argument(given: str) -> tuple[bytes, str | None]:
    """A key named on a command line: its text, or a file whose first line holds it (and maybe a name)."""
    if given.strip().startswith(PUBLIC_PREFIX):
        return parse_public(given), None
    with wrap_oserror("read the key file", given, f"give the key itself ({PUBLIC_PREFIX}...) or a file holding it"):
        fd = os.open(given, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise CcwError("INVALID_ARGUMENT", f"{given!r} is not a regular file; give a key file or the key")
            content = f.read(MAX_KEY_FILE_BYTES)
    words = content.decode("utf-8", "replace").strip().splitlines()[0].split() if content.strip() else []
    if not words:
        raise CcwError("INVALID_ARGUMENT",
                       f"{given!r} is empty; it should hold {PUBLIC_PREFIX}BASE64 on its first line")
    comment = words[1] if len(words) > 1 and NAME.fullmatch(words[1]) else None
    return parse_public(words[0]), comment


def trusted_keys(root: Path) -> list[TrustedKey]:
    """The keys the state dir at ``root`` trusts (none if it has no list)."""
    path = root / TRUST_NAME
    with wrap_oserror("read the trusted witness keys", str(path), "check the state dir's permissions"):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return []
        with os.fdopen(fd, "rb") as f:
            _check_private(os.fstat(f.fileno()), path)
            content = f.read(MAX_TRUST_BYTES + 1)
    return _parse(content, path)


def _check_private(info: os.stat_result, path: Path) -> None:
    if stat.S_ISREG(info.st_mode) and info.st_uid in (os.geteuid(), 0) and not info.st_mode & 0o022:
        return
    raise CcwError("PERMISSION_DENIED", f"{str(path)!r} is not a regular file of this user's that only it may "
                   f"write (uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o}), so the keys it names are not "
                   "trusted: anyone who can write it could make their witnesses run here.  Check who changed it, "
                   f"then remove it and trust the keys again (ccw witness trust)", {"path": str(path)})


def _parse(content: bytes, path: Path) -> list[TrustedKey]:
    damaged = CcwError("CONFLICT", f"{str(path)!r} is not a list of trusted witness keys ccw wrote; move it away "
                       "and trust the keys again (ccw witness trust); until then no key is trusted here",
                       {"path": str(path)})
    try:
        document = json.loads(content) if len(content) <= MAX_TRUST_BYTES else None
        keys = [TrustedKey(str(k["name"]), parse_public(str(k["key"])), str(k.get("added_at", "")))
                for k in document["keys"]] if isinstance(document, dict) and document.get("format") == TRUST_FORMAT \
            else None
    except (ValueError, KeyError, TypeError, CcwError):
        keys = None
    if keys is None:
        raise damaged
    return keys


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    with wrap_oserror("lock the trusted witness keys", str(root / LOCK_NAME), "check the state dir's permissions"):
        fd = os.open(root / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _change(root: Path, edit: Callable[[list[TrustedKey]], list[TrustedKey]]) -> None:
    """Replace the list with ``edit(list)``, one writer at a time, in one rename."""
    with _locked(root):
        keys = edit(trusted_keys(root))
        document = {"format": TRUST_FORMAT, "keys": [{"name": k.name, "key": public_text(k.raw), "added_at": k.added_at}
                                                     for k in keys]}
        tmp = root / f".{TRUST_NAME}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        with wrap_oserror("write the trusted witness keys", str(tmp), "check the state dir's permissions"):
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(json.dumps(document, indent=2, sort_keys=True).encode() + b"\n")
                    f.flush()
                    os.fsync(f.fileno())
                os.rename(tmp, root / TRUST_NAME)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise


def trust(root: Path, raw: bytes, name: str | None, own: bytes) -> TrustedKey:
    """Add ``raw`` to the list under ``name`` (or a name made from its fingerprint); CONFLICT if either is there."""
    name = name or "key-" + fingerprint(raw).removeprefix("SHA256:")[:8].replace("/", "_").replace("+", "-")
    if not NAME.fullmatch(name):
        raise CcwError("INVALID_ARGUMENT", f"{name[:80]!r} cannot name a key: use {NAME_RULE}", {"name": name[:80]})
    if raw == own:
        raise CcwError("CONFLICT", "that is this state dir's own key: its witnesses replay here already")
    added = TrustedKey(name, raw, dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))

    def add(keys: list[TrustedKey]) -> list[TrustedKey]:
        for k in keys:
            if k.raw == raw:
                raise CcwError("CONFLICT", f"that key is trusted already, as {k.name!r}; to name it otherwise, "
                               f"ccw witness untrust {k.name} first", {"name": k.name})
            if k.name == name:
                raise CcwError("CONFLICT", f"{name!r} names another trusted key ({fingerprint(k.raw)}); choose "
                               f"another --name, or ccw witness untrust {name} first", {"name": name})
        return [*keys, added]

    _change(root, add)
    return added


def untrust(root: Path, given: str) -> TrustedKey:
    """Take ``given`` (a trusted name, or the key's text) off the list; NOT_FOUND if it is not there."""
    removed: list[TrustedKey] = []

    def drop(keys: list[TrustedKey]) -> list[TrustedKey]:
        raw = parse_public(given) if given.strip().startswith(PUBLIC_PREFIX) else None
        removed.extend(k for k in keys if k.name == given or k.raw == raw)
        if not removed:
            raise CcwError("NOT_FOUND", f"no trusted key is named or is {given[:80]!r}; ccw witness keys lists them",
                           {"given": given[:80]})
        return [k for k in keys if k not in removed]

    _change(root, drop)
    return removed[0]
