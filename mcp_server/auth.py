"""Bearer tokens for the HTTP transport and the scopes they grant.

HTTP always authenticates, loopback included: any local user can reach a loopback port,
so the port is no proof of who is calling.  The tokens come from ``CCW_TOKENS_FILE``
when it is set; otherwise from the file the server generates in its state dir on first
start (``GENERATED_FILE``: one token named ``local`` with scope ``admin``, from
``secrets.token_urlsafe(32)``), which ``ccw client-config CLIENT --http HOST:PORT``
prints for a client and ``ccw http token rotate`` replaces (``rotate_generated``).  The
unix socket (peer credentials, mode 0600) stays the tokenless local path.

The file is JSON::

    {"tokens": [
        {"name": "ci-agent", "token": "a long random string", "scopes": ["read", "exec"]},
        {"name": "operator", "token": "…", "scopes": ["admin"]}
    ]}

Scopes are ``read, write, exec, promote, admin`` (``SCOPES``: defined here, where tokens
grant them; tools/registry.py holds each tool to one of them); ``admin`` grants every
scope.  Every tool declares the one scope it needs.  Tokens are compared in constant
time against every entry, so timing does not reveal which prefix matched.  A
``CCW_TOKENS_FILE`` readable by group or others is accepted with a warning on stderr
(the operator may share it on purpose).

A running server keeps the file in view (``TokenFile``), whichever it is: each request
costs one ``stat``, and when the file changed it is read and judged again exactly as at
start.  What a token held ends with it: a *credential* is a token under its name
(``Principal.key``, a keyed hash of both, so no secret travels in a request's scope),
and the credentials of the last good table that the new one lacks are *revoked*: the
HTTP transport ends their sessions and cuts their requests in flight.  A file that
cannot be used (gone, malformed, unsafe) revokes nothing, since a half-saved edit is not
a decision, and nothing is served until it is fixed.

Some facts about the generated file, which lives in a directory someone else might be
able to write (a state dir under ``/tmp``, a shared service dir):

- ``open(O_CREAT | O_EXCL)`` fails on any existing name, a symlink included, dangling or
  not, so creating never writes through a link planted there; ``O_NOFOLLOW`` makes the
  read fail (ELOOP) on a symlink instead of reading its target.
- The token is written to a fresh temporary name and ``link``-ed into place: ``link``
  never replaces an existing name, and a reader never sees a half-written file.  Two
  servers starting at once both keep the first file linked.  A rotation ``rename``s its
  temporary file over the name instead: ``rename`` replaces the name itself (a symlink
  there is replaced, never followed) in one step, so a reader sees the old file or the
  new one, and the new one has a new inode, which the server's ``stat`` sees.
- A file already there is trusted only if it is a regular file owned by the server's
  uid with no group or other permission bits.  Anything else is refused, not repaired:
  a token that was readable may already have been read, and a file someone else owns
  holds a token someone else chose.  The fix is to remove it and start again, or to
  rotate, which puts a fresh private file in its place.
- Reads go through a descriptor of the state dir (``dir_fd``), so every check is about
  the same directory; ``O_NONBLOCK`` keeps a FIFO planted there from hanging the start
  (or a running server's event loop).
- A file edited in place keeps its inode, and its mtime moves in clock ticks, so an edit
  in the tick in which the server read it would leave the ``stat`` unchanged.  As git
  does with its index ("racily clean" entries), a file changed less than ``RACY_NS`` before
  it was read is read again at the next look, until it has been still that long.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import stat
import time
from dataclasses import dataclass
from typing import Any

from mcp_server.logs import LOGGER
from mcp_server.statedir import make_state_dir
from sandbox.errors import CcwError, from_oserror, wrap_oserror

SCOPES = ("read", "write", "exec", "promote", "admin")  # what a token grants; each tool needs one
GENERATED_FILE = "http-tokens.json"  # in the state dir, when CCW_TOKENS_FILE is unset
GENERATED_NAME = "local"
MAX_TOKENS_FILE = 1 << 20  # bytes read from a tokens file; a real one is a few hundred
RACY_NS = 2_000_000_000  # a file changed this recently is read again at the next look (module docstring)
_CREDENTIAL_SALT = secrets.token_bytes(16)  # this process's: a credential's key means nothing elsewhere


@dataclass(frozen=True)
class Principal:
    """Who presented a token: its name in the file, the scopes it grants, and the credential's key."""

    name: str
    scopes: frozenset[str]
    key: str = ""  # the credential (this token under this name), as credential_key makes it

    def grants(self, scope: str) -> bool:
        """True when this principal may use something that needs ``scope``."""
        return scope in self.scopes or "admin" in self.scopes


def insufficient_scope(needed: str) -> tuple[bytes, bytes]:
    """The ``WWW-Authenticate`` header of a 403 for want of ``needed`` (RFC 6750 section 3's
    challenge, which the MCP authorization spec of 2025-11-25 asks for with that 403)."""
    return b"www-authenticate", f'Bearer realm="ccw", error="insufficient_scope", scope="{needed}"'.encode()


def credential_key(name: str, token: bytes) -> str:
    """A credential's identity in this process: equal for the same token under the same name, and
    no way back to the token (keyed with a random salt, so not even for a short one)."""
    return hashlib.blake2b(name.encode("utf-8") + b"\0" + token, key=_CREDENTIAL_SALT, digest_size=16).hexdigest()


@dataclass(frozen=True)
class TokenTable:
    """The bearer tokens an HTTP server accepts, and where they were read."""

    entries: tuple[tuple[bytes, Principal], ...]
    source: str = ""

    @classmethod
    def load(cls, path: str) -> TokenTable:
        """Read and check the tokens file; a malformed file raises CcwError saying what to fix."""
        return _operator_table(path, warn=True)

    @classmethod
    def for_server(cls, tokens_file: str, state_dir: str) -> TokenTable:
        """``tokens_file`` when set, else the state dir's generated file (made on first use)."""
        return cls.load(tokens_file) if tokens_file else cls.generated(state_dir)

    @classmethod
    def generated(cls, state_dir: str) -> TokenTable:
        """The state dir's generated tokens: created if absent, refused if unsafe (module docstring)."""
        path = generated_path(state_dir)
        dir_fd = _open_state_dir(state_dir)
        try:
            text = _generated_text(dir_fd, path, create=True)
        finally:
            os.close(dir_fd)
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
                    "INVALID_ARGUMENT",
                    f"{where}: tokens[{index}] has unknown scopes {unknown}; known: {', '.join(SCOPES)}",
                )
            name = str(item.get("name") or f"token{index}")
            token = item["token"].encode("utf-8")
            entries.append((token, Principal(name, frozenset(scopes), credential_key(name, token))))
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

    def credentials(self) -> frozenset[str]:
        """The keys of the credentials this table admits."""
        return frozenset(principal.key for _, principal in self.entries)

    def token_named(self, name: str | None) -> str:
        """The token of entry ``name`` (None: the only entry), for a client's config."""
        named = [(token, p) for token, p in self.entries if name is None or p.name == name]
        if len(named) != 1:
            names = ", ".join(sorted(p.name for _, p in self.entries))
            wanted = f"no token named {name!r}" if name else f"{len(self.entries)} tokens"
            raise CcwError("INVALID_ARGUMENT", f"{self.source}: {wanted}; choose one with --token-name ({names})")
        return named[0][0].decode("utf-8")


class TokenFile:
    """The tokens file as a running server sees it: one ``stat`` a look, read and judged again as
    at start when it changed (module docstring).  ``table`` is the last good table; ``fault``
    says why the file cannot be used now ("" when it can)."""

    def __init__(self, path: str, dir_fd: int | None, table: TokenTable, seen: os.stat_result | None) -> None:
        self.path = path
        self.generated = dir_fd is not None  # the state dir's generated file, else CCW_TOKENS_FILE
        self.table = table
        self.fault = ""
        self._dir_fd = dir_fd  # the state dir's, through which the generated file is read
        self._seen = _identity(seen)
        self._racy = _is_racy(seen)

    @classmethod
    def for_server(cls, tokens_file: str, state_dir: str) -> TokenFile:
        """The server's tokens, read now: a file that cannot be used stops the start (CcwError)."""
        if tokens_file:
            seen = _stat(tokens_file, None)
            return cls(tokens_file, None, TokenTable.load(tokens_file), seen)
        path = generated_path(state_dir)
        dir_fd = _open_state_dir(state_dir)
        try:
            _generated_text(dir_fd, path, create=True)
            seen = _stat(GENERATED_FILE, dir_fd)  # before the read: a change after it is seen next time
            text = _generated_text(dir_fd, path, create=False)
            return cls(path, dir_fd, TokenTable.parse(_decode(text, path), path), seen)
        except BaseException:
            os.close(dir_fd)
            raise

    def close(self) -> None:
        """Let go of the state dir."""
        if self._dir_fd is not None:
            os.close(self._dir_fd)
            self._dir_fd = None

    def refresh(self) -> frozenset[str]:
        """Look at the file (one stat); if it changed, read it again.  The credentials revoked."""
        if self.generated and self._dir_fd is None:
            return frozenset()  # closed: the server has stopped serving
        seen = _stat(GENERATED_FILE if self.generated else self.path, self._dir_fd)
        identity = _identity(seen)
        if identity == self._seen and not self._racy:
            return frozenset()
        changed = identity != self._seen  # not a racy look again, which must not repeat a warning
        self._seen, self._racy = identity, _is_racy(seen)
        try:
            table = self._read(changed)
        except CcwError as exc:
            if exc.message != self.fault:
                LOGGER.error(f"mcp:http every request is refused until the tokens file is fixed: {exc.message}")
            self.fault = exc.message
            return frozenset()
        revoked = self.table.credentials() - table.credentials()
        if revoked or self.fault:
            ended = f", {len(revoked)} revoked: what they hold ends" if revoked else ""
            LOGGER.info(f"mcp:http tokens file {self.path} read again: {len(table.entries)} tokens{ended}")
        self.table, self.fault = table, ""
        return revoked

    def _read(self, changed: bool) -> TokenTable:
        if self._dir_fd is None:
            return _operator_table(self.path, warn=changed)
        text = _generated_text(self._dir_fd, self.path, create=False)
        return TokenTable.parse(_decode(text, self.path), self.path)


def generated_path(state_dir: str) -> str:
    """Where the server keeps its generated tokens when CCW_TOKENS_FILE is unset."""
    return os.path.join(state_dir, GENERATED_FILE)


@dataclass(frozen=True)
class Rotation:
    """What ``rotate_generated`` did: where the new token is, and what it replaced."""

    path: str
    replaced: bool  # a file (or anything) was there
    unsafe: str = ""  # what was there when it was not a private file of ours (_describe), else ""


def rotate_generated(state_dir: str) -> Rotation:
    """Replace the state dir's generated token with a fresh one (``ccw http token rotate``).

    The new file is made as the first one is, and ``rename``d over the name in one step,
    whatever is there (nothing, the old file, a planted symlink or FIFO: replaced, never
    followed or read), so a server reads the old token or the new one, never a mix.
    """
    path = generated_path(state_dir)
    dir_fd = _open_state_dir(state_dir)
    try:
        try:
            before = os.stat(GENERATED_FILE, dir_fd=dir_fd, follow_symlinks=False)
            rotation = Rotation(path, True, "" if _is_private(before) else _describe(before))
        except FileNotFoundError:
            rotation = Rotation(path, False)
        temporary = _write_temporary(dir_fd, path)
        try:
            with wrap_oserror("replace generated tokens file", path, "remove it and rotate again"):
                os.rename(temporary, GENERATED_FILE, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                os.fsync(dir_fd)  # the rename itself survives a crash: the old token stays dead
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary, dir_fd=dir_fd)
            raise
    finally:
        os.close(dir_fd)
    return rotation


def _identity(info: os.stat_result | None) -> tuple[int, ...] | None:
    """What a look compares: a new inode (a rename), or new times or size (an edit in place)."""
    if info is None:
        return None
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _is_racy(info: os.stat_result | None) -> bool:
    """True when the file changed so recently that an edit in the same clock tick would not show."""
    return info is not None and time.time_ns() - max(info.st_mtime_ns, info.st_ctime_ns) < RACY_NS


def _stat(name: str, dir_fd: int | None) -> os.stat_result | None:
    """The file's stat (never through a symlink in the state dir); None when it cannot be had."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=dir_fd is None)
    except OSError:
        return None  # the read that follows says why


def _decode(text: str, path: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: deeply nested arrays
        raise CcwError("INVALID_ARGUMENT", f"tokens file {path}: not JSON ({exc})") from None


def _operator_table(path: str, warn: bool) -> TokenTable:
    """CCW_TOKENS_FILE's table; if ``warn``, a file group or others may read is said on stderr."""
    text, shared = _read_operator(path)
    if shared and warn:
        LOGGER.warning(f"mcp:warning tokens file {path} is readable by group or others")
    return TokenTable.parse(_decode(text, path), path)


def _read_operator(path: str) -> tuple[str, bool]:
    """CCW_TOKENS_FILE's text (a regular file: a server reads it again when it changes), and
    whether group or others may read it."""
    hint = "set CCW_TOKENS_FILE to a readable JSON file"
    with wrap_oserror("read tokens file", path, hint):
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO must not hang the loop
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise CcwError("INVALID_ARGUMENT", f"tokens file {path} is not a regular file; {hint}")
            text = os.read(fd, MAX_TOKENS_FILE).decode("utf-8", "replace")
        finally:
            os.close(fd)
    return text, bool(info.st_mode & (stat.S_IRGRP | stat.S_IROTH))


def _open_state_dir(state_dir: str) -> int:
    make_state_dir(state_dir)
    with wrap_oserror("open state dir", state_dir, "set CCW_STATE_DIR to a directory you own"):
        return os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def _generated_text(dir_fd: int, path: str, create: bool) -> str:
    """The generated file's text; made first if absent and ``create``."""
    text = _read_generated(dir_fd, path)
    if text is None and create:
        _create_generated(dir_fd, path)
        text = _read_generated(dir_fd, path)
    if text is None:
        raise CcwError("NOT_FOUND", f"{path} is gone: run `ccw http token rotate` to make a new token "
                       "(or start the server again)", {"path": path})
    return text


def _read_generated(dir_fd: int, path: str) -> str | None:
    """The generated file's text, None if absent; anything but our own private file is refused."""
    remove = f"remove {path} and start the server again, or run `ccw http token rotate`, to get a fresh token"
    try:
        fd = os.open(GENERATED_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP: a symlink, never followed
        raise from_oserror(exc, "open generated tokens file", path,
                           f"ccw never follows a symlink there; {remove}") from exc
    try:
        info = os.fstat(fd)
        if not _is_private(info):
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


def _is_private(info: os.stat_result) -> bool:
    """A regular file of this uid's that no one else may read or write: the only kind trusted."""
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o077


def _describe(info: os.stat_result) -> str:
    kind = "a regular file" if stat.S_ISREG(info.st_mode) else "not a regular file"
    return f"{kind} owned by uid {info.st_uid} with mode {stat.S_IMODE(info.st_mode):04o}"


def _write_temporary(dir_fd: int, path: str) -> str:
    """A fresh admin token in a new private file beside ``path``; its name, for link or rename."""
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
        except BaseException:
            os.unlink(temporary, dir_fd=dir_fd)
            raise
    return temporary


def _create_generated(dir_fd: int, path: str) -> None:
    """Write a fresh admin token under a temporary name, then link it into place (never replacing)."""
    temporary = _write_temporary(dir_fd, path)
    try:
        with wrap_oserror("create generated tokens file", path, "set CCW_STATE_DIR to a directory you own"):
            try:
                os.link(temporary, GENERATED_FILE, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
            except FileExistsError:
                pass  # another server linked its file first, or something was planted: read and judged next
    finally:
        os.unlink(temporary, dir_fd=dir_fd)
    LOGGER.info(f"mcp:http generated a bearer token in {path} (mode 0600); ccw client-config CLIENT --http "
                "HOST:PORT prints it")
