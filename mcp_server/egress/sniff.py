"""Direct connection attempts, from the packets the helper's sniffer socket delivers.

Some facts about the sniffer, as the helper makes it and this module reads it:

- It is an ``AF_PACKET`` ``SOCK_DGRAM`` socket bound to the egress end of the capsule's
  veth.  ``SOCK_DGRAM`` strips the link-layer header, so each datagram starts at the IP
  header (v4 or v6, told apart by the first nibble), and ``recvfrom`` gives a
  ``sockaddr_ll`` whose ``sll_pkttype`` says the direction: ``PACKET_HOST`` for what the
  jail sent to the egress namespace, ``PACKET_OUTGOING`` for what the egress side sent.
- A packet socket sees both directions, so the helper attaches a classic-BPF filter that
  keeps only TCP segments with SYN and without ACK, and UDP (v4 and v6).  The filter runs
  in the kernel before anything is queued; the parser below re-checks the same facts
  (``bubblewrap``'s habit: the other side's check is not trusted).
- Every destination is local in the egress namespace ("AnyIP" routes) and nothing
  listens but the proxy's two sockets, so a direct TCP attempt is refused with a RST
  after the first SYN and a UDP datagram draws an ICMP port-unreachable.  The client
  gives up at once, so there is no retransmission to count twice; a program that loops
  still makes one packet per try, and the session keeps one record per distinct
  (protocol, address, port) in an exec.
- SYNs to the proxy's own listeners are the proxy at work, not direct attempts; the
  session drops them by their destination.
- The kernel queues at most the socket's receive buffer; a flood beyond it is dropped
  (the denial itself does not depend on the sniffer: the egress namespace refuses
  regardless).  Reading the sniffer only records what happened.
- A packet is queued on the sniffer before the egress side answers it (the kernel hands
  it to taps first), so every attempt of an exec is queued before its jail exits.  But
  the reading task is one trio task among all the proxy's, each record a database row
  for the session's observer; the helper's answer that the exec ended can be acted on
  first.  Once, a busy front end closed an exec's records with its last four direct
  attempts still queued (the proxy's record of the request made after them was there:
  the proxy records before it answers).  So the exec's end reads what is queued, without
  waiting (``Sniffer.drain``).  And the task does not read with trio's ``recvfrom``: that
  returns through a checkpoint *after* the packet has left the queue, and a packet held
  there by a task not yet resumed was lost to the exec ending meanwhile (seen with a slow
  observer: one attempt of nine).  It waits until the socket is readable and then drains
  it too, reading and recording in one step with no checkpoint between.  The queue holds
  about 256 small datagrams (the default receive buffer, 212 992 bytes; measured on the
  project's VM: 300 sent, 256 queued, 44 counted dropped).
- IPv6 may put extension headers before TCP/UDP (hop-by-hop, routing, destination
  options, fragment); they are walked.  A non-first fragment carries no ports and is
  ignored, as are IPv4 fragments after the first.
- The jail's own hostname (``JAIL_HOSTNAME``) is in its /etc/hosts, but a lookup still
  sends DNS queries for it under resolv.conf's search domains (``hostname -f``, Python's
  ``getfqdn``, a resolver that reads no hosts file) to the host's resolvers: each was a
  denied ``udp`` record and note in every such exec, about nothing the command asked
  for.  Such a query is not handed on (``own_names``); it still goes nowhere (the egress
  namespace answers port-unreachable, so the lookup fails at once, as it would in a
  ``network: none`` jail).  Only a standard query (opcode 0, one question) to port 53
  whose whole name is one of those, within the captured ``SNAP_BYTES``, and whose datagram
  (the UDP header's length) holds nothing after the question but an EDNS OPT record, is
  left out: any other name, a label with a dot in it, bytes after the question, or a packet
  that cannot be read so far, is recorded as before.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import trio

from mcp_server.egress.hostspace import RESOLV_CONF
from sandbox.spec import JAIL_HOSTNAME

log = logging.getLogger("ccw.egress")

PACKET_OUTGOING = 4  # sll_pkttype of what this host sent (linux/if_packet.h)
IPPROTO_TCP = 6
IPPROTO_UDP = 17
TCP_SYN = 0x02
TCP_ACK = 0x10
_IPV6_EXTENSIONS = {0, 43, 60}  # hop-by-hop, routing, destination options
_IPV6_FRAGMENT = 44
_MAX_EXTENSIONS = 8
MAX_DRAINED = 4096  # packets ``drain`` reads at most: a service still sending cannot hold an exec's end
DNS_PORT = 53


@dataclass(frozen=True)
class DirectAttempt:
    """One packet the jail sent around the proxy: where it was going."""

    protocol: Literal["tcp", "udp"]
    address: str
    port: int
    source: str
    query: bytes | None = None  # a DNS query's one name (``question``), for UDP to port 53


def question(payload: bytes, length: int) -> bytes | None:
    """The name a DNS query asks about (lower case, dotted, no root dot), if ``payload`` is a
    standard query with one question whose name is whole in it and that is all the
    ``length`` bytes of the message (the UDP header's) hold, bar a resolver's EDNS OPT record;
    None for anything else."""
    if len(payload) < 12:
        return None
    flags, count, answers, authorities, additional = struct.unpack_from("!HHHHH", payload, 2)
    if flags & 0xF800 or count != 1 or answers or authorities or additional > 1:  # a response, another opcode
        return None
    labels: list[bytes] = []
    at = 12
    while at < len(payload):
        size = payload[at]
        if size == 0:
            break
        if size > 63 or at + 1 + size > len(payload):  # a compression pointer, or cut by the snap length
            return None
        labels.append(payload[at + 1:at + 1 + size])
        at += 1 + size
    else:
        return None
    end = at + 5  # the root label, QTYPE, QCLASS
    if additional:  # glibc's ``options edns0``: the root's OPT (type 41), then its data
        if payload[end:end + 3] != b"\0\0\x29" or len(payload) < end + 11:
            return None
        end += 11 + struct.unpack_from("!H", payload, end + 9)[0]
    if not labels or end != length or any(b"." in label for label in labels):
        return None  # bytes after the question (other traffic under a lookup's name), or a dot in a label
    return b".".join(labels).lower()


def own_names(resolv_conf: Path = RESOLV_CONF) -> frozenset[bytes]:
    """The names a lookup of the jail's hostname queries: the bare name and, under each of
    ``resolv_conf``'s ``search`` and ``domain`` domains (the jail reads the host's), the name
    in it."""
    try:
        lines = resolv_conf.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    domains = {word.strip(".").lower() for line in lines if line.split()[:1] in (["search"], ["domain"])
               for word in line.split()[1:]}
    host = JAIL_HOSTNAME.encode()
    return frozenset({host, *(host + b"." + domain.encode("ascii", "replace") for domain in domains if domain)})


def _transport(protocol: int, segment: bytes, source: str, address: str) -> DirectAttempt | None:
    if protocol == IPPROTO_TCP:
        if len(segment) < 14:
            return None
        flags = segment[13]
        if not flags & TCP_SYN or flags & TCP_ACK:
            return None
        return DirectAttempt("tcp", address, struct.unpack_from("!H", segment, 2)[0], source)
    if protocol == IPPROTO_UDP:
        if len(segment) < 8:
            return None
        port, length = struct.unpack_from("!HH", segment, 2)
        query = question(segment[8:], length - 8) if port == DNS_PORT else None
        return DirectAttempt("udp", address, port, source, query)
    return None


def _parse_v4(packet: bytes) -> DirectAttempt | None:
    if len(packet) < 20:
        return None
    header = (packet[0] & 0x0F) * 4
    fragment_offset = struct.unpack_from("!H", packet, 6)[0] & 0x1FFF
    if header < 20 or len(packet) < header or fragment_offset:
        return None
    source = str(ipaddress.IPv4Address(packet[12:16]))
    address = str(ipaddress.IPv4Address(packet[16:20]))
    return _transport(packet[9], packet[header:], source, address)


def _parse_v6(packet: bytes) -> DirectAttempt | None:
    if len(packet) < 40:
        return None
    next_header = packet[6]
    source = str(ipaddress.IPv6Address(packet[8:24]))
    address = str(ipaddress.IPv6Address(packet[24:40]))
    offset = 40
    for _ in range(_MAX_EXTENSIONS):
        if next_header in _IPV6_EXTENSIONS:
            if len(packet) < offset + 2:
                return None
            next_header, offset = packet[offset], offset + (packet[offset + 1] + 1) * 8
        elif next_header == _IPV6_FRAGMENT:
            if len(packet) < offset + 8 or struct.unpack_from("!H", packet, offset + 2)[0] & 0xFFF8:
                return None
            next_header, offset = packet[offset], offset + 8
        else:
            break
    return _transport(next_header, packet[offset:], source, address)


def parse_packet(packet: bytes) -> DirectAttempt | None:
    """The TCP SYN or UDP datagram in an L3 packet, or None for anything else or garbage."""
    if not packet:
        return None
    version = packet[0] >> 4
    if version == 4:
        return _parse_v4(packet)
    if version == 6:
        return _parse_v6(packet)
    return None


class Sniffer:
    """The helper's sniffer socket, read by a task (``serve``) and, at an exec's end, at
    once (``drain``); each direct attempt is handed to ``seen``."""

    def __init__(self, fd: int, seen: Callable[[DirectAttempt], None], own: frozenset[bytes] | None = None) -> None:
        self._socket = socket.socket(fileno=fd)
        self._socket.setblocking(False)
        self._seen = seen
        self._own = own_names() if own is None else own  # the jail's lookups of its own hostname: not handed on

    async def serve(self) -> None:
        """Read until the socket fails (ENETDOWN once the veth is gone) or the task is cancelled."""
        while True:
            try:
                await trio.lowlevel.wait_readable(self._socket)
                self._read_queued()
            except (OSError, trio.ClosedResourceError) as exc:
                log.warning("egress sniffer: stopped reading: %s", exc)
                return

    def drain(self) -> None:
        """Hand on every packet queued now, without waiting (the socket's failure: ``serve`` says it)."""
        try:
            self._read_queued()
        except OSError as exc:
            log.debug("egress sniffer: nothing read at an exec's end: %s", exc)

    def _read_queued(self) -> None:
        """Read and hand on at most ``MAX_DRAINED`` packets, with no checkpoint between."""
        for _ in range(MAX_DRAINED):
            try:
                packet, address = self._socket.recvfrom(65536)
            except BlockingIOError:
                return
            if isinstance(address, tuple) and len(address) > 2 and address[2] == PACKET_OUTGOING:
                continue  # what the egress side sent (the filter drops it too)
            seen = parse_packet(packet)
            if seen is not None and seen.query not in self._own:
                self._seen(seen)

    def close(self) -> None:
        """Close the socket (a task waiting on it is woken: trio's rule for closing)."""
        if self._socket.fileno() != -1:
            trio.lowlevel.notify_closing(self._socket)
            self._socket.close()
