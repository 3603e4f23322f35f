"""Attacks on the host through a capsule's egress proxy (issue 24, class 8): the host itself.

The proxy connects from the host's network namespace, so an allowlist rule that leads to
one of the host's own addresses reaches every service the host binds to 0.0.0.0 or [::].
Here a server listens on the host's 0.0.0.0 and [::] at a port of the test's, and a
namespace of the test's (``netfixtures.lab_namespace``) stands for the host's LAN and
its resolver.  The host's end of the veth carries addresses that are in no refused
range (198.18.0.1, 2001:2::1: benchmarking space, which egress leaves open), so it is
their being the host's that refuses them, and a private one (10.97.0.1); the far end has
198.18.0.2 (a stand-in for the internet), 198.18.0.3 (the resolver: the front end reads
a resolv.conf of the test's naming it) and 10.97.0.2 (the LAN).  Names resolve through
a trio hostname resolver the test installs, as the host's DNS would answer them.

From a jail, through the HTTP proxy and SOCKS5: names that resolve to the host's
addresses (v4, v6) or into the LAN, ``0.0.0.0/0`` and ``::/0`` rules, IPv4-mapped
literals, the resolver, CIDRs that contain the host, every real address of the host
(whatever its interfaces carry), and rules without a port aimed at other ports.  Each
is refused before any connection, recorded with the class that refused it, and
nothing answers; an exact-address rule with the port reaches the host (the explicit
way), and a rule without a port reaches 80 and 443 only.  Traffic stays on loopback and
the test's namespace.

Ranges the host routes to itself without an address ("AnyIP", ``ip route add local``)
are the host's too.  That test changes no routing table of the host's: it makes a
namespace whose lo carries AnyIP ranges (198.19.77.0/24, 2001:2:77::/64: space egress
otherwise leaves open, never on the internet) and a server on its 0.0.0.0 and [::], and
runs the front end there (``ccw`` under ``ip netns exec``, which starts the state dir's
front-end daemon in it; the helper is started first, in the host's namespaces).  Names
resolve through the namespace's own /etc/hosts (``/etc/netns/<name>/hosts``, which
``ip netns exec`` mounts over /etc/hosts).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from mcp_server.capsules.networks import Networks
from mcp_server.egress.hostspace import HostSpaceReader, dump_addresses
from tests.support import netfixtures as nf
from tests.support.cli_process import CCW, ROOT, ccw, cli_env
from tests.support.lab_names import THROUGH_PROXY as JAIL
from tests.support.lab_names import LabResolver

HOST_V4, HOST_V6, HOST_LAN = "198.18.0.1", "2001:2::1", "10.97.0.1"
FAR, RESOLVER, LAN = "198.18.0.2", "198.18.0.3", "10.97.0.2"
NAMES = {b"host.attack.test": [HOST_V4], b"host6.attack.test": [HOST_V6], b"lan.attack.test": [LAN]}


def _shown(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _host_addresses() -> list[str]:
    """The host's real addresses (its interfaces', before the test adds any), loopback and link-local aside."""
    return sorted(str(a) for a in dump_addresses()[0] if not (a.is_loopback or a.is_link_local))


def attacks(port: int, real: list[str]) -> dict[tuple[str, ...], list[tuple[str, str, str]]]:
    """Rules -> the attempts made under them: (protocol, target, the class that must refuse it)."""
    mapped = str(ipaddress.ip_address(f"::ffff:{HOST_V4}"))
    mapped_lan = str(ipaddress.ip_address(f"::ffff:{LAN}"))
    p = port
    return {
        (f"*.attack.test:{p}", f"0.0.0.0/0:{p}", f"[::/0]:{p}", "0.0.0.0/0:53"): [
            ("http", f"host.attack.test:{p}", "host address"),
            ("socks", f"host.attack.test:{p}", "host address"),
            ("http", f"host6.attack.test:{p}", "host address"),
            ("http", f"lan.attack.test:{p}", "private"),
            ("http", f"{HOST_V4}:{p}", "host address"),
            ("http", f"[{HOST_V6}]:{p}", "host address"),
            ("http", f"{HOST_LAN}:{p}", "host address"),
            ("http", f"{LAN}:{p}", "private"),
            ("http", f"[{mapped}]:{p}", "host address"),
            ("http", f"[{mapped_lan}]:{p}", "private"),
            ("http", f"{RESOLVER}:53", "resolver"),
            *[("http", _shown(address, p), "host address") for address in real],
        ],
        (f"198.18.0.0/24:{p}", f"[2001:2::/64]:{p}", f"10.97.0.0/24:{p}"): [
            ("http", f"{HOST_V4}:{p}", "host address"),
            ("http", f"[{HOST_V6}]:{p}", "host address"),
            ("http", f"{HOST_LAN}:{p}", "host address"),
            ("http", f"{LAN}:{p}", "private"),
        ],
        (HOST_V4, "0.0.0.0/0", "::/0"): [  # no port: 80 and 443 only
            ("http", f"{HOST_V4}:{p}", "port"),
            ("http", f"[{HOST_V6}]:{p}", "port"),
            ("http", f"{FAR}:22", "port"),
            ("http", f"{FAR}:5432", "port"),
        ],
    }


def allowed(port: int) -> dict[tuple[str, ...], list[tuple[str, str, str]]]:
    """Rules -> attempts that must reach their server: (protocol, target, the banner it answers)."""
    p = port
    return {
        (f"{HOST_V4}:{p}", f"[{HOST_V6}]:{p}", f"{LAN}:{p}", f"{RESOLVER}:53"): [
            ("http", f"{HOST_V4}:{p}", f"host:{p}"),
            ("http", f"[{HOST_V6}]:{p}", f"host:{p}"),
            ("http", f"{LAN}:{p}", f"far:{p}"),
            ("http", f"{RESOLVER}:53", "far:53"),
        ],
        (FAR,): [("http", f"{FAR}:80", "far:80"), ("http", f"{FAR}:443", "far:443")],
    }


@pytest.fixture
def lab(tools: Any, tmp_path: Path) -> Iterator[tuple[int, list[str]]]:
    """The host's server and the lab namespace with its servers; (the host server's port, the host's real addresses)."""
    real = _host_addresses()
    with nf.banner_servers("host", [0]) as (port,), \
            nf.lab_namespace(host=(f"{HOST_V4}/24", f"{HOST_V6}/64", f"{HOST_LAN}/24"),
                             far=(f"{FAR}/24", f"{RESOLVER}/24", f"{LAN}/24", "2001:2::2/64")) as made, \
            nf.banner_servers("far", [port, 22, 53, 80, 443, 5432], made.namespace):
        resolv = tmp_path / "resolv.conf"
        resolv.write_text(f"nameserver {RESOLVER}\n")
        reader = HostSpaceReader(resolv)
        tools.runtime.networks = Networks(reader)
        try:
            yield port, real
        finally:
            reader.close()


def _run(tools: Any, tmp_path: Path, plan: dict[tuple[str, ...], list[tuple[str, str, str]]]) -> list[Any]:
    """Each rule set's capsule runs its attempts in one exec: [(rules, attempts, jail's answers, records)]."""
    ws = tmp_path / "project"
    ws.mkdir(exist_ok=True)

    async def scenario(t: Any) -> list[Any]:
        trio.socket.set_custom_hostname_resolver(LabResolver(NAMES))
        out = []
        for rules, attempts in plan.items():
            cap = (await t.call("capsule_create", {"workspace": str(ws), "network": list(rules)}))["capsule_id"]
            targets = [[protocol, target] for protocol, target, _ in attempts]
            ran = await t.call("capsule_exec", {"capsule_id": cap, "cmd": [
                "/usr/bin/python3", "-c", JAIL, json.dumps(targets)], "timeout_ms": 120000})
            assert ran["exit_code"] == 0, ran["stderr"]
            out.append((rules, attempts, json.loads(ran["stdout"]), ran["touched"]["network"]))
            await t.call("capsule_destroy", {"capsule_id": cap})
        return out

    result: list[Any] = tools.run(scenario)
    return result


def _record(records: list[dict[str, Any]], protocol: str, target: str) -> dict[str, Any]:
    host, _, port = target.rpartition(":")
    kind = "https" if protocol == "http" else "socks5"
    name = host.strip("[]")
    found = [r for r in records if r["host"] == name and r["port"] == int(port) and r["protocol"] == kind]
    assert len(found) == 1, (target, records)
    return found[0]


def test_egress_never_reaches_the_host_or_private_space(tools: Any, lab: tuple[int, list[str]], tmp_path: Path,
                                                        record_property: Callable[[str, object], None]) -> None:
    port, real = lab
    plan = attacks(port, real)
    record_property("escapes_tried", sum(len(attempts) for attempts in plan.values()))
    escaped, unrecorded = [], []
    for rules, attempts, answers, records in _run(tools, tmp_path, plan):
        for (protocol, target, klass), (_, _, said, banner) in zip(attempts, answers, strict=True):
            if banner:
                escaped.append((rules, protocol, target, said, banner))
            record = _record(records, protocol, target)
            reason = str(record["reason"])
            if klass == "port":
                verdict = reason.startswith("no rule allows") and "has no port, so it allows 80 and 443 only" in reason
            else:
                verdict = reason.startswith(f"{klass}: ")
            if record["allowed"] or not verdict:
                unrecorded.append((rules, protocol, target, record["allowed"], reason))
    assert escaped == []
    assert unrecorded == []


def test_an_exact_address_rule_reaches_it_and_no_port_means_80_and_443(
        tools: Any, lab: tuple[int, list[str]], tmp_path: Path) -> None:
    port, _ = lab
    plan = allowed(port)
    for _rules, attempts, answers, records in _run(tools, tmp_path, plan):
        for (protocol, target, banner), (_, _, said, got) in zip(attempts, answers, strict=True):
            assert (said, got) == ("HTTP/1.1 200 Connection established", banner), target
            record = _record(records, protocol, target)
            assert record["allowed"] and record["reason"] is None, record


ANYIP, ANYIP6 = "198.19.77.0/24", "2001:2:77::/64"
EXACT, EXACT6 = "198.19.77.7", "2001:2:77::7"  # in the ranges, and named by a rule
OTHER, OTHER6, LAST = "198.19.77.8", "2001:2:77::8", "198.19.77.250"  # in the ranges, named by none
ANYIP_NAMES = {"anyip.attack.test": OTHER, "anyip6.attack.test": OTHER6, "exact.attack.test": EXACT}


@pytest.fixture
def anyip(root_required: None) -> Iterator[tuple[str, int]]:
    """A namespace whose lo routes ANYIP and ANYIP6 to itself, with a server on its 0.0.0.0
    and [::] and names of its own; (its name, the server's port)."""
    name = f"ccwa{os.getpid()}"
    etc = Path("/etc/netns") / name
    made_netns_dir = not etc.parent.exists()
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    try:
        etc.mkdir(parents=True)
        (etc / "hosts").write_text("127.0.0.1 localhost\n::1 localhost\n"
                                   + "".join(f"{address} {host}\n" for host, address in ANYIP_NAMES.items()))
        (etc / "resolv.conf").write_text("nameserver 127.0.0.1\n")  # the namespace's own lo: nothing answers
        for argv in (["link", "set", "lo", "up"], ["route", "add", "local", ANYIP, "dev", "lo"],
                     ["-6", "route", "add", "local", ANYIP6, "dev", "lo"]):
            subprocess.run(["ip", "-n", name, *argv], check=True, capture_output=True)
        with nf.banner_servers("anyip", [0], name) as (port,):
            yield name, port
    finally:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
        shutil.rmtree(etc, ignore_errors=True)
        if made_netns_dir:  # the host's /etc as it was
            with contextlib.suppress(OSError):
                etc.parent.rmdir()


def _ccw_in(namespace: str, state: Path, *argv: str) -> dict[str, Any]:
    """``ccw --json ARGV`` run in ``namespace``; its result."""
    done = subprocess.run(["ip", "netns", "exec", namespace, *CCW, "--json", *argv], capture_output=True, text=True,
                          env=cli_env(state), cwd=ROOT, timeout=180, check=False)
    assert done.returncode == 0, (argv, done.stdout, done.stderr)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_egress_refuses_ranges_the_host_routes_to_itself_but_an_exact_address(
        cli_state: Path, anyip: tuple[str, int], tmp_path: Path) -> None:
    namespace, p = anyip
    ccw(cli_state, "helper", "start")
    ws = tmp_path / "project"
    ws.mkdir()
    rules = (f"*.attack.test:{p}", f"198.19.0.0/16:{p}", f"[2001:2::/32]:{p}", f"{EXACT}:{p}", f"[{EXACT6}]:{p}")
    # Names that resolve into the ranges, CIDRs that hold them, the addresses themselves:
    # (protocol, target, the address refused).
    refused = [("http", f"anyip.attack.test:{p}", OTHER), ("socks", f"anyip.attack.test:{p}", OTHER),
               ("http", f"anyip6.attack.test:{p}", OTHER6), ("http", f"{OTHER}:{p}", OTHER),
               ("http", f"{LAST}:{p}", LAST), ("http", f"[{OTHER6}]:{p}", OTHER6)]
    # The rule naming the exact address (and port) re-opens it, whatever the name.
    allowed = [("http", f"{EXACT}:{p}"), ("socks", f"{EXACT}:{p}"), ("http", f"[{EXACT6}]:{p}"),
               ("http", f"exact.attack.test:{p}")]
    attempts = [[protocol, target] for protocol, target, _ in refused] + [list(attempt) for attempt in allowed]

    cap = _ccw_in(namespace, cli_state, "capsule", "create", *(f"--network={rule}" for rule in rules),
                  str(ws))["capsule_id"]
    ran = _ccw_in(namespace, cli_state, "capsule", "exec", cap, "--", "/usr/bin/python3", "-c", JAIL,
                  json.dumps(attempts))
    _ccw_in(namespace, cli_state, "capsule", "destroy", cap)
    assert ran["exit_code"] == 0, ran["stderr"]
    answers, records = json.loads(ran["stdout"]), ran["touched"]["network"]

    for (protocol, target, address), (_, _, said, banner) in zip(refused, answers[:len(refused)], strict=True):
        assert banner == "", (target, said, banner)  # nothing answered: the proxy never connected
        record = _record(records, protocol, target)
        reason = str(record["reason"])
        assert not record["allowed"] and reason.startswith("local route: "), record
        assert "an address this host routes to itself (local " in reason, reason
        assert reason.endswith(f"only by a rule naming that exact address ({_shown(address, p)})"), reason
    for (protocol, target), (_, _, said, banner) in zip(allowed, answers[len(refused):], strict=True):
        expected = "HTTP/1.1 200 Connection established" if protocol == "http" else "socks 0"
        assert (said, banner) == (expected, f"anyip:{p}"), target
        record = _record(records, protocol, target)
        assert record["allowed"] and record["reason"] is None, record
