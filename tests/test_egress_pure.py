"""The pure parts of a capsule's egress: the sniffer's cBPF program, the proxy env, the wire.

The program is run here by a small classic-BPF interpreter over packets built by hand
(network header first, as a SOCK_DGRAM packet socket sees them), so what it keeps is
checked without a kernel; vm-tests/test_egress_kernel.py checks it on the real one.
"""

from __future__ import annotations

import ipaddress
import struct
from typing import Any

import pytest

from sandbox import egress, netlink
from sandbox.errors import ProtocolError
from sandbox.ops import NetOpenRequest, parse_request
from sandbox.replies import NetOpenReply

ETH_P_IP, ETH_P_IPV6 = 0x0800, 0x86DD
PACKET_HOST, PACKET_OUTGOING = 0, 4
SYN, ACK, RST = 0x02, 0x10, 0x04


def run_cbpf(program: list[egress.Instruction], packet: bytes, protocol: int, pkttype: int) -> int:
    """Classic BPF, just the instructions the sniffer uses; returns the bytes kept (0: dropped)."""
    a = x = 0
    pc = 0
    ancillary = {egress._ancillary(egress._SKF_AD_PROTOCOL): protocol,
                 egress._ancillary(egress._SKF_AD_PKTTYPE): pkttype}
    while True:
        code, jt, jf, k = program[pc]
        pc += 1
        if code == egress._LD_W_ABS:
            a = ancillary[k] if k in ancillary else struct.unpack_from("!I", packet, k)[0]
        elif code == egress._LD_H_ABS:
            a = struct.unpack_from("!H", packet, k)[0]
        elif code == egress._LD_B_ABS:
            a = packet[k]
        elif code == egress._LD_B_IND:
            a = packet[x + k]
        elif code == egress._LDX_B_MSH:
            x = 4 * (packet[k] & 0x0F)
        elif code == egress._ALU_AND_K:
            a &= k
        elif code == egress._JMP_JA:
            pc += k
        elif code == egress._JMP_JEQ_K:
            pc += jt if a == k else jf
        elif code == egress._JMP_JSET_K:
            pc += jt if a & k else jf
        elif code == egress._RET_K:
            return k
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")


def ipv4(protocol: int, transport: bytes, options: bytes = b"", fragment: int = 0) -> bytes:
    ihl = 5 + len(options) // 4
    header = struct.pack("!BBHHHBBH4s4s", 0x40 | ihl, 0, 4 * ihl + len(transport), 1, fragment, 64, protocol, 0,
                         ipaddress.IPv4Address("10.99.0.2").packed, ipaddress.IPv4Address("192.0.2.1").packed)
    return header + options + transport


def ipv6(next_header: int, transport: bytes) -> bytes:
    return struct.pack("!IHBB16s16s", 6 << 28, len(transport), next_header, 64,
                       ipaddress.IPv6Address("fd63:6377::2").packed,
                       ipaddress.IPv6Address("2001:db8::1").packed) + transport


def tcp(flags: int, port: int = 80) -> bytes:
    return struct.pack("!HHIIBBHHH", 40000, port, 1, 0, 5 << 4, flags, 65535, 0, 0)


UDP = struct.pack("!HHHH", 40000, 53, 8, 0)
ICMP = bytes([8, 0, 0, 0, 0, 1, 0, 1])


@pytest.mark.parametrize(("packet", "protocol", "kept"), [
    (ipv4(6, tcp(SYN)), ETH_P_IP, True),
    (ipv4(6, tcp(SYN), options=b"\x01" * 8), ETH_P_IP, True),  # flags found past IP options
    (ipv4(17, UDP), ETH_P_IP, True),
    (ipv6(6, tcp(SYN)), ETH_P_IPV6, True),
    (ipv6(17, UDP), ETH_P_IPV6, True),
    (ipv4(6, tcp(SYN | ACK)), ETH_P_IP, False),
    (ipv4(6, tcp(ACK)), ETH_P_IP, False),
    (ipv4(6, tcp(RST | ACK)), ETH_P_IP, False),
    (ipv6(6, tcp(ACK)), ETH_P_IPV6, False),
    (ipv4(1, ICMP), ETH_P_IP, False),
    (ipv6(58, ICMP), ETH_P_IPV6, False),
    (ipv4(17, UDP, fragment=0x0010), ETH_P_IP, False),  # a later fragment: no ports in it
    (b"\0" * 28, 0x0806, False),  # ARP
])
def test_sniffer_keeps_flow_openings_from_the_jail(packet: bytes, protocol: int, kept: bool) -> None:
    program = egress.sniffer_program()
    assert run_cbpf(program, packet, protocol, PACKET_HOST) == (egress.SNAP_BYTES if kept else 0)
    assert run_cbpf(program, packet, protocol, PACKET_OUTGOING) == 0  # the kernel's own replies


def test_sniffer_program_shape() -> None:
    program = egress.sniffer_program()
    assert len(program) < 64 and program[-1] == (egress._RET_K, 0, 0, 0)
    for at, (code, jt, jf, k) in enumerate(program):
        assert 0 <= jt < 256 and 0 <= jf < 256 and 0 <= k < 1 << 32
        targets = [at + 1 + k] if code == egress._JMP_JA else [at + 1 + jt, at + 1 + jf] if code & 0x07 == 0x05 else []
        assert all(at < target < len(program) for target in targets), (at, code)  # forward only, in range
        if code == egress._RET_K:
            assert k in (0, egress.SNAP_BYTES)


def test_proxy_env_fills_only_what_the_caller_left_unset() -> None:
    env = egress.proxy_env({"PATH": "/bin", "https_proxy": "http://mine:1"})
    assert env["PATH"] == "/bin" and env["https_proxy"] == "http://mine:1"
    assert env["HTTP_PROXY"] == env["http_proxy"] == env["HTTPS_PROXY"] == "http://10.99.0.1:3128"
    assert env["ALL_PROXY"] == env["all_proxy"] == "socks5h://10.99.0.1:1080"
    assert env["NO_PROXY"] == env["no_proxy"] == "localhost,127.0.0.1,::1"
    assert set(egress.PROXY_ENV) == {"HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY",
                                     "all_proxy", "NO_PROXY", "no_proxy"}


GOOD_REPLY: dict[str, Any] = {"http_proxy": "10.99.0.1:3128", "socks_proxy": "10.99.0.1:1080",
                              "jail_addresses": ["10.99.0.2", "fd63:6377::2"], "env": {"HTTP_PROXY": "x"},
                              "mechanism": "egress: one line"}


def test_net_open_request_and_reply_on_the_wire() -> None:
    request = parse_request("net_open", {"capsule_id": "cap_1"})
    assert request == NetOpenRequest("cap_1") and request.to_args() == {"capsule_id": "cap_1"}
    for bad in ({}, {"capsule_id": "x"}, {"capsule_id": "cap_1", "network": "egress"}):
        with pytest.raises(ProtocolError):
            parse_request("net_open", bad)
    reply = NetOpenReply.from_args(GOOD_REPLY)
    assert reply.jail_addresses == ("10.99.0.2", "fd63:6377::2") and reply.to_args() == GOOD_REPLY
    for key, value in (("jail_addresses", "10.99.0.2"), ("jail_addresses", [1]), ("env", {"A": 1}), ("env", []),
                       ("mechanism", None), ("http_proxy", 3128)):
        with pytest.raises(ProtocolError):
            NetOpenReply.from_args({**GOOD_REPLY, key: value})
    with pytest.raises(ProtocolError):
        NetOpenReply.from_args({**GOOD_REPLY, "capsule_id": "cap_1"})


def test_netlink_attributes_are_padded_and_nested() -> None:
    assert netlink.attr(3, b"eth0\0") == struct.pack("=HH", 9, 3) + b"eth0\0" + b"\0\0\0"
    assert netlink.attr(28, netlink.u32(7)) == struct.pack("=HHI", 8, 28, 7)
    inner = netlink.attr(1, b"veth")
    assert netlink.nested(18, inner) == struct.pack("=HH", 4 + len(inner), 18 | netlink.NLA_F_NESTED) + inner
