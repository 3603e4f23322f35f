"""Bearer tokens for the HTTP transport (``CCW_TOKENS_FILE``) and the scopes they grant.

The file is JSON::

    {"tokens": [
        {"name": "ci-agent", "token": "a long random string", "scopes": ["read", "exec"]},
        {"name": "operator", "token": "…", "scopes": ["admin"]}
    ]}

Scopes are ``read, write, exec, promote, admin`` (mcp_server.tools.registry.SCOPES);
``admin`` grants every scope.  Every tool declares the one scope it needs.  Tokens are
compared in constant time against every entry, so timing does not reveal which
prefix matched.  The file is read once at start; a file readable by group or others
is accepted with a warning on stderr (the operator may share it on purpose).
"""

from __future__ import annotations

import hmac
import json
import os
import stat
from dataclasses import dataclass
from typing import Any

from mcp_server.logs import LOGGER
from mcp_server.tools.registry import SCOPES
from sandbox.errors import CcwError, wrap_oserror


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
    """The tokens of CCW_TOKENS_FILE."""

    entries: tuple[tuple[bytes, Principal], ...]

    @classmethod
    def load(cls, path: str) -> TokenTable:
        """Read and check the tokens file; a malformed file raises CcwError saying what to fix."""
        with wrap_oserror("read tokens file", path, "set CCW_TOKENS_FILE to a readable JSON file"):
            mode = os.stat(path).st_mode
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        if mode & (stat.S_IRGRP | stat.S_IROTH):
            LOGGER.warning(f"mcp:warning tokens file {path} is readable by group or others")
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise CcwError("INVALID_ARGUMENT", f"tokens file {path}: not JSON ({exc})") from None
        return cls.parse(data, path)

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
        return cls(tuple(entries))

    def authenticate(self, authorization: str | None) -> Principal | None:
        """The principal for an ``Authorization: Bearer …`` header value, or None."""
        if not authorization or authorization[:7].lower() != "bearer ":
            return None
        presented = authorization[7:].strip().encode("utf-8")
        found = None
        for token, principal in self.entries:
            if hmac.compare_digest(token, presented):
                found = principal
        return found
