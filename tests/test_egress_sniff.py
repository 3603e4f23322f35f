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


def udp(port: int) -> bytes:
    return struct.pack("!HHHH", 5353, port, 8, 0)


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
        seen = parse_packet(v4("10.99.0.2", "10.255.255.53", 17, udp(port) + payload))
        assert seen is not None
        return seen.query

    assert asked(dns_query(b"CCW.corp.example")) == b"ccw.corp.example"
    assert parse_packet(v6("fd63:6377::2", "2001:db8::53", 17, udp(53) + dns_query(b"ccw"))) == DirectAttempt(
        "udp", "2001:db8::53", 53, "fd63:6377::2", b"ccw")
    assert asked(dns_query(b"ccw"), port=5353) is None  # not DNS's port
    assert asked(dns_query(b"ccw", flags=0x8180)) is None  # an answer, not a query
    assert asked(dns_query(b"ccw", flags=0x2900)) is None  # an UPDATE
    assert asked(dns_query(b"ccw", count=2)) is None
    assert asked(dns_query(b"ccw")[:14]) is None  # the name cut (by the sniffer's snap length)
    assert asked(dns_query(b"ccw")[:12] + b"\xc0\x0c") is None  # a compression pointer
    assert asked(b"\0" * 12 + b"\0") is None  # the root: no name


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
    sent = [v4("10.99.0.2", "10.255.255.53", 17, udp(53) + dns_query(name))
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
