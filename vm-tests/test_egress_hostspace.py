"""The host-space reader on the real kernel: it follows addresses, local routes and policy
rules added and removed at once.

The reader runs in a network namespace the test makes (``ip netns exec``), so the
addresses, routes and rules the test adds and removes belong to that namespace and
nothing else; each line the test writes to the reader's stdin (a JSON list of addresses)
asks it for ``current()`` again, and which local route holds each address.  The kernel's
own answer for those addresses (``ip route get``: ``local`` or not) is asked too, so the
ranges the reader counts are the ones the kernel delivers to the host.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent

READER = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    from mcp_server.egress.hostspace import HostSpaceReader
    import ipaddress
    reader = HostSpaceReader()
    for line in sys.stdin:
        space = reader.current()
        held = {address: space.local_routes.find(ipaddress.ip_address(address)) for address in json.loads(line)}
        print(json.dumps({"addresses": sorted(map(str, space.addresses)),
                          "broadcasts": sorted(map(str, space.broadcasts)),
                          "local": sorted(map(str, space.local_routes.routes)),
                          "held": {address: None if route is None else str(route) for address, route in held.items()}}),
              flush=True)
""")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def namespace(root_required: None) -> Iterator[str]:
    name = f"ccwhs{os.getpid()}"
    _ip("netns", "add", name)
    try:
        # A veth pair inside the namespace (this kernel may have no dummy driver).
        _ip("-n", name, "link", "add", "d0", "type", "veth", "peer", "name", "d1")
        _ip("-n", name, "link", "set", "lo", "up")
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)


@contextlib.contextmanager
def reader_in(namespace: str) -> Iterator[Callable[..., dict[str, Any]]]:
    """The reader running in ``namespace``: a function that asks it for ``current()`` (and
    which local route holds each address given)."""
    reader = subprocess.Popen(["ip", "netns", "exec", namespace, sys.executable, "-c", READER, str(ROOT)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert reader.stdin is not None and reader.stdout is not None

    def current(*addresses: str) -> dict[str, Any]:
        assert reader.stdin is not None and reader.stdout is not None
        reader.stdin.write(json.dumps(addresses) + "\n")
        reader.stdin.flush()
        seen: dict[str, Any] = json.loads(reader.stdout.readline())
        return seen

    try:
        yield current
    finally:
        reader.stdin.close()
        reader.wait(timeout=10)
        reader.stdout.close()


def test_the_reader_follows_address_changes(namespace: str) -> None:
    with reader_in(namespace) as current:
        def shown() -> dict[str, Any]:
            seen = current()
            return {"addresses": seen["addresses"], "broadcasts": seen["broadcasts"]}

        assert shown() == {"addresses": ["127.0.0.1", "::1"], "broadcasts": []}
        _ip("-n", namespace, "addr", "add", "198.18.7.1/24", "broadcast", "198.18.7.255", "dev", "d0")
        _ip("-n", namespace, "addr", "add", "2001:2::7/64", "dev", "d0", "nodad")
        assert shown() == {"addresses": ["127.0.0.1", "198.18.7.1", "2001:2::7", "::1"],
                           "broadcasts": ["198.18.7.255"]}
        _ip("-n", namespace, "addr", "del", "198.18.7.1/24", "dev", "d0")
        assert shown()["addresses"] == ["127.0.0.1", "2001:2::7", "::1"]
        _ip("-n", namespace, "link", "del", "d0")
        assert shown() == {"addresses": ["127.0.0.1", "::1"], "broadcasts": []}


# Addresses in ranges the test routes locally (benchmarking space, never on the internet).
PROBES = ("198.19.77.7", "198.19.88.7", "198.19.90.7", "198.19.91.7", "2001:2:77::7")


def _kernel_local(namespace: str, address: str) -> bool:
    """Whether the kernel routes ``address`` to this namespace itself, for a connection made by root."""
    done = subprocess.run(["ip", "-n", namespace, "route", "get", address, "uid", "0"],
                          capture_output=True, text=True, check=False)
    return done.returncode == 0 and done.stdout.startswith("local ")


def test_the_reader_follows_local_routes_and_the_rules_that_reach_them(namespace: str) -> None:
    for end in ("d0", "d1"):  # no IPv6 on the veth: deleting it then tells of nothing but the link
        subprocess.run(["ip", "netns", "exec", namespace, "sysctl", "-qw", f"net.ipv6.conf.{end}.disable_ipv6=1"],
                       check=True, capture_output=True)
        _ip("-n", namespace, "link", "set", end, "up")
    with reader_in(namespace) as current:
        kernels_own = set(current()["local"])  # loopback's, one per address
        assert "local 127.0.0.0/8, table local" in kernels_own

        def step(*expected: str) -> None:
            seen = current(*PROBES)
            assert set(seen["local"]) - kernels_own == set(expected)
            held = {address: route for address, route in seen["held"].items() if route is not None}
            assert set(held) == {address for address in PROBES if _kernel_local(namespace, address)}, held

        step()
        # AnyIP, as iproute2 makes it (into table local), and in main on the veth, IPv6 too.
        _ip("-n", namespace, "route", "add", "local", "198.19.77.0/24", "dev", "lo")
        _ip("-n", namespace, "route", "add", "local", "198.19.88.0/24", "dev", "d0", "table", "main")
        _ip("-n", namespace, "-6", "route", "add", "local", "2001:2:77::/64", "dev", "lo")
        anyip = ("local 198.19.77.0/24, table local", "local 198.19.88.0/24, table main",
                 "local 2001:2:77::/64, table local")
        step(*anyip)
        # TPROXY's table: everything local, for marked packets only; the proxy's are not.
        _ip("-n", namespace, "route", "add", "local", "0.0.0.0/0", "dev", "lo", "table", "100")
        _ip("-n", namespace, "rule", "add", "fwmark", "1", "lookup", "100")
        step(*anyip)
        # A rule for other users' sockets reaches it no more; one for some destinations does, for them.
        _ip("-n", namespace, "rule", "add", "uidrange", "1000-1999", "lookup", "100")
        step(*anyip)
        _ip("-n", namespace, "rule", "add", "to", "198.19.90.0/24", "lookup", "100")
        step(*anyip, "local 198.19.90.0/24, table 100")
        _ip("-n", namespace, "rule", "del", "to", "198.19.90.0/24", "lookup", "100")
        step(*anyip)
        # A deleted link takes its IPv4 routes with it, without telling (RTM_DELLINK does).
        _ip("-n", namespace, "link", "del", "d0")
        step(anyip[0], anyip[2])
        _ip("-n", namespace, "route", "del", "local", "198.19.77.0/24", "dev", "lo", "table", "local")
        _ip("-n", namespace, "-6", "route", "del", "local", "2001:2:77::/64", "dev", "lo", "table", "local")
        step()
