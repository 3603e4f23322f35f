"""The sniffer's packet parser: IPv4/IPv6, TCP SYN and UDP, extension headers, garbage; DNS
queries for the jail's own hostname, left out."""

from __future__ import annotations

import dataclasses
import socket
import struct
from pathlib import Path

import trio
from hypothesis import given
from hypothesis import strategies as st

from mcp_server.egress.sniff import JAIL_HOSTNAME, DirectAttempt, Sniffer, own_names, parse_packet
from sandbox.contain import JailSpec


def tcp(port: int, flags: int) -> bytes:
    return struct.pack("!HHIIBBHHH", 40000, port, 1, 0, 5 << 4, flags, 65535, 0, 0)


def udp(port: int, payload: bytes = b"", *, length: int | None = None) -> bytes:
    return struct.pack("!HHHH", 5353, port, 8 + len(payload) if length is None else length, 0) + payload


def v4(src: str, dst: str, protocol: int, payload: bytes, *, ihl: int = 5, fragment: int = 0) -> bytes:
    options = b"\x01" * ((ihl - 5) * 4)
    header = struct.pack("!BBHHHBBH4s4s", 0x40 | ihl, 0, 20 + len(options) + len(payload), 0, fragment,
                         64, protocol, 0, socket.inet_aton(src), socket.inet_aton(dst))
    return header + options + payload


def v6(src: str, dst: str, next_header: int, payload: bytes) -> bytes:
    return struct.pack("!IHBB16s16s", 6 << 28, len(payload), next_header, 64,
                       socket.inet_pton(socket.AF_INET6, src), socket.inet_pton(socket.AF_INET6, dst)) + payload


def test_tcp_syn_v4() -> None:
    packet = v4("10.99.0.2", "93.184.216.34", 6, tcp(443, 0x02))
    assert parse_packet(packet) == DirectAttempt("tcp", "93.184.216.34", 443, "10.99.0.2")
    assert parse_packet(v4("10.99.0.2", "1.1.1.1", 6, tcp(443, 0x02), ihl=7)) == DirectAttempt(
        "tcp", "1.1.1.1", 443, "10.99.0.2")


def test_non_syn_segments_are_ignored() -> None:
    for flags in (0x12, 0x10, 0x04, 0x11, 0x00):
        assert parse_packet(v4("10.99.0.2", "1.1.1.1", 6, tcp(443, flags))) is None


def test_udp_v4_and_v6() -> None:
    assert parse_packet(v4("10.99.0.2", "8.8.8.8", 17, udp(53))) == DirectAttempt("udp", "8.8.8.8", 53, "10.99.0.2")
    assert parse_packet(v6("fd63:6377::2", "2001:db8::53", 17, udp(53))) == DirectAttempt(
        "udp", "2001:db8::53", 53, "fd63:6377::2")


def test_v6_extension_headers_are_walked() -> None:
    hop_by_hop = bytes([60, 0]) + b"\x00" * 6  # next: destination options, 8 bytes
    destination = bytes([44, 0]) + b"\x00" * 6  # next: fragment
    first_fragment = bytes([6, 0]) + struct.pack("!HI", 0x0001, 7)  # offset 0, more fragments
    packet = v6("fd63:6377::2", "2001:db8::1", 0, hop_by_hop + destination + first_fragment + tcp(22, 0x02))
    assert parse_packet(packet) == DirectAttempt("tcp", "2001:db8::1", 22, "fd63:6377::2")
    later_fragment = bytes([6, 0]) + struct.pack("!HI", 0x0008, 7)  # offset 1: no ports here
    assert parse_packet(v6("fd63:6377::2", "2001:db8::1", 44, later_fragment + tcp(22, 0x02))) is None


def test_other_protocols_fragments_and_truncation() -> None:
    assert parse_packet(v4("10.99.0.2", "1.1.1.1", 1, b"\x08\x00" + b"\x00" * 6)) is None  # ICMP
    assert parse_packet(v4("10.99.0.2", "1.1.1.1", 17, udp(53), fragment=0x0010)) is None
    assert parse_packet(v6("fd63:6377::2", "2001:db8::1", 58, b"\x80\x00" + b"\x00" * 6)) is None  # ICMPv6
    whole = v4("10.99.0.2", "1.1.1.1", 6, tcp(443, 0x02))
    for cut in range(len(whole) - 6):
        assert parse_packet(whole[:cut]) is None, cut
    assert parse_packet(b"") is None
    assert parse_packet(b"\x55" * 60) is None  # IP version 5


@given(st.binary(max_size=120))
def test_any_bytes_parse_or_are_ignored(data: bytes) -> None:
    result = parse_packet(data)
    assert result is None or (result.protocol in ("tcp", "udp") and 0 <= result.port <= 65535)


@given(st.binary(min_size=1, max_size=80), st.sampled_from([0x45, 0x46, 0x4F, 0x60]))
def test_any_bytes_after_a_version_nibble(data: bytes, first: int) -> None:
    parse_packet(bytes([first]) + data)


def dns_query(name: bytes, flags: int = 0x0100, count: int = 1) -> bytes:
    """A DNS query for ``name`` (A, IN), as a resolver sends it: recursion desired."""
    labels = b"".join(bytes([len(label)]) + label for label in name.split(b".")) + b"\0"
    return struct.pack("!HHHHHH", 0x1234, flags, count, 0, 0, 0) + labels + struct.pack("!HH", 1, 1)


def test_a_dns_query_carries_its_one_name() -> None:
    def asked(payload: bytes, port: int = 53) -> bytes | None:
        seen = parse_packet(v4("10.99.0.2", "10.255.255.53", 17, udp(port, payload)))
        assert seen is not None
        return seen.query

    assert asked(dns_query(b"CCW.corp.example")) == b"ccw.corp.example"
    assert parse_packet(v6("fd63:6377::2", "2001:db8::53", 17, udp(53, dns_query(b"ccw")))) == DirectAttempt(
        "udp", "2001:db8::53", 53, "fd63:6377::2", b"ccw")
    assert asked(dns_query(b"ccw"), port=5353) is None  # not DNS's port
    assert asked(dns_query(b"ccw", flags=0x8180)) is None  # an answer, not a query
    assert asked(dns_query(b"ccw", flags=0x2900)) is None  # an UPDATE
    assert asked(dns_query(b"ccw", count=2)) is None
    assert asked(dns_query(b"ccw")[:14]) is None  # the name cut (by the sniffer's snap length)
    assert asked(dns_query(b"ccw")[:12] + b"\xc0\x0c") is None  # a compression pointer
    assert asked(b"\0" * 12 + b"\0") is None  # the root: no name


def asked_of(datagram: bytes) -> bytes | None:
    seen = parse_packet(v4("10.99.0.2", "10.255.255.53", 17, datagram))
    assert seen is not None
    return seen.query


OPT = b"\0" + struct.pack("!HHIH", 41, 1232, 0, 0)  # glibc's ``options edns0``: the root's OPT, no data


def test_only_a_bare_lookup_carries_its_name() -> None:
    """A datagram to port 53 that starts as a lookup of ``ccw`` but holds more (any payload
    after the question, beyond the snap length or not) is other traffic under the jail's
    hostname: it is recorded, as is a name whose one label has a dot in it."""
    query = dns_query(b"ccw")
    with_opt = query[:10] + b"\0\1" + query[12:] + OPT
    assert asked_of(udp(53, with_opt)) == b"ccw"
    assert asked_of(udp(53, query + b"exfiltrated bytes")) is None
    assert asked_of(udp(53, query, length=8 + len(query) + 1400)) is None  # the rest past the snap length
    assert asked_of(udp(53, query[:-4])) is None  # no QTYPE and QCLASS: not what a resolver sends
    assert asked_of(udp(53, query[:6] + b"\0\1" + query[8:] + b"\xc0\x0c\0\1\0\1\0\0\0\0\0\0")) is None
    assert asked_of(udp(53, with_opt + b"more")) is None
    assert asked_of(udp(53, query[:10] + b"\0\1" + query[12:] + b"\0\0\x01" + OPT[3:])) is None  # not an OPT
    one_label = query[:12] + b"\x10ccw.corp.example\0" + query[-4:]  # the name ccw\.corp\.example
    assert asked_of(udp(53, one_label)) is None


@given(st.lists(st.tuples(st.integers(0, 80), st.integers(0, 255)), max_size=6),
       st.binary(max_size=40), st.integers(0, 60), st.integers(-4, 40))
def test_mutated_lookups_of_the_hostname_are_left_out_only_when_bare(
        changes: list[tuple[int, int]], tail: bytes, cut: int, length_change: int) -> None:
    """Fuzz: a lookup of ``ccw`` (with and without OPT) with bytes changed, appended, cut off,
    and its UDP length changed never fails to parse, and is left out only if what its UDP
    length holds is exactly a bare lookup of the name."""
    for start in (dns_query(b"ccw"), dns_query(b"ccw")[:10] + b"\0\1" + dns_query(b"ccw")[12:] + OPT):
        message = bytearray(start + tail)
        for at, value in changes:
            if at < len(message):
                message[at] = value
        message = message[:max(12, len(message) - cut)] if cut > 40 else message
        length = 8 + len(message) + length_change
        seen = parse_packet(v4("10.99.0.2", "10.255.255.53", 17, udp(53, bytes(message), length=length & 0xFFFF)))
        assert seen is not None
        if seen.query == b"ccw":
            whole = bytes(message[:length - 8])
            assert len(whole) == length - 8
            assert whole[4:12] in (b"\0\1\0\0\0\0\0\0", b"\0\1\0\0\0\0\0\1")
            assert whole[12:17].lower() == b"\x03ccw\0"
            assert len(whole) == 21 or (whole[21:24] == b"\0\0\x29" and len(whole) == 32 + whole[31] + 256 * whole[30])


def test_own_names_are_the_jails_hostname_under_each_search_domain(tmp_path: Path) -> None:
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("# comment\n\nnameserver 10.0.0.1\nsearch corp.example Lab.example.\ndomain x.example\n")
    assert own_names(resolv) == {b"ccw", b"ccw.corp.example", b"ccw.lab.example", b"ccw.x.example"}
    assert own_names(tmp_path / "missing") == {b"ccw"}
    spec_default = next(f.default for f in dataclasses.fields(JailSpec) if f.name == "hostname")
    assert spec_default == JAIL_HOSTNAME  # what the jail is named, what its lookups ask


def test_the_sniffer_leaves_out_only_lookups_of_the_jails_own_hostname(tmp_path: Path) -> None:
    """A lookup of ``ccw`` was a denied udp record in every allowlist capsule's exec that ran git
    or ``hostname -f``: no attempt at the network, and left out; any other name stays."""
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("search corp.example\n")
    sent = [v4("10.99.0.2", "10.255.255.53", 17, udp(53, dns_query(name)))
            for name in (b"ccw", b"ccw.corp.example", b"ccw.evil.example", b"pypi.org", b"ccw.corp")]
    sent.append(v4("10.99.0.2", "10.255.255.53", 17, udp(53)))  # no query in it
    seen: list[DirectAttempt] = []

    async def main() -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        sniffer = Sniffer(ours.detach(), seen.append, own_names(resolv))
        with theirs:
            for packet in sent:
                theirs.send(packet)
            sniffer.drain()
        sniffer.close()

    trio.run(main)
    assert [attempt.query for attempt in seen] == [b"ccw.evil.example", b"pypi.org", b"ccw.corp", None]
