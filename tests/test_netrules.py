"""The network allowlist: rule grammar, canonical form, decisions, ports (test_netspace.py: the host's space)."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_server.core.netrules import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    WEB_PORTS,
    NetworkSpec,
    decide,
    network_json,
    parse_network,
    parse_rule,
)
from sandbox.errors import CcwError


def spec(*rules: str) -> NetworkSpec:
    parsed = parse_network(list(rules))
    assert parsed is not None
    return parsed


@pytest.mark.parametrize(
    ("text", "canonical", "kind", "port"),
    [
        ("PyPI.org", "pypi.org", "name", None),
        ("pypi.org:443", "pypi.org:443", "name", 443),
        (" files.pythonhosted.org:0443 ", "files.pythonhosted.org:443", "name", 443),
        ("*.GitHub.com", "*.github.com", "wildcard", None),
        ("*.github.com:22", "*.github.com:22", "wildcard", 22),
        ("localhost:8080", "localhost:8080", "name", 8080),
        ("10.0.0.1", "10.0.0.1", "ip", None),
        ("10.0.0.1:65535", "10.0.0.1:65535", "ip", 65535),
        ("10.0.0.0/8", "10.0.0.0/8", "cidr", None),
        ("192.168.1.0/24:1", "192.168.1.0/24:1", "cidr", 1),
        ("10.0.0.1/32", "10.0.0.1/32", "cidr", None),
        ("2001:DB8::1", "2001:db8::1", "ip", None),
        ("[2001:db8:0:0::1]:443", "[2001:db8::1]:443", "ip", 443),
        ("[2001:db8::1]", "2001:db8::1", "ip", None),
        ("2001:db8::/32", "2001:db8::/32", "cidr", None),
        ("[2001:db8::/32]:80", "[2001:db8::/32]:80", "cidr", 80),
        ("::1", "::1", "ip", None),
    ],
)
def test_rule_canonical_forms(text: str, canonical: str, kind: str, port: int | None) -> None:
    rule = parse_rule(text)
    assert (rule.text, rule.kind, rule.port) == (canonical, kind, port)
    assert parse_rule(rule.text) == rule


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        "*",
        "*.",
        "foo.*.com",
        "pypi.org.",
        "py pi.org",
        "pypi..org",
        "pypi_org",
        "bücher.de",
        "pypi.org:0",
        "pypi.org:65536",
        "pypi.org:",
        "pypi.org:+80",
        "pypi.org:http",
        "a" * 64 + ".com",
        ".".join(["abc"] * 64),
        "127.1",
        "010.0.0.1",
        "1.2.3.4.5",
        "0x7f.1",
        "*.10.0.0.1",
        "10.0.0.1/33",
        "10.0.0.5/8",
        "10.0.0.0/8/9",
        "[10.0.0.1]:80",
        "[2001:db8::1",
        "[2001:db8::1]80",
        "[2001:db8::1]:",
        "2001:db8::1:80:",
        "2001:db8::/129",
        "fe80::1%eth0",
        "http://pypi.org",
    ],
)
def test_bad_rules_name_the_rule_and_the_grammar(text: str) -> None:
    with pytest.raises(CcwError) as caught:
        parse_rule(text)
    assert caught.value.code == "INVALID_ARGUMENT"
    assert repr(text) in caught.value.message
    assert "host[:port]" in caught.value.message


def test_parse_network_forms() -> None:
    assert parse_network(None) is None
    assert parse_network("none") is None
    listed = spec("pypi.org", "*.github.com:443", "pypi.org", "PYPI.ORG")
    assert [rule.text for rule in listed.allow] == ["*.github.com:443", "pypi.org"]
    assert (listed.max_bytes, listed.max_connections) == (DEFAULT_MAX_BYTES, DEFAULT_MAX_CONNECTIONS)
    assert DEFAULT_MAX_BYTES == 1073741824 and DEFAULT_MAX_CONNECTIONS == 512
    obj = parse_network({"allow": ["10.0.0.0/8"], "max_bytes": 10, "max_connections": 2})
    assert obj == NetworkSpec((parse_rule("10.0.0.0/8"),), 10, 2)
    assert network_json(None) == "none"
    assert network_json(obj) == {"allow": ["10.0.0.0/8"], "max_bytes": 10, "max_connections": 2}


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ([], "use 'none'"),
        ({"allow": []}, "use 'none'"),
        ("pypi.org", "a list of rules"),
        ("egress", "a list of rules"),
        (42, "a list of rules"),
        ({"allow": "pypi.org"}, "must be a list"),
        ({"rules": ["pypi.org"]}, "unknown fields"),
        ({"max_bytes": 5}, "needs 'allow'"),
        ({"allow": ["pypi.org"], "max_bytes": 0}, "max_bytes"),
        ({"allow": ["pypi.org"], "max_bytes": True}, "max_bytes"),
        ({"allow": ["pypi.org"], "max_connections": -1}, "max_connections"),
        ({"allow": ["pypi.org"], "max_connections": 2.5}, "max_connections"),
        (["pypi.org", 5], "not a string"),
        (["pypi.org", "nope:99999"], "'nope:99999'"),
    ],
)
def test_parse_network_refusals(value: Any, fragment: str) -> None:
    with pytest.raises(CcwError) as caught:
        parse_network(value)
    assert caught.value.code == "INVALID_ARGUMENT"
    assert fragment in caught.value.message


def test_wildcards_match_strictly_under_the_domain() -> None:
    rules = spec("*.example.com")
    assert decide(rules, "a.example.com", 443).allowed
    assert decide(rules, "a.b.example.com", 80).allowed
    assert decide(rules, "A.Example.COM.", 80).allowed
    assert decide(rules, "a.example.com", 80).rule == "*.example.com"
    for host in ("example.com", "badexample.com", "a.example.com.evil", "example.com.evil", "xexample.com"):
        assert not decide(rules, host, 443).allowed, host


def test_names_match_exactly_and_ports_bind() -> None:
    rules = spec("pypi.org:443", "files.pythonhosted.org")
    assert decide(rules, "pypi.org", 443).allowed
    denied = decide(rules, "pypi.org", 80)
    assert (denied.allowed, denied.rule, denied.reason) == (False, None, "no rule allows pypi.org:80")
    assert denied.wanted == "pypi.org:80"  # the rule its denial tells how to get (allow_hint)
    assert decide(rules, "files.pythonhosted.org", 80).allowed
    assert decide(rules, "files.pythonhosted.org", 443).allowed
    assert not decide(rules, "www.pypi.org", 443).allowed
    assert not decide(rules, "pypi.org", 0).allowed
    assert not decide(rules, "pypi.org", 70000).allowed


def test_names_never_match_ip_rules_nor_ips_name_rules() -> None:
    rules = spec("10.0.0.0/8", "localhost")
    assert not decide(rules, "ten.example", 80).allowed
    assert not decide(rules, "127.0.0.1", 80).allowed
    assert decide(rules, "10.1.2.3", 80).allowed
    assert decide(rules, "localhost", 80).allowed


@pytest.mark.parametrize(
    ("rule", "host", "allowed"),
    [
        ("10.0.0.0/8", "10.0.0.0", True),
        ("10.0.0.0/8", "10.255.255.255", True),
        ("10.0.0.0/8", "11.0.0.0", False),
        ("10.0.0.0/8", "9.255.255.255", False),
        ("192.168.1.128/25", "192.168.1.127", False),
        ("192.168.1.128/25", "192.168.1.128", True),
        ("0.0.0.0/0", "203.0.113.9", True),
        ("0.0.0.0/0", "2001:db8::1", False),
        ("::/0", "10.0.0.1", False),
        ("::/0", "2001:db8::1", True),
        ("2001:db8::/32", "[2001:db8:ffff::1]", True),
        ("2001:db8::/32", "2001:db9::", False),
        ("10.0.0.0/8", "::ffff:10.0.0.1", False),
        ("10.0.0.1", "10.0.0.1", True),
        ("10.0.0.1", "10.0.0.2", False),
        ("10.0.0.1", "010.0.0.1", False),
        ("127.0.0.1", "127.1", False),
        ("fe80::/10", "fe80::1%eth0", False),
    ],
)
def test_cidr_edges(rule: str, host: str, allowed: bool) -> None:
    assert decide(spec(rule), host, 443).allowed is allowed


def test_denials_say_why() -> None:
    rules = spec("pypi.org")
    assert decide(rules, "2001:db8::1", 443).reason == "no rule allows [2001:db8::1]:443"
    assert decide(rules, "2001:db8::1", 443).wanted == "[2001:db8::1]:443"
    assert decide(rules, "127.1", 80).wanted is None  # no rule would allow it: nothing to propose
    assert "neither an IP address nor a host name" in decide(rules, "127.1", 80).reason
    assert "ASCII" in decide(rules, "bücher.de", 80).reason
    assert "not allowed" in decide(rules, "a b", 80).reason
    assert decide(rules, "pypi.org", True).reason.startswith("port True")  # type: ignore[arg-type]


@pytest.mark.parametrize("rule", ["files.pythonhosted.org", "*.pythonhosted.org", "10.1.2.3", "10.0.0.0/8",
                                  "2001:db8::1", "0.0.0.0/0", "::/0"])
def test_a_rule_without_a_port_allows_80_and_443_only(rule: str) -> None:
    host = {"files.pythonhosted.org": "files.pythonhosted.org", "*.pythonhosted.org": "a.pythonhosted.org",
            "2001:db8::1": "2001:db8::1", "::/0": "2001:db8::7"}.get(rule, "10.1.2.3")
    rules = spec(rule)
    assert WEB_PORTS == (80, 443)
    assert [port for port in (22, 80, 443, 5432, 8080, 8443) if decide(rules, host, port).allowed] == [80, 443]
    shown = f"[{host}]" if ":" in host else host
    assert decide(rules, host, 5432).reason == (f"no rule allows {shown}:5432 ({rule} has no port, so it allows "
                                                f"80 and 443 only; name the port: {shown}:5432)")
    assert decide(spec(rule, f"{shown}:5432"), host, 5432).allowed


def test_policy_matching_reads_a_rule_without_a_port_as_any_port() -> None:
    rule = parse_rule("*.corp.example")
    assert rule.matches("git.corp.example", 22) and not rule.allows("git.corp.example", 22)
    assert rule.allows("git.corp.example", 443) and rule.matches("git.corp.example", 443)
    ported = parse_rule("git.corp.example:22")
    assert ported.matches("git.corp.example", 22) and ported.allows("git.corp.example", 22)
    assert not ported.matches("git.corp.example", 23)


# --- property tests -----------------------------------------------------------------

_labels = st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True)
_names = st.lists(_labels, min_size=1, max_size=4).map(".".join)
_ports = st.none() | st.integers(1, 65535)


def _with_port(host: str, port: int | None) -> str:
    return host if port is None else f"{host}:{port}"


@st.composite
def rule_texts(draw: st.DrawFn) -> str:
    port = draw(_ports)
    kind = draw(st.sampled_from(["name", "wildcard", "v4", "v4net", "v6", "v6net"]))
    if kind in ("name", "wildcard"):
        name = draw(_names)
        return _with_port(("*." if kind == "wildcard" else "") + name, port)
    if kind.startswith("v4"):
        address = ipaddress.IPv4Address(draw(st.integers(0, 2**32 - 1)))
        text = str(address)
        if kind == "v4net":
            text = str(ipaddress.ip_network(f"{address}/{draw(st.integers(0, 32))}", strict=False))
        return _with_port(text, port)
    address6 = ipaddress.IPv6Address(draw(st.integers(0, 2**128 - 1)))
    text = address6.exploded if draw(st.booleans()) else str(address6)
    if kind == "v6net":
        text = str(ipaddress.ip_network(f"{address6}/{draw(st.integers(0, 128))}", strict=False))
    return text if port is None else f"[{text}]:{port}"


@given(st.lists(rule_texts(), min_size=1, max_size=6), st.integers(1, 2**40), st.integers(1, 10000))
def test_to_json_round_trips(texts: list[str], max_bytes: int, max_connections: int) -> None:
    parsed = parse_network({"allow": texts, "max_bytes": max_bytes, "max_connections": max_connections})
    assert parsed is not None
    again = parse_network(parsed.to_json())
    assert again == parsed
    assert parsed.to_json()["allow"] == sorted(set(parsed.to_json()["allow"]))


@given(_names, st.lists(_labels, min_size=0, max_size=3), _ports, st.sampled_from(WEB_PORTS) | st.integers(1, 65535))
def test_wildcard_property(domain: str, prefix: list[str], rule_port: int | None, port: int) -> None:
    rules = spec(_with_port("*." + domain, rule_port))
    host = ".".join([*prefix, domain])
    expected = bool(prefix) and (port == rule_port or (rule_port is None and port in WEB_PORTS))
    assert decide(rules, host, port).allowed is expected


@given(st.integers(0, 2**32 - 1), st.integers(0, 32), st.integers(0, 2**32 - 1))
def test_cidr_property(base: int, prefix: int, probe: int) -> None:
    network = ipaddress.ip_network(f"{ipaddress.IPv4Address(base)}/{prefix}", strict=False)
    address = ipaddress.IPv4Address(probe)
    assert decide(spec(str(network)), str(address), 80).allowed is (address in network)


@given(st.integers(0, 2**128 - 1), st.integers(0, 128), st.integers(0, 2**128 - 1), st.booleans())
def test_cidr6_property(base: int, prefix: int, probe: int, bracket: bool) -> None:
    network = ipaddress.ip_network(f"{ipaddress.IPv6Address(base)}/{prefix}", strict=False)
    address = ipaddress.IPv6Address(probe)
    host = f"[{address}]" if bracket else str(address)
    assert decide(spec(f"[{network}]:443"), host, 443).allowed is (address in network)
    assert not decide(spec(f"[{network}]:443"), host, 444).allowed
