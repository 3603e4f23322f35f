"""An "egress" capsule on the real kernel, through a real helper, privileged and rootless.

egress_scenario.py runs as its own process (as root for the privileged helper, as a
user made for the test for the rootless one, which starts its own user namespace):
it drives the helper through the client and reports what the jail and the passed
descriptors showed.  The jail reaches the proxy listener and nothing else: TEST-NET and
the host's own addresses end in the capsule's egress namespace at once, 127.0.0.1 is the
jail's own loopback, and the sniffer sees every attempt.  Traffic never leaves the
namespaces the helper makes, and the host's test server listens on 127.0.0.1 only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


from sandbox import egress  # noqa: E402
from tests.support import SUPPORT_DIR  # noqa: E402
from tests.support.users import as_user  # noqa: E402

FAST_S = 0.5  # "at once": a refusal in the egress namespace takes well under this


def run_scenario(mode: str, directory: Path, wrap: Callable[[list[str]], list[str]]) -> dict[str, Any]:
    """egress_scenario.py's report, run by ``wrap`` (as root, or as a user)."""
    argv = wrap([sys.executable, str(SUPPORT_DIR / "egress_scenario.py"), str(ROOT), mode, str(directory)])
    done = subprocess.run(argv, cwd=str(directory), capture_output=True, timeout=240,
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"})
    logs = "".join(p.read_text() for p in sorted(directory.glob("helper-*.log")))
    assert done.returncode == 0, done.stderr.decode()[-6000:] + logs[-4000:]
    result: dict[str, Any] = json.loads(done.stdout.decode().splitlines()[-1])
    return result


_SEEN: dict[str, dict[str, Any]] = {}  # one run per mode serves every test of the module


@pytest.fixture(params=["privileged", "rootless"])
def scenario(request: pytest.FixtureRequest, root_required: None, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """What the scenario saw, with a privileged helper run by root or a rootless one run by a user."""
    mode = request.param
    if mode not in _SEEN and mode == "privileged":
        tmp_path.chmod(0o755)
        _SEEN[mode] = run_scenario(mode, tmp_path, lambda argv: argv)
    elif mode not in _SEEN:
        uid, gid, home = request.getfixturevalue("user_dir")
        keep: list[str] = []
        try:
            _SEEN[mode] = run_scenario(mode, home, lambda argv: as_user(uid, gid, argv, keep))
        finally:
            for directory in keep:
                os.rmdir(directory)
    yield _SEEN[mode]


def test_jail_reaches_the_proxy_listener_and_nothing_else(scenario: dict[str, Any]) -> None:
    jail = scenario["jail"]
    assert jail["links"] == ["eth0", "lo"]
    assert jail["proxy"]["got"] == "pong" and scenario["proxy_received"] == ["ping"]
    for name in ("testnet", "udp", "v6"):  # TCP reset, ICMP port unreachable, IPv6 alike
        assert jail[name]["errno"] == "ECONNREFUSED" and jail[name]["s"] < FAST_S, (name, jail[name])
    # 127.0.0.1 is the jail's own loopback: the host's server there is never reached.
    assert jail["host_loopback"]["errno"] == "ECONNREFUSED" and scenario["host_server_reached"] is False
    assert jail["host_addresses"], "the host has no global address to try"
    for host, port, seen in jail["host_addresses"]:
        assert seen.get("errno") == "ECONNREFUSED" and seen["s"] < FAST_S, (host, port, seen)
    assert jail["env"] == egress.PROXY_ENV


def test_sniffer_sees_every_direct_attempt(scenario: dict[str, Any]) -> None:
    sniffed = [tuple(one) for one in scenario["sniffed"]]
    expected = [("tcp", "10.99.0.1", 3128), ("tcp", "192.0.2.1", 80), ("udp", "192.0.2.53", 53),
                ("tcp", "2001:db8::1", 80)]
    expected += [("tcp", host, port) for host, port, _seen in scenario["jail"]["host_addresses"]]
    # The edges (test_link_local_multicast_and_broadcast_never_hang): what left the jail.
    expected += [("tcp", "fe80::1", 80), ("udp", "fe80::1", 53), ("tcp", "169.254.169.254", 80),
                 ("udp", "224.0.0.251", 5353), ("udp", "ff02::fb", 5353), ("udp", "255.255.255.255", 67)]
    # One packet per attempt (none of the kernel's SYN-ACKs, resets or ICMP), and nothing
    # for 127.0.0.1: that stays on the jail's own loopback.
    assert sniffed == expected


def test_link_local_multicast_and_broadcast_never_hang(scenario: dict[str, Any]) -> None:
    edges = scenario["jail"]["edges"]
    # Link-local, v6 and v4, is refused by the egress namespace at once: no neighbour
    # discovery for a neighbour nobody is (the sniffer test sees each attempt).
    for name in ("link_local", "link_local_udp", "link_local_v4"):
        assert edges[name]["errno"] == "ECONNREFUSED" and edges[name]["s"] < FAST_S, (name, edges[name])
    # TCP to a group: the jail's own kernel refuses before any packet.
    for name in ("multicast_tcp", "multicast_tcp_v6"):
        assert edges[name]["errno"] == "ENETUNREACH" and edges[name]["s"] < FAST_S, (name, edges[name])
    # UDP to a group or the broadcast address leaves at once (and is sniffed, so recorded).
    for name in ("multicast_udp", "multicast_udp_v6", "broadcast_udp"):
        assert edges[name]["sent"] is True and edges[name]["s"] < FAST_S, (name, edges[name])
    assert edges["broadcast_no_option"]["errno"] == "EACCES"


def test_net_open_reply_and_descriptors(scenario: dict[str, Any]) -> None:
    assert scenario["reply"] == {
        "http_proxy": "10.99.0.1:3128", "socks_proxy": "10.99.0.1:1080",
        "jail_addresses": ["10.99.0.2", "fd63:6377::2"],
        "env": egress.PROXY_ENV, "mechanism": egress.MECHANISM}
    assert scenario["flags"] == [[False, False]] * 3  # non-blocking, close-on-exec
    assert scenario["same_listener"] is True  # a second net_open passes the same sockets again
    assert scenario["isolation"] == ["egress", egress.MECHANISM, egress.NO_MECHANISM]


def test_none_capsule_is_unchanged(scenario: dict[str, Any]) -> None:
    none = scenario["none"]
    assert none["links"] == ["lo"] and none["env"] == {}
    for name in ("testnet", "udp", "v6"):
        assert none[name]["errno"] == "ENETUNREACH", (name, none[name])
    assert scenario["none_net_open"] == "INVALID_ARGUMENT"


def test_exec_without_a_kit_is_unavailable_until_net_open(scenario: dict[str, Any]) -> None:
    assert scenario["before_open"] == "UNAVAILABLE network_not_open"
    # The capsule stays "egress" across a helper restart (meta.json); its kit does not.
    restart = scenario["restart"]
    assert restart["before_open"] == "UNAVAILABLE network_not_open"
    assert restart["testnet"]["errno"] == "ECONNREFUSED"
    # It saw an egress capsule in its state dir, so a spare kit was ready before net_open:
    # the sockets net_open passed and the jail's namespace were held from the start.
    assert set(restart["kit_links"]) <= set(restart["held_at_start"])
    assert restart["netns"] in restart["held_at_start"]
    assert scenario["helper_exit"] == 0 and scenario["helper_exit_2"] == 0


def test_destroy_closes_the_kit(scenario: dict[str, Any]) -> None:
    kit = [*scenario["kit_links"], scenario["jail"]["netns"]]
    assert set(kit) <= set(scenario["held_before_destroy"])
    assert not set(kit) & set(scenario["held_after_destroy"])
