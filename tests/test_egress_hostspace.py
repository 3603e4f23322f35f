"""Reading the host's space: the RTM_GETADDR, RTM_GETROUTE and RTM_GETRULE parsers on made-up
messages, which local routes count, resolv.conf, the reader."""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from pathlib import Path

import pytest

from mcp_server.core.netspace import LocalRoute
from mcp_server.egress.hostspace import (
    FIB_RULE_INVERT,
    FR_ACT_TO_TBL,
    FRA_DST,
    FRA_FWMARK,
    FRA_FWMASK,
    FRA_IIFNAME,
    FRA_IP_PROTO,
    FRA_L3MDEV,
    FRA_OIFNAME,
    FRA_PRIORITY,
    FRA_PROTOCOL,
    FRA_SRC,
    FRA_SUPPRESS_PREFIXLEN,
    FRA_TABLE,
    FRA_TUN_ID,
    FRA_UID_RANGE,
    IFA_ADDRESS,
    IFA_BROADCAST,
    IFA_LOCAL,
    NLMSG_DONE,
    NLMSG_ERROR,
    RTA_DST,
    RTA_TABLE,
    RTM_NEWADDR,
    RTM_NEWLINK,
    RTM_NEWROUTE,
    RTM_NEWRULE,
    RTN_LOCAL,
    HostSpaceReader,
    PolicyRule,
    dump_addresses,
    dump_local_routes,
    local_ranges,
    parse_addresses,
    parse_local_routes,
    parse_resolv_conf,
    parse_rules,
    tells_of_change,
)

# <linux/rtnetlink.h>, <linux/fib_rules.h>: what the module has no use for
RTN_UNICAST, RTN_BROADCAST, RTNL_FAMILY_IPMR, FR_ACT_GOTO, RTM_DELLINK, FRA_DPORT_RANGE = 1, 3, 128, 2, 17, 24
UID = 1000


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
    with pytest.raises(OSError) as caught:  # a dump that failed part way ends with the error in its DONE
        parse_local_routes(_message(NLMSG_DONE, struct.pack("=i", -16)))
    assert caught.value.errno == 16


def _route(family: int, dst: str | None, dst_len: int, table: int, kind: int = RTN_LOCAL, *attrs: bytes) -> bytes:
    body = struct.pack("=BBBBBBBBI", family, dst_len, 0, 0, table, 2, 254, kind, 0)
    return _message(RTM_NEWROUTE, body + (b"" if dst is None else _attr(RTA_DST, _packed(dst))) + b"".join(attrs))


def test_parse_local_routes_keeps_the_local_ones_with_their_table() -> None:
    data = b"".join([
        _route(socket.AF_INET, "198.51.100.0", 24, 255),
        _route(socket.AF_INET, "127.0.0.1", 32, 255),
        _route(socket.AF_INET, "203.0.113.0", 24, 252, RTN_LOCAL, _attr(RTA_TABLE, struct.pack("=I", 1000))),
        _route(socket.AF_INET, None, 0, 100),  # local 0.0.0.0/0 has no RTA_DST
        _route(socket.AF_INET6, "2001:db8:1::", 64, 255),
        _route(socket.AF_INET6, None, 0, 254),
        _route(socket.AF_INET, "10.0.0.0", 8, 254, RTN_UNICAST),  # not local
        _route(socket.AF_INET, "198.18.0.255", 32, 255, RTN_BROADCAST),
        _route(socket.AF_INET, "198.51.100.7", 24, 255),  # host bits set: the kernel never sends that, cleared
        _route(socket.AF_INET, "192.0.2.0", 40, 255),  # a prefix longer than the address: skipped
        _route(RTNL_FAMILY_IPMR, None, 0, 255),  # another family: skipped
        _message(RTM_NEWROUTE, b"\x02\x18"),  # too short: skipped
    ])
    routes, done = parse_local_routes(data)
    assert done is False and routes == [
        (socket.AF_INET, LocalRoute(ipaddress.ip_network("198.51.100.0/24"), 255)),
        (socket.AF_INET, LocalRoute(ipaddress.ip_network("127.0.0.1/32"), 255)),
        (socket.AF_INET, LocalRoute(ipaddress.ip_network("203.0.113.0/24"), 1000)),
        (socket.AF_INET, LocalRoute(ipaddress.ip_network("0.0.0.0/0"), 100)),
        (socket.AF_INET6, LocalRoute(ipaddress.ip_network("2001:db8:1::/64"), 255)),
        (socket.AF_INET6, LocalRoute(ipaddress.ip_network("::/0"), 254)),
        (socket.AF_INET, LocalRoute(ipaddress.ip_network("198.51.100.0/24"), 255)),
    ]
    assert parse_local_routes(data + _message(NLMSG_DONE, struct.pack("=i", 0)))[1] is True


def _rule(*attrs: bytes, family: int = socket.AF_INET, table: int = 100, action: int = FR_ACT_TO_TBL,
          flags: int = 0, dst_len: int = 0, src_len: int = 0, tos: int = 0) -> bytes:
    body = struct.pack("=BBBBBBBBI", family, dst_len, src_len, tos, table, 0, 0, action, flags)
    return _message(RTM_NEWRULE, body + _attr(FRA_PRIORITY, struct.pack("=I", 100))
                    + _attr(FRA_PROTOCOL, b"\x04") + b"".join(attrs))


def _u32(kind: int, value: int) -> bytes:
    return _attr(kind, struct.pack("=I", value))


@pytest.mark.parametrize(
    ("rule", "reached"),
    [
        (_rule(), True),  # from all lookup 100
        (_rule(_u32(FRA_FWMARK, 1)), False),  # fwmark 1: TPROXY's, Istio's, Cilium's
        (_rule(_u32(FRA_FWMARK, 0x200), _u32(FRA_FWMASK, 0xF00)), False),
        (_rule(_u32(FRA_FWMASK, 0xFF)), True),  # fwmark 0/0xff: unmarked packets
        (_rule(_u32(FRA_FWMARK, 1), flags=FIB_RULE_INVERT), True),  # not fwmark 1
        (_rule(flags=FIB_RULE_INVERT), False),  # not from all
        (_rule(_attr(FRA_IIFNAME, b"lo\0")), True),  # what the host sends
        (_rule(_attr(FRA_IIFNAME, b"eth0\0")), False),  # what arrives on eth0
        (_rule(_attr(FRA_IIFNAME, b"eth0\0"), flags=FIB_RULE_INVERT), True),
        (_rule(_attr(FRA_OIFNAME, b"wg0\0")), False),
        (_rule(_attr(FRA_L3MDEV, b"\x01")), False),
        (_rule(_attr(FRA_UID_RANGE, struct.pack("=II", 1000, 1999))), True),
        (_rule(_attr(FRA_UID_RANGE, struct.pack("=II", 0, 999))), False),
        (_rule(_attr(FRA_IP_PROTO, b"\x06")), True),
        (_rule(_attr(FRA_IP_PROTO, b"\x11")), False),  # ipproto udp
        (_rule(_attr(FRA_IP_PROTO, b"\x06"), _attr(FRA_DPORT_RANGE, struct.pack("=HH", 443, 443))), True),
        (_rule(_attr(FRA_DPORT_RANGE, struct.pack("=HH", 443, 443)), flags=FIB_RULE_INVERT), True),  # depends
        (_rule(_attr(FRA_TUN_ID, struct.pack(">Q", 7))), False),
        (_rule(tos=0x10), False),
        (_rule(_attr(FRA_SRC, _packed("10.0.0.0")), src_len=8), True),  # the source is not known yet
        (_rule(_attr(FRA_SRC, _packed("10.0.0.0")), src_len=8, flags=FIB_RULE_INVERT), True),
        (_rule(_attr(40, b"\x01")), True),  # a selector newer than this module: it may match
        (_rule(_attr(40, b"\x01"), _u32(FRA_FWMARK, 1)), False),
        (_rule(_attr(40, b"\x01"), _u32(FRA_FWMARK, 1), flags=FIB_RULE_INVERT), True),
    ],
)
def test_a_rule_is_judged_against_the_proxys_connections(rule: bytes, reached: bool) -> None:
    (judged,), done = parse_rules(rule, UID)
    assert judged.reached is reached and judged.table == 100 and done is False


def test_parse_rules_reads_the_table_the_prefix_and_the_suppression() -> None:
    data = b"".join([
        _rule(_u32(FRA_TABLE, 1000), table=252),
        _rule(_attr(FRA_DST, _packed("198.51.100.0")), dst_len=25),
        _rule(_attr(FRA_DST, _packed("198.51.100.0")), dst_len=25, flags=FIB_RULE_INVERT),  # outside it: any
        _rule(_u32(FRA_SUPPRESS_PREFIXLEN, 0), table=254),
        _rule(family=socket.AF_INET6, table=255),
        _rule(action=FR_ACT_GOTO, table=0),
        _rule(family=RTNL_FAMILY_IPMR, table=255),  # multicast routing's: skipped
    ])
    rules, _ = parse_rules(data, UID)
    four = socket.AF_INET
    assert rules == [
        PolicyRule(four, 1000, True),
        PolicyRule(four, 100, True, ipaddress.ip_network("198.51.100.0/25")),
        PolicyRule(four, 100, True),
        PolicyRule(four, 254, True, None, 0),
        PolicyRule(socket.AF_INET6, 255, True),
        PolicyRule(four, 0, True),
    ]


def _net(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    return ipaddress.ip_network(text)


def test_local_ranges_count_the_tables_the_proxys_connections_can_reach() -> None:
    four, six = socket.AF_INET, socket.AF_INET6
    routes = [
        (four, LocalRoute(_net("127.0.0.0/8"), 255)),
        (four, LocalRoute(_net("198.51.100.0/24"), 255)),
        (four, LocalRoute(_net("0.0.0.0/0"), 100)),  # TPROXY's table, behind fwmark 1
        (four, LocalRoute(_net("0.0.0.0/0"), 101)),  # behind a rule for some destinations only
        (four, LocalRoute(_net("203.0.113.0/24"), 102)),  # the rule's prefix is longer: the rule's
        (four, LocalRoute(_net("192.0.2.0/26"), 102)),  # outside the rule's prefix: never looked up for it
        (four, LocalRoute(_net("192.0.2.0/24"), 254)),  # main, behind suppress_prefixlength 24
        (four, LocalRoute(_net("192.0.2.0/25"), 254)),
        (six, LocalRoute(_net("2001:db8::/64"), 255)),  # IPv6 has no rules here: every table counts
        (six, LocalRoute(_net("2001:db8:1::/64"), 7)),
    ]
    rules = [
        PolicyRule(four, 255, True),
        PolicyRule(four, 100, False),
        PolicyRule(four, 101, True, _net("198.18.0.0/15")),
        PolicyRule(four, 102, True, _net("203.0.113.0/25")),
        PolicyRule(four, 254, True, None, 24),
    ]
    assert local_ranges(routes, rules).routes == {
        LocalRoute(_net("127.0.0.0/8"), 255), LocalRoute(_net("198.51.100.0/24"), 255),
        LocalRoute(_net("198.18.0.0/15"), 101), LocalRoute(_net("203.0.113.0/25"), 102),
        LocalRoute(_net("192.0.2.0/25"), 254),
        LocalRoute(_net("2001:db8::/64"), 255), LocalRoute(_net("2001:db8:1::/64"), 7),
    }
    # No rules could be read (a kernel without policy routing): every table counts.
    assert local_ranges(routes, None).routes == {route for _, route in routes}


def test_a_links_news_is_no_change_but_its_deletion_is() -> None:
    link = _message(RTM_NEWLINK, b"\0" * 16)
    assert tells_of_change(link) is False
    assert tells_of_change(link + link) is False
    assert tells_of_change(link + _message(RTM_DELLINK, b"\0" * 16)) is True
    assert tells_of_change(_route(socket.AF_INET, "198.51.100.0", 24, 255)) is True
    assert tells_of_change(_address(socket.AF_INET, _attr(IFA_ADDRESS, _packed("192.0.2.2")))) is True


def test_parse_resolv_conf() -> None:
    text = ("# generated\nsearch example\nnameserver 10.255.255.53\nnameserver fe80::1%eth0\n"
            "nameserver not-an-address\n  nameserver   2001:db8::53  # trailing\n"
            ";nameserver 1.1.1.1\noptions ndots:1\n")
    assert parse_resolv_conf(text) == frozenset(map(ipaddress.ip_address, ("10.255.255.53", "fe80::1", "2001:db8::53")))


def test_the_reader_sees_this_hosts_loopback_and_follows_resolv_conf(tmp_path: Path) -> None:
    conf = tmp_path / "resolv.conf"
    reader = HostSpaceReader(conf)
    try:
        first = reader.current()
        assert ipaddress.ip_address("127.0.0.1") in first.addresses
        assert first.addresses == dump_addresses()[0]
        assert first.local_routes == dump_local_routes(os.geteuid())
        assert first.local_routes.find(ipaddress.ip_address("127.0.0.2")) == LocalRoute(
            ipaddress.ip_network("127.0.0.0/8"), 255)  # the kernel's own, in table local
        assert first.resolvers == frozenset()  # no file: glibc asks 127.0.0.1, loopback anyway
        conf.write_text("nameserver 198.18.0.53\n")
        assert reader.current().resolvers == {ipaddress.ip_address("198.18.0.53")}
        replacement = tmp_path / "resolv.new"  # replaced by rename, as resolvconf does
        replacement.write_text("nameserver 198.18.0.54\n")
        os.rename(replacement, conf)
        assert reader.current().resolvers == {ipaddress.ip_address("198.18.0.54")}
    finally:
        reader.close()
