"""Which addresses egress refuses by default: the host itself and space that is not the internet.

Pure logic (no I/O): the egress proxy (``mcp_server.egress``) reads the host's own
addresses and its resolvers (``egress/hostspace.py``) and passes them in as a
``HostSpace``; ``refusal`` judges each address it is about to connect to, after any name
has been resolved, so what is checked is what is connected to (no gap for DNS
rebinding between the two).

Why: the proxy connects from the host's network namespace, so an address of any of the
host's interfaces reaches every service the host binds to 0.0.0.0 or [::], and private
space reaches the host's neighbours (a database on the LAN, a cloud's metadata
service, the router).  An allowlist is for the internet; the host and the LAN are
opened one exact address at a time.

The classes, checked in this order, each named first in a refusal's reason (the
``reason`` of the connection's record in ``touched.network``):

- ``loopback`` (127/8, ::1), ``unspecified`` (0/8, which Linux connects to the host,
  and ::), ``link-local`` (169.254/16, fe80::/10);
- ``host address``: an address of one of the host's interfaces, whatever its range;
- ``broadcast``: 255.255.255.255 and the broadcast address of the host's subnets;
- ``resolver``: a nameserver of the host's /etc/resolv.conf (the agent may resolve
  names only through the proxy, which asks the host's resolver itself);
- ``local route``: an address in a range the host routes to itself without having it
  as an address (a ``local`` route, "AnyIP": ``ip route add local 198.51.100.0/24 dev
  lo``), public space too: the kernel delivers a connection there to the host's own
  listeners, as it does one to an address (``egress/hostspace.py`` says which routes
  count);
- ``private``: 10/8, 172.16/12, 192.168/16, fc00::/7 (ULA), fec0::/10 (the old
  site-local) and 64:ff9b:1::/48 (RFC 8215's local-use NAT64: a local translator);
- ``carrier-grade NAT``: 100.64/10 (RFC 6598, the ISP's side of the host's NAT);
- ``multicast``: 224/4, ff00::/8;
- ``reserved``: 240/4 (never routed on the internet; some clouds use it inside),
  192.0.0.0/24 (IETF protocol assignments, e.g. DS-Lite's local 192.0.0.0/29), 100::/64
  (discard-only);
- ``documentation``: 192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32,
  3fff::/20: never on the internet, so whoever answers there is a local network.

Left open, deliberately: the benchmarking ranges 198.18.0.0/15 and 2001:2::/48.  They
are not routed on the internet either, but "fake-IP" proxies (Clash, sing-box, Surge)
answer every name with an address in 198.18.0.0/15 and carry the connection to the
real destination; refusing them would end all egress on such hosts with no way back,
since a CIDR rule never re-opens a refused class.

IPv6 forms that carry an IPv4 address are judged by that address as well: IPv4-mapped
(``::ffff:10.0.0.1``, which an AF_INET6 socket connects over IPv4), SIIT's
``::ffff:0:a.b.c.d``, the deprecated IPv4-compatible ``::a.b.c.d``, NAT64's
64:ff9b::/96, 6to4's 2002::/16 and Teredo's client address.

Re-opening: a rule that names the exact address (an ``ip`` rule, not a CIDR that merely
contains it), with the port asked for, e.g. ``10.1.2.3:5432`` or ``[fd00::1]:443``; and,
for loopback only, the rule for the name ``localhost`` when ``localhost`` is what was
asked for.  A wildcard or another name that resolves into a refused class is refused
whatever the rule, since the DNS answer could be the attacker's.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass, field

from mcp_server.core.netrules import (
    IPAddress,
    IPNetwork,
    NetworkSpec,
    Rule,
    normalize_host,
    parse_rule,
)

LOOPBACK = "loopback"
HOST_ADDRESS = "host address"
RESOLVER = "resolver"
LOCAL_ROUTE = "local route"

_NEAR: tuple[tuple[str, str], ...] = (  # the host's own services, checked before the host's addresses
    ("127.0.0.0/8", LOOPBACK), ("::1/128", LOOPBACK),
    ("0.0.0.0/8", "unspecified"), ("::/128", "unspecified"),
    ("169.254.0.0/16", "link-local"), ("fe80::/10", "link-local"),
)
_RANGES: tuple[tuple[str, str], ...] = (  # space that is not the internet
    ("10.0.0.0/8", "private"), ("172.16.0.0/12", "private"), ("192.168.0.0/16", "private"),
    ("fc00::/7", "private"), ("fec0::/10", "private"), ("64:ff9b:1::/48", "private"),
    ("100.64.0.0/10", "carrier-grade NAT"),
    ("224.0.0.0/4", "multicast"), ("ff00::/8", "multicast"),
    ("255.255.255.255/32", "broadcast"),
    ("240.0.0.0/4", "reserved"), ("192.0.0.0/24", "reserved"), ("100::/64", "reserved"),
    ("192.0.2.0/24", "documentation"), ("198.51.100.0/24", "documentation"),
    ("203.0.113.0/24", "documentation"), ("2001:db8::/32", "documentation"), ("3fff::/20", "documentation"),
)


Table = dict[int, tuple[tuple[int, int, IPNetwork, str], ...]]  # version -> (first, last, network, class)


def _table(entries: tuple[tuple[str, str], ...]) -> Table:
    # Bounds as integers, by IP version: a decision compares each address with every
    # range, and ``address in network`` costs a microsecond where two int comparisons
    # cost a tenth.
    networks = [(ipaddress.ip_network(text), name) for text, name in entries]
    return {version: tuple((int(net.network_address), int(net.broadcast_address), net, name)
                           for net, name in networks if net.version == version) for version in (4, 6)}


NEAR = _table(_NEAR)
RANGES = _table(_RANGES)
_V6_PREFIX96 = {0: "IPv4-compatible", 0xFFFF: "IPv4-mapped", 0xFFFF0000: "IPv4-translated",
                0x0064FF9B0000000000000000: "NAT64"}  # the first 96 bits -> the form's name
_6TO4, _TEREDO = 0x2002, 0x20010000  # 2002::/16, 2001::/32


TABLE_NAMES = {253: "default", 254: "main", 255: "local"}  # <linux/rtnetlink.h>: RT_TABLE_*


@dataclass(frozen=True)
class LocalRoute:
    """A range the host routes to itself (a ``local`` route), and the table that holds it."""

    network: IPNetwork
    table: int

    def __str__(self) -> str:
        return f"local {self.network}, table {TABLE_NAMES.get(self.table, self.table)}"


@dataclass(frozen=True)
class LocalRoutes:
    """The host's ``local`` routes, found by an address in a few dict lookups.

    Indexed by IP version and prefix length, longest first: a decision masks the address
    once per length the host uses (a handful: /32 and /128 for its addresses, /8 for
    loopback, its AnyIP ranges') instead of comparing it with every route (there is one
    per address of the host), and the longest range that holds it is the one named.
    """

    routes: frozenset[LocalRoute] = frozenset()
    _index: dict[int, tuple[tuple[int, dict[int, LocalRoute]], ...]] = field(
        init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        by_length: dict[tuple[int, int], dict[int, LocalRoute]] = {}
        for route in sorted(self.routes, key=lambda r: r.table):  # one table named, the same every time
            net = route.network
            by_length.setdefault((net.version, net.prefixlen), {}).setdefault(int(net.network_address), route)
        index = {version: tuple(sorted(((length, found) for (v, length), found in by_length.items() if v == version),
                                       key=lambda entry: -entry[0]))
                 for version in (4, 6)}
        object.__setattr__(self, "_index", index)

    def find(self, ip: IPAddress) -> LocalRoute | None:
        """The longest local route holding ``ip``, or None."""
        value, bits = int(ip), ip.max_prefixlen
        for length, found in self._index[ip.version]:
            route = found.get(value >> (bits - length) << (bits - length))
            if route is not None:
                return route
        return None


@dataclass(frozen=True)
class HostSpace:
    """The host's own addresses, its subnets' broadcast addresses, its resolvers and the
    ranges it routes to itself, as the egress read them for one decision."""

    addresses: frozenset[IPAddress] = frozenset()
    broadcasts: frozenset[IPAddress] = frozenset()
    resolvers: frozenset[IPAddress] = frozenset()
    local_routes: LocalRoutes = field(default_factory=LocalRoutes)


@dataclass(frozen=True)
class Guarded:
    """Why an address is off limits: its class and the words that place it there."""

    klass: str
    why: str


def _in(ip: IPAddress, table: Table) -> Guarded | None:
    value = int(ip)
    for first, last, network, klass in table[ip.version]:
        if first <= value <= last:
            return Guarded(klass, f"{klass} space ({network})")
    return None


def _classify(ip: IPAddress, space: HostSpace) -> Guarded | None:
    near = _in(ip, NEAR)
    if near is not None:
        return near
    if ip in space.addresses:
        return Guarded(HOST_ADDRESS, "an address of this host")
    if ip in space.broadcasts:
        return Guarded("broadcast", "a broadcast address of this host's subnets")
    if ip in space.resolvers:
        return Guarded(RESOLVER, "this host's resolver (a nameserver of /etc/resolv.conf)")
    route = space.local_routes.find(ip)
    if route is not None:
        return Guarded(LOCAL_ROUTE, f"an address this host routes to itself ({route})")
    return _in(ip, RANGES)


def embedded(ip: IPAddress) -> Iterator[tuple[ipaddress.IPv4Address, str]]:
    """The IPv4 addresses an IPv6 address carries, each with the name of the form."""
    if ip.version != 6:
        return
    value = int(ip)
    form = _V6_PREFIX96.get(value >> 32)
    if form is not None:
        yield ipaddress.IPv4Address(value & 0xFFFFFFFF), form
    elif value >> 112 == _6TO4:
        yield ipaddress.IPv4Address((value >> 80) & 0xFFFFFFFF), "6to4"
    elif value >> 96 == _TEREDO:  # the client's address, stored inverted
        yield ipaddress.IPv4Address(~value & 0xFFFFFFFF), "Teredo"


def guarded(address: str | IPAddress, space: HostSpace) -> Guarded | None:
    """The class that puts ``address`` off limits by default, or None for the internet."""
    ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    found = _classify(ip, space)
    if found is not None:
        return found
    for inner, form in embedded(ip):
        found = _classify(inner, space)
        if found is not None:
            return Guarded(found.klass, f"{found.why}, as the {form} form of {inner}")
    return None


def reopened(spec: NetworkSpec, address: IPAddress, port: int) -> bool:
    """Whether a rule names exactly this address (not a CIDR holding it) with this port."""
    return any(rule.kind == "ip" and rule.allows_port(port) and ipaddress.ip_address(rule.host) == address
               for rule in spec.allow)


def refusal(spec: NetworkSpec, rule: Rule | str, host: str, port: int, address: str | IPAddress,
            space: HostSpace) -> str | None:
    """Why the connection that ``rule`` admitted for ``host:port`` may not go to
    ``address`` (what ``host`` resolved to, or ``host`` itself), or None when it may.

    The reason begins with the class (``"host address: ..."``) and ends with the exact
    rule that would re-open the address.
    """
    ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    found = guarded(ip, space)
    if found is None or reopened(spec, ip, port):
        return None
    name, _ = normalize_host(host)
    if found.klass == LOOPBACK and name == "localhost":
        matched = rule if isinstance(rule, Rule) else parse_rule(rule)
        if matched.kind == "name" and matched.host == "localhost":
            return None
    shown = f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"
    target = f"{name} is" if name == str(ip) else f"{name} resolves to {ip},"
    also = " or the name localhost" if found.klass == LOOPBACK else ""
    return (f"{found.klass}: {target} {found.why}; egress reaches the host, private and reserved space only "
            f"by a rule naming that exact address ({shown}){also}")
