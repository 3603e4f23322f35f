"""Bearer tokens for the HTTP transport and the scopes they grant.

HTTP always authenticates, loopback included: any local user can reach a loopback port,
so the port is no proof of who is calling.  The tokens come from ``CCW_TOKENS_FILE``
when it is set; otherwise from the file the server generates in its state dir on first
start (``GENERATED_FILE``: one token named ``local`` with scope ``admin``, from
``secrets.token_urlsafe(32)``), which ``ccw client-config CLIENT --http HOST:PORT``
prints for a client.  The unix socket (peer credentials, mode 0600) stays the tokenless
local path.

The file is JSON::

    {"tokens": [
        {"name": "ci-agent", "token": "a long random string", "scopes": ["read", "exec"]},
        {"name": "operator", "token": "…", "scopes": ["admin"]}
    ]}

Scopes are ``read, write, exec, promote, admin`` (``SCOPES``: defined here, where tokens
grant them; tools/registry.py holds each tool to one of them); ``admin`` grants every
scope.  Every tool declares the one scope it needs.  Tokens are compared in constant
time against every entry, so timing does not reveal which prefix matched.  The file is
read once at start; a ``CCW_TOKENS_FILE`` readable by group or others is accepted with a
warning on stderr (the operator may share it on purpose).

Some facts about the generated file, which lives in a directory someone else might be
able to write (a state dir under ``/tmp``, a shared service dir):

- ``open(O_CREAT | O_EXCL)`` fails on any existing name, a symlink included, dangling or
  not, so creating never writes through a link planted there; ``O_NOFOLLOW`` makes the
  read fail (ELOOP) on a symlink instead of reading its target.
- The token is written to a fresh temporary name and ``link``-ed into place: ``link``
  never replaces an existing name, and a reader never sees a half-written file.  Two
  servers starting at once both keep the first file linked.
- A file already there is trusted only if it is a regular file owned by the server's
  uid with no group or other permission bits.  Anything else is refused, not repaired:
  a token that was readable may already have been read, and a file someone else owns
  holds a token someone else chose.  The fix is to remove it and start again.
- Reads go through a descriptor of the state dir (``dir_fd``), so every check is about
  the same directory; ``O_NONBLOCK`` keeps a FIFO planted there from hanging the start.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import stat
from dataclasses import dataclass
from typing import Any

from mcp_server.logs import LOGGER
from sandbox.errors import CcwError, from_oserror, wrap_oserror

SCOPES = ("read", "write", "exec", "promote", "admin")  # what a token grants; each tool needs one
GENERATED_FILE = "http-tokens.json"  # in the state dir, when CCW_TOKENS_FILE is unset
GENERATED_NAME = "local"
MAX_TOKENS_FILE = 1 << 20  # bytes read from a tokens file; a real one is a few hundred


@dataclass(frozen=True)
class Principal:
    """Who presented a token: its name in the file and the scopes it grants."""

    name: str
    scopes: frozenset[str]

    def grants(self, scope: str) -> bool:
        """True when this principal may use something that needs ``scope``."""
        return scope in self.scopes or "admin" in self.scopes


@dataclass(frozen=True)
class TokenTable:
    """The bearer tokens an HTTP server accepts, and where they were read."""

    entries: tuple[tuple[bytes, Principal], ...]
    source: str = ""

    @classmethod
    def load(cls, path: str) -> TokenTable:
        """Read and check the tokens file; a malformed file raises CcwError saying what to fix."""
        with wrap_oserror("read tokens file", path, "set CCW_TOKENS_FILE to a readable JSON file"):
            mode = os.stat(path).st_mode
            with open(path, encoding="utf-8") as handle:
                text = handle.read(MAX_TOKENS_FILE)
        if mode & (stat.S_IRGRP | stat.S_IROTH):
            LOGGER.warning(f"mcp:warning tokens file {path} is readable by group or others")
        return cls.parse(_decode(text, path), path)

    @classmethod
    def for_server(cls, tokens_file: str, state_dir: str) -> TokenTable:
        """``tokens_file`` when set, else the state dir's generated file (made on first use)."""
        return cls.load(tokens_file) if tokens_file else cls.generated(state_dir)

    @classmethod
    def generated(cls, state_dir: str) -> TokenTable:
        """The state dir's generated tokens: created if absent, refused if unsafe (module docstring)."""
        path = generated_path(state_dir)
        with wrap_oserror("open state dir", state_dir, "set CCW_STATE_DIR to a directory you own"):
            os.makedirs(state_dir, mode=0o700, exist_ok=True)
            dir_fd = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            text = _read_generated(dir_fd, path)
            if text is None:
                _create_generated(dir_fd, path)
                text = _read_generated(dir_fd, path)
        finally:
            os.close(dir_fd)
        if text is None:
            raise CcwError("CONFLICT", f"{path} vanished as it was created; start the server again")
        return cls.parse(_decode(text, path), path)

    @classmethod
    def parse(cls, data: Any, where: str = "tokens") -> TokenTable:
        """Build a table from the decoded file contents."""
        items = data.get("tokens") if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise CcwError("INVALID_ARGUMENT", f'{where}: expected {{"tokens": [{{"name", "token", "scopes"}}, …]}}')
        entries = []
        for index, item in enumerate(items):
            if not isinstance(item, dict) or not isinstance(item.get("token"), str) or not item["token"]:
                raise CcwError("INVALID_ARGUMENT", f"{where}: tokens[{index}] needs a non-empty string 'token'")
            scopes = item.get("scopes")
            if not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes):
                raise CcwError("INVALID_ARGUMENT", f"{where}: tokens[{index}].scopes must be a list of strings")
            unknown = sorted(set(scopes) - set(SCOPES))
            if unknown:
                raise CcwError(
                    "INVALID_ARGUMENT", f"{where}: tokens[{index}] has unknown scopes {unknown}; known: {', '.join(SCOPES)}"
                )
            name = str(item.get("name") or f"token{index}")
            entries.append((item["token"].encode("utf-8"), Principal(name, frozenset(scopes))))
        return cls(tuple(entries), where)

    def authenticate(self, authorization: str | None) -> Principal | None:
        """The principal for an ``Authorization: Bearer …`` header value, or None.

        RFC 6750's form, ``Bearer`` (any case), one or more spaces, the token: nothing
        else around it (HTTP has already removed the header's own outer whitespace).
        """
        if not authorization or authorization[:7].lower() != "bearer ":
            return None
        presented = authorization[7:].lstrip(" ").encode("utf-8")
        found = None
        for token, principal in self.entries:
            if hmac.compare_digest(token, presented):
                found = principal
        return found

    def token_named(self, name: str | None) -> str:
        """The token of entry ``name`` (None: the only entry), for a client's config."""
        named = [(token, p) for token, p in self.entries if name is None or p.name == name]
        if len(named) != 1:
            names = ", ".join(sorted(p.name for _, p in self.entries))
            wanted = f"no token named {name!r}" if name else f"{len(self.entries)} tokens"
            raise CcwError("INVALID_ARGUMENT", f"{self.source}: {wanted}; choose one with --token-name ({names})")
        return named[0][0].decode("utf-8")


def generated_path(state_dir: str) -> str:
    """Where the server keeps its generated tokens when CCW_TOKENS_FILE is unset."""
    return os.path.join(state_dir, GENERATED_FILE)


def _decode(text: str, path: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CcwError("INVALID_ARGUMENT", f"tokens file {path}: not JSON ({exc})") from None


def _read_generated(dir_fd: int, path: str) -> str | None:
    """The generated file's text, None if absent; anything but our own private file is refused."""
    remove = f"remove {path} and start the server again to generate a fresh token"
    try:
        fd = os.open(GENERATED_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP: a symlink, never followed
        raise from_oserror(exc, "open generated tokens file", path, f"ccw never follows a symlink there; {remove}") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise CcwError(
                "PERMISSION_DENIED",
                f"refusing the tokens file {path}: it must be a regular file owned by uid {os.geteuid()} "
                f"with mode 0600, and it is {_describe(info)}; its token may have been read or chosen "
                f"by someone else, so it is not repaired: {remove}",
                {"path": path},
            )
        with wrap_oserror("read generated tokens file", path, remove):
            return os.read(fd, MAX_TOKENS_FILE).decode("utf-8", "replace")
    finally:
        os.close(fd)


def _describe(info: os.stat_result) -> str:
    kind = "a regular file" if stat.S_ISREG(info.st_mode) else "not a regular file"
    return f"{kind} owned by uid {info.st_uid} with mode {stat.S_IMODE(info.st_mode):04o}"


def _create_generated(dir_fd: int, path: str) -> None:
    """Write a fresh admin token under a temporary name, then link it into place (never replacing)."""
    document = {"tokens": [{"name": GENERATED_NAME, "token": secrets.token_urlsafe(32), "scopes": ["admin"]}]}
    temporary = f".{GENERATED_FILE}.{os.getpid()}.{secrets.token_hex(6)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with wrap_oserror("create generated tokens file", path, "set CCW_STATE_DIR to a directory you own"):
        fd = os.open(temporary, flags, 0o600, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                os.fchmod(fd, 0o600)  # whatever the umask left
                handle.write(json.dumps(document, indent=2) + "\n")
                handle.flush()
                os.fsync(fd)
            try:
                os.link(temporary, GENERATED_FILE, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
            except FileExistsError:
                pass  # another server linked its file first, or something was planted: read and judged next
        finally:
            os.unlink(temporary, dir_fd=dir_fd)
    LOGGER.info(f"mcp:http generated a bearer token in {path} (mode 0600); ccw client-config CLIENT --http "
                "HOST:PORT prints it")
