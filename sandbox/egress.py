"""A capsule's way out: a pair of network namespaces whose only exits are the front end's proxies.

A capsule whose network is ``"egress"`` runs its commands in its own JAIL namespace:
``lo`` and ``eth0``, one end of a veth pair (10.99.0.2/30, fd63:6377::2/64, default
routes via the other end).  The other end is in a private EGRESS namespace (10.99.0.1/30,
fd63:6377::1/64) whose main table also holds the "AnyIP" routes ``local 0.0.0.0/0 dev
ccw0`` and ``local ::/0 dev ccw0``: there every destination is a local address.  Nothing
listens in it but the two TCP listeners made here, 10.99.0.1:3128 (the front end's
HTTP proxy) and 10.99.0.1:1080 (its SOCKS5 proxy).  So from the jail the proxies answer,
a direct TCP connection to any other address is reset at once (ECONNREFUSED), UDP (raw
DNS too) gets ICMP port unreachable (ECONNREFUSED at the next receive), IPv6 the same,
and 127.0.0.1 is the jail's own loopback, never the host's.  The third descriptor is an
AF_PACKET socket on the egress end with a classic BPF filter (``sniffer_program``) that
keeps TCP SYNs without ACK and UDP datagrams arriving from the jail, so that the front
end sees and records every direct attempt.  The helper hands the three descriptors to
the front end (``net_open``), which accepts, checks the allowlist and connects out from
the host's namespace; the helper never sees the allowlist.  These three, with the jail
namespace's descriptor, are a capsule's ``Kit``.

Some facts about network namespaces that this module follows from:

- ``unshare(CLONE_NEWNET)`` moves only the calling *thread*, and a socket (netlink,
  TCP, packet) belongs for its whole life to the namespace its creating thread was in.
  So one thread builds a kit: unshare (the jail), raise lo, keep a descriptor of it and a
  netlink socket in it; unshare again (the egress), raise lo, make the veth with its
  peer put straight into the jail (``IFLA_NET_NS_FD``), configure each side through its
  own netlink socket, make the listeners and the sniffer.  It never goes back: it is a
  thread of its own, started for one kit, and it ends when the kit is built.  That is
  what lets a rootless helper build kits too: going back into the helper's own
  namespace needs CAP_SYS_ADMIN over the *initial* user namespace, which it lacks
  (namespaces.py's spares are privileged-only for that reason).
- Both namespaces belong to the user namespace of the thread that made them.  A
  rootless helper owns its user namespace and has every capability in it, so it may
  make veths, addresses, routes and packet sockets in namespaces that user namespace
  owns without any privilege on the host: the veth joins two namespaces of its own, and
  no host interface, route or firewall rule is touched.  So one path serves both modes
  (this replaces the issue's "unix-socket bridge" for rootless: the jail can reach
  nothing but the proxies by construction, and the front end needs no mode of its own).
- The jail's init ``setns``-es into the capsule's jail namespace (descriptor 5, as for
  namespaces.py's spares) before it unshares the rest; the namespace lives as long as
  the helper holds its descriptor, and every exec of the capsule uses the same one.
  The egress namespace lives as long as any of its sockets: the helper's copies and the
  front end's.
- ICMP errors are rate limited per destination (``icmp_ratelimit``, 1 s); a jail that
  tries a few UDP ports in a row would find its later attempts hang instead of failing.
  These sysctls are per namespace, so the egress namespace turns them off for itself.
- A veth end normally gets an IPv6 link-local address and an on-link ``fe80::/64``
  route.  Then a jail connecting to ``fe80::1%eth0`` asks for that neighbour (neighbour
  discovery), nobody answers, and connect fails only when the kernel gives up (3 s),
  with no packet for the sniffer to see.  Answering every solicitation is not on offer
  (IPv6 proxy NDP answers only for addresses listed one by one), so both namespaces set
  ``addr_gen_mode`` to none before the veth is made: no link-local address, no
  ``fe80::/64`` route, and the jail's default route carries link-local destinations to
  the egress end like any other.  There the AnyIP routes hang off the veth end, not
  ``lo``: a link-local destination is looked up strictly by the interface it arrived on
  (``RT6_LOOKUP_F_IFACE``), which a route on ``lo`` does not match (the kernel answers
  "no route", a soft error TCP retries after a second).  IPv4 link-local (169.254/16)
  needs nothing: the jail has no on-link route for it, so it is refused like TEST-NET.
- Multicast and broadcast: TCP to either is refused by the jail's own kernel
  (ENETUNREACH) before a packet exists.  UDP to a group, or to 255.255.255.255 with
  ``SO_BROADCAST`` (without it: EACCES), leaves at once and the sniffer shows it, so it
  is recorded as denied; nothing answers (a kernel never sends ICMP errors about
  multicast or broadcast), so a program that waits for a reply waits for its own
  timeout, as on any link where no one is in the group.

Measured on this project's 2-core VM (kernel 6.18), each kit built on its own thread of
a threaded process (two namespaces, veth, four addresses, four routes, the ICMP knobs,
two listeners, the sniffer), medians of 20: raw rtnetlink (``sandbox/netlink.py``)
3.2 ms as root and 3.1 ms rootless (uid 65534 in a user namespace of its own); pyroute2
0.9.7 ``IPRoute`` for the same netlink steps 11.2 ms, after 112 ms to import it.  So the
helper speaks raw netlink: five kinds of request are about 150 lines of struct packing,
and pyroute2's asyncio machinery would run in the threads of a process that forks
jails.  A spare kit (one waits once a capsule has asked for one) makes ``net_open``
cost a few dups: through the client, medians of 31, 1.2 to 2.1 ms with a spare ready
against 5.4 to 6.4 ms right after another net_open took it (both modes).  A helper that
finds egress capsules in its state dir makes a spare as it starts: the first net_open
after a restart (medians of 15 restarts, 0.5 s after ready) took 2.4 ms against 7.5 ms
without it privileged, 2.4 against 8.8 ms rootless.  An exec in
an egress capsule costs what one in a "none" capsule does (/bin/true, interleaved:
19.1 against 20.0 ms privileged, 18.1 against 19.4 ms rootless, on a shared VM).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from sandbox import namespaces, syscalls
from sandbox.errors import CcwError
from sandbox.netlink import Rtnl
from sandbox.replies import NetOpenReply

log = logging.getLogger("ccw.egress")

JAIL_LINK = "eth0"
EGRESS_LINK = "ccw0"
JAIL_V4, EGRESS_V4, PREFIX_V4 = "10.99.0.2", "10.99.0.1", 30
JAIL_V6, EGRESS_V6, PREFIX_V6 = "fd63:6377::2", "fd63:6377::1", 64
HTTP_PROXY_PORT = 3128
SOCKS_PROXY_PORT = 1080
HTTP_PROXY = f"{EGRESS_V4}:{HTTP_PROXY_PORT}"
SOCKS_PROXY = f"{EGRESS_V4}:{SOCKS_PROXY_PORT}"
JAIL_ADDRESSES = (JAIL_V4, JAIL_V6)
LISTEN_BACKLOG = 128
MECHANISM = (
    "egress: own network namespace (eth0 10.99.0.2, fd63:6377::2) on a veth to a private namespace "
    "where only the front end's HTTP proxy 10.99.0.1:3128 and SOCKS5 proxy 10.99.0.1:1080 answer; "
    "every other destination is refused there (TCP reset, ICMP unreachable), and an AF_PACKET "
    "sniffer shows each direct attempt to the front end"
)
NO_MECHANISM = "none: empty network namespace, lo up"

# The proxy environment a jail of an egress capsule gets, unless the caller sets the name.
_HTTP_URL = f"http://{HTTP_PROXY}"
_SOCKS_URL = f"socks5h://{SOCKS_PROXY}"
_NO_PROXY = "localhost,127.0.0.1,::1"
PROXY_ENV = {
    "HTTP_PROXY": _HTTP_URL, "http_proxy": _HTTP_URL, "HTTPS_PROXY": _HTTP_URL, "https_proxy": _HTTP_URL,
    "ALL_PROXY": _SOCKS_URL, "all_proxy": _SOCKS_URL, "NO_PROXY": _NO_PROXY, "no_proxy": _NO_PROXY,
}

_ADDR_GEN_MODE, _ADDR_GEN_MODE_NONE = "/proc/sys/net/ipv6/conf/default/addr_gen_mode", "1"
_ICMP_SYSCTLS = ("/proc/sys/net/ipv4/icmp_ratelimit", "/proc/sys/net/ipv6/icmp/ratelimit")


# What net_open answers (the same for every capsule: each has namespaces of its own).
REPLY = NetOpenReply(HTTP_PROXY, SOCKS_PROXY, JAIL_ADDRESSES, dict(PROXY_ENV), MECHANISM)


def proxy_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the proxy variables added where the caller did not set them."""
    return {**PROXY_ENV, **env}


# --- the sniffer's filter -----------------------------------------------------------------

# <linux/filter.h>: classic BPF opcodes and the ancillary loads.
_LD_W_ABS, _LD_H_ABS, _LD_B_ABS, _LD_B_IND, _LDX_B_MSH = 0x20, 0x28, 0x30, 0x50, 0xB1
_ALU_AND_K, _JMP_JA, _JMP_JEQ_K, _JMP_JSET_K, _RET_K = 0x54, 0x05, 0x15, 0x45, 0x06
_SKF_AD_OFF = -0x1000
_SKF_AD_PROTOCOL, _SKF_AD_PKTTYPE = 0, 4
_PACKET_OUTGOING = 4
_ETH_P_IP, _ETH_P_IPV6, _ETH_P_ALL = 0x0800, 0x86DD, 0x0003
_IPPROTO_TCP, _IPPROTO_UDP = 6, 17
_TCP_SYN, _TCP_ACK = 0x02, 0x10
SNAP_BYTES = 128  # an IPv4 header with options (60) or IPv6's (40), and the transport's ports
SO_ATTACH_FILTER, SO_LOCK_FILTER = 26, 44

Instruction = tuple[int, int, int, int]  # code, jt, jf, k (struct sock_filter)


def _ancillary(offset: int) -> int:
    return (_SKF_AD_OFF + offset) & 0xFFFFFFFF


def sniffer_program() -> list[Instruction]:
    """The classic BPF program of the sniffer: keep what the jail sends that opens a flow.

    The socket is SOCK_DGRAM, so offsets count from the network header.  Kept (the first
    SNAP_BYTES of each): IPv4 or IPv6 UDP, and TCP with SYN set and ACK clear, arriving
    from the jail.  IPv6 extension headers are not walked (a jail's TCP and UDP have
    none); IPv4 fragments after the first carry no ports and are dropped.
    """
    labels: dict[str, int] = {}
    code: list[tuple[int, str | int, str | int, int]] = []

    def emit(op: int, k: int = 0, jt: str | int = 0, jf: str | int = 0) -> None:
        code.append((op, jt, jf, k))

    # Only packets coming in from the jail (the kernel's own replies go out: not ours).
    emit(_LD_W_ABS, _ancillary(_SKF_AD_PKTTYPE))
    emit(_JMP_JEQ_K, _PACKET_OUTGOING, jt="drop")
    # Which network protocol (skb->protocol, host order after the ancillary load).
    emit(_LD_W_ABS, _ancillary(_SKF_AD_PROTOCOL))
    emit(_JMP_JEQ_K, _ETH_P_IP, jf="ipv6")
    # IPv4: not a later fragment; UDP kept; TCP goes on to its flags, at IHL*4 + 13.
    emit(_LD_H_ABS, 6)
    emit(_JMP_JSET_K, 0x1FFF, jt="drop")
    emit(_LD_B_ABS, 9)
    emit(_JMP_JEQ_K, _IPPROTO_UDP, jt="keep")
    emit(_JMP_JEQ_K, _IPPROTO_TCP, jf="drop")
    emit(_LDX_B_MSH, 0)
    emit(_LD_B_IND, 13)
    emit(_JMP_JA, jt="tcp_flags")
    # IPv6: the next header straight after the fixed 40 bytes; TCP's flags at 40 + 13.
    labels["ipv6"] = len(code)
    emit(_JMP_JEQ_K, _ETH_P_IPV6, jf="drop")
    emit(_LD_B_ABS, 6)
    emit(_JMP_JEQ_K, _IPPROTO_UDP, jt="keep")
    emit(_JMP_JEQ_K, _IPPROTO_TCP, jf="drop")
    emit(_LD_B_ABS, 40 + 13)
    # TCP: SYN without ACK opens a connection; everything else of a flow is not an attempt.
    labels["tcp_flags"] = len(code)
    emit(_ALU_AND_K, _TCP_SYN | _TCP_ACK)
    emit(_JMP_JEQ_K, _TCP_SYN, jf="drop")
    labels["keep"] = len(code)
    emit(_RET_K, SNAP_BYTES)
    labels["drop"] = len(code)
    emit(_RET_K, 0)
    return [_resolve(at, one, labels) for at, one in enumerate(code)]


def _resolve(at: int, instruction: tuple[int, str | int, str | int, int], labels: dict[str, int]) -> Instruction:
    """Turn label jumps into the offsets classic BPF counts from the next instruction."""
    op, jt, jf, k = instruction
    if op == _JMP_JA:  # an unconditional jump counts in k
        return op, 0, 0, labels[str(jt)] - at - 1
    return (op, labels[jt] - at - 1 if isinstance(jt, str) else jt,
            labels[jf] - at - 1 if isinstance(jf, str) else jf, k)


def _attach_filter(sock: socket.socket, program: list[Instruction]) -> None:
    raw = b"".join(struct.pack("=HBBI", *one) for one in program)
    buffer = ctypes.create_string_buffer(raw, len(raw))
    fprog = struct.pack("=HxxxxxxQ", len(program), ctypes.addressof(buffer))  # struct sock_fprog
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
    sock.setsockopt(socket.SOL_SOCKET, SO_LOCK_FILTER, 1)  # the front end may not swap it


# --- the kit ---------------------------------------------------------------------------------


@dataclass
class Kit:
    """One capsule's namespaces: the jail's (a descriptor) and the egress's three sockets."""

    jail_netns: int
    http_listener: socket.socket
    socks_listener: socket.socket
    sniffer: socket.socket

    def descriptors(self) -> list[int]:
        """New close-on-exec copies of [http listener, socks listener, sniffer]; the caller owns them."""
        return [os.dup(one.fileno()) for one in (self.http_listener, self.socks_listener, self.sniffer)]

    def jail_descriptor(self) -> int:
        """A new close-on-exec copy of the jail namespace's descriptor; the caller owns it."""
        return os.dup(self.jail_netns)

    def close(self) -> None:
        """Close everything the helper holds; the namespaces go when the front end's copies do."""
        for one in (self.http_listener, self.socks_listener, self.sniffer):
            one.close()
        with contextlib.suppress(OSError):
            os.close(self.jail_netns)


def build() -> Kit:
    """A new kit, built on a thread of its own that ends with it (see the essay); raises OSError."""
    return namespaces.on_own_thread(_build_here)


def _build_here() -> Kit:
    """The kit, step by step, on this thread, which is left in the egress namespace."""
    syscalls.unshare(syscalls.CLONE_NEWNET)  # the jail's namespace
    namespaces.loopback_up()
    _no_link_local()
    jail_netns = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    made: list[socket.socket] = []
    try:
        with Rtnl() as jail_rtnl:
            syscalls.unshare(syscalls.CLONE_NEWNET)  # the egress namespace, this thread's from now on
            namespaces.loopback_up()
            _no_link_local()
            with Rtnl() as rtnl:
                _wire(rtnl, jail_rtnl, jail_netns)
        _quiet_icmp_limits()
        made.append(_listener(HTTP_PROXY_PORT))
        made.append(_listener(SOCKS_PROXY_PORT))
        made.append(_sniffer())
        return Kit(jail_netns, *made)
    except BaseException:
        for one in made:
            one.close()
        os.close(jail_netns)
        raise


def _wire(rtnl: Rtnl, jail_rtnl: Rtnl, jail_netns: int) -> None:
    """The veth between the two namespaces, its addresses, and the routes of each side."""
    rtnl.add_veth(EGRESS_LINK, JAIL_LINK, jail_netns)
    rtnl.link_up(EGRESS_LINK)
    jail_rtnl.link_up(JAIL_LINK)
    egress_index, jail_index = rtnl.link_index(EGRESS_LINK), jail_rtnl.link_index(JAIL_LINK)
    rtnl.add_address(egress_index, EGRESS_V4, PREFIX_V4)
    rtnl.add_address(egress_index, EGRESS_V6, PREFIX_V6)
    jail_rtnl.add_address(jail_index, JAIL_V4, PREFIX_V4)
    jail_rtnl.add_address(jail_index, JAIL_V6, PREFIX_V6)
    jail_rtnl.add_default_route(EGRESS_V4, jail_index)
    jail_rtnl.add_default_route(EGRESS_V6, jail_index)
    rtnl.add_anyip_route(socket.AF_INET, egress_index)  # on the veth end, not lo: see the essay
    rtnl.add_anyip_route(socket.AF_INET6, egress_index)


def _no_link_local() -> None:
    """No IPv6 link-local address (nor its fe80::/64 route) on links made from now on in this namespace."""
    with open(_ADDR_GEN_MODE, "w") as knob:  # the thread's namespace, as below
        knob.write(_ADDR_GEN_MODE_NONE)


def _quiet_icmp_limits() -> None:
    """No per-destination ICMP rate limit in the egress namespace (its own sysctls; see the essay)."""
    for path in _ICMP_SYSCTLS:
        with open(path, "w") as knob:  # /proc/sys/net follows the opening thread's namespace
            knob.write("0")


def _listener(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
    try:
        sock.bind((EGRESS_V4, port))
        sock.listen(LISTEN_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def _sniffer() -> socket.socket:
    # Protocol 0 receives nothing until bound, so no packet arrives before the filter.
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC, 0)
    try:
        _attach_filter(sock, sniffer_program())
        sock.bind((EGRESS_LINK, _ETH_P_ALL))
    except BaseException:
        sock.close()
        raise
    return sock


def probe() -> str:
    """Build a kit and close it (``ccw doctor``'s probe, in a forked child); what was made, and how fast."""
    started = time.monotonic()
    build().close()
    return (f"two network namespaces, a veth, addresses, AnyIP routes, the proxy listeners and the sniffer "
            f"made in {(time.monotonic() - started) * 1000:.1f} ms")


# --- the kits of a helper's capsules ------------------------------------------------------


def _spare_kit() -> Kit | None:
    try:
        return build()
    except OSError as exc:  # the next net_open builds its own and reports the failure
        log.warning("could not build a spare egress kit: %s", exc)
        return None


class Kits:
    """The kit of each capsule that asked for one since the helper started, and a spare.

    Kits live in the helper's memory only: after a restart a capsule has none until the
    front end calls ``net_open`` again (exec says ``network_not_open`` until then).
    """

    def __init__(self) -> None:
        self._by_capsule: dict[str, Kit] = {}
        self._lock = threading.Lock()
        self._spares: namespaces.SparePool[Kit] = namespaces.SparePool(_spare_kit, Kit.close)

    def open(self, capsule_id: str) -> list[int]:
        """Copies of the capsule's [http listener, socks listener, sniffer], its kit made on first use."""
        with self._lock:
            kit = self._by_capsule.get(capsule_id)
            if kit is not None:
                return kit.descriptors()
        made = self._spares.take() or build()
        self.prepare()  # once a capsule has asked, the next one is likely to
        with self._lock:
            kit = self._by_capsule.setdefault(capsule_id, made)
            descriptors = kit.descriptors()
        if kit is not made:  # another net_open of the same capsule won the race
            made.close()
        return descriptors

    def prepare(self) -> None:
        """Start making a spare kit, unless one waits.

        It is made on a thread of its own, which ends in the kit's egress namespace (see
        the essay).  Called after a capsule's first net_open, and at helper start when
        the state dir holds egress capsules, so their first net_open finds a kit ready.
        """
        threading.Thread(target=self._spares.refill, name="ccw-egress-spare", daemon=True).start()

    def jail_descriptor(self, capsule_id: str) -> int:
        """A copy of the capsule's jail namespace descriptor (the caller closes it).

        UNAVAILABLE (reason ``network_not_open``) when the capsule has no kit in this
        helper: the front end calls net_open and retries.
        """
        with self._lock:
            kit = self._by_capsule.get(capsule_id)
            if kit is not None:
                return kit.jail_descriptor()
        raise CcwError("UNAVAILABLE", f"capsule {capsule_id}'s network is not open in this helper (none since it "
                       "started): call net_open, then exec again",
                       {"reason": "network_not_open", "capsule_id": capsule_id})

    def close(self, capsule_id: str) -> None:
        """Close the capsule's kit, if it has one (destroy)."""
        with self._lock:
            kit = self._by_capsule.pop(capsule_id, None)
        if kit is not None:
            kit.close()

    def close_all(self) -> None:
        """Close every kit and the spare (the helper is stopping)."""
        self._spares.close()
        with self._lock:
            kits, self._by_capsule = list(self._by_capsule.values()), {}
        for kit in kits:
            kit.close()
