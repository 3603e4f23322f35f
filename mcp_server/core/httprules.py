"""Method/path rules: which requests a capsule may send to a host, judged one by one.

Pure logic (no I/O).  core/netrules.py parses the rules (``GET,HEAD https://pypi.example/simple/**``,
``READ http://api.internal:8080/v1/**``) into the capsule's allowlist, where they admit
connections to their host and port; this module judges each request sent there: the
proxy asks ``RequestRules.check`` with the request's method and target, for plain HTTP
(egress/proxy.py) and for the requests of a TLS connection it terminated.

Choices made here:
- **A host with a method/path rule is narrowed by it.**  Once any such rule names
  ``host:port``, a request there passes only if one of them allows it, even when a host
  rule (``pypi.example``, a preset's) also admits the host: adding ``READ
  https://pypi.example/**`` beside ``pypi.example`` makes it read-only, as a person
  writing it means.  A host without one is not read (``check`` says None).
- **The path judged is the path the server will act on, or the request is refused.**
  Servers resolve dot segments, decode percent escapes and, some, read ``;params`` or a
  backslash as a separator, so a path that matches a rule as text could name another
  place (``/simple/../admin``, ``/simple/%2e%2e/admin``, ``/simple/..;/admin``,
  ``/simple/..%2fadmin``, ``/simple\\..\\admin``).  So ``normal_path`` refuses any path
  with a dot segment (after decoding ``%2e`` and dropping ``;params``), an escaped ``/``,
  ``\\``, ``%`` or NUL, a raw backslash, a byte outside visible ASCII, or a broken escape;
  decodes the escapes of unreserved characters (RFC 3986 makes ``%7E`` and ``~`` one
  path); and leaves other escapes as they are (a rule's literal text has no ``%``, so
  only a ``*`` can match one).  The query is not judged (nor recorded: it may carry a
  placeholder or a token).
- **A ``*`` matches one or more characters within a segment, never none**: a server that
  collapses ``//`` would otherwise read ``/a//b``, which ``/a/*/b`` matched, as ``/a/b``,
  which it does not allow.  ``**`` matches anything, ``/`` included, or nothing.
- **Methods are compared exactly**: HTTP methods are case-sensitive, so ``get`` is not
  ``GET`` and is refused by a rule that names GET (a server that reads it as GET still
  got nothing the rule did not allow, since the rule would have allowed GET).
- **The scheme counts**: ``https://`` rules judge requests read out of TLS the proxy
  terminated, ``http://`` rules plain requests; a plain request to a port whose rules
  are all ``https://`` is refused.
- **A refusal names the rules it missed** and what was asked (``Verdict.line``: the
  method and the path, never a header or the body), so the jail's 403 and the run's
  connection record say what to allow.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass

from mcp_server.core.netrules import NetworkSpec, Rule

MAX_LINE = 300  # characters of a request line kept in a record
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_NEVER_ESCAPED = frozenset(b"/\\%\0")  # an escaped separator, backslash, percent (double escaping) or NUL


@dataclass(frozen=True)
class Verdict:
    """One request judged: allowed by ``rule``, or refused (``reason`` names the rules missed);
    ``line`` is what a record keeps of the request (method and path, no query)."""

    allowed: bool
    rule: str | None
    reason: str
    line: str


class BadPath(ValueError):
    """A request path ccw cannot judge (the message says why); the request is refused."""


def _decoded(match: re.Match[str]) -> str:
    byte = int(match.group(1), 16)
    if byte in _NEVER_ESCAPED:
        raise BadPath(f"it escapes {chr(byte)!r} as {match.group(0)}, which servers read differently")
    return chr(byte) if byte in _UNRESERVED else match.group(0).upper()


def normal_path(target: str) -> str:
    """The path of an origin-form ``target`` as rules match it (unreserved escapes decoded, the
    query dropped); BadPath when a server could read it as another path (module docstring)."""
    path = target.split("?", 1)[0]
    if not path.startswith("/"):
        raise BadPath("it is not a path starting with /")
    if any(not 0x21 <= ord(ch) <= 0x7E for ch in path) or "\\" in path or "#" in path:
        raise BadPath("it has a space, control or non-ASCII byte, a backslash or a #")
    if re.search(r"%(?![0-9A-Fa-f]{2})", path):
        raise BadPath("it has a % that starts no escape")
    path = _ESCAPE.sub(_decoded, path)
    if any(segment.split(";", 1)[0] in (".", "..") for segment in path.split("/")):
        raise BadPath("it has a dot segment (. or ..), which a server resolves to another path")
    return path


@functools.lru_cache(maxsize=1024)
def pattern(path: str) -> re.Pattern[str]:
    """A rule's path as a regular expression: ``**`` any text, ``*`` one or more within a segment."""
    pieces = re.split(r"(\*\*|\*)", path)
    parts = [".*" if piece == "**" else "[^/]+" if piece == "*" else re.escape(piece) for piece in pieces]
    return re.compile("".join(parts) + r"\Z")


def allows(rule: Rule, scheme: str, method: str, path: str) -> bool:
    """Whether method/path ``rule`` allows ``method`` on ``path`` (normal_path's) over ``scheme``."""
    return (rule.scheme == scheme and ("*" in rule.methods or method in rule.methods)
            and pattern(rule.path).match(path) is not None)


class RequestRules:
    """A capsule's method/path rules by host and port: what the proxy asks per request."""

    def __init__(self, rules: Iterable[Rule]) -> None:
        self._by_host: dict[tuple[str, int], list[Rule]] = {}
        for rule in rules:
            if rule.is_http:
                assert rule.port is not None  # a method/path rule always has its port
                self._by_host.setdefault((rule.host, rule.port), []).append(rule)

    def hosts(self) -> frozenset[tuple[str, int]]:
        """The (host, port) pairs whose requests are judged: a tunnel to one would carry them
        unread, so the proxy terminates its TLS (or refuses it)."""
        return frozenset(self._by_host)

    def tls_hosts(self) -> frozenset[tuple[str, int]]:
        """The (host, port) pairs an https rule names: the proxy terminates their TLS (egress/tlsterm.py)."""
        return frozenset(pair for pair, rules in self._by_host.items() if any(rule.scheme == "https" for rule in rules))

    def check(self, host: str, port: int, scheme: str, method: str | bytes,
              target: str | bytes) -> Verdict | None:
        """The verdict on one request to ``host:port`` (``host`` as netrules.normalize_host
        leaves it), or None when no method/path rule names that host and port."""
        rules = self._by_host.get((host, port))
        if rules is None:
            return None
        method = method.decode("ascii", "replace") if isinstance(method, bytes) else method
        target = target.decode("ascii", "replace") if isinstance(target, bytes) else target
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        missed = "; ".join(rule.text for rule in rules)
        try:
            path = normal_path(target)
        except BadPath as exc:
            line = f"{method} {target.split('?', 1)[0]}"[:MAX_LINE]
            return Verdict(False, None, f"{line} to {shown} refused: {exc}; its rules: {missed}", line)
        line = f"{method} {path}"[:MAX_LINE]
        for rule in rules:
            if allows(rule, scheme, method, path):
                return Verdict(True, rule.text, f"allowed by {rule.text}", line)
        return Verdict(False, None, f"no rule allows {scheme} {line} to {shown}; its method/path rules: {missed}",
                       line)


@functools.lru_cache(maxsize=64)
def of(spec: NetworkSpec) -> RequestRules:
    """The method/path rules of ``spec`` (kept: a session asks at every request)."""
    return RequestRules(spec.allow)
