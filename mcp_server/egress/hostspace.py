"""The host's own space, read for each connection decision: its addresses, the ranges it
routes to itself, and its resolvers.

``core/netspace.py`` refuses them; this module reads them, in the front end, whose
network namespace is the host's (the proxy's upstream sockets are made here).

Some facts about reading a host's own space, as this module uses them:

- ``RTM_GETADDR`` with ``NLM_F_DUMP`` on a ``NETLINK_ROUTE`` socket lists every address
  of every interface in the caller's namespace, IPv4 and IPv6, secondaries and
  link-local included; no privilege is needed.  An address is ``IFA_LOCAL`` when the
  message has one (on a point-to-point link ``IFA_ADDRESS`` is the *peer*'s) and
  ``IFA_ADDRESS`` otherwise (IPv6 has no ``IFA_LOCAL`` but on such links);
  ``IFA_BROADCAST`` is the subnet's broadcast address.  ``getifaddrs`` and the
  ``SIOCGIFADDR`` ioctl see one IPv4 address per interface, and no IPv6.
- A route of type ``local`` (``RTN_LOCAL``) makes a whole range the host's without an
  address ("AnyIP"): after ``ip route add local 198.51.100.0/24 dev lo`` (or the same
  for an IPv6 /64, as hosts that send from random addresses of one do) a connection to
  any address in it reaches the host's listeners on 0.0.0.0 and [::], as a connection
  to one of its addresses does.  iproute2 puts a ``local`` route in table ``local``
  (255) unless told another table; the kernel keeps one there for each address of the
  host as well.  ``RTM_GETROUTE`` with ``NLM_F_DUMP`` lists the routes of every table.
  With ``NETLINK_GET_STRICT_CHK`` set (4.20+) the kernel honours the request's
  ``rtm_type`` and sends the local routes only, so a big main table (a router's, a
  Kubernetes node's) costs it a walk, not a copy; an older kernel sends every route
  and the parser keeps the local ones.  One ``AF_UNSPEC`` dump runs every family's:
  IPv4's and IPv6's, and multicast routing's and MPLS's, which have no local routes.
- Which tables count: those the proxy's own connections can be looked up in.  The
  policy rules (``RTM_GETRULE``, one dump for both families) say which table a packet is
  looked up in, by selectors; each is judged against what the proxy's upstream sockets
  are: TCP, made here (``iif lo``), with no mark (``SO_MARK``), the front end's uid,
  TOS 0, bound to no device (so no ``oif`` and no VRF), no tunnel.  A rule none of them
  can match leads nowhere: that is how transparent proxies and service meshes (TPROXY,
  Istio, Cilium) send *marked* packets to a table holding ``local 0.0.0.0/0``, which
  does not make the internet the host's.  A selector this module cannot judge (the
  source address, ports, a selector newer than it) may match, and ``not`` inverts
  what was judged.  A rule's ``to`` prefix narrows what its table makes local to that
  prefix; ``suppress_prefixlength N`` drops its table's routes of N bits or fewer.
  Neither the rules' order nor the longer routes of other types are weighed: a local
  range counts in every table some rule can reach, even where an earlier rule or a
  longer unicast route would win, which errs toward refusing (a rule naming the exact
  address re-opens it).  A family that lists no rule at all counts every table.
- IPv6's subnet-router anycast routes (``RTN_ANYCAST``, on a forwarding host) are
  delivered locally too, but a TCP connection to one does not open (tried on 6.18), so
  they are not read.
- Kept current without a dump per connection: a second netlink socket is bound to the
  groups of both families' addresses, routes and rules, and to the links', and
  receives a message for every change.  At each decision a non-blocking read on it
  says whether anything changed: ``EAGAIN``, nothing; a message, or ``ENOBUFS`` (its
  queue overflowed, so changes were lost), dump everything again.  It is subscribed
  before the first dump, so a change between the two is not lost.  The links' group is
  there because IPv4 removes the routes of a deleted link without an ``RTM_DELROUTE``
  (6.18 still), so the link's ``RTM_DELLINK`` stands for them; a link's other news
  (``RTM_NEWLINK``: up, down, carrier) is not a change here, as IPv4 keeps a local
  route on a link that goes down, and IPv6 announces what it removes.
- Cost, measured on the project's 2-core VM (kernel 6.18: 4 interfaces, 5 addresses, 6
  local routes, the 3 default rules) while other work shared it, medians of 2000: a
  dump of the addresses 55-90 us, of the local routes with the rules 165-175 us (two
  requests, 70 and 40 us, and 20 us to judge the rules and index the ranges);
  ``current()`` with nothing changed 6 us (the empty read, the resolv.conf ``stat``),
  and netspace's checks of an internet address 4 us more, 1 us of it the local
  routes' lookup; a plain connect and accept on loopback alone costs about 100 us.  So
  the dumps are kept off the path: a dump per connection would cost more than two
  connections.
- The resolvers are the ``nameserver`` lines of /etc/resolv.conf, read again whenever
  the file's inode, size or mtime changed (a ``stat`` per decision): resolvconf and
  NetworkManager replace it with a rename, which changes the inode.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from mcp_server.core.netrules import IPAddress, IPNetwork
from mcp_server.core.netspace import HostSpace, LocalRoute, LocalRoutes

RESOLV_CONF = Path("/etc/resolv.conf")

# <linux/netlink.h>, <linux/rtnetlink.h>, <linux/if_addr.h>, <linux/fib_rules.h>
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
SOL_NETLINK, NETLINK_GET_STRICT_CHK = 270, 12
RTM_NEWLINK = 16
RTM_NEWADDR, RTM_GETADDR = 20, 22
RTM_NEWROUTE, RTM_GETROUTE = 24, 26
RTM_NEWRULE, RTM_GETRULE = 32, 34
IFA_ADDRESS, IFA_LOCAL, IFA_BROADCAST = 1, 2, 4
RTN_LOCAL = 2
RTA_DST, RTA_TABLE = 1, 15
FRA_DST, FRA_SRC, FRA_IIFNAME, FRA_GOTO, FRA_PRIORITY = 1, 2, 3, 4, 6
FRA_FWMARK, FRA_FLOW, FRA_TUN_ID, FRA_SUPPRESS_IFGROUP, FRA_SUPPRESS_PREFIXLEN = 10, 11, 12, 13, 14
FRA_TABLE, FRA_FWMASK, FRA_OIFNAME, FRA_PAD, FRA_L3MDEV, FRA_UID_RANGE = 15, 16, 17, 18, 19, 20
FRA_PROTOCOL, FRA_IP_PROTO = 21, 22
FR_ACT_TO_TBL = 1
FIB_RULE_INVERT = 0x2
RTNLGRP_LINK, RTNLGRP_IPV4_IFADDR, RTNLGRP_IPV4_ROUTE, RTNLGRP_IPV4_RULE = 1, 5, 7, 8
RTNLGRP_IPV6_IFADDR, RTNLGRP_IPV6_ROUTE, RTNLGRP_IPV6_RULE = 9, 11, 19
GROUPS = (RTNLGRP_LINK, RTNLGRP_IPV4_IFADDR, RTNLGRP_IPV4_ROUTE, RTNLGRP_IPV4_RULE,
          RTNLGRP_IPV6_IFADDR, RTNLGRP_IPV6_ROUTE, RTNLGRP_IPV6_RULE)
_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, index
_RTMSG = struct.Struct("=BBBBBBBBI")  # family, dst_len, src_len, tos, table, protocol, scope, type, flags
_FIB_RULE_HDR = struct.Struct("=BBBBBBBBI")  # family, dst_len, src_len, tos, table, res1, res2, action, flags
_RTATTR = struct.Struct("=HH")  # len, type
_U32 = struct.Struct("=I")
_RECV = 65536
_FAMILIES = (socket.AF_INET, socket.AF_INET6)
_UNSUPPORTED = (errno.EOPNOTSUPP, errno.EAFNOSUPPORT)  # a kernel without policy rules
# Rule attributes that select nothing (priority, table, who made it...) or that _selectors
# judges; any other is a selector this module cannot judge.
_KNOWN = frozenset({FRA_DST, FRA_GOTO, FRA_PRIORITY, FRA_FLOW, FRA_SUPPRESS_IFGROUP, FRA_SUPPRESS_PREFIXLEN,
                    FRA_TABLE, FRA_PAD, FRA_PROTOCOL, FRA_FWMARK, FRA_FWMASK, FRA_IIFNAME, FRA_OIFNAME,
                    FRA_L3MDEV, FRA_UID_RANGE, FRA_TUN_ID, FRA_IP_PROTO, FRA_SRC})


def _messages(data: bytes, request: str) -> Iterator[tuple[int, bytes]]:
    """Each message of one read as (type, body), up to and with ``NLMSG_DONE``; the
    kernel's error (an ``NLMSG_ERROR``, or a dump that ended with one) raises OSError."""
    offset = 0
    while offset + _NLMSGHDR.size <= len(data):
        length, kind, _flags, _seq, _pid = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size:
            return
        body = data[offset + _NLMSGHDR.size : offset + length]
        offset += (length + 3) & ~3
        if kind in (NLMSG_ERROR, NLMSG_DONE) and len(body) >= 4:
            (code,) = struct.unpack_from("=i", body)
            if code < 0:
                raise OSError(-code, f"{request}: {os.strerror(-code)}")
        yield kind, body
        if kind == NLMSG_DONE:
            return


def _attributes(data: bytes) -> dict[int, bytes]:
    attrs: dict[int, bytes] = {}
    offset = 0
    while offset + _RTATTR.size <= len(data):
        length, kind = _RTATTR.unpack_from(data, offset)
        if length < _RTATTR.size:
            break
        attrs[kind] = data[offset + _RTATTR.size : offset + length]
        offset += (length + 3) & ~3
    return attrs


def _u32(attrs: dict[int, bytes], kind: int, default: int) -> int:
    value = attrs.get(kind, b"")
    return int(_U32.unpack(value)[0]) if len(value) == 4 else default


def _network(family: int, packed: bytes | None, length: int) -> IPNetwork | None:
    """A prefix of ``family`` (``packed`` None: all zeros), host bits cleared; None if malformed."""
    size = 4 if family == socket.AF_INET else 16 if family == socket.AF_INET6 else 0
    packed = bytes(size) if packed is None else packed
    if not size or len(packed) != size or length > size * 8:
        return None
    return ipaddress.ip_network((packed, length), strict=False)


def _overlap(a: IPNetwork, b: IPNetwork) -> IPNetwork | None:
    """The addresses two prefixes share (the longer one, if one holds the other), or None."""
    wide, narrow = (a, b) if a.prefixlen <= b.prefixlen else (b, a)
    return narrow if narrow.version == wide.version and narrow.supernet(new_prefix=wide.prefixlen) == wide else None


def parse_addresses(data: bytes) -> tuple[set[IPAddress], set[IPAddress], bool]:
    """One read of an ``RTM_GETADDR`` dump -> (addresses, broadcasts, done).

    ``done`` is True once ``NLMSG_DONE`` was seen; an ``NLMSG_ERROR`` raises OSError.
    """
    addresses: set[IPAddress] = set()
    broadcasts: set[IPAddress] = set()
    for kind, body in _messages(data, "RTM_GETADDR"):
        if kind == NLMSG_DONE:
            return addresses, broadcasts, True
        if kind != RTM_NEWADDR or len(body) < _IFADDRMSG.size:
            continue
        attrs = _attributes(body[_IFADDRMSG.size :])
        own = attrs.get(IFA_LOCAL, attrs.get(IFA_ADDRESS, b""))
        if len(own) in (4, 16):
            addresses.add(ipaddress.ip_address(own))
        if len(attrs.get(IFA_BROADCAST, b"")) == 4:
            broadcasts.add(ipaddress.ip_address(attrs[IFA_BROADCAST]))
    return addresses, broadcasts, False


def parse_local_routes(data: bytes) -> tuple[list[tuple[int, LocalRoute]], bool]:
    """One read of an ``RTM_GETROUTE`` dump -> ([(family, local route)], done); routes of other types are skipped."""
    routes: list[tuple[int, LocalRoute]] = []
    for kind, body in _messages(data, "RTM_GETROUTE"):
        if kind == NLMSG_DONE:
            return routes, True
        if kind != RTM_NEWROUTE or len(body) < _RTMSG.size:
            continue
        family, dst_len, _src_len, _tos, table, _protocol, _scope, route_type, _flags = _RTMSG.unpack_from(body)
        attrs = _attributes(body[_RTMSG.size :])
        network = _network(family, attrs.get(RTA_DST), dst_len)  # no RTA_DST: a default route
        if route_type == RTN_LOCAL and network is not None:
            routes.append((family, LocalRoute(network, _u32(attrs, RTA_TABLE, table))))
    return routes, False


@dataclass(frozen=True)
class PolicyRule:
    """A policy rule as the proxy's own connections meet it."""

    family: int
    table: int  # the table it looks up; 0: it looks up none (goto, nop, unreachable...)
    reached: bool  # whether the proxy's connections can match it
    to: IPNetwork | None = None  # the destinations it is limited to; None: any
    suppress_prefixlen: int | None = None  # its table's routes this short or shorter do not count


def parse_rules(data: bytes, uid: int) -> tuple[list[PolicyRule], bool]:
    """One read of an ``RTM_GETRULE`` dump -> (rules, done), each judged against the proxy's
    connections made by ``uid``; rules of other families (multicast routing's) are skipped."""
    rules: list[PolicyRule] = []
    for kind, body in _messages(data, "RTM_GETRULE"):
        if kind == NLMSG_DONE:
            return rules, True
        if kind != RTM_NEWRULE or len(body) < _FIB_RULE_HDR.size:
            continue
        family, dst_len, src_len, tos, table, _res1, _res2, action, flags = _FIB_RULE_HDR.unpack_from(body)
        if family not in _FAMILIES:
            continue
        attrs = _attributes(body[_FIB_RULE_HDR.size :])
        verdicts = _selectors(attrs, src_len, tos, uid)
        to = _network(family, attrs.get(FRA_DST, b""), dst_len) if dst_len else None
        inverted = bool(flags & FIB_RULE_INVERT)
        if inverted and to is not None:  # every destination outside the prefix: not one range
            verdicts.append(None)
            to = None
        matched = False if False in verdicts else None if None in verdicts else True
        if inverted and matched is not None:
            matched = not matched
        suppress = _u32(attrs, FRA_SUPPRESS_PREFIXLEN, 0xFFFFFFFF)
        rules.append(PolicyRule(family, _u32(attrs, FRA_TABLE, table) if action == FR_ACT_TO_TBL else 0,
                                matched is not False, to, None if suppress == 0xFFFFFFFF else suppress))
    return rules, False


def _selectors(attrs: dict[int, bytes], src_len: int, tos: int, uid: int) -> list[bool | None]:
    """Each selector of a rule against the proxy's connections: True they match it, False
    they never do, None it depends on the connection (or this module cannot judge it)."""
    mark = _u32(attrs, FRA_FWMARK, 0)
    mask = _u32(attrs, FRA_FWMASK, 0xFFFFFFFF if mark else 0)  # the kernel's default for a mark alone
    verdicts: list[bool | None] = [mark & mask == 0]  # the kernel's (mark ^ 0) & mask, for no mark
    if FRA_IIFNAME in attrs:  # a packet made here comes from lo
        verdicts.append(attrs[FRA_IIFNAME].rstrip(b"\0") == b"lo")
    if FRA_OIFNAME in attrs or any(attrs.get(FRA_L3MDEV, b"")):
        verdicts.append(False)  # the proxy's sockets are bound to no device, in no VRF
    if len(attrs.get(FRA_UID_RANGE, b"")) == 8:
        first, last = struct.unpack("=II", attrs[FRA_UID_RANGE])
        verdicts.append(first <= uid <= last)
    if tos or any(attrs.get(FRA_TUN_ID, b"")):
        verdicts.append(False)  # the proxy sets no TOS, and only tunnel metadata carries an id
    if FRA_IP_PROTO in attrs:
        verdicts.append(attrs[FRA_IP_PROTO][:1] == bytes([socket.IPPROTO_TCP]))
    if src_len or not _KNOWN.issuperset(attrs):
        verdicts.append(None)  # the source is chosen with the route; ports, DSCP, what a later kernel adds
    return verdicts


def local_ranges(routes: list[tuple[int, LocalRoute]], rules: list[PolicyRule] | None) -> LocalRoutes:
    """The local routes the proxy's connections can meet: those of a table that a rule they
    can match looks up, narrowed to the rule's ``to``.  ``rules`` None, or none of a
    family: every table of it counts."""
    ruled = {rule.family for rule in rules or ()}
    found: set[LocalRoute] = set()
    for family, route in routes:
        if family not in ruled:
            found.add(route)
            continue
        for rule in rules or ():
            if rule.family != family or not rule.reached or rule.table != route.table:
                continue
            if rule.suppress_prefixlen is not None and route.network.prefixlen <= rule.suppress_prefixlen:
                continue
            shared = route.network if rule.to is None else _overlap(route.network, rule.to)
            if shared is not None:
                found.add(LocalRoute(shared, route.table))
    return LocalRoutes(frozenset(found))


def tells_of_change(data: bytes) -> bool:
    """Whether one read of the subscription tells of anything but a link's news (``RTM_NEWLINK``)."""
    offset = 0
    while offset + _NLMSGHDR.size <= len(data):
        length, kind, _flags, _seq, _pid = _NLMSGHDR.unpack_from(data, offset)
        if kind != RTM_NEWLINK or length < _NLMSGHDR.size:
            return True
        offset += (length + 3) & ~3
    return False


def _route_socket() -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE)
    sock.bind((0, 0))
    return sock


def _ask(sock: socket.socket, kind: int, request: bytes) -> None:
    sock.send(_NLMSGHDR.pack(_NLMSGHDR.size + len(request), kind, NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + request)


def dump_addresses() -> tuple[frozenset[IPAddress], frozenset[IPAddress]]:
    """Every address of the namespace's interfaces, and their broadcast addresses."""
    addresses: set[IPAddress] = set()
    broadcasts: set[IPAddress] = set()
    with _route_socket() as sock:
        _ask(sock, RTM_GETADDR, _IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0))
        done = False
        while not done:
            found, bcast, done = parse_addresses(sock.recv(_RECV))
            addresses |= found
            broadcasts |= bcast
    return frozenset(addresses), frozenset(broadcasts)


def dump_local_routes(uid: int) -> LocalRoutes:
    """The ranges the namespace routes to itself that the proxy's connections, made by ``uid``, can meet."""
    routes: list[tuple[int, LocalRoute]] = []
    rules: list[PolicyRule] = []
    with _route_socket() as sock:
        with contextlib.suppress(OSError):  # before 4.20: every route comes, the parser keeps the local ones
            sock.setsockopt(SOL_NETLINK, NETLINK_GET_STRICT_CHK, 1)
        _ask(sock, RTM_GETROUTE, _RTMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0, 0, 0, RTN_LOCAL, 0))
        done = False
        while not done:
            found, done = parse_local_routes(sock.recv(_RECV))
            routes += found
        try:
            _ask(sock, RTM_GETRULE, _FIB_RULE_HDR.pack(socket.AF_UNSPEC, 0, 0, 0, 0, 0, 0, 0, 0))
            done = False
            while not done:
                judged, done = parse_rules(sock.recv(_RECV), uid)
                rules += judged
        except OSError as exc:
            if exc.errno not in _UNSUPPORTED:
                raise
            return local_ranges(routes, None)
    return local_ranges(routes, rules)


def parse_resolv_conf(text: str) -> frozenset[IPAddress]:
    """The ``nameserver`` addresses of a resolv.conf (a zone ``%eth0`` dropped, junk skipped)."""
    found: set[IPAddress] = set()
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "nameserver":
            with contextlib.suppress(ValueError):
                found.add(ipaddress.ip_address(fields[1].partition("%")[0]))
    return frozenset(found)


class HostSpaceReader:
    """The host's current ``HostSpace``: addresses and local routes kept current by
    netlink, resolvers by stat.

    One per process (``capsules/networks.py``), shared by the egress sessions; used from
    the trio thread only.  ``uid`` is whose the proxy's sockets are (policy rules may
    select by it).  ``close`` ends the subscription.
    """

    def __init__(self, resolv_conf: Path = RESOLV_CONF, uid: int | None = None) -> None:
        self.resolv_conf = resolv_conf
        self.uid = os.geteuid() if uid is None else uid
        self._events = socket.socket(socket.AF_NETLINK,
                                     socket.SOCK_RAW | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC,
                                     socket.NETLINK_ROUTE)
        try:
            self._events.bind((0, sum(1 << (group - 1) for group in GROUPS)))  # group n: bit n-1
        except OSError:
            self._events.close()
            raise
        self._kernel: tuple[frozenset[IPAddress], frozenset[IPAddress], LocalRoutes] | None = None
        self._resolv_key: tuple[int, ...] | None = None
        self._resolvers: frozenset[IPAddress] = frozenset()

    def current(self) -> HostSpace:
        """The host's space now (dumps only when an address, route, rule or link changed since the last)."""
        if self._changed() or self._kernel is None:
            self._kernel = (*dump_addresses(), dump_local_routes(self.uid))
        addresses, broadcasts, local_routes = self._kernel
        return HostSpace(addresses, broadcasts, self._read_resolvers(), local_routes)

    def _changed(self) -> bool:
        changed = False
        while True:
            try:
                data = self._events.recv(_RECV)
            except BlockingIOError:
                return changed
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    raise
                changed = True
                continue
            if not data:
                return changed
            changed = changed or tells_of_change(data)

    def _read_resolvers(self) -> frozenset[IPAddress]:
        try:
            st = os.stat(self.resolv_conf)
        except FileNotFoundError:
            self._resolv_key, self._resolvers = None, frozenset()
            return self._resolvers
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if key != self._resolv_key:
            self._resolvers = parse_resolv_conf(self.resolv_conf.read_text(errors="replace"))
            self._resolv_key = key
        return self._resolvers

    def close(self) -> None:
        """End the subscription."""
        self._events.close()
