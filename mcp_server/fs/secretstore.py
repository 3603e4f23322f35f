"""The state dir's secrets: values a capsule never holds, each bound to the hosts it belongs to.

``ccw secret set`` puts one here (``SecretStore.put``), ``ccw secret list`` and ``rm`` show and remove them,
and (issue 38, next) the egress proxy asks ``SecretStore.value`` for one when a request
to a bound host carries its placeholder (core/placeholders.py).  Choices:

- **One file**, ``<state dir>/secrets.json``, mode 0600, read with O_NOFOLLOW and
  trusted only if private, replaced whole under an flock of ``secrets.lock``
  (fs/privatefile.py says why each of those).  A value rests in it in base64 (it may be
  any bytes but control characters): as plain on disk as ``~/.netrc`` or ``gh``'s
  hosts file, readable by this user only.  Who wants nothing at rest uses a command.
- **Sources**: a prompt (no echo), stdin, a file (read once, at set), or a command run
  each time the value is needed (``--command 'gh auth token'``: ``/bin/sh -c``, in its
  own session so a timeout kills all it started, its stdout less one trailing newline).
  A command is run once at set too, so a typo is found then rather than at a capsule's
  first request.  Only the command is stored.
- **Never a value in a message.**  A value lives in a ``SecretValue``, whose repr says
  nothing of it; no error, log line, listing or JSON this module makes holds one.  A
  failing command's error gives its status and the end of its stderr (a command that
  failed printed no value on stdout; its stdout is never shown).
- **A value is one line of at most ``MAX_VALUE`` bytes with no control character**, so
  it can go in a header as it is: CR or LF in a value would let it split a request.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcp_server.core.secretbind import Binding, binding_from_json, check_name
from mcp_server.fs.privatefile import (
    locked,
    read_private,
    remove_private,
    replace_private,
    state_dir_fd,
)
from sandbox.errors import CcwError

STORE_NAME = "secrets.json"
LOCK_NAME = "secrets.lock"
STORE_FORMAT = "ccw-secrets/1"
SOURCES = ("prompt", "stdin", "file", "command")
MAX_VALUE = 16 << 10  # a token, a password, a key: far less
MAX_STORE = 4 << 20
MAX_COMMAND = 4096
DEFAULT_TIMEOUT = 30.0  # seconds a --command may take (a password manager may ask to unlock)
STDERR_TAIL = 300  # characters of a failed command's stderr in its error
WHAT = "the secret store"


class SecretValue:
    """A value held in memory; its repr and str never show it."""

    __slots__ = ("_bytes",)

    def __init__(self, value: bytes) -> None:
        self._bytes = value

    def __repr__(self) -> str:
        return "SecretValue(<hidden>)"

    __str__ = __repr__

    def reveal(self) -> bytes:
        """The value itself: for the one place that puts it in a request."""
        return self._bytes


@dataclass(frozen=True)
class StoredSecret:
    """One secret as stored: its binding, where its value comes from, and (not for a command) the value."""

    binding: Binding
    source: str  # one of SOURCES
    set_at: str
    command: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    stored: SecretValue | None = field(default=None, repr=False)

    def listing(self) -> dict[str, Any]:
        """What ``ccw secret list`` and tools may show: never the value."""
        out = {**self.binding.to_json(), "source": self.source, "set_at": self.set_at}
        if self.command is not None:
            out["command"] = self.command
            out["timeout"] = self.timeout
        return out


def check_value(name: str, raw: bytes) -> bytes:
    """``raw`` less one trailing newline, if it can be a value; INVALID_ARGUMENT (without it) if not."""
    value = raw[:-1] if raw.endswith(b"\n") else raw
    value = value[:-1] if raw.endswith(b"\r\n") else value
    if not value:
        raise CcwError("INVALID_ARGUMENT", f"the value given for secret {name} is empty: give the value itself",
                       {"name": name})
    if len(value) > MAX_VALUE:
        raise CcwError("INVALID_ARGUMENT", f"the value given for secret {name} is {len(value)} bytes; at most "
                       f"{MAX_VALUE}", {"name": name})
    bad = next((i for i, byte in enumerate(value) if byte < 0x20 or byte == 0x7F), None)
    if bad is not None:
        raise CcwError("INVALID_ARGUMENT", f"the value given for secret {name} has a control character (a line "
                       f"break, NUL, tab ...) at byte {bad}: a value is one line that can go in an HTTP header as "
                       "it is; check that the source gives only the value", {"name": name})
    return value


def run_command(name: str, command: str, timeout: float) -> bytes:
    """What ``command`` prints (one trailing newline off), checked as a value; UNAVAILABLE if it fails."""
    try:
        proc = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True, close_fds=True)
    except OSError as exc:
        raise CcwError("UNAVAILABLE", f"could not start the command of secret {name} ({command!r}): {exc}",
                       {"name": name}) from None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: everything it started
        proc.communicate()
        raise CcwError("TIMEOUT", f"the command of secret {name} ({command!r}) did not finish in {timeout:g} s: "
                       "run it by hand to see what it waits for (a password manager to unlock?), or give "
                       "ccw secret set --timeout SECONDS", {"name": name}) from None
    if proc.returncode != 0:
        tail = err.decode("utf-8", "replace").strip()[-STDERR_TAIL:]
        tail = "".join(ch if ch.isprintable() else " " for ch in tail)
        raise CcwError("UNAVAILABLE", f"the command of secret {name} ({command!r}) exited with status "
                       f"{proc.returncode}{': ' + tail if tail else ''}; run it by hand to fix it, or set the secret "
                       "again with another source", {"name": name, "status": proc.returncode})
    try:
        return check_value(name, out)
    except CcwError as exc:
        raise CcwError("UNAVAILABLE", f"the command of secret {name} ({command!r}) printed no usable value: "
                       f"{exc.message}", {"name": name}) from None


def _decode(document: Any, path: str) -> list[StoredSecret]:
    damaged = CcwError("CONFLICT", f"{path} is not a secret store ccw wrote; move it away and set the secrets "
                       "again (ccw secret set); until then no secret is used", {"path": path})
    if not isinstance(document, dict) or document.get("format") != STORE_FORMAT:
        raise damaged
    found = []
    try:
        for entry in document["secrets"]:
            value = entry.get("value_b64")
            found.append(StoredSecret(
                binding_from_json(entry), str(entry["source"]), str(entry["set_at"]),
                None if entry.get("command") is None else str(entry["command"]), float(entry["timeout"]),
                None if value is None else SecretValue(base64.b64decode(value, validate=True))))
    except (KeyError, TypeError, ValueError, binascii.Error, CcwError):
        raise damaged from None
    return found


def _encode(found: list[StoredSecret]) -> bytes:
    entries = []
    for secret in found:
        entry = {**secret.binding.to_json(), "source": secret.source, "set_at": secret.set_at,
                 "command": secret.command, "timeout": secret.timeout}
        if secret.stored is not None:
            entry["value_b64"] = base64.b64encode(secret.stored.reveal()).decode()
        entries.append(entry)
    return json.dumps({"format": STORE_FORMAT, "secrets": entries}, indent=2, sort_keys=True).encode() + b"\n"


class SecretStore:
    """The secrets of the state dir at ``root``; each call reads the file again (a person may set one meanwhile)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.path = str(self.root / STORE_NAME)

    def _read(self, dir_fd: int) -> list[StoredSecret]:
        data = read_private(dir_fd, STORE_NAME, self.path, MAX_STORE, WHAT)
        if data is None:
            return []
        try:
            document = json.loads(data)
        except ValueError:
            document = None
        return _decode(document, self.path)

    def secrets(self) -> list[StoredSecret]:
        """Every secret, by name."""
        with state_dir_fd(self.root) as dir_fd:
            return sorted(self._read(dir_fd), key=lambda s: s.binding.name)

    def get(self, name: str) -> StoredSecret:
        """The secret called ``name``; NOT_FOUND saying how to set it."""
        check_name(name)
        for secret in self.secrets():
            if secret.binding.name == name:
                return secret
        raise CcwError("NOT_FOUND", f"no secret is called {name} in {self.root}: ccw secret list shows them, "
                       f"ccw secret set {name} --host HOST sets it", {"name": name})

    def put(self, binding: Binding, source: str, value: bytes | None = None, command: str | None = None,
            timeout: float = DEFAULT_TIMEOUT) -> StoredSecret:
        """Store ``binding`` with its value (checked) or its command (run once now), replacing one of that name."""
        if source not in SOURCES or (source == "command") != (command is not None) or \
                (command is None) == (value is None):
            raise CcwError("INVALID_ARGUMENT", f"secret {binding.name}: give either a value (from a prompt, "
                           "stdin or a file) or --command, not both", {"name": binding.name})
        if not 0 < timeout <= 600:
            raise CcwError("INVALID_ARGUMENT", f"--timeout {timeout:g}: a command may take 0-600 seconds")
        if command is not None:
            if not command.strip() or len(command) > MAX_COMMAND or "\0" in command:
                raise CcwError("INVALID_ARGUMENT", f"secret {binding.name}: --command is a shell command line of "
                               f"1-{MAX_COMMAND} characters", {"name": binding.name})
            run_command(binding.name, command, timeout)
        stored = None if value is None else SecretValue(check_value(binding.name, value))
        secret = StoredSecret(binding, source, dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                              command, timeout, stored)
        with state_dir_fd(self.root) as dir_fd, locked(dir_fd, LOCK_NAME, str(self.root / LOCK_NAME)):
            others = [s for s in self._read(dir_fd) if s.binding.name != binding.name]
            replace_private(dir_fd, STORE_NAME, self.path, _encode([*others, secret]), WHAT)
        return secret

    def remove(self, name: str) -> StoredSecret:
        """Forget the secret ``name``; NOT_FOUND if there is none."""
        check_name(name)
        with state_dir_fd(self.root) as dir_fd, locked(dir_fd, LOCK_NAME, str(self.root / LOCK_NAME)):
            found = self._read(dir_fd)
            gone = [s for s in found if s.binding.name == name]
            if not gone:
                raise CcwError("NOT_FOUND", f"no secret is called {name}: ccw secret list shows them", {"name": name})
            kept = [s for s in found if s.binding.name != name]
            if kept:
                replace_private(dir_fd, STORE_NAME, self.path, _encode(kept), WHAT)
            else:
                remove_private(dir_fd, STORE_NAME, self.path, WHAT)
        return gone[0]

    def value(self, name: str) -> SecretValue:
        """The value of ``name`` now: the stored one, or what its command prints."""
        secret = self.get(name)
        if secret.command is not None:
            return SecretValue(run_command(name, secret.command, secret.timeout))
        assert secret.stored is not None
        return secret.stored

    def hosts_needing_tls(self) -> list[tuple[str, int]]:
        """Every host:port a secret is bound to: where the proxy must terminate TLS (core/tlsca.py)."""
        return sorted({host for secret in self.secrets() for host in secret.binding.hosts})
