"""The sniffer's packet parser: IPv4/IPv6, TCP SYN and UDP, extension headers, garbage."""

from __future__ import annotations

import socket
import struct

from hypothesis import given
from hypothesis import strategies as st

from mcp_server.egress.sniff import DirectAttempt, parse_packet


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
