"""What a secret is bound to: its name, the hosts it may be sent to, and where in a request it goes.

Pure logic (no I/O): the secret store (``fs/secretstore.py``) keeps a ``Binding`` beside
each value, the ``ccw secret`` command builds one from its flags, and the placeholder
rewriter (``core/placeholders.py``) reads it to decide where a value may be put.  No
value ever passes through this module, so nothing here can print one.

Choices made here:
- **A name** is an environment variable's name (``[A-Za-z_][A-Za-z0-9_]{0,63}``): a
  capsule asks for a secret by name and finds its placeholder in the variable of that
  name.
- **Hosts are exact**: a name or an IP address with a port, parsed by
  ``core/netrules.parse_rule`` so they read as the allowlist's rules do.  No wildcard and
  no CIDR: a person names each host a credential belongs to, and the TLS CA made for
  them (``core/tlsca.py``) is constrained to exactly those names.  A host without a
  port means 443 only, not netrules' 80 and 443: a credential sent over plain HTTP is
  on the wire for anyone between, so port 80 must be written (``host:80``).
- **Where a value goes only inside TLS**: port 443, and any host written
  ``https://HOST[:PORT]`` (443 unless given).  A port says nothing of its scheme (8443 is
  as often HTTPS as 8080 is plain), so a binding to another port goes as each request's
  scheme says unless the person wrote ``https://``; the proxy refuses such a value in a
  cleartext request (egress/credentials.py ``Credentials.judge``).
- **The format** says where the value goes: a template with one ``{}`` for the value
  (``'Bearer {}'``, ``'token {}'``, ``'{}'``) that the named header must equal exactly;
  ``basic-user`` / ``basic-password``, the user or the password inside
  ``Authorization: Basic``; or ``query:PARAM``, a query parameter of the request line.
  Without ``--format`` it is ``'Bearer {}'`` for ``Authorization`` and ``'{}'`` for any
  other header.  Headers that carry the connection itself (``Host``, ``Content-Length``,
  ``Transfer-Encoding``, the hop-by-hop ones) cannot hold a secret.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mcp_server.core.netrules import parse_rule
from sandbox.errors import CcwError

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
NAME_RULE = "1-64 letters, digits and '_', not starting with a digit (it names the capsule's variable)"
HEADER = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}\Z")  # RFC 9110 token
PARAM = re.compile(r"[A-Za-z0-9._~-]{1,64}\Z")  # a query parameter's name that needs no escaping
TEMPLATE_CHARS = re.compile(r"[\x20-\x7e]{0,128}\Z")
DEFAULT_PORT = 443
TLS_PORT = 443  # a value bound here was meant for HTTPS, written https:// or not
HTTPS = "https://"
AUTHORIZATION = "authorization"
BASIC_FORMATS = ("basic-user", "basic-password")
QUERY = "query:"
FORMAT_HELP = "'Bearer {}' (any text with one {}), basic-user, basic-password or query:PARAM"
UNFIT_HEADERS = frozenset({
    "host", "content-length", "transfer-encoding", "connection", "keep-alive", "proxy-connection",
    "proxy-authorization", "proxy-authenticate", "te", "trailer", "upgrade",
})
MAX_HOSTS = 32


@dataclass(frozen=True)
class Binding:
    """A secret's name and where its value may go (never the value)."""

    name: str
    hosts: tuple[tuple[str, int], ...]  # (host as netrules normalises it, port), sorted
    header: str | None  # lowercase header name; None for query:PARAM
    format: str  # a template with one {}, basic-user, basic-password, or query:PARAM
    tls_hosts: tuple[tuple[str, int], ...] = ()  # those of ``hosts`` written https://, sorted

    @property
    def query_param(self) -> str | None:
        """The query parameter of a ``query:PARAM`` binding, else None."""
        return self.format[len(QUERY):] if self.format.startswith(QUERY) else None

    def binds(self, host: str, port: int) -> bool:
        """True if the value may be sent to ``host:port`` (``host`` as netrules.normalize_host left it)."""
        return (host, port) in self.hosts

    def tls_only(self, host: str, port: int) -> bool:
        """True if the value may go to ``host:port`` only inside TLS: port 443, or a host written https://."""
        return port == TLS_PORT or (host, port) in self.tls_hosts

    def host_texts(self) -> list[str]:
        """The hosts as ``host:port`` (IPv6 in brackets), ``https://`` before those written so but 443."""
        return [(HTTPS if port != TLS_PORT and (host, port) in self.tls_hosts else "") + host_text(host, port)
                for host, port in self.hosts]

    def to_json(self) -> dict[str, Any]:
        """The stored and listed form."""
        return {"name": self.name, "hosts": self.host_texts(), "header": self.header, "format": self.format}


def host_text(host: str, port: int) -> str:
    """``host:port``, with an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def check_name(name: str) -> str:
    """``name`` if it can name a secret; INVALID_ARGUMENT saying what a name is otherwise."""
    if not isinstance(name, str) or not NAME.match(name):
        shown = name[:80] if isinstance(name, str) else type(name).__name__
        raise CcwError("INVALID_ARGUMENT", f"{shown!r} cannot name a secret: use {NAME_RULE}", {"name": shown})
    return name


def parse_host(text: str) -> tuple[str, int, bool]:
    """``[https://]HOST[:PORT]`` as (host, port, written https://): an exact name or IP address,
    port 443 unless given."""
    if not isinstance(text, str):
        raise CcwError("INVALID_ARGUMENT", f"a secret's host is a string like api.example.com:443, not {text!r}")
    tls = text[:len(HTTPS)].lower() == HTTPS
    text = text[len(HTTPS):] if tls else text
    if "://" in text:
        raise CcwError("INVALID_ARGUMENT", f"secret host {text!r}: https:// is the only scheme a host may be "
                       "written with (it keeps the value inside TLS); a plain HOST:PORT goes as each request's "
                       "scheme says", {"host": text})
    host, slash, path = text.rpartition("@")[2].partition("/")
    if "@" in text or (slash and not path[:1].isdigit()):  # a URL pasted whole (a CIDR's "/" has digits after)
        raise CcwError("INVALID_ARGUMENT", f"secret host {text!r}: a secret is bound to a host, not a URL: "
                       f"give --host {HTTPS if tls else ''}{host} (no user, no path; the client's URL keeps "
                       "them)", {"host": text})
    if "*" in text or "/" in text:
        raise CcwError("INVALID_ARGUMENT", f"secret host {text!r}: a secret is bound to exact hosts, never a "
                       "wildcard or a network; give each host with its own --host", {"host": text})
    rule = parse_rule(text)  # INVALID_ARGUMENT with the grammar for anything else
    return rule.host, rule.port if rule.port is not None else DEFAULT_PORT, tls


def _header(header: str | None, fmt: str) -> str | None:
    if fmt.startswith(QUERY):
        if header is not None:
            raise CcwError("INVALID_ARGUMENT", f"--format {fmt} puts the value in the request line, not a header: "
                           "drop --header", {"format": fmt})
        return None
    name = (header or "Authorization").lower()
    if not HEADER.match(name) or name in UNFIT_HEADERS:
        raise CcwError("INVALID_ARGUMENT", f"{(header or '')[:80]!r} cannot carry a secret: a header name is an "
                       f"HTTP token, and not one of {', '.join(sorted(UNFIT_HEADERS))}", {"header": header})
    if fmt in BASIC_FORMATS and name != AUTHORIZATION:
        raise CcwError("INVALID_ARGUMENT", f"--format {fmt} is Basic auth, which travels in Authorization: drop "
                       f"--header {header}", {"header": header})
    return name


def _format(fmt: str | None, header: str | None) -> str:
    if fmt is None:
        return "Bearer {}" if header is None or header.lower() == AUTHORIZATION else "{}"
    if fmt in BASIC_FORMATS:
        return fmt
    if fmt.startswith(QUERY):
        if not PARAM.match(fmt[len(QUERY):]):
            raise CcwError("INVALID_ARGUMENT", f"--format {fmt[:80]!r}: the parameter's name is 1-64 of letters, "
                           "digits, '.', '_', '~' and '-'", {"format": fmt[:80]})
        return fmt
    rest = fmt.replace("{}", "", 1)
    if not TEMPLATE_CHARS.match(fmt) or "{}" not in fmt or "{" in rest or "}" in rest:
        raise CcwError("INVALID_ARGUMENT", f"--format {fmt[:80]!r} is not one of {FORMAT_HELP}: a template is "
                       "printable ASCII with exactly one {} and no other brace", {"format": fmt[:80]})
    return fmt


def make_binding(name: str, hosts: Iterable[str], header: str | None = None, fmt: str | None = None) -> Binding:
    """A checked ``Binding`` from ``ccw secret set``'s arguments; INVALID_ARGUMENT saying what to change."""
    check_name(name)
    written = [parse_host(text) for text in hosts]
    parsed = sorted({(host, port) for host, port, _tls in written})
    if not parsed:
        raise CcwError("INVALID_ARGUMENT", f"secret {name} needs at least one --host HOST[:PORT]: the hosts its "
                       "value may be sent to", {"name": name})
    if len(parsed) > MAX_HOSTS:
        raise CcwError("INVALID_ARGUMENT", f"secret {name} names {len(parsed)} hosts; at most {MAX_HOSTS}: a "
                       "credential used that widely is better split into several secrets", {"name": name})
    chosen = _format(fmt, header)
    tls_hosts = tuple(sorted({(host, port) for host, port, tls in written if tls}))
    return Binding(name, tuple(parsed), _header(header, chosen), chosen, tls_hosts)


def binding_from_json(document: Mapping[str, Any]) -> Binding:
    """A stored binding read back (checked again: the file could have been edited)."""
    header = document.get("header")
    return make_binding(str(document["name"]), [str(h) for h in document["hosts"]],
                        None if header is None else str(header), str(document["format"]))
