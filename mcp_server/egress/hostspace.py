"""The host's own space, read for each connection decision: its addresses and its resolvers.

``core/netspace.py`` refuses the host's addresses and its resolvers; this module reads
them, in the front end, whose network namespace is the host's (the proxy's upstream
sockets are made here).

Some facts about reading a host's addresses, as this module uses them:

- ``RTM_GETADDR`` with ``NLM_F_DUMP`` on a ``NETLINK_ROUTE`` socket lists every address
  of every interface in the caller's namespace, IPv4 and IPv6, secondaries and
  link-local included; no privilege is needed.  An address is ``IFA_LOCAL`` when the
  message has one (on a point-to-point link ``IFA_ADDRESS`` is the *peer*'s) and
  ``IFA_ADDRESS`` otherwise (IPv6 has no ``IFA_LOCAL`` but on such links);
  ``IFA_BROADCAST`` is the subnet's broadcast address.  ``getifaddrs`` and the
  ``SIOCGIFADDR`` ioctl see one IPv4 address per interface, and no IPv6.
- Kept current without a dump per connection: a second netlink socket, bound to the
  groups ``RTMGRP_IPV4_IFADDR`` and ``RTMGRP_IPV6_IFADDR``, receives a message for every
  address added or removed.  At each decision a non-blocking read on it says whether
  anything changed: ``EAGAIN``, nothing; a message, or ``ENOBUFS`` (its queue overflowed,
  so changes were lost), dump again.  It is subscribed before the first dump, so a
  change between the two is not lost.
- Cost, measured on the project's 2-core VM (4 interfaces, 5 addresses) while other
  work shared it: a dump 60-115 us; ``current()`` with nothing changed 8-10 us (the
  empty read, the resolv.conf ``stat``), and netspace's checks of one address some
  10 us more; a plain connect and accept on loopback alone costs about 100 us.  So a
  dump per connection would have been affordable too; the subscription keeps it off
  the path anyway.
- What the list does not see: ``local`` routes that make whole ranges this host's
  without an address ("AnyIP", ``ip route add local 198.51.100.0/24 dev lo``) are not
  addresses.  Private and reserved space is refused by its range anyway; a host that
  routes public space to itself that way must say so with a deny rule of its own.
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
from pathlib import Path

from mcp_server.core.netrules import IPAddress
from mcp_server.core.netspace import HostSpace

RESOLV_CONF = Path("/etc/resolv.conf")

# <linux/netlink.h>, <linux/rtnetlink.h>, <linux/if_addr.h>
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
RTM_NEWADDR, RTM_GETADDR = 20, 22
IFA_ADDRESS, IFA_LOCAL, IFA_BROADCAST = 1, 2, 4
RTMGRP_IPV4_IFADDR, RTMGRP_IPV6_IFADDR = 0x10, 0x100
_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, index
_RTATTR = struct.Struct("=HH")  # len, type
_RECV = 65536


def parse_addresses(data: bytes) -> tuple[set[IPAddress], set[IPAddress], bool]:
    """One read of an ``RTM_GETADDR`` dump -> (addresses, broadcasts, done).

    ``done`` is True once ``NLMSG_DONE`` was seen; an ``NLMSG_ERROR`` raises OSError.
    """
    addresses: set[IPAddress] = set()
    broadcasts: set[IPAddress] = set()
    offset = 0
    while offset + _NLMSGHDR.size <= len(data):
        length, kind, _flags, _seq, _pid = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size:
            break
        body = data[offset + _NLMSGHDR.size : offset + length]
        offset += (length + 3) & ~3
        if kind == NLMSG_DONE:
            return addresses, broadcasts, True
        if kind == NLMSG_ERROR:
            (code,) = struct.unpack_from("=i", body)
            raise OSError(-code, f"RTM_GETADDR: {os.strerror(-code)}")
        if kind != RTM_NEWADDR or len(body) < _IFADDRMSG.size:
            continue
        attrs = _attributes(body[_IFADDRMSG.size :])
        own = attrs.get(IFA_LOCAL, attrs.get(IFA_ADDRESS, b""))
        if len(own) in (4, 16):
            addresses.add(ipaddress.ip_address(own))
        if len(attrs.get(IFA_BROADCAST, b"")) == 4:
            broadcasts.add(ipaddress.ip_address(attrs[IFA_BROADCAST]))
    return addresses, broadcasts, False


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


def dump_addresses() -> tuple[frozenset[IPAddress], frozenset[IPAddress]]:
    """Every address of the namespace's interfaces, and their broadcast addresses."""
    addresses: set[IPAddress] = set()
    broadcasts: set[IPAddress] = set()
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE) as sock:
        sock.bind((0, 0))
        request = _IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
        sock.send(_NLMSGHDR.pack(_NLMSGHDR.size + len(request), RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP, 1, 0)
                  + request)
        done = False
        while not done:
            found, bcast, done = parse_addresses(sock.recv(_RECV))
            addresses |= found
            broadcasts |= bcast
    return frozenset(addresses), frozenset(broadcasts)


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
    """The host's current ``HostSpace``: addresses kept current by netlink, resolvers by stat.

    One per process (``capsules/networks.py``), shared by the egress sessions; used from
    the trio thread only.  ``close`` ends the subscription.
    """

    def __init__(self, resolv_conf: Path = RESOLV_CONF) -> None:
        self.resolv_conf = resolv_conf
        self._events = socket.socket(socket.AF_NETLINK,
                                     socket.SOCK_RAW | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC,
                                     socket.NETLINK_ROUTE)
        try:
            self._events.bind((0, RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR))
        except OSError:
            self._events.close()
            raise
        self._addresses: tuple[frozenset[IPAddress], frozenset[IPAddress]] | None = None
        self._resolv_key: tuple[int, ...] | None = None
        self._resolvers: frozenset[IPAddress] = frozenset()

    def current(self) -> HostSpace:
        """The host's space now (a dump only when an address changed since the last one)."""
        if self._changed() or self._addresses is None:
            self._addresses = dump_addresses()
        addresses, broadcasts = self._addresses
        return HostSpace(addresses, broadcasts, self._read_resolvers())

    def _changed(self) -> bool:
        changed = False
        while True:
            try:
                if not self._events.recv(_RECV):
                    return changed
            except BlockingIOError:
                return changed
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    raise
            changed = True

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
        """End the address subscription."""
        self._events.close()
