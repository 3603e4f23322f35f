"""Who is at the other end of an accepted loopback TCP connection: the uid that owns the
connecting socket, asked of the kernel with sock_diag.

A forwarded port listens on the host's loopback, where every local user can connect;
only the capsule's owner may pass.  Some facts about finding out who connected, as this
module uses them:

- TCP carries no credentials.  ``SO_PEERCRED`` is filled in by ``connect`` on unix
  sockets only; on a TCP socket it reads pid 0, uid and gid -1 (tried on 6.18).  What
  the kernel does keep is each socket's owner: ``sk_uid``, the fsuid of whoever made
  the socket, kept through ``SCM_RIGHTS`` and ``setuid`` alike; only an ``fchown`` of
  the socket changes it, which takes ``CAP_CHOWN`` (tried: both).
- ``NETLINK_SOCK_DIAG`` shows it.  A ``SOCK_DIAG_BY_FAMILY`` request with an
  ``inet_diag_req_v2`` for TCP and *without* ``NLM_F_DUMP`` is an exact lookup: the
  kernel finds the one socket by its 4-tuple in the established hash
  (``inet_diag_find_one_icsk``) and answers with one ``inet_diag_msg`` whose
  ``idiag_uid`` is that owner, mapped into the asking socket's user namespace; or with
  ``ENOENT``.  No privilege is needed (``ss`` shows every user's sockets the same way).
  A 4-tuple is the socket's own end (``idiag_src``/``sport``) and its other end
  (``idiag_dst``/``dport``): the client's own end is our peer, its other end is us.
  ``/proc/net/tcp`` has the same uid column, but reading it walks and prints every
  socket of the namespace; the lookup is one hash probe.
- The lookup is unambiguous on loopback.  In one network namespace a 4-tuple names at
  most one socket (``connect`` refuses a tuple in use), and our own accepted socket has
  the reversed tuple, so it is never the one found.  ``lo`` belongs to one namespace: a
  connection to ``127.0.0.1`` or ``::1`` comes from a socket in the listener's namespace,
  and sock_diag answers for the namespace of the netlink socket, made here beside the
  listener.  A connection from anywhere else (``route_localnet`` and a DNAT) has no socket
  here to find, and reads as unknown.
- Not found in the established hash, the kernel goes on to the *listeners*, by the
  socket's own end alone: asked for a client that has gone, it may answer with some
  listener that happens to sit on the client's old port, and that listener's owner.  So
  the reply is taken only if it names the socket asked for, both ends.
- If the client closes first.  After a reset the socket is gone: ``ENOENT``.  After a
  ``close`` it lingers: as a full socket in ``FIN_WAIT1`` while unsent data remains, then
  as a time-wait mini-socket (state ``FIN_WAIT2`` or ``TIME_WAIT``) for up to a minute.
  A mini-socket reports uid 0 and inode 0 whoever owned it (``inet_twsk_diag_fill``):
  read naively, every closed client would be root.  An orphaned full socket keeps its
  real uid, but its inode is 0 too, since no process holds it any more.  So a reply with
  inode 0 reads as not found: the client has closed, and nobody is there to answer.  A
  client that only shut its sending side (``shutdown(SHUT_WR)``, as ``nc -N`` does at
  its input's end) still holds its socket and is found.
- The kernel answers inside ``send``: netlink hands the request to sock_diag in the
  sender's own call, which queues the reply before returning.  The socket is non-blocking
  all the same, so a kernel that did otherwise would fail the lookup, not hang trio.
- Cost, measured on the project's 2-core VM (kernel 6.18) while other work shared it,
  medians of 10 000 interleaved: ``peer_uid`` on a live loopback connection 35 us, of
  which 17 us are the netlink socket made, asked and closed (6 us with one kept open)
  and the rest Python's packing and checking (``inet_pton`` for the addresses: 1.4 us
  for two, ``ipaddress`` 9); a loopback connect, accept and close alone 100 us.  So the
  stateless form is kept: nothing to open, share or close, for a third of what the
  connection costs anyway.
- Without ``inet_diag`` and ``tcp_diag`` in the kernel (the kernel loads them on first
  use where they are modules) every lookup says ``ENOENT``; ``socket_uid`` of a listener
  of one's own tells that case apart (``forward.py`` checks it when it opens a port).

Used by ``forward.py`` (a port's own listener, once when it opens), and by ``runs.py``,
which asks the same lookup for a socket's cgroup v2 id through a sock_diag socket the
helper made in a capsule's namespace.  Per connection, a forwarded port's program
(egress/forwarder/ccw_forward.c, ``owner_of``) makes this lookup in C, with each check
above; ``peer_uid`` is its form here, which tests/test_peer.py holds to the same cases.
"""

from __future__ import annotations

import errno
import socket
import struct
from typing import Protocol

from mcp_server.egress.hostspace import _NLMSGHDR, NLM_F_REQUEST, _messages

# <linux/netlink.h>, <linux/sock_diag.h>, <linux/inet_diag.h>
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
INET_DIAG_NOCOOKIE = 0xFFFFFFFF
ALL_STATES = 0xFFFFFFFF  # every TCP state; an exact lookup does not read it
# inet_diag_req_v2: family, protocol, ext, pad, states; then inet_diag_sockid: sport,
# dport (both big-endian: packed through htons), src, dst, if, cookie[2].
_REQ_V2 = struct.Struct("=BBBBIHH16s16sIII")
# inet_diag_msg: family, state, timer, retrans; inet_diag_sockid as above; expires,
# rqueue, wqueue, uid, inode.
_DIAG_MSG = struct.Struct("=BBBBHH16s16sIIIIIIII")
_V4_MAPPED = bytes(10) + b"\xff\xff"  # ::ffff:0:0/96
INET_DIAG_CGROUP_ID = 21  # a u64 attribute after the inet_diag_msg, sent unasked (ext 0)
_NLA = struct.Struct("=HH")  # struct nlattr: length (header included), type
_NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED and NLA_F_NET_BYTEORDER
_RECV = 8192  # one inet_diag_msg and its few attributes (124 bytes in all on 6.18)

Endpoint = tuple[str, int]


class Connected(Protocol):
    """A connected socket, stdlib's or trio's."""

    def getsockname(self) -> object:
        """Its own end."""
        ...

    def getpeername(self) -> object:
        """Its other end."""
        ...


def _ip(text: str) -> tuple[int, bytes]:
    """An address as the kernel hashes it, (family, packed): an IPv4-mapped IPv6 address
    is its IPv4 one."""
    host = text.partition("%")[0]
    if ":" not in host:
        return socket.AF_INET, socket.inet_pton(socket.AF_INET, host)
    raw = socket.inet_pton(socket.AF_INET6, host)
    return (socket.AF_INET, raw[12:]) if raw.startswith(_V4_MAPPED) else (socket.AF_INET6, raw)


def _unpacked(family: int, raw: bytes) -> tuple[int, bytes]:
    """A reply's ``idiag_src`` or ``idiag_dst`` as ``_ip`` gives an address."""
    if family == socket.AF_INET6 and not raw.startswith(_V4_MAPPED):
        return socket.AF_INET6, raw
    return socket.AF_INET, raw[12:] if family == socket.AF_INET6 else raw[:4]


def request(local: Endpoint, remote: Endpoint, scope_id: int = 0) -> bytes:
    """The exact-lookup request (netlink header included) for the TCP socket whose own end
    is ``local`` and whose other end is ``remote``; ``scope_id``: an IPv6 link's index."""
    (family, own), (other_family, other) = _ip(local[0]), _ip(remote[0])
    if family != other_family:
        raise ValueError(f"{local[0]} and {remote[0]} are not of one family")
    body = _REQ_V2.pack(family, socket.IPPROTO_TCP, 0, 0, ALL_STATES, socket.htons(local[1]),
                        socket.htons(remote[1]), own.ljust(16, b"\0"), other.ljust(16, b"\0"), scope_id,
                        INET_DIAG_NOCOOKIE, INET_DIAG_NOCOOKIE)
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0) + body


def _found(data: bytes, local: Endpoint, remote: Endpoint) -> tuple[int, bytes] | None:
    """(owner uid, the reply's body) of the socket asked for, or None (see ``parse_reply``)."""
    asked = (_ip(local[0]), local[1], _ip(remote[0]), remote[1])
    try:
        for kind, body in _messages(data, "sock_diag lookup"):
            if kind != SOCK_DIAG_BY_FAMILY or len(body) < _DIAG_MSG.size:
                continue
            (family, _state, _timer, _retrans, sport, dport, src, dst, _if, _c0, _c1,
             _expires, _rqueue, _wqueue, uid, inode) = _DIAG_MSG.unpack_from(body)
            found = (_unpacked(family, src), socket.ntohs(sport), _unpacked(family, dst), socket.ntohs(dport))
            if found == asked and inode != 0:
                return int(uid), body
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None
        raise
    return None


def parse_reply(data: bytes, local: Endpoint, remote: Endpoint) -> int | None:
    """The owner's uid from the reply to ``request(local, remote)``; None when no process
    holds such a socket (``ENOENT``, another socket's reply, or one with inode 0: what is
    left of a closed socket).  Any other error raises OSError."""
    found = _found(data, local, remote)
    return None if found is None else found[0]


def parse_cgroup(data: bytes, local: Endpoint, remote: Endpoint) -> int | None:
    """The cgroup v2 id from the reply to ``request(local, remote)`` (its ``INET_DIAG_CGROUP_ID``
    attribute, sandbox/run_sockets.py); None as ``parse_reply``, or if the kernel sent none."""
    found = _found(data, local, remote)
    if found is None:
        return None
    body, at = found[1], _DIAG_MSG.size
    while at + _NLA.size <= len(body):
        length, kind = _NLA.unpack_from(body, at)
        if length < _NLA.size:
            break
        if kind & _NLA_TYPE_MASK == INET_DIAG_CGROUP_ID and length >= _NLA.size + 8:
            return int(struct.unpack_from("=Q", body, at + _NLA.size)[0])
        at += (length + 3) & ~3
    return None


def socket_cgroup(diag: socket.socket, local: Endpoint, remote: Endpoint, scope_id: int = 0) -> int | None:
    """The cgroup v2 id of the TCP socket whose own end is ``local`` and whose other end is
    ``remote``, asked through ``diag``, a sock_diag socket of the namespace it is in (the
    helper makes it there); None if no process holds one."""
    diag.send(request(local, remote, scope_id))
    try:
        data = diag.recv(_RECV)
    except BlockingIOError:
        raise OSError(errno.ETIMEDOUT, "sock_diag lookup: the kernel did not answer") from None
    return parse_cgroup(data, local, remote)


def socket_uid(local: Endpoint, remote: Endpoint, scope_id: int = 0) -> int | None:
    """The uid that owns the TCP socket (of this network namespace) whose own end is
    ``local`` and whose other end is ``remote``; None if no process holds one.

    A listener's other end is the unspecified address, port 0."""
    message = request(local, remote, scope_id)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC,
                       NETLINK_SOCK_DIAG) as diag:
        diag.send(message)
        try:
            data = diag.recv(_RECV)
        except BlockingIOError:
            raise OSError(errno.ETIMEDOUT, "sock_diag lookup: the kernel did not answer") from None
    return parse_reply(data, local, remote)


def _endpoint(address: object) -> tuple[str, int, int]:
    """(address, port, scope id) of an AF_INET or AF_INET6 socket address."""
    if (isinstance(address, tuple) and len(address) in (2, 4) and isinstance(address[0], str)
            and isinstance(address[1], int)):
        return address[0], address[1], address[3] if len(address) == 4 else 0
    raise ValueError(f"not a TCP/IP socket address: {address!r}")


def peer_uid(conn: Connected) -> int | None:
    """The uid that owns the socket at the other end of an accepted loopback TCP
    connection; None if none is open there any more (treat as refused)."""
    ours, our_port, _ = _endpoint(conn.getsockname())
    theirs, their_port, scope_id = _endpoint(conn.getpeername())
    return socket_uid((theirs, their_port), (ours, our_port), scope_id)
