"""Raw nf_tables netlink: tables owned by their socket, base chains, and the few rule forms
a forwarded port's kernel path needs (kernel_ports.py).

Some facts about nf_tables' netlink interface that this module follows from:

- Changes go in a *batch*: ``NFNL_MSG_BATCH_BEGIN``, the messages, ``NFNL_MSG_BATCH_END``,
  in one ``sendmsg``.  The kernel applies the batch whole or not at all, before ``sendmsg``
  returns, so every answer is queued by then: they are read without blocking.  Each
  message asks for an acknowledgement; the first error names what was refused.
- Unlike rtnetlink, every integer attribute is big-endian.  What a rule compares is raw
  register data in the packet's (or the kernel's) own byte order: an address and a port
  as on the wire, a socket's uid and the conntrack state as host-order 32-bit words, an
  interface name as 16 bytes (IFNAMSIZ) padded with NULs.
- A table made with ``NFT_TABLE_F_OWNER`` belongs to the netlink socket that made it: only
  that socket may change it, and the kernel deletes it, chains and rules and all, when the
  socket closes, however its holder ended.  So a helper killed with SIGKILL leaves no rule
  behind: what it set up lives exactly as long as the helper's descriptor.
- In the ``ip`` family a rule that reads a TCP header field must first match the layer-4
  protocol (``meta l4proto``): the payload expression reads bytes at an offset of
  whatever transport header the packet has.
- A nat chain sees only a connection's first packet; the rest follow its conntrack entry.
  So a counter in a nat rule counts connections, not packets.
- A connection's NAT is decided at its first packet and kept in its conntrack entry, so
  deleting a rule leads none of its connections elsewhere: they go on until their entries
  are deleted too (ctnetlink's ``IPCTNL_MSG_CT_DELETE``, by one direction's tuple).  The
  kernel does that itself only once no nat chain is left in the namespace.
- Every nfnetlink message needs ``CAP_NET_ADMIN`` over the network namespace the socket
  talks to, reads included.

Expressions are built as ``(name, attributes)`` pairs by the small functions below; a rule
is a list of them.  ``nft --debug=netlink`` prints the same expressions for a rule written
in nft's own language, which is how each builder here was checked.
"""

from __future__ import annotations

import errno
import os
import socket
import struct

from sandbox.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST, NLMSG_ERROR, attr, nested

NETLINK_NETFILTER = 12
NFNL_SUBSYS_CTNETLINK, NFNL_SUBSYS_NFTABLES = 1, 10
NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END = 0x10, 0x11
NFT_MSG_NEWTABLE, NFT_MSG_GETTABLE, NFT_MSG_DELTABLE = 0, 1, 2
NFT_MSG_NEWCHAIN, NFT_MSG_NEWRULE, NFT_MSG_GETRULE = 3, 6, 7
NLM_F_DUMP, NLM_F_APPEND = 0x300, 0x800
NLMSG_DONE = 3
NFPROTO_IPV4 = 2
NFT_TABLE_F_OWNER = 0x2

NFTA_TABLE_NAME, NFTA_TABLE_FLAGS = 1, 2
NFTA_CHAIN_TABLE, NFTA_CHAIN_NAME, NFTA_CHAIN_HOOK, NFTA_CHAIN_TYPE = 1, 3, 4, 7
NFTA_HOOK_HOOKNUM, NFTA_HOOK_PRIORITY = 1, 2
NFTA_RULE_TABLE, NFTA_RULE_CHAIN, NFTA_RULE_EXPRESSIONS = 1, 2, 4
NFTA_LIST_ELEM, NFTA_EXPR_NAME, NFTA_EXPR_DATA = 1, 1, 2
NFTA_DATA_VALUE, NFTA_DATA_VERDICT, NFTA_VERDICT_CODE = 1, 2, 1
NFTA_COUNTER_BYTES, NFTA_COUNTER_PACKETS = 1, 2
# ctnetlink: messages, and the attributes of a connection's tuples
IPCTNL_MSG_CT_GET, IPCTNL_MSG_CT_DELETE = 1, 2
CTA_TUPLE_ORIG, CTA_TUPLE_REPLY = 1, 2
CTA_TUPLE_IP, CTA_TUPLE_PROTO = 1, 2
CTA_IP_V4_SRC, CTA_IP_V4_DST = 1, 2
CTA_PROTO_NUM, CTA_PROTO_SRC_PORT, CTA_PROTO_DST_PORT = 1, 2, 3

# hooks (NF_INET_*)
PREROUTING, INPUT, FORWARD, OUTPUT, POSTROUTING = 0, 1, 2, 3, 4
# registers: the verdict's, and the first two 16-byte data registers
REG_VERDICT, REG_1, REG_2 = 0, 1, 2
NF_DROP, NF_ACCEPT = 0, 1
# meta keys
META_IIFNAME, META_OIFNAME, META_SKUID, META_L4PROTO = 6, 7, 10, 16
# conntrack keys, and the state bits (NF_CT_STATE_BIT of IP_CT_ESTABLISHED, IP_CT_RELATED)
CT_STATE, CT_DIRECTION, CT_DST_IP = 0, 1, 20
CT_ESTABLISHED, CT_RELATED = 1 << 1, 1 << 2
CMP_EQ, CMP_NEQ = 0, 1
PAYLOAD_NETWORK, PAYLOAD_TRANSPORT = 1, 2
NAT_SNAT, NAT_DNAT = 0, 1
NAT_PROTO_SPECIFIED = 0x2
IFNAMSIZ = 16

_NLMSGHDR = struct.Struct("=IHHII")
_NFGENMSG_SIZE = 4  # struct nfgenmsg: family, version, res_id (big-endian)
_RECV = 65536

Expr = tuple[str, bytes]
Tuple = tuple[bytes, bytes, int, int]  # a TCP connection's direction: source, destination (4 bytes), their ports


def _genmsg(family: int, res_id: int = 0) -> bytes:
    return struct.pack(">BBH", family, 0, res_id)


def _be32(value: int) -> bytes:
    return struct.pack(">I", value & 0xFFFFFFFF)


def _string(value: str) -> bytes:
    return value.encode() + b"\0"


def _value(kind: int, value: bytes) -> bytes:
    """An NFTA_*_DATA attribute holding one NFTA_DATA_VALUE."""
    return nested(kind, attr(NFTA_DATA_VALUE, value))


def ifname(name: str) -> bytes:
    """An interface name as a rule compares it: IFNAMSIZ bytes, NUL-padded."""
    raw = name.encode()
    if len(raw) >= IFNAMSIZ:
        raise ValueError(f"interface name {name!r} is longer than {IFNAMSIZ - 1} bytes")
    return raw.ljust(IFNAMSIZ, b"\0")


def meta(key: int, reg: int = REG_1) -> Expr:
    return "meta", attr(1, _be32(reg)) + attr(2, _be32(key))


def cmp(value: bytes, op: int = CMP_EQ, reg: int = REG_1) -> Expr:
    return "cmp", attr(1, _be32(reg)) + attr(2, _be32(op)) + _value(3, value)


def payload(base: int, offset: int, length: int, reg: int = REG_1) -> Expr:
    return "payload", attr(1, _be32(reg)) + attr(2, _be32(base)) + attr(3, _be32(offset)) + attr(4, _be32(length))


def ct(key: int, reg: int = REG_1, original: bool | None = None) -> Expr:
    direction = b"" if original is None else attr(3, b"\0" if original else b"\1")
    return "ct", attr(1, _be32(reg)) + attr(2, _be32(key)) + direction


def bitwise_and(mask: bytes, reg: int = REG_1) -> Expr:
    """``reg = (reg & mask) ^ 0``."""
    return "bitwise", (attr(1, _be32(reg)) + attr(2, _be32(reg)) + attr(3, _be32(len(mask)))
                       + _value(4, mask) + _value(5, b"\0" * len(mask)))


def immediate(value: bytes, reg: int) -> Expr:
    return "immediate", attr(1, _be32(reg)) + _value(2, value)


def verdict(code: int) -> Expr:
    data = nested(2, nested(NFTA_DATA_VERDICT, attr(NFTA_VERDICT_CODE, _be32(code))))
    return "immediate", attr(1, _be32(REG_VERDICT)) + data


def reject(tcp: bool) -> Expr:
    """Refuse at once: a TCP reset, else ICMP port unreachable (filter chains on input, forward, output)."""
    return "reject", attr(1, _be32(1 if tcp else 0)) + attr(2, b"\0" if tcp else b"\3")


def counter() -> Expr:
    return "counter", attr(NFTA_COUNTER_BYTES, b"\0" * 8) + attr(NFTA_COUNTER_PACKETS, b"\0" * 8)


def nat(kind: int, addr_reg: int, port_reg: int | None = None) -> Expr:
    """SNAT or DNAT (IPv4) to the address in ``addr_reg`` and the port in ``port_reg``."""
    body = attr(1, _be32(kind)) + attr(2, _be32(NFPROTO_IPV4)) + attr(3, _be32(addr_reg))
    if port_reg is not None:
        body += attr(5, _be32(port_reg)) + attr(7, _be32(NAT_PROTO_SPECIFIED))
    return "nat", body


def tcp_to(address: bytes, port: int) -> list[Expr]:
    """Matches of a TCP packet to ``address`` (4 bytes) and ``port``."""
    return [payload(PAYLOAD_NETWORK, 16, 4), cmp(address), meta(META_L4PROTO), cmp(bytes([socket.IPPROTO_TCP])),
            payload(PAYLOAD_TRANSPORT, 2, 2), cmp(struct.pack(">H", port))]


def uid_is(uid: int) -> list[Expr]:
    return [meta(META_SKUID), cmp(struct.pack("=I", uid))]


def ct_reply_side() -> list[Expr]:
    """``ct state established,related``."""
    return [ct(CT_STATE), bitwise_and(struct.pack("=I", CT_ESTABLISHED | CT_RELATED)),
            cmp(b"\0\0\0\0", CMP_NEQ)]


def _rule_body(table: str, chain: str, exprs: list[Expr]) -> bytes:
    elems = b"".join(nested(NFTA_LIST_ELEM, attr(NFTA_EXPR_NAME, _string(name)), nested(NFTA_EXPR_DATA, data)
                             if data else b"") for name, data in exprs)
    return (attr(NFTA_RULE_TABLE, _string(table)) + attr(NFTA_RULE_CHAIN, _string(chain))
            + nested(NFTA_RULE_EXPRESSIONS, elems))


class Batch:
    """The messages of one nf_tables transaction, for the ``ip`` family."""

    def __init__(self) -> None:
        self.messages: list[tuple[int, int, bytes, str]] = []  # (type, flags, body, what)

    def table(self, name: str) -> Batch:
        """A new table owned by the socket that sends the batch (EEXIST if the name is taken)."""
        body = attr(NFTA_TABLE_NAME, _string(name)) + attr(NFTA_TABLE_FLAGS, _be32(NFT_TABLE_F_OWNER))
        self.messages.append((NFT_MSG_NEWTABLE, NLM_F_CREATE | NLM_F_EXCL, body, f"create table {name}"))
        return self

    def delete_table(self, name: str) -> Batch:
        self.messages.append((NFT_MSG_DELTABLE, 0, attr(NFTA_TABLE_NAME, _string(name)), f"delete table {name}"))
        return self

    def chain(self, table: str, name: str, kind: str, hook: int, priority: int) -> Batch:
        """A base chain of ``kind`` ("nat" or "filter") on ``hook``, accepting by default."""
        hooked = nested(NFTA_CHAIN_HOOK, attr(NFTA_HOOK_HOOKNUM, _be32(hook)),
                        attr(NFTA_HOOK_PRIORITY, _be32(priority)))
        body = (attr(NFTA_CHAIN_TABLE, _string(table)) + attr(NFTA_CHAIN_NAME, _string(name)) + hooked
                + attr(NFTA_CHAIN_TYPE, _string(kind)))
        self.messages.append((NFT_MSG_NEWCHAIN, NLM_F_CREATE, body, f"create chain {table} {name}"))
        return self

    def rule(self, table: str, chain: str, exprs: list[Expr]) -> Batch:
        self.messages.append((NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, _rule_body(table, chain, exprs),
                              f"add a rule to {table} {chain}"))
        return self


class NfTables:
    """One NETLINK_NETFILTER socket: it talks to the network namespace current for the thread
    that made it, and owns the tables it makes (they go when it closes)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_NETFILTER)
        self.sock.bind((0, 0))
        self._seq = 0

    def close(self) -> None:
        self.sock.close()

    def _header(self, kind: int, flags: int, body: bytes) -> bytes:
        self._seq += 1
        return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), kind, flags, self._seq, 0) + body

    def send(self, batch: Batch) -> None:
        """Apply ``batch`` whole, or raise OSError naming the first message refused."""
        bounds = _genmsg(socket.AF_UNSPEC, NFNL_SUBSYS_NFTABLES)
        frames = [self._header(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, bounds)]
        whats: dict[int, str] = {}
        for kind, flags, body, what in batch.messages:
            frames.append(self._header((NFNL_SUBSYS_NFTABLES << 8) | kind, NLM_F_REQUEST | NLM_F_ACK | flags,
                                       _genmsg(NFPROTO_IPV4) + body))
            whats[self._seq] = what
        frames.append(self._header(NFNL_MSG_BATCH_END, NLM_F_REQUEST, bounds))
        self.sock.send(b"".join(frames))
        acked = 0
        while acked < len(whats):
            try:
                data = self.sock.recv(_RECV, socket.MSG_DONTWAIT)
            except BlockingIOError:
                raise OSError(errno.EPROTO, f"nf_tables answered {acked} of {len(whats)} changes") from None
            for msg_type, seq, body in _messages(data):
                if msg_type != NLMSG_ERROR or seq not in whats:
                    continue
                (code,) = struct.unpack_from("=i", body)
                if code:
                    self._drain()
                    raise OSError(-code, f"{whats[seq]}: {os.strerror(-code)}")
                acked += 1

    def _drain(self) -> None:
        while True:
            try:
                self.sock.recv(_RECV, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return

    def _dump(self, kind: int, attrs: bytes, what: str, subsystem: int = NFNL_SUBSYS_NFTABLES) -> list[bytes]:
        """The attributes of each object a dump request of ``kind`` answers with."""
        self.sock.send(self._header((subsystem << 8) | kind, NLM_F_REQUEST | NLM_F_DUMP,
                                    _genmsg(NFPROTO_IPV4) + attrs))
        seq, found = self._seq, list[bytes]()
        while True:
            for msg_type, got_seq, body in _messages(self.sock.recv(_RECV)):
                if got_seq != seq:
                    continue
                if msg_type == NLMSG_DONE:
                    return found
                if msg_type == NLMSG_ERROR:
                    (code,) = struct.unpack_from("=i", body)
                    raise OSError(-code, f"{what}: {os.strerror(-code)}")
                found.append(body[_NFGENMSG_SIZE:])

    def packets(self, table: str, chain: str) -> int:
        """The sum of the counters in ``table``'s ``chain``: for a nat chain, connections."""
        where = attr(NFTA_RULE_TABLE, _string(table)) + attr(NFTA_RULE_CHAIN, _string(chain))
        rules = self._dump(NFT_MSG_GETRULE, where, f"read the counters of {table} {chain}")
        return sum(_counted(rule) for rule in rules)

    def tables(self) -> list[str]:
        """The names of the ``ip`` family's tables in this socket's namespace, whoever owns them."""
        return [_attrs(table).get(NFTA_TABLE_NAME, b"").rstrip(b"\0").decode()
                for table in self._dump(NFT_MSG_GETTABLE, b"", "list the tables")]


    def tcp_connections(self) -> list[tuple[Tuple, Tuple]]:
        """The original and reply directions of each IPv4 TCP connection conntrack follows here."""
        found = []
        for entry in self._dump(IPCTNL_MSG_CT_GET, b"", "list the connections", NFNL_SUBSYS_CTNETLINK):
            parts = _attrs(entry)
            original, reply = _tuple(parts.get(CTA_TUPLE_ORIG, b"")), _tuple(parts.get(CTA_TUPLE_REPLY, b""))
            if original is not None and reply is not None:
                found.append((original, reply))
        return found

    def forget(self, original: Tuple) -> None:
        """Delete the conntrack entry of the TCP connection ``original`` (one gone already is no error)."""
        source, destination, sport, dport = original
        addresses = nested(CTA_TUPLE_IP, attr(CTA_IP_V4_SRC, source), attr(CTA_IP_V4_DST, destination))
        body = nested(CTA_TUPLE_ORIG, addresses,
                      nested(CTA_TUPLE_PROTO, attr(CTA_PROTO_NUM, bytes([socket.IPPROTO_TCP])),
                             attr(CTA_PROTO_SRC_PORT, struct.pack(">H", sport)),
                             attr(CTA_PROTO_DST_PORT, struct.pack(">H", dport))))
        self.sock.send(self._header((NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_DELETE, NLM_F_REQUEST | NLM_F_ACK,
                                    _genmsg(NFPROTO_IPV4) + body))
        seq = self._seq
        while True:
            for msg_type, got_seq, answer in _messages(self.sock.recv(_RECV)):
                if msg_type == NLMSG_ERROR and got_seq == seq:
                    (code,) = struct.unpack_from("=i", answer)
                    if code and -code != errno.ENOENT:
                        raise OSError(-code, f"delete a connection's conntrack entry: {os.strerror(-code)}")
                    return


def _tuple(data: bytes) -> Tuple | None:
    """A conntrack tuple's attributes as a Tuple; None if it is not IPv4 TCP."""
    parts = _attrs(data)
    address, proto = _attrs(parts.get(CTA_TUPLE_IP, b"")), _attrs(parts.get(CTA_TUPLE_PROTO, b""))
    source, destination = address.get(CTA_IP_V4_SRC, b""), address.get(CTA_IP_V4_DST, b"")
    sport, dport = proto.get(CTA_PROTO_SRC_PORT, b""), proto.get(CTA_PROTO_DST_PORT, b"")
    if (proto.get(CTA_PROTO_NUM, b"")[:1] != bytes([socket.IPPROTO_TCP]) or len(source) < 4 or len(destination) < 4
            or len(sport) < 2 or len(dport) < 2):
        return None
    return source[:4], destination[:4], struct.unpack(">H", sport[:2])[0], struct.unpack(">H", dport[:2])[0]


def _messages(data: bytes) -> list[tuple[int, int, bytes]]:
    out, offset = [], 0
    while offset + _NLMSGHDR.size <= len(data):
        length, msg_type, _flags, seq, _pid = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size:
            raise OSError(errno.EPROTO, "malformed nf_tables reply")
        out.append((msg_type, seq, data[offset + _NLMSGHDR.size: offset + length]))
        offset += (length + 3) & ~3
    return out


def _attrs(data: bytes) -> dict[int, bytes]:
    out, offset = {}, 0
    while offset + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, offset)
        if length < 4:
            break
        out[kind & 0x3FFF] = data[offset + 4: offset + length]
        offset += (length + 3) & ~3
    return out


def _counted(rule: bytes) -> int:
    """The packets of the counters in one rule's attributes."""
    total = 0
    exprs = _attrs(rule).get(NFTA_RULE_EXPRESSIONS, b"")
    offset = 0
    while offset + 4 <= len(exprs):
        length, _kind = struct.unpack_from("=HH", exprs, offset)
        if length < 4:
            break
        expr = _attrs(exprs[offset + 4: offset + length])
        if expr.get(NFTA_EXPR_NAME, b"").rstrip(b"\0") == b"counter":
            packets = _attrs(expr.get(NFTA_EXPR_DATA, b"")).get(NFTA_COUNTER_PACKETS)
            if packets is not None:
                total += struct.unpack(">Q", packets[:8])[0]
        offset += (length + 3) & ~3
    return total
