"""Raw rtnetlink: the requests an egress kit and a forwarded port's link need (veth, link up, address,
route, index, delete).

Some facts about rtnetlink that this module follows from:

- A ``NETLINK_ROUTE`` socket talks to the network namespace that was current for the
  *thread* that created it, for its whole life.  So one thread can open a socket in the
  jail's namespace, move on to the egress namespace, and still configure the jail
  through the first socket: no ``setns`` back and forth, which a rootless helper could
  not do anyway (see egress.py).
- Every request here asks for an acknowledgement (``NLM_F_ACK``); the kernel answers
  with an ``NLMSG_ERROR`` whose error is 0 on success or ``-errno``.  Requests are sent
  one at a time and each answer is read before the next, so a reply always belongs to
  the request just sent (the sequence number is checked anyway).
- A veth pair is made in one ``RTM_NEWLINK``: ``IFLA_LINKINFO`` {kind "veth", data
  {``VETH_INFO_PEER``: an ifinfomsg and the peer's attributes}}; the peer's
  ``IFLA_NET_NS_FD`` puts it straight into another namespace.  A link is named by
  ``IFLA_IFNAME`` with index 0 when its index is not known (RTM_GETLINK, RTM_NEWLINK).
- An IPv6 address is "tentative" for about a second while duplicate address detection
  runs, and a tentative address cannot be bound or used as a source: ``IFA_F_NODAD``
  makes it usable at once (a /64 on a veth with one peer has no duplicate to find).
- "AnyIP": a route of type ``RTN_LOCAL`` for ``0.0.0.0/0`` (``::/0``) makes every
  destination an address of this host.  It goes into the *main* table, not the local
  one: the local table is looked up first, so there it would also swallow the replies
  to the jail's own address; in main, the connected /30 (/64) is longer and wins.

pyroute2 does all this too; egress.py's essay says why the helper speaks raw netlink.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct

# <linux/netlink.h>, <linux/rtnetlink.h>, <linux/if_link.h>, <linux/if_addr.h>, <linux/veth.h>
NLMSG_ERROR = 2
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK, RTM_NEWADDR, RTM_NEWROUTE = 16, 17, 18, 20, 24
IFLA_IFNAME, IFLA_LINKINFO, IFLA_NET_NS_FD = 3, 18, 28
IFLA_INFO_KIND, IFLA_INFO_DATA, VETH_INFO_PEER = 1, 2, 1
IFA_ADDRESS, IFA_LOCAL, IFA_FLAGS, IFA_F_NODAD = 1, 2, 8, 0x02
RTA_DST, RTA_OIF, RTA_GATEWAY = 1, 4, 5
RT_TABLE_MAIN, RTPROT_STATIC = 254, 4
RT_SCOPE_UNIVERSE, RT_SCOPE_HOST = 0, 254
RTN_UNICAST, RTN_LOCAL = 1, 2
IFF_UP = 0x1
NLA_F_NESTED = 0x8000

_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_IFINFOMSG = struct.Struct("=BxHiII")  # family, type, index, flags, change
_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, index
_RTMSG = struct.Struct("=BBBBBBBBI")  # family, dst_len, src_len, tos, table, protocol, scope, type, flags
_RECV = 65536


def attr(kind: int, payload: bytes) -> bytes:
    """One rtattr: length, type, payload, padded to 4 bytes."""
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


def nested(kind: int, *attrs: bytes) -> bytes:
    """A nested rtattr holding ``attrs``."""
    return attr(kind | NLA_F_NESTED, b"".join(attrs))


def ifname(name: str) -> bytes:
    """An IFLA_IFNAME attribute (NUL-terminated)."""
    return attr(IFLA_IFNAME, name.encode() + b"\0")


def u32(value: int) -> bytes:
    """A native-endian 32-bit attribute payload."""
    return struct.pack("=I", value)


class Rtnl:
    """One NETLINK_ROUTE socket, talking to the namespace current when it was made."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE)
        self.sock.bind((0, 0))
        self._seq = 0

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()

    def __enter__(self) -> Rtnl:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def request(self, kind: int, flags: int, body: bytes, what: str) -> list[tuple[int, bytes]]:
        """Send one request with NLM_F_ACK; return the messages before the ack, or raise OSError naming ``what``."""
        self._seq += 1
        header = _NLMSGHDR.pack(_NLMSGHDR.size + len(body), kind, NLM_F_REQUEST | NLM_F_ACK | flags, self._seq, 0)
        self.sock.send(header + body)
        replies: list[tuple[int, bytes]] = []
        while True:
            data = self.sock.recv(_RECV)
            offset = 0
            while offset + _NLMSGHDR.size <= len(data):
                length, msg_type, _flags, seq, _pid = _NLMSGHDR.unpack_from(data, offset)
                if length < _NLMSGHDR.size:
                    raise OSError(errno.EPROTO, f"{what}: malformed netlink reply")
                payload = data[offset + _NLMSGHDR.size: offset + length]
                offset += (length + 3) & ~3
                if seq != self._seq:
                    continue
                if msg_type == NLMSG_ERROR:
                    (code,) = struct.unpack_from("=i", payload)
                    if code:
                        raise OSError(-code, f"{what}: {os.strerror(-code)}")
                    return replies
                replies.append((msg_type, payload))

    def add_veth(self, name: str, peer: str, peer_netns_fd: int) -> None:
        """A veth pair: ``name`` here, ``peer`` in the namespace of ``peer_netns_fd``."""
        peer_info = (_IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + ifname(peer)
                     + attr(IFLA_NET_NS_FD, u32(peer_netns_fd)))
        info = nested(IFLA_LINKINFO, attr(IFLA_INFO_KIND, b"veth"),
                      nested(IFLA_INFO_DATA, attr(VETH_INFO_PEER, peer_info)))
        body = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + ifname(name) + info
        self.request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, body, f"create veth {name} (peer {peer})")

    def delete_link(self, name: str) -> None:
        """Delete the link called ``name`` (a veth's peer goes with it)."""
        body = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + ifname(name)
        self.request(RTM_DELLINK, 0, body, f"delete link {name}")

    def link_up(self, name: str) -> None:
        """Set IFF_UP on the link called ``name``."""
        body = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, IFF_UP, IFF_UP) + ifname(name)
        self.request(RTM_NEWLINK, 0, body, f"set {name} up")

    def link_index(self, name: str) -> int:
        """The index of the link called ``name``."""
        body = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + ifname(name)
        for msg_type, payload in self.request(RTM_GETLINK, 0, body, f"get link {name}"):
            if msg_type == RTM_NEWLINK:
                return int(_IFINFOMSG.unpack_from(payload)[2])
        raise OSError(errno.ENODEV, f"get link {name}: no such link")

    def add_address(self, index: int, address: str, prefix: int) -> None:
        """Add ``address/prefix`` to link ``index`` (IPv6 without duplicate address detection)."""
        ip = ipaddress.ip_address(address)
        family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
        body = _IFADDRMSG.pack(family, prefix, 0, RT_SCOPE_UNIVERSE, index)
        body += attr(IFA_LOCAL, ip.packed) + attr(IFA_ADDRESS, ip.packed)
        if ip.version == 6:
            body += attr(IFA_FLAGS, u32(IFA_F_NODAD))
        self.request(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, body, f"add address {address}/{prefix}")

    def add_default_route(self, gateway: str, index: int) -> None:
        """A default route (v4 or v6, by the gateway's family) via ``gateway`` on link ``index``."""
        ip = ipaddress.ip_address(gateway)
        family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
        body = _RTMSG.pack(family, 0, 0, 0, RT_TABLE_MAIN, RTPROT_STATIC, RT_SCOPE_UNIVERSE, RTN_UNICAST, 0)
        body += attr(RTA_GATEWAY, ip.packed) + attr(RTA_OIF, u32(index))
        self.request(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, body, f"add default route via {gateway}")

    def add_anyip_route(self, family: int, index: int) -> None:
        """``local 0.0.0.0/0`` (or ``::/0``) on link ``index`` in the main table: every address is ours."""
        size = 4 if family == socket.AF_INET else 16
        body = _RTMSG.pack(family, 0, 0, 0, RT_TABLE_MAIN, RTPROT_STATIC, RT_SCOPE_HOST, RTN_LOCAL, 0)
        body += attr(RTA_DST, b"\0" * size) + attr(RTA_OIF, u32(index))
        self.request(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, body,
                     f"add local default route ({'v4' if size == 4 else 'v6'})")
