"""The host's space: which addresses egress refuses after resolution, why, and the exact rule that re-opens one."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_server.core.netrules import NetworkSpec, parse_network, parse_rule
from mcp_server.core.netspace import HostSpace, LocalRoute, LocalRoutes, guarded, refusal


def _local(network: str, table: int = 255) -> LocalRoute:
    return LocalRoute(ipaddress.ip_network(network), table)


HOST = HostSpace(
    addresses=frozenset(map(ipaddress.ip_address, ("127.0.0.1", "::1", "198.18.0.1", "2001:2::1", "192.0.2.2"))),
    broadcasts=frozenset({ipaddress.ip_address("198.18.0.255")}),
    resolvers=frozenset(map(ipaddress.ip_address, ("198.18.0.53", "2001:2::53"))),
    # the kernel's own (loopback, one per address) and AnyIP ranges in space that is otherwise open
    local_routes=LocalRoutes(frozenset({
        _local("127.0.0.0/8"), _local("127.0.0.1/32"), _local("198.18.0.1/32"), _local("::1/128"),
        _local("198.19.77.0/24"), _local("198.19.77.128/25", 100), _local("2001:2:77::/64", 254),
        _local("10.9.0.0/16", 254),
    })),
)


def spec(*rules: str) -> NetworkSpec:
    parsed = parse_network(list(rules))
    assert parsed is not None
    return parsed


@pytest.mark.parametrize(
    ("address", "klass"),
    [
        ("127.0.0.1", "loopback"), ("127.255.0.1", "loopback"), ("::1", "loopback"),
        ("0.0.0.0", "unspecified"), ("0.1.2.3", "unspecified"), ("::", "unspecified"),
        ("169.254.169.254", "link-local"), ("fe80::1", "link-local"),
        ("198.18.0.1", "host address"), ("2001:2::1", "host address"), ("192.0.2.2", "host address"),
        ("198.18.0.255", "broadcast"), ("255.255.255.255", "broadcast"),
        ("198.18.0.53", "resolver"), ("2001:2::53", "resolver"),
        ("198.19.77.7", "local route"), ("198.19.77.200", "local route"), ("2001:2:77::7", "local route"),
        ("2001:2:77:0:ffff::1", "local route"), ("10.9.0.1", "local route"),
        ("10.0.0.1", "private"), ("172.16.0.1", "private"), ("172.31.255.254", "private"),
        ("192.168.1.1", "private"), ("fd00::1", "private"), ("fc00::1", "private"), ("fec0::1", "private"),
        ("64:ff9b:1::a00:1", "private"),
        ("100.64.0.1", "carrier-grade NAT"), ("100.127.255.254", "carrier-grade NAT"),
        ("224.0.0.251", "multicast"), ("239.255.255.250", "multicast"), ("ff02::fb", "multicast"),
        ("240.0.0.1", "reserved"), ("192.0.0.8", "reserved"), ("100::1", "reserved"),
        ("192.0.2.1", "documentation"), ("198.51.100.1", "documentation"), ("203.0.113.9", "documentation"),
        ("2001:db8::1", "documentation"), ("3fff::1", "documentation"),
        # IPv6 forms carrying an IPv4 address are judged by it
        ("::ffff:10.0.0.1", "private"), ("::ffff:127.0.0.1", "loopback"), ("::ffff:198.18.0.1", "host address"),
        ("::ffff:198.18.0.53", "resolver"), ("::ffff:0:10.0.0.1", "private"), ("::10.0.0.1", "private"),
        ("64:ff9b::10.0.0.1", "private"), ("64:ff9b::198.18.0.1", "host address"),
        ("2002:c0a8:101::1", "private"), ("2002:c612:1::1", "host address"),
        ("::ffff:198.19.77.7", "local route"), ("64:ff9b::198.19.77.7", "local route"),
    ],
)
def test_each_class_is_named(address: str, klass: str) -> None:
    found = guarded(address, HOST)
    assert found is not None and found.klass == klass, (address, found)


def test_teredo_is_judged_by_its_client() -> None:
    # Teredo: server 65.54.227.120, client 192.168.1.1 (stored inverted in the last 32 bits).
    client = int(ipaddress.ip_address("192.168.1.1")) ^ 0xFFFFFFFF
    address = ipaddress.IPv6Address((0x20010000 << 96) | (int(ipaddress.ip_address("65.54.227.120")) << 64) | client)
    found = guarded(address, HOST)
    assert found is not None and found.klass == "private" and "Teredo form of 192.168.1.1" in found.why


@pytest.mark.parametrize("address", ["1.1.1.1", "8.8.8.8", "151.101.0.223", "198.18.0.2", "198.19.255.1",
                                     "172.32.0.1", "100.128.0.1", "2606:4700::1111", "2001:2::2",
                                     "::ffff:8.8.8.8", "64:ff9b::8.8.8.8", "2002:808:808::1",
                                     "198.19.76.255", "198.19.78.0", "2001:2:78::1"])
def test_the_internet_and_benchmarking_space_stay_open(address: str) -> None:
    assert guarded(address, HOST) is None


@pytest.mark.parametrize(
    ("rules", "host", "port", "address", "klass"),
    [
        (["0.0.0.0/0"], "198.18.0.1", 443, "198.18.0.1", "host address"),
        (["::/0"], "2001:2::1", 443, "2001:2::1", "host address"),
        (["*.example.com"], "a.example.com", 443, "198.18.0.1", "host address"),
        (["a.example.com"], "a.example.com", 443, "10.1.2.3", "private"),
        (["198.18.0.0/24:8080"], "198.18.0.1", 8080, "198.18.0.1", "host address"),
        (["198.18.0.0/16"], "198.18.0.53", 443, "198.18.0.53", "resolver"),
        (["10.0.0.0/8:5432"], "10.1.2.3", 5432, "10.1.2.3", "private"),
        (["::/0"], "::ffff:10.0.0.1", 443, "::ffff:10.0.0.1", "private"),
        (["[::ffff:0:0/96]:80"], "::ffff:198.18.0.1", 80, "::ffff:198.18.0.1", "host address"),
        (["10.1.2.3:5432"], "db.example", 5432, "::ffff:10.1.2.3", "private"),
        (["10.1.2.3:5432"], "10.1.2.3", 80, "10.1.2.3", "private"),  # the port is not the rule's
        (["*.localhost"], "a.localhost", 80, "127.0.0.1", "loopback"),
        (["127.0.0.0/8"], "127.0.0.1", 80, "127.0.0.1", "loopback"),
        (["*.example.com"], "a.example.com", 80, "::", "unspecified"),
        (["localhost"], "localhost", 443, "198.18.0.1", "host address"),  # localhost re-opens loopback only
        (["*.example.com:8080"], "a.example.com", 8080, "198.19.77.7", "local route"),
        (["198.19.0.0/16:8080"], "198.19.77.7", 8080, "198.19.77.7", "local route"),
        (["[2001:2::/32]:443"], "2001:2:77::7", 443, "2001:2:77::7", "local route"),
    ],
)
def test_refused_unless_a_rule_names_the_exact_address(rules: list[str], host: str, port: int, address: str,
                                                       klass: str) -> None:
    why = refusal(spec(*rules), rules[0], host, port, address, HOST)
    assert why is not None and why.startswith(f"{klass}: "), why
    text = str(ipaddress.ip_address(address))  # ::ffff:10.0.0.1 is ::ffff:a00:1 before Python 3.13
    shown = f"[{text}]:{port}" if ":" in text else f"{text}:{port}"
    assert why.endswith(f"only by a rule naming that exact address ({shown})" +
                        (" or the name localhost" if klass == "loopback" else ""))


@pytest.mark.parametrize(
    ("rules", "host", "port", "address"),
    [
        (["10.1.2.3:5432"], "10.1.2.3", 5432, "10.1.2.3"),
        (["[fd00::1]:443"], "fd00::1", 443, "fd00::1"),
        (["198.18.0.1"], "198.18.0.1", 443, "198.18.0.1"),  # no port: 80 and 443
        (["198.18.0.1:8080"], "198.18.0.1", 8080, "198.18.0.1"),
        (["198.18.0.53:53"], "198.18.0.53", 53, "198.18.0.53"),
        (["db.example:5432", "10.1.2.3:5432"], "db.example", 5432, "10.1.2.3"),  # the address is named too
        (["[::ffff:10.0.0.1]:80"], "::ffff:10.0.0.1", 80, "::ffff:10.0.0.1"),
        (["localhost:8080"], "localhost", 8080, "127.0.0.1"),
        (["localhost:8080"], "localhost", 8080, "::1"),
        (["127.0.0.1:8080"], "127.0.0.1", 8080, "127.0.0.1"),
        (["169.254.169.254"], "169.254.169.254", 80, "169.254.169.254"),
        (["0.0.0.0/0"], "1.1.1.1", 443, "1.1.1.1"),
        (["pypi.org"], "pypi.org", 443, "151.101.0.223"),
        (["198.19.77.7:8080"], "198.19.77.7", 8080, "198.19.77.7"),
        (["a.example.com:8080", "198.19.77.7:8080"], "a.example.com", 8080, "198.19.77.7"),
        (["[2001:2:77::7]:443"], "2001:2:77::7", 443, "2001:2:77::7"),
    ],
)
def test_an_exact_rule_reopens_its_address(rules: list[str], host: str, port: int, address: str) -> None:
    assert refusal(spec(*rules), rules[0], host, port, address, HOST) is None
    assert refusal(spec(*rules), parse_rule(rules[0]), host, port, ipaddress.ip_address(address), HOST) is None


def test_a_reason_says_what_the_name_resolved_to() -> None:
    why = refusal(spec("*.example.com"), "*.example.com", "a.example.com", 443, "198.18.0.1", HOST)
    assert why == ("host address: a.example.com resolves to 198.18.0.1, an address of this host; egress reaches "
                   "the host, private and reserved space only by a rule naming that exact address (198.18.0.1:443)")
    why = refusal(spec("::/0"), "::/0", "::ffff:10.0.0.1", 443, "::ffff:10.0.0.1", HOST)
    mapped = ipaddress.ip_address("::ffff:10.0.0.1")
    assert why is not None and why.startswith(
        f"private: {mapped} is private space (10.0.0.0/8), as the IPv4-mapped form of 10.0.0.1;")


def test_a_local_route_is_named_with_its_table() -> None:
    why = refusal(spec("*.example.com"), "*.example.com", "a.example.com", 443, "198.19.77.7", HOST)
    assert why == ("local route: a.example.com resolves to 198.19.77.7, an address this host routes to itself "
                   "(local 198.19.77.0/24, table local); egress reaches the host, private and reserved space only "
                   "by a rule naming that exact address (198.19.77.7:443)")
    found = guarded("198.19.77.200", HOST)  # the longest range that holds it
    assert found is not None and found.why.endswith("(local 198.19.77.128/25, table 100)")
    found = guarded("2001:2:77::1", HOST)
    assert found is not None and found.why.endswith("(local 2001:2:77::/64, table main)")


def test_local_routes_find_the_longest_range() -> None:
    routes = LocalRoutes(frozenset({_local("0.0.0.0/0", 100), _local("198.19.0.0/16"), _local("198.19.77.7/32"),
                                    _local("::/0", 100)}))
    assert routes.find(ipaddress.ip_address("198.19.77.7")) == _local("198.19.77.7/32")
    assert routes.find(ipaddress.ip_address("198.19.77.8")) == _local("198.19.0.0/16")
    assert routes.find(ipaddress.ip_address("1.1.1.1")) == _local("0.0.0.0/0", 100)
    assert routes.find(ipaddress.ip_address("2606:4700::1111")) == _local("::/0", 100)
    assert LocalRoutes().find(ipaddress.ip_address("1.1.1.1")) is None
    # the same range in two tables: one of them is named, the same every time
    twice = LocalRoutes(frozenset({_local("198.19.77.0/24", 255), _local("198.19.77.0/24", 100)}))
    assert twice.find(ipaddress.ip_address("198.19.77.1")) == _local("198.19.77.0/24", 100)


@given(st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 32)), max_size=12), st.integers(0, 2**32 - 1))
def test_local_routes_agree_with_a_scan(ranges: list[tuple[int, int]], value: int) -> None:
    routes = frozenset(LocalRoute(ipaddress.IPv4Network((start, length), strict=False), 255)
                       for start, length in ranges)
    address = ipaddress.IPv4Address(value)
    holding = [route for route in routes if address in route.network]
    found = LocalRoutes(routes).find(address)
    if not holding:
        assert found is None
    else:
        assert found is not None and found.network.prefixlen == max(r.network.prefixlen for r in holding)
        assert address in found.network


@given(st.integers(0, 2**32 - 1), st.integers(1, 65535))
def test_a_cidr_never_reopens_guarded_space(value: int, port: int) -> None:
    address = ipaddress.IPv4Address(value)
    why = refusal(spec(f"0.0.0.0/0:{port}"), f"0.0.0.0/0:{port}", str(address), port, address, HOST)
    assert (why is None) is (guarded(address, HOST) is None)
    assert refusal(spec(f"{address}:{port}"), f"{address}:{port}", str(address), port, address, HOST) is None
