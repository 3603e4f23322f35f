"""Reading the host's space: the RTM_GETADDR parser on made-up messages, resolv.conf, the reader."""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from pathlib import Path

import pytest

from mcp_server.egress.hostspace import (
    IFA_ADDRESS,
    IFA_BROADCAST,
    IFA_LOCAL,
    NLMSG_DONE,
    NLMSG_ERROR,
    RTM_NEWADDR,
    HostSpaceReader,
    dump_addresses,
    parse_addresses,
    parse_resolv_conf,
)


def _attr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


def _message(kind: int, body: bytes) -> bytes:
    data = struct.pack("=IHHII", 16 + len(body), kind, 2, 1, 0) + body
    return data + b"\0" * (-len(data) % 4)


def _address(family: int, *attrs: bytes) -> bytes:
    return _message(RTM_NEWADDR, struct.pack("=BBBBI", family, 24, 0, 0, 2) + b"".join(attrs))


def _packed(text: str) -> bytes:
    return ipaddress.ip_address(text).packed


def test_parse_addresses_takes_local_over_the_peer_and_the_broadcast() -> None:
    data = b"".join([
        _address(socket.AF_INET, _attr(IFA_ADDRESS, _packed("192.0.2.2")), _attr(IFA_LOCAL, _packed("192.0.2.2")),
                 _attr(IFA_BROADCAST, _packed("192.0.2.255")), _attr(3, b"eth0\0")),
        # point to point: IFA_ADDRESS is the peer, IFA_LOCAL this host's
        _address(socket.AF_INET, _attr(IFA_ADDRESS, _packed("10.8.0.1")), _attr(IFA_LOCAL, _packed("10.8.0.2"))),
        _address(socket.AF_INET6, _attr(IFA_ADDRESS, _packed("2001:2::1"))),
        _message(RTM_NEWADDR, b"\x02"),  # too short: skipped
        _address(socket.AF_INET, _attr(IFA_ADDRESS, b"\x01\x02")),  # not an address: skipped
    ])
    addresses, broadcasts, done = parse_addresses(data)
    assert addresses == set(map(ipaddress.ip_address, ("192.0.2.2", "10.8.0.2", "2001:2::1")))
    assert broadcasts == {ipaddress.ip_address("192.0.2.255")} and done is False
    assert parse_addresses(data + _message(NLMSG_DONE, struct.pack("=i", 0)))[2] is True


def test_parse_addresses_raises_the_kernels_error() -> None:
    with pytest.raises(OSError) as caught:
        parse_addresses(_message(NLMSG_ERROR, struct.pack("=i", -13) + b"\0" * 16))
    assert caught.value.errno == 13


def test_parse_resolv_conf() -> None:
    text = ("# generated\nsearch example\nnameserver 10.255.255.53\nnameserver fe80::1%eth0\n"
            "nameserver not-an-address\n  nameserver   2001:db8::53  # trailing\n;nameserver 1.1.1.1\noptions ndots:1\n")
    assert parse_resolv_conf(text) == frozenset(map(ipaddress.ip_address, ("10.255.255.53", "fe80::1", "2001:db8::53")))


def test_the_reader_sees_this_hosts_loopback_and_follows_resolv_conf(tmp_path: Path) -> None:
    conf = tmp_path / "resolv.conf"
    reader = HostSpaceReader(conf)
    try:
        first = reader.current()
        assert ipaddress.ip_address("127.0.0.1") in first.addresses
        assert first.addresses == dump_addresses()[0]
        assert first.resolvers == frozenset()  # no file: glibc asks 127.0.0.1, loopback anyway
        conf.write_text("nameserver 198.18.0.53\n")
        assert reader.current().resolvers == {ipaddress.ip_address("198.18.0.53")}
        replacement = tmp_path / "resolv.new"  # replaced by rename, as resolvconf does
        replacement.write_text("nameserver 198.18.0.54\n")
        os.rename(replacement, conf)
        assert reader.current().resolvers == {ipaddress.ip_address("198.18.0.54")}
    finally:
        reader.close()
