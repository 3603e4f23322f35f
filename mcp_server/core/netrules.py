"""A capsule's network allowlist: the rule grammar, parsing, and the decision per request.

Pure logic (no I/O): the egress proxy (``mcp_server.egress``) asks ``decide`` before it
resolves or connects anything, and ``core/netspace.refusal`` for each address it is
about to connect to.

Choices made here:
- A capsule's ``network`` is ``None`` ("none": the jail has only loopback) or a
  ``NetworkSpec``: the allow rules and two per-exec caps (bytes both ways summed,
  connections).  There is no empty allowlist: that is "none", said plainly.
- Rule grammar: ``host[:port]``, ``*.domain[:port]`` (any name strictly under the
  domain, never the domain itself), IPv4 ``a.b.c.d[:port]``, IPv4 CIDR
  ``a.b.c.d/n[:port]``, IPv6 ``[addr]:port`` or bare ``addr`` (no port), IPv6 CIDR
  ``addr/n`` or ``[addr/n]:port``.  Names are lowercased ASCII letters, digits, ``-``
  and ``.`` with no trailing dot.
- A rule without a port allows ports 80 and 443 (``WEB_PORTS``), not every port: what
  an allowlist is mostly for is the web, and an unported rule for a host that also
  runs ssh, a database or an admin console should not open them by accident.  Any
  other port is named: ``pypi.org:8443``.  (A policy's ``allow_hosts``/``deny_hosts``
  share the grammar but judge connections already made, where a rule without a port
  matches any port: ``Rule.matches``.)
- Names match only name rules and IP literals only IP rules.  So a denied name is never
  resolved (no DNS query leaves for it), and an allowed name is not judged by the
  address it happens to resolve to, which the agent's DNS answers could steer.
- A name whose last label is all digits (``127.1``, ``010.0.0.1``) is refused as a
  rule and as a request: the C resolver reads such strings as IPv4 addresses in
  inet_aton's loose forms (``127.1`` is 127.0.0.1, ``010`` is octal), so they would
  reach an address no IP rule allowed.
- Rules change while a capsule lives (``changed``: the person's ``capsule_network``):
  each set of rules in force has an id, ``rules_id``, a hash of its canonical form, so
  the same rules have the same id in every capsule and state dir, and a record naming it
  can be checked against the rules it names (capsules/netlive.py keeps them).
- A rule may also name methods and a path (``GET,HEAD https://pypi.example/simple/**``,
  ``READ http://api.internal:8080/v1/**``: ``READ`` is GET, HEAD and OPTIONS, ``*`` any
  method): it admits connections to its one host and port, as ``host:port`` would, and
  core/httprules.py judges each request sent there.  Its canonical text spells the
  methods out, sorted, and drops the scheme's own port.  No wildcard or CIDR: such a rule
  names a host whose requests the proxy must read, TLS included, so it is one name or
  address.  A path is ``/`` then pchars without ``%``, where ``*`` matches within a
  segment and ``**`` across them; a dot segment is refused (a server would resolve it).
- Whatever the rules allow, the host itself (its addresses, loopback, its resolvers)
  and space that is not the internet (private, ULA, CGNAT, multicast, reserved,
  documentation) are refused after resolution unless a rule names that exact address
  (``10.1.2.3:5432``, ``[fd00::1]:443``; a CIDR that contains it does not):
  ``core/netspace.py`` says which space and why.  So ``0.0.0.0/0`` means the internet.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sandbox.errors import CcwError

DEFAULT_MAX_BYTES = 1 << 30  # 1 GiB per exec, both directions summed
ON_MISS = ("deny", "ask")  # what a connection no rule allows gets: refused at once, or held while a person is asked
DEFAULT_ASK_MS = 30_000  # how long it is held at most (capsules/asks.py)
ASK_MS_RANGE = (1_000, 600_000)
DEFAULT_MAX_CONNECTIONS = 512  # per exec

WEB_PORTS = (80, 443)  # what a rule without a port allows
GRAMMAR = (
    "a rule is host[:port], *.domain[:port], a.b.c.d[:port], a.b.c.d/n[:port], "
    "[ipv6]:port, ipv6, ipv6/n or [ipv6/n]:port; port 1-65535, none = 80 and 443"
)

HTTP_GRAMMAR = (
    "a method/path rule is METHODS http[s]://host[:port]/path: METHODS GET,POST,... or READ (GET, HEAD, "
    "OPTIONS) or *; one host name or address; a path of letters, digits and -._~!$&'()+,;=:@/ where * "
    "matches within a segment and ** across them (none: /**)"
)
READ = ("GET", "HEAD", "OPTIONS")  # the read-only preset's methods
SCHEME_PORTS = {"http": 80, "https": 443}

RuleKind = Literal["name", "wildcard", "ip", "cidr"]
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_LABEL = re.compile(r"[a-z0-9-]{1,63}\Z")
_NUMERIC_LABEL = re.compile(r"(?:[0-9]+|0x[0-9a-f]*)\Z")
_PORT = re.compile(r"[0-9]{1,5}\Z")
_METHOD = re.compile(r"[A-Z]{1,20}\Z")
_PATH = re.compile(r"/[A-Za-z0-9\-._~!$&'()+,;=:@/*]{0,1023}\Z")
_POLICY = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}\Z")  # policies/policy.schema.json's name

@dataclass(frozen=True, order=True)
class Rule:
    """One allow rule; ``text`` is its canonical form (what records and reports name)."""

    text: str
    kind: RuleKind
    host: str  # the name, the wildcard's domain (without "*."), or the address/network
    port: int | None
    methods: tuple[str, ...] = ()  # a method/path rule's (core/httprules.py judges its requests); ("*",): any
    scheme: str = ""  # a method/path rule's: http or https
    path: str = ""  # a method/path rule's pattern

    @property
    def is_http(self) -> bool:
        """Whether this is a method/path rule (its requests are judged one by one)."""
        return bool(self.methods)

    def network(self) -> IPNetwork:
        """The rule's addresses (an exact IP rule is a /32 or /128)."""
        return ipaddress.ip_network(self.host)

    def allows_port(self, port: int) -> bool:
        """Whether the allowlist rule lets ``port`` through (no port: ``WEB_PORTS``)."""
        return port in WEB_PORTS if self.port is None else port == self.port

    def allows(self, host: str, port: int) -> bool:
        """True if this allowlist rule allows ``host:port`` (``host`` as ``normalize_host`` left it)."""
        return self.allows_port(port) and self.names(host)

    def matches(self, host: str, port: int) -> bool:
        """True if a connection made to ``host:port`` matches the rule as a policy reads it
        (``allow_hosts``/``deny_hosts``): a rule without a port matches any port."""
        return (self.port is None or self.port == port) and self.names(host)

    def names(self, host: str) -> bool:
        """True if ``host`` is this rule's name, under its wildcard, or in its addresses."""
        if self.kind == "name":
            return host == self.host
        if self.kind == "wildcard":
            return host.endswith("." + self.host)
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        network = self.network()
        return address.version == network.version and address in network


@dataclass(frozen=True)
class Decision:
    """The verdict on one request: the matching rule's text, or why none matched."""

    allowed: bool
    rule: str | None
    reason: str
    wanted: str | None = None  # a plain miss's: the rule that would allow it (for allow_hint)


@dataclass(frozen=True)
class NetworkSpec:
    """An allowlist capsule's network: the rules (sorted, canonical) and per-exec caps."""

    allow: tuple[Rule, ...]
    max_bytes: int = DEFAULT_MAX_BYTES
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    on_miss: str = "deny"
    ask_timeout_ms: int = DEFAULT_ASK_MS
    policy: str | None = None  # the policy whose network section pre-approves proposals (capsules/proposals.py)

    def to_json(self) -> dict[str, Any]:
        """The canonical form; ``parse_network`` reads it back to an equal spec.  ``on_miss``
        and ``ask_timeout_ms`` appear only when not the defaults, so that the rules ids of
        specs made before they existed (``rules_id``, kept in witnesses) stay the same."""
        out: dict[str, Any] = {
            "allow": [rule.text for rule in self.allow],
            "max_bytes": self.max_bytes,
            "max_connections": self.max_connections,
        }
        if self.on_miss != "deny":
            out["on_miss"] = self.on_miss
        if self.ask_timeout_ms != DEFAULT_ASK_MS:
            out["ask_timeout_ms"] = self.ask_timeout_ms
        if self.policy is not None:
            out["policy"] = self.policy
        return out

    def rules_text(self) -> str:
        """The rules as one line, for a denial's message."""
        return ", ".join(rule.text for rule in self.allow)


def _invalid(message: str, **details: Any) -> CcwError:
    return CcwError("INVALID_ARGUMENT", message, details)


def _port(text: str, rule: str) -> int:
    if not _PORT.match(text) or not 1 <= int(text) <= 65535:
        raise _invalid(f"network rule {rule!r}: port {text!r} is not 1-65535; {GRAMMAR}", rule=rule)
    return int(text)


def _name_problem(name: str) -> str | None:
    """Why ``name`` (lowercase) is not a host name ccw accepts, or None if it is one."""
    if not name or len(name) > 253:
        return "a host name has 1-253 characters"
    labels = name.split(".")
    if not all(_LABEL.match(label) for label in labels):
        return "a host name is ASCII letters, digits, '-' and '.', no empty label, no trailing dot"
    if _NUMERIC_LABEL.match(labels[-1]):
        return "it is neither an IP address nor a host name (the resolver would read it as an IPv4 address)"
    return None


def _ip_rule(text: str, port: int | None, rule: str, version: int) -> Rule:
    try:
        network = ipaddress.ip_network(text, strict=True)
    except ValueError as exc:
        raise _invalid(f"network rule {rule!r}: {exc}; {GRAMMAR}", rule=rule) from None
    if network.version != version:
        where = "IPv6 goes in brackets with a port, bare without" if version == 4 else "brackets hold IPv6 only"
        raise _invalid(f"network rule {rule!r}: {where}; {GRAMMAR}", rule=rule)
    exact = "/" not in text
    host = str(network.network_address) if exact else str(network)
    if version == 6:
        body = f"[{host}]:{port}" if port is not None else host
    else:
        body = f"{host}:{port}" if port is not None else host
    return Rule(body, "ip" if exact else "cidr", host, port)


def _methods(text: str, rule: str) -> tuple[str, ...]:
    words = text.upper().split(",")
    if words == ["READ"] or words == ["*"]:
        return READ if words == ["READ"] else ("*",)
    if not all(_METHOD.match(word) for word in words):
        raise _invalid(f"network rule {rule!r}: methods {text!r} are not GET,POST,... ; {HTTP_GRAMMAR}", rule=rule)
    return tuple(sorted(set(words)))


def _http_rule(text: str) -> Rule:
    """A method/path rule (``METHODS scheme://host[:port]/path``), canonical."""
    words = text.split()
    if len(words) != 2:
        raise _invalid(f"network rule {text!r}: a method/path rule is two words; {HTTP_GRAMMAR}", rule=text)
    methods = _methods(words[0], text)
    scheme, sep, rest = words[1].partition("://")
    if not sep or scheme.lower() not in SCHEME_PORTS:
        raise _invalid(f"network rule {text!r}: the URL starts with http:// or https://; {HTTP_GRAMMAR}", rule=text)
    scheme = scheme.lower()
    slash = rest.find("/")
    authority, path = (rest, "/**") if slash == -1 else (rest[:slash], rest[slash:])
    if not _PATH.match(path) or any(seg in (".", "..") for seg in path.split("/")):
        raise _invalid(f"network rule {text!r}: path {path!r} is not one ccw matches (no %, ?, #, \\ or dot "
                       f"segment); {HTTP_GRAMMAR}", rule=text)
    if "@" in authority or not authority:
        raise _invalid(f"network rule {text!r}: the URL names a host (no user@); {HTTP_GRAMMAR}", rule=text)
    try:
        host = parse_rule(authority)
    except CcwError as exc:
        raise _invalid(f"network rule {text!r}: host {exc.message.removeprefix('network rule ')}", rule=text) from None
    if host.kind not in ("name", "ip") or host.is_http:
        raise _invalid(f"network rule {text!r}: one host name or address, no wildcard or CIDR (its requests are "
                       f"read, so it names one host); {HTTP_GRAMMAR}", rule=text)
    port = SCHEME_PORTS[scheme] if host.port is None else host.port
    shown = f"[{host.host}]" if ":" in host.host else host.host
    shown += "" if port == SCHEME_PORTS[scheme] else f":{port}"
    return Rule(f"{','.join(methods)} {scheme}://{shown}{path}", host.kind, host.host, port, methods, scheme, path)


def parse_rule(text: str) -> Rule:
    """Parse one rule; INVALID_ARGUMENT naming the rule and the grammar if it is not one."""
    if not isinstance(text, str):
        raise _invalid(f"network rule {text!r} is not a string; {GRAMMAR}")
    if text.isascii() and ("://" in text or len(text.split()) == 2):
        return _http_rule(text.strip())
    rule = text.strip().lower()
    if not rule or not rule.isascii() or any(ch.isspace() for ch in rule):
        raise _invalid(f"network rule {text!r} is empty or has spaces or non-ASCII; {GRAMMAR}", rule=text)
    if rule.startswith("preset:"):  # fs/netpresets.py expands these where rules are given; not here
        raise _invalid(f"network rule {text!r}: a preset is named where a capsule's rules are given "
                       "(capsule_create, capsule_network, a replay's network), not here; write its rules "
                       "(ccw net presets NAME lists them)", rule=text)
    if "%" in rule:
        raise _invalid(f"network rule {text!r}: scoped IPv6 addresses (%zone) are not allowed; {GRAMMAR}", rule=text)
    if rule.startswith("["):
        close = rule.find("]")
        if close == -1:
            raise _invalid(f"network rule {text!r}: '[' without ']'; {GRAMMAR}", rule=text)
        rest = rule[close + 1 :]
        if rest and not rest.startswith(":"):
            raise _invalid(f"network rule {text!r}: after ']' comes ':port' or nothing; {GRAMMAR}", rule=text)
        port = _port(rest[1:], text) if rest else None
        return _ip_rule(rule[1:close], port, text, 6)
    if rule.count(":") >= 2:
        return _ip_rule(rule, None, text, 6)
    host, colon, port_text = rule.partition(":")
    port = _port(port_text, text) if colon else None
    if "/" in host or is_ip_literal(host, 4):
        return _ip_rule(host, port, text, 4)
    wildcard = host.startswith("*.")
    name = host[2:] if wildcard else host
    problem = _name_problem(name)
    if problem is not None:
        raise _invalid(f"network rule {text!r}: {problem}; {GRAMMAR}", rule=text)
    canonical = ("*." if wildcard else "") + name + (f":{port}" if port is not None else "")
    return Rule(canonical, "wildcard" if wildcard else "name", name, port)


def is_ip_literal(text: str, version: int | None = None) -> bool:
    """True if ``text`` is an IP address (of ``version``, if given) in its strict form."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return False
    return version is None or address.version == version


def parse_rules(values: Iterable[Any]) -> tuple[Rule, ...]:
    """Parse a list of rule strings into sorted, de-duplicated canonical rules."""
    return tuple(sorted({parse_rule(value) for value in values}))


def _cap(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _invalid(f"network {name} must be a positive integer, not {value!r}", field=name)
    return value


def parse_network(value: Any) -> NetworkSpec | None:
    """A capsule's ``network`` argument: ``"none"``/None, a list of rules, or an object.

    The object is ``{"allow": [...], "max_bytes": n, "max_connections": n, "on_miss":
    "deny"|"ask", "ask_timeout_ms": n, "policy": NAME}`` (all but allow optional; the policy's
    network section is capsules/policy.py's).  Anything else is
    INVALID_ARGUMENT saying what is expected.
    """
    if value is None or value == "none":
        return None
    on_miss, ask_ms, policy = "deny", DEFAULT_ASK_MS, None
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - {"allow", "max_bytes", "max_connections", "on_miss", "ask_timeout_ms", "policy"})
        if unknown:
            raise _invalid(f"network has unknown fields {unknown}; it takes allow, max_bytes, max_connections, "
                           "on_miss, ask_timeout_ms, policy")
        policy = value.get("policy")
        if policy is not None and (not isinstance(policy, str) or not _POLICY.match(policy)):
            raise _invalid(f"network policy {policy!r} is not a policy's name (policy_list lists them)")
        if "allow" not in value:
            raise _invalid("network object needs 'allow': a list of rules")
        allow = value["allow"]
        max_bytes = _cap(value.get("max_bytes", DEFAULT_MAX_BYTES), "max_bytes")
        max_connections = _cap(value.get("max_connections", DEFAULT_MAX_CONNECTIONS), "max_connections")
        on_miss = value.get("on_miss", "deny")
        if on_miss not in ON_MISS:
            raise _invalid(f"network on_miss {on_miss!r}: use deny (refuse at once) or ask (hold it while a "
                           "person is asked)")
        ask_ms = value.get("ask_timeout_ms", DEFAULT_ASK_MS)
        low, high = ASK_MS_RANGE
        if isinstance(ask_ms, bool) or not isinstance(ask_ms, int) or not low <= ask_ms <= high:
            raise _invalid(f"network ask_timeout_ms must be an integer from {low} to {high}, not {ask_ms!r}")
    elif isinstance(value, Sequence) and not isinstance(value, str | bytes):
        allow, max_bytes, max_connections = value, DEFAULT_MAX_BYTES, DEFAULT_MAX_CONNECTIONS
    else:
        raise _invalid(f"network must be 'none', a list of rules or an object with 'allow', not {value!r}")
    if isinstance(allow, str | bytes) or not isinstance(allow, Sequence):
        raise _invalid(f"network allow must be a list of rules, not {allow!r}; {GRAMMAR}")
    if not allow:
        raise _invalid("network allow list is empty: use 'none' for a capsule without network")
    return NetworkSpec(parse_rules(allow), max_bytes, max_connections, on_miss, ask_ms, policy)


def rules_id(spec: NetworkSpec) -> str:
    """The id of a set of rules and caps: ``n-`` and 16 hex digits of its canonical form's SHA-256."""
    canonical = json.dumps(spec.to_json(), sort_keys=True, separators=(",", ":"))
    return "n-" + hashlib.sha256(canonical.encode()).hexdigest()[:16]


def changed(spec: NetworkSpec, allow: Iterable[Any] = (), remove: Iterable[Any] = (),
            caps: Mapping[str, Any] | None = None) -> NetworkSpec:
    """``spec`` with the rules ``allow`` added, ``remove`` taken out and ``caps`` set.

    INVALID_ARGUMENT, saying what to send instead, for a rule to remove that is not in
    force, a rule both added and removed, unknown caps, or a change that would leave no
    rule (an allowlist capsule does not become "none" while it lives).
    """
    added, removed = set(parse_rules(allow)), set(parse_rules(remove))
    both = sorted(rule.text for rule in added & removed)
    if both:
        raise _invalid(f"network rules {both} are both allowed and removed: send each once", rules=both)
    absent = sorted(rule.text for rule in removed - set(spec.allow))
    if absent:
        raise _invalid(f"network rules {absent} are not in force, so they cannot be removed; in force: "
                       f"{spec.rules_text()}", rules=absent, in_force=[rule.text for rule in spec.allow])
    rules = tuple(sorted((set(spec.allow) - removed) | added))
    if not rules:
        raise _invalid("removing every rule would leave the capsule with an empty allowlist; a capsule's "
                       "network cannot become none while it lives: keep one rule, or destroy the capsule")
    unknown = sorted(set(caps or {}) - {"max_bytes", "max_connections"})
    if unknown:
        raise _invalid(f"network caps has unknown fields {unknown}; it takes max_bytes, max_connections")
    given = dict(caps or {})
    max_bytes = _cap(given.get("max_bytes", spec.max_bytes), "max_bytes")
    max_connections = _cap(given.get("max_connections", spec.max_connections), "max_connections")
    return NetworkSpec(rules, max_bytes, max_connections, spec.on_miss, spec.ask_timeout_ms, spec.policy)


def network_json(spec: NetworkSpec | None) -> str | dict[str, Any]:
    """What the capsule's record keeps: ``"none"`` or the spec's canonical object."""
    return "none" if spec is None else spec.to_json()


def normalize_host(host: str) -> tuple[str | None, str]:
    """A requested host in the form rules match (lowercase, IPv6 unbracketed, no trailing dot).

    Returns ``(host, "")`` or ``(None, why)`` when it is neither an IP nor a host name.
    """
    text = host.strip().lower()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    if "%" in text:
        return None, f"{host!r} is not allowed: scoped IPv6 addresses (%zone) name a local link"
    try:
        return str(ipaddress.ip_address(text)), ""
    except ValueError:
        pass
    if text.endswith(".") and not text.endswith(".."):
        text = text[:-1]  # the root's dot: "pypi.org." is "pypi.org"
    problem = _name_problem(text) if text.isascii() else "a host name is ASCII"
    if problem is not None:
        return None, f"{host!r} is not allowed: {problem}"
    return text, ""


def decide(spec: NetworkSpec, host: str, port: int) -> Decision:
    """Whether ``spec`` allows a connection to ``host:port``, by which rule, or why not."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        return Decision(False, None, f"port {port!r} is not 1-65535")
    name, why = normalize_host(host)
    if name is None:
        return Decision(False, None, why)
    for rule in spec.allow:
        if rule.allows(name, port):
            return Decision(True, rule.text, f"allowed by {rule.text}")
    shown = f"[{name}]" if ":" in name else name
    unported = [rule.text for rule in spec.allow if rule.port is None and rule.names(name)]
    if unported:
        return Decision(False, None, f"no rule allows {shown}:{port} ({unported[0]} has no port, "
                                     f"so it allows 80 and 443 only; name the port: {shown}:{port})")
    return Decision(False, None, f"no rule allows {shown}:{port}", wanted=f"{shown}:{port}")


def allow_hint(wanted: str) -> str:
    """How a plain miss is allowed, said in its denial: an agent proposes the rule, a person
    adds it (with ``on_miss: "ask"`` the person is asked instead: capsules/misses.py)."""
    return f'to allow it: capsule_network {{propose: ["{wanted}"], reason}}, or ccw capsule net CAP allow {wanted}'
