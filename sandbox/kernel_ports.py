"""A forwarded port's kernel path: the owner's connections to ``127.0.0.1:HOST_PORT`` led
into the capsule by NAT, with no process relaying their bytes.

A relay in user space (the front end's ``ccw-forward``) adds two loopback hops and two
wake-ups to each request; on a kept connection to a fast server that halves the rate
(its essay).  Here the kernel moves the bytes: the host and the capsule's namespace are
joined by a veth pair, and three NAT steps carry a connection across it:

1. host, nat OUTPUT: a TCP connection to ``127.0.0.1:HOST_PORT`` from a socket the owner's
   uid owns (``meta skuid``: the uid sock_diag reports, which the relay checks too) goes to
   the capsule's end of the link, ``CAPSULE_ADDR:PORT``.  Any other uid's connection is not
   touched and reaches the front end's listener on that port, which refuses it and counts
   it as before.  A nat chain sees a connection's first packet only, so the rule's counter
   counts connections.
2. host, nat POSTROUTING: its source becomes the host's end of the link (it was 127.0.0.1,
   which the capsule would answer on its own loopback).
3. capsule, nat PREROUTING: ``CAPSULE_ADDR:PORT`` goes to ``127.0.0.1:PORT``, where dev
   servers listen; and nat INPUT: its source becomes ``127.0.0.1`` too, as a relayed
   connection's is, since servers trust loopback clients that the link's address is not
   (PostgreSQL's ``pg_hba.conf`` refused the host's ``psql`` without it).  The replies are
   led back by conntrack: their destination, 127.0.0.1 at first, is rewritten at OUTPUT
   and the route looked up again.

Some kernel facts this follows from:

- A packet from 127.0.0.1 may leave by a device other than ``lo``, and one to 127.0.0.1
  may arrive by one, only where ``route_localnet`` is set for that device.  It is set on
  the two ends of this link alone, never for ``all``: set globally (as kube-proxy once did)
  it lets a neighbour on the LAN reach the host's loopback services.  Here the host's end
  reaches only a namespace of this helper's, and the filters below refuse what comes from
  it unasked.
- The link must not become the capsule's way to the host, nor another user's way into the
  capsule.  So the host's filter chains, in a table of the link's own made before the link
  has an address: (a) from the link, only packets of connections already established
  (the replies); anything new is refused at once (a TCP reset, else ICMP port
  unreachable, let out as replies), as the capsule's other ways out are, where a drop
  left a connect hanging; (b) to the link, only connections that were made to
  ``127.0.0.1`` (``ct original ip daddr``: only step 1 turns such a connection into one to
  the link, and only for the owner), so another user's connection to ``CAPSULE_ADDR``
  itself is dropped; (c) nothing forwarded from or to it.  IPv6 is disabled on both
  ends, so none of this needs an IPv6 twin: no link-local address, nothing passes.
- The jail cannot change any of it: the capsule's namespace belongs to the helper's user
  namespace, over which a jail has no capability (no route, no raw socket, no nf_tables).
- Every table here is owned by the netlink socket that made it (nftables.py): when the
  helper ends, however it ends, the kernel deletes the rules.  A forward's rules go with
  the front end that asked for them too (a pidfd of it, watched): its listener went with
  it, and the port may be another program's by the time the owner connects there again.
  Rules going end their connections too, as the relay ends its own: each connection keeps
  its NAT in its conntrack entry (nftables.py), so those are deleted on both sides, and the
  owner's socket is aborted (``_abort``), which a client that only reads learns at once.  The
  link goes with the capsule's namespace, or at ``close_capsule``.  A helper killed with
  SIGKILL leaves at most a link into a namespace with no process in it (sockets of it
  still held elsewhere keep it), no rule leading there and none filtering it; the next
  privileged helper to start deletes it (``sweep``), as does one that needs its name.
- Addresses: each capsule's link is a /30 from 169.254.128.0/22 (link-local: this link
  only, never routed beyond it; 169.254.169.254, where clouds answer, stays outside it).
  The host's end is named ``ccwpN`` and its table ``ccw_ccwpN``: the table is made first,
  and the kernel's refusal of a table name already taken (another helper's link) is the
  allocator, so a live helper's link always has its table, and one without is a dead
  helper's.  N gives the /30.
- Only a privileged helper has ``CAP_NET_ADMIN`` in the host's namespace: a rootless
  helper's forwards relay in user space.  A server that listens on ``::1`` alone cannot
  be reached by IPv4 NAT, so a path is made only once ``127.0.0.1:PORT`` answers in the
  capsule; the relay serves it otherwise.

The front end proves it holds the port: the request carries its listening socket, which
must be a TCP listener on ``127.0.0.1``; the host port is read from it, never taken from
the arguments.  Only the caller's own connections are redirected, so a caller could lead
nobody else's traffic anywhere.  The helper keeps a duplicate of that listener while rules
lead from its port, so no other program binds the port meanwhile: rules a failed close left
behind lead the owner to no other program's port.  A uid has ``MAX_FORWARDS`` at once.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import select
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from sandbox import namespaces, nftables, syscalls
from sandbox.errors import CcwError
from sandbox.netlink import Rtnl
from sandbox.nftables import Batch, NfTables

T = TypeVar("T")

HOST_PREFIX = "ccwp"  # the host's end of a capsule's link: ccwp0, ccwp1, ...
CAPSULE_LINK = "ccwhost"  # its end in the capsule's namespace
MAX_LINKS = 256  # /30s in 169.254.128.0/22
MAX_FORWARDS = 64  # one uid's at once (a front end keeps 32 a capsule): each holds a descriptor here
_NET = ipaddress.ip_network("169.254.128.0/22")
_LOOPBACK = socket.inet_aton("127.0.0.1")


def addresses(index: int) -> tuple[str, str]:
    """The host's and the capsule's address on link ``index``."""
    base = int(_NET.network_address) + 4 * index
    return str(ipaddress.ip_address(base + 1)), str(ipaddress.ip_address(base + 2))


def _sysctl(path: str, value: str) -> None:
    with open(path, "w") as knob:  # /proc/sys/net follows the opening thread's namespace
        knob.write(value)


def _link_sysctls(name: str) -> None:
    _sysctl(f"/proc/sys/net/ipv4/conf/{name}/route_localnet", "1")
    with contextlib.suppress(FileNotFoundError):  # no IPv6 on this kernel: nothing to turn off
        _sysctl(f"/proc/sys/net/ipv6/conf/{name}/disable_ipv6", "1")


def _inside(netns: int, work: Callable[[], T]) -> T:
    def run() -> T:
        syscalls.setns(netns, syscalls.CLONE_NEWNET)
        return work()

    return namespaces.on_own_thread(run)


def _answers_v4(netns: int, port: int) -> bool:
    def work() -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as probe:
            return probe.connect_ex(("127.0.0.1", port)) == 0

    return _inside(netns, work)


def held_port(listener: int) -> int:
    """The port of ``listener`` if it is a TCP socket listening on 127.0.0.1, else INVALID_ARGUMENT."""
    sock = socket.socket(fileno=os.dup(listener))
    with sock:
        try:
            listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
            kind = sock.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE)
            name = sock.getsockname()
        except OSError:
            listening, kind, name = 0, 0, None
    if (sock.family != socket.AF_INET or kind != socket.SOCK_STREAM or not listening
            or not isinstance(name, tuple) or name[0] != "127.0.0.1"):
        raise CcwError("INVALID_ARGUMENT", "net_forward carries the forward's listening TCP socket on 127.0.0.1, "
                       "which proves the caller holds the port; this descriptor is not one")
    return int(name[1])


@dataclass
class _Forward:
    port: int  # the capsule's
    uid: int  # whose connections it leads
    pid: int  # the front end that asked
    listener: int  # a duplicate of the port's listening socket: no other program binds the port while rules lead it


@dataclass
class _Link:
    index: int
    host: NfTables  # owns the link's table and each forward's host table
    capsule: NfTables  # made in the capsule's namespace: owns each forward's capsule table
    forwards: dict[int, _Forward] = field(default_factory=dict)  # by host port

    @property
    def name(self) -> str:
        return f"{HOST_PREFIX}{self.index}"

    def close(self) -> None:
        for host_port in list(self.forwards):  # their connections end too, not only their rules
            _drop_forward(self, host_port)
        self.host.close()
        self.capsule.close()
        with contextlib.suppress(OSError), Rtnl() as rtnl:
            rtnl.delete_link(self.name)


def _link_table(name: str, host_addr: str) -> Batch:
    """The host's rules for link ``name`` (the essay's step 2, and filters a, b and c)."""
    table = f"ccw_{name}"
    on_out = [nftables.meta(nftables.META_OIFNAME), nftables.cmp(nftables.ifname(name))]
    on_in = [nftables.meta(nftables.META_IIFNAME), nftables.cmp(nftables.ifname(name))]
    accept, drop = nftables.verdict(nftables.NF_ACCEPT), nftables.verdict(nftables.NF_DROP)
    batch = Batch().table(table)
    batch.chain(table, "post", "nat", nftables.POSTROUTING, 100)
    batch.rule(table, "post", [*on_out, nftables.immediate(socket.inet_aton(host_addr), nftables.REG_1),
                               nftables.nat(nftables.NAT_SNAT, nftables.REG_1)])
    batch.chain(table, "in", "filter", nftables.INPUT, 0)
    batch.rule(table, "in", [*on_in, *nftables.ct_reply_side(), accept])
    # Refused at once, as the capsule's other ways out are (a dropped SYN hung for a minute).
    batch.rule(table, "in", [*on_in, nftables.meta(nftables.META_L4PROTO), nftables.cmp(bytes([socket.IPPROTO_TCP])),
                             nftables.reject(tcp=True)])
    batch.rule(table, "in", [*on_in, nftables.reject(tcp=False)])
    batch.chain(table, "out", "filter", nftables.OUTPUT, 0)
    batch.rule(table, "out", [*on_out, nftables.ct(nftables.CT_DST_IP, original=True), nftables.cmp(_LOOPBACK), accept])
    # and the refusals of what came from the link (a reply of its own connection's entry)
    batch.rule(table, "out", [*on_out, nftables.ct(nftables.CT_DIRECTION), nftables.cmp(b"\1"), accept])
    batch.rule(table, "out", [*on_out, drop])
    batch.chain(table, "forward", "filter", nftables.FORWARD, 0)
    batch.rule(table, "forward", [*on_in, drop])
    batch.rule(table, "forward", [*on_out, drop])
    return batch


def _dnat(address: str, port: int) -> list[nftables.Expr]:
    return [nftables.immediate(socket.inet_aton(address), nftables.REG_1),
            nftables.immediate(struct.pack(">H", port), nftables.REG_2),
            nftables.nat(nftables.NAT_DNAT, nftables.REG_1, nftables.REG_2)]


def forward_table(host_port: int) -> str:
    return f"ccw_fwd_{host_port}"


class KernelPorts:
    """Each capsule's link to the host, and each forward's rules on both sides of it."""

    def __init__(self, rootless: bool) -> None:
        self.rootless = rootless
        self._links: dict[str, _Link] = {}
        self._lock = threading.Lock()
        self._front_ends: dict[int, int] = {}  # pid: its pidfd, while it has forwards
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._watcher: threading.Thread | None = None
        self._stopping = False

    def _watch(self) -> None:
        """Drop the forwards of each front end that ends: its listener went with it, and a rule
        left behind would lead the owner's connections to that port, now maybe another
        program's, into the capsule."""
        while True:
            poller = select.poll()
            poller.register(self._wake_r, select.POLLIN)
            with self._lock:
                if self._stopping:
                    return
                watched = {pidfd: pid for pid, pidfd in self._front_ends.items()}
            for pidfd in watched:
                poller.register(pidfd, select.POLLIN)
            for fd, _events in poller.poll():
                if fd == self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 64)
                elif fd in watched:
                    self._ended(watched[fd])

    def _ended(self, pid: int) -> None:
        with self._lock:
            pidfd = self._front_ends.pop(pid, None)
            for link in self._links.values():
                for host_port in [hp for hp, forward in link.forwards.items() if forward.pid == pid]:
                    _drop_forward(link, host_port)
        if pidfd is not None:
            os.close(pidfd)

    def _follow(self, pid: int) -> None:
        """Watch front end ``pid`` (under the lock)."""
        if pid not in self._front_ends:
            self._front_ends[pid] = os.pidfd_open(pid)
            os.write(self._wake_w, b"w")
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, name="ccw-forward-lifelines", daemon=True)
            self._watcher.start()

    def open(self, capsule_id: str, netns: int, port: int, host_port: int, uid: int, pid: int, listener: int) -> None:
        """Lead ``uid``'s connections to ``127.0.0.1:host_port`` (``listener``'s port) to the
        capsule's ``port``, for as long as front end ``pid`` lives; the same forward again is
        left as it is, with the connections it leads."""
        if self.rootless:
            raise CcwError("UNSUPPORTED", "a rootless helper cannot add rules to the host's network namespace; "
                           "the forward relays in user space")
        if not _answers_v4(netns, port):
            raise CcwError("CONFLICT", f"nothing in capsule {capsule_id} answers on 127.0.0.1:{port} now; the "
                           "forward relays in user space until it does", {"capsule_id": capsule_id, "port": port})
        with self._lock:
            self._follow(pid)
            link = self._links.get(capsule_id)
            kept = None if link is None else link.forwards.get(host_port)
            if kept is not None and (kept.port, kept.pid) == (port, pid):
                return
            for other in self._links.values():  # the caller holds the port now: another forward there is over
                if host_port in other.forwards:
                    _drop_forward(other, host_port)
            if sum(f.uid == uid for other in self._links.values() for f in other.forwards.values()) >= MAX_FORWARDS:
                raise CcwError("TOO_LARGE", f"uid {uid} has {MAX_FORWARDS} forwarded ports on the kernel path; this "
                               "one relays in user space (close some forwards to free the path)", {"uid": uid})
            if link is None:
                link = self._links[capsule_id] = _make_link(netns)
            capsule_addr = addresses(link.index)[1]
            table = forward_table(host_port)
            link.host.send(Batch().table(table).chain(table, "out", "nat", nftables.OUTPUT, -100).rule(
                table, "out", [*nftables.tcp_to(_LOOPBACK, host_port), *nftables.uid_is(uid), nftables.counter(),
                               *_dnat(capsule_addr, port)]))
            try:
                on_link = [nftables.meta(nftables.META_IIFNAME), nftables.cmp(nftables.ifname(CAPSULE_LINK))]
                inside = Batch().table(table).chain(table, "pre", "nat", nftables.PREROUTING, -100).rule(
                    table, "pre", [*on_link, *nftables.tcp_to(socket.inet_aton(capsule_addr), port),
                                   *_dnat("127.0.0.1", port)])
                inside.chain(table, "in", "nat", nftables.INPUT, 100).rule(table, "in", [
                    *on_link, *nftables.tcp_to(_LOOPBACK, port), nftables.immediate(_LOOPBACK, nftables.REG_1),
                    nftables.nat(nftables.NAT_SNAT, nftables.REG_1)])
                link.capsule.send(inside)
            except OSError:
                link.host.send(Batch().delete_table(table))
                raise
            link.forwards[host_port] = _Forward(port, uid, pid, os.dup(listener))

    def connections(self, capsule_id: str, host_port: int) -> int | None:
        """How many connections the path has led into the capsule; None: it has no path."""
        with self._lock:
            link = self._links.get(capsule_id)
            if link is None or host_port not in link.forwards:
                return None
            return link.host.packets(forward_table(host_port), "out")

    def close(self, capsule_id: str, host_port: int) -> bool:
        """Remove one forward's rules and end the connections they led (_forget_connections)."""
        with self._lock:
            link = self._links.get(capsule_id)
            if link is None or host_port not in link.forwards:
                return False
            _drop_forward(link, host_port)
            return True

    def close_capsule(self, capsule_id: str) -> None:
        """The capsule is going: its link and every rule of it."""
        with self._lock:
            link = self._links.pop(capsule_id, None)
        if link is not None:
            link.close()

    def close_all(self) -> None:
        with self._lock:
            links, self._links = list(self._links.values()), {}
            self._stopping = True
            pidfds, self._front_ends = list(self._front_ends.values()), {}
        os.write(self._wake_w, b"s")
        if self._watcher is not None:
            self._watcher.join()
        for link in links:
            link.close()
        for fd in (*pidfds, self._wake_r, self._wake_w):
            os.close(fd)


def _drop_forward(link: _Link, host_port: int) -> None:
    table = forward_table(host_port)
    forward = link.forwards.pop(host_port, None)
    for side in (link.host, link.capsule):
        with contextlib.suppress(OSError):
            side.send(Batch().delete_table(table))
    with contextlib.suppress(OSError):
        _forget_connections(link, {host_port}, None if forward is None else forward.uid)
    if forward is not None:  # the port is free only once nothing leads there
        os.close(forward.listener)


def _forget_connections(link: _Link, host_ports: set[int], uid: int | None) -> None:
    """End the connections the forwards on ``host_ports`` led, as the relay ends its own: each
    keeps its NAT in its conntrack entry after the rules go (nftables.py), so they are deleted
    on both sides.  The owner's next packet then reaches the host port itself (reset there),
    and the server's reaches nothing in the capsule (reset there)."""
    capsule_addr = socket.inet_aton(addresses(link.index)[1])
    for original, reply in link.host.tcp_connections():
        if original[1] == _LOOPBACK and original[3] in host_ports and reply[0] == capsule_addr:
            link.host.forget(original)
            with contextlib.suppress(OSError):  # the capsule's namespace may be gone
                link.capsule.forget((reply[1], reply[0], reply[3], reply[2]))
            _abort(original, uid)


SOCK_DIAG_BY_FAMILY, SOCK_DESTROY, NETLINK_SOCK_DIAG = 20, 21, 4  # <linux/sock_diag.h>, <linux/netlink.h>
# inet_diag_req_v2 and its inet_diag_sockid (ports big-endian), as egress/peer.py's lookups send it;
# inet_diag_msg: family, state, timer, retrans, the sockid, expires, rqueue, wqueue, uid, inode
_DIAG_REQ = struct.Struct("=BBBBIHH16s16sIII")
_DIAG_MSG = struct.Struct("=BBBBHH16s16sIIIIIIII")
_NO_COOKIE = (0xFFFFFFFF, 0xFFFFFFFF)


def _led_socket(reply: bytes, original: nftables.Tuple, uid: int | None) -> tuple[int, int] | None:
    """The cookie of the socket an exact lookup of ``original`` answered with, if it is that
    connection's own end, held by a process (inode), and ``uid``'s.  Not found among the
    connections, the kernel answers with a listener on the tuple's source port (egress/peer.py's
    essay): a conntrack entry outlives its socket, and that port may be anyone's server now."""
    if len(reply) < 16 + _DIAG_MSG.size or struct.unpack_from("=H", reply, 4)[0] != SOCK_DIAG_BY_FAMILY:
        return None
    (family, _state, _timer, _retrans, sport, dport, src, dst, _if, cookie0, cookie1,
     _expires, _rqueue, _wqueue, owner, inode) = _DIAG_MSG.unpack_from(reply, 16)
    found = (src[:4], dst[:4], socket.ntohs(sport), socket.ntohs(dport))
    if family != socket.AF_INET or found != original or not inode or (uid is not None and owner != uid):
        return None
    return cookie0, cookie1


def _abort(original: nftables.Tuple, uid: int | None) -> None:
    """Abort the owner's end of a led connection (SOCK_DESTROY), so that a client that only reads
    (server-sent events, a download) sees the end at once, as the relay's clients do: with its
    conntrack entry gone it would otherwise learn it only at its next write.  A kernel without
    ``CONFIG_INET_DIAG_DESTROY`` refuses; the connection then ends at that write.  Only the
    socket found first (``_led_socket``) is aborted: the destroy names its cookie."""
    source, destination, sport, dport = original
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG) as diag:
        diag.settimeout(1)

        def ask(kind: int, flags: int, cookie: tuple[int, int]) -> bytes:
            body = _DIAG_REQ.pack(socket.AF_INET, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF, socket.htons(sport),
                                  socket.htons(dport), source.ljust(16, b"\0"), destination.ljust(16, b"\0"), 0,
                                  *cookie)
            diag.send(struct.pack("=IHHII", 16 + len(body), kind, flags, 1, 0) + body)
            return diag.recv(4096)  # the answer or the ack, whatever it says: gone, or not supported here

        with contextlib.suppress(OSError):
            cookie = _led_socket(ask(SOCK_DIAG_BY_FAMILY, 0x1, _NO_COOKIE), original, uid)  # REQUEST
            if cookie is not None:
                ask(SOCK_DESTROY, 0x1 | 0x4, cookie)  # REQUEST | ACK


def _claim() -> tuple[int, NfTables]:
    """A link index no helper holds: its host table made first, so the table's name is the
    allocator (a link with no table is one whose helper died: ``sweep``)."""
    host = NfTables()
    try:
        for index in range(MAX_LINKS):
            name = f"{HOST_PREFIX}{index}"
            try:
                host.send(_link_table(name, addresses(index)[0]))
            except (FileExistsError, PermissionError) as exc:
                # A table another socket owns is EPERM to all others, not EEXIST.
                if isinstance(exc, PermissionError) and f"ccw_{name}" not in host.tables():
                    raise
                continue
            return index, host
    except BaseException:
        host.close()
        raise
    host.close()
    raise CcwError("UNAVAILABLE", f"all {MAX_LINKS} links for forwarded ports are in use; close some "
                   "forwards or destroy capsules that hold them")


def _make_link(netns: int) -> _Link:
    """A veth pair from the host into ``netns``, its host rules in place before it exists."""
    index, host = _claim()
    name = f"{HOST_PREFIX}{index}"
    with Rtnl() as rtnl:
        host_addr, capsule_addr = addresses(index)
        try:
            try:
                rtnl.add_veth(name, CAPSULE_LINK, netns)
            except FileExistsError:  # a dead helper's link (its table was gone for _claim): ``sweep``'s case
                rtnl.delete_link(name)
                rtnl.add_veth(name, CAPSULE_LINK, netns)
        except BaseException:
            host.close()
            raise
        try:
            _link_sysctls(name)
            rtnl.add_address(rtnl.link_index(name), host_addr, 30)
            rtnl.link_up(name)
            capsule = _inside(netns, lambda: _capsule_side(capsule_addr))
        except BaseException:
            with contextlib.suppress(OSError):
                rtnl.delete_link(name)
            host.close()
            raise
    return _Link(index, host, capsule)


def sweep() -> list[str]:
    """Delete the links of helpers that died (SIGKILL: their tables went, their links stayed while
    something held the capsule's namespace, ``route_localnet`` set and no filter); the names deleted.
    A live helper's link always has its table (``_claim`` makes the table first)."""
    swept = []
    with Rtnl() as rtnl, contextlib.closing(NfTables()) as listing:
        for index in range(MAX_LINKS):
            name = f"{HOST_PREFIX}{index}"
            try:
                rtnl.link_index(name)
            except OSError:  # none of that name (ENODEV)
                continue
            # Listed after the link was seen: a live helper made its table before its link.
            if f"ccw_{name}" not in listing.tables():
                with contextlib.suppress(OSError):  # gone meanwhile
                    rtnl.delete_link(name)
                    swept.append(name)
    return swept


def _capsule_side(capsule_addr: str) -> NfTables:
    """Configure the link's end in the capsule (this thread is in its namespace): its nf_tables socket."""
    _link_sysctls(CAPSULE_LINK)
    with Rtnl() as rtnl:
        rtnl.add_address(rtnl.link_index(CAPSULE_LINK), capsule_addr, 30)
        rtnl.link_up(CAPSULE_LINK)
    try:
        return NfTables()
    except OSError as exc:
        raise OSError(exc.errno or errno.EIO, f"nf_tables in the capsule's namespace: {exc.strerror}") from exc
