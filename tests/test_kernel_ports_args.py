"""The kernel path's checks that need no privilege (sandbox/kernel_ports.py, sandbox/nftables.py):
the proof a caller holds its port, the op's arguments, the link addresses, and the reading of
a rule's counter.  The path itself, on the real kernel, is vm-tests/test_kernel_ports.py's."""

from __future__ import annotations

import ipaddress
import socket
import struct

import pytest

from sandbox import kernel_ports, nftables
from sandbox.errors import CcwError, ProtocolError
from sandbox.netlink import attr, nested
from sandbox.ops import NetForwardRequest, attach_descriptors, parse_request


def _listener(family: int = socket.AF_INET, host: str = "127.0.0.1", listen: bool = True,
              kind: int = socket.SOCK_STREAM) -> socket.socket:
    sock = socket.socket(family, kind)
    sock.bind((host, 0))
    if listen and kind == socket.SOCK_STREAM:
        sock.listen()
    return sock


def test_the_port_is_read_from_a_loopback_listener_and_nothing_else_proves_it() -> None:
    with _listener() as held:
        assert kernel_ports.held_port(held.fileno()) == held.getsockname()[1]
    for sock in (_listener(listen=False), _listener(host="0.0.0.0"), _listener(kind=socket.SOCK_DGRAM),
                 _listener(socket.AF_INET6, "::1")):
        with sock, pytest.raises(CcwError) as refused:
            kernel_ports.held_port(sock.fileno())
        assert refused.value.code == "INVALID_ARGUMENT" and "listening TCP socket on 127.0.0.1" in refused.value.message
    with open("/dev/null") as not_a_socket, pytest.raises((CcwError, OSError)):
        kernel_ports.held_port(not_a_socket.fileno())


def test_open_carries_one_descriptor_and_the_others_none() -> None:
    args = {"capsule_id": "cap_1", "port": 8000, "host_port": 40000}
    opening = parse_request("net_forward", {**args, "action": "open"})
    assert opening.descriptors_wanted() == 1 and opening.to_args() == {**args, "action": "open"}
    with _listener() as held:
        fd = held.fileno()
        request = NetForwardRequest("cap_1", 8000, 40000, "open", listener=fd)
        assert request.descriptors() == [fd] and "listener" not in request.to_args()
    for action in ("close", "count"):
        request = parse_request("net_forward", {**args, "action": action})
        assert request.descriptors_wanted() == 0
    with pytest.raises(CcwError) as refused:  # a descriptor nobody asked for is closed and refused
        attach_descriptors(parse_request("net_forward", {**args, "action": "count"}), [socket.socket().detach()])
    assert refused.value.code == "INVALID_ARGUMENT"
    for bad in ({**args, "action": "flush"}, {**args, "action": "open", "host_port": 0},
                {**args, "action": "open", "uid": 0}):
        with pytest.raises(ProtocolError):
            parse_request("net_forward", bad)


def test_each_link_is_its_own_slash_30_away_from_where_clouds_answer() -> None:
    seen = set()
    for index in range(kernel_ports.MAX_LINKS):
        host, capsule = (ipaddress.ip_address(a) for a in kernel_ports.addresses(index))
        net = ipaddress.ip_network(f"{host}/30", strict=False)
        assert capsule == host + 1 and host == net.network_address + 1 and net not in seen
        assert net.subnet_of(ipaddress.ip_network("169.254.128.0/22"))
        assert ipaddress.ip_address("169.254.169.254") not in net
        seen.add(net)


def test_a_rules_counter_is_read_from_its_dump() -> None:
    counter = nested(nftables.NFTA_LIST_ELEM, attr(nftables.NFTA_EXPR_NAME, b"counter\0"), nested(
        nftables.NFTA_EXPR_DATA, attr(nftables.NFTA_COUNTER_BYTES, struct.pack(">Q", 9000)),
        attr(nftables.NFTA_COUNTER_PACKETS, struct.pack(">Q", 7))))
    other = nested(nftables.NFTA_LIST_ELEM, attr(nftables.NFTA_EXPR_NAME, b"meta\0"),
                   nested(nftables.NFTA_EXPR_DATA, attr(1, b"\0\0\0\1")))
    rule = attr(nftables.NFTA_RULE_TABLE, b"t\0") + nested(nftables.NFTA_RULE_EXPRESSIONS, other, counter)
    assert nftables._counted(rule) == 7
    assert nftables._counted(attr(nftables.NFTA_RULE_TABLE, b"t\0")) == 0


def test_an_interface_name_is_compared_as_ifnamsiz_bytes() -> None:
    assert nftables.ifname("ccwp12") == b"ccwp12" + b"\0" * 10
    with pytest.raises(ValueError):
        nftables.ifname("x" * 16)
