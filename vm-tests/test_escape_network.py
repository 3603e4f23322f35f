"""The escape suite's network attempts: a capsule with an allowlist tries every other way out.

The capsule may reach one server (the test's namespace, ``10.98.0.2:8080``) through the
proxy.  Each attempt is an ``escape_probes.py`` probe run in the jail, after the same
rule as test_escape_jail.py: a probe that gets what it tried prints ``ESCAPED``.  The
attempts: other ports and hosts straight or through either proxy, the proxy's own
listeners, the test's host-side veth address, the host's loopback, IPv6 and link-local,
UDP and SOCKS UDP, raw and packet sockets, and reconfiguring the jail's interface.
Every address tried is the test's, the egress namespace's, or one the egress namespace
answers itself; nothing leaves the machine.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import SUPPORT_DIR
from tests.support import netfixtures as nf

ALLOWED = f"{nf.SERVER_ADDRESS}:{nf.HTTP_PORT}"
P = "/usr/bin/python3 escape_probes.py"
ATTEMPTS = {
    "direct-to-allowed-server": f"{P} tcp_connect {ALLOWED}",
    "direct-other-port": f"{P} tcp_connect {nf.SERVER_ADDRESS}:22",
    "host-veth-address": f"{P} tcp_connect {nf.HOST_ADDRESS}:22",
    "egress-other-port": f"{P} tcp_connect 10.99.0.1:22",
    "host-loopback": f"{P} tcp_connect 127.0.0.1:{{loop_port}}",
    "ipv6-egress": f"{P} tcp6_connect [fd63:6377::1]:22",
    "ipv6-elsewhere": f"{P} tcp6_connect [fd98::2]:80",
    "ipv6-link-local": f"{P} tcp6_connect [fe80::1%eth0]:80",
    "ipv4-link-local-metadata": f"{P} tcp_connect 169.254.169.254:80",
    "udp-to-server": f"{P} udp_reply {nf.SERVER_ADDRESS}:53",
    "udp-to-egress": f"{P} udp_reply 10.99.0.1:53",
    "proxy-connect-other-port": f"{P} proxy_connect {nf.SERVER_ADDRESS}:22",
    "proxy-connect-itself": f"{P} proxy_connect 10.99.0.1:3128",
    "proxy-connect-host-loopback": f"{P} proxy_connect 127.0.0.1:{{loop_port}}",
    "proxy-connect-localhost": f"{P} proxy_connect localhost:{{loop_port}}",
    "socks-denied-host": f"{P} socks_connect denied.example:80",
    "socks-host-loopback": f"{P} socks_connect 127.0.0.1:{{loop_port}}",
    "socks-udp-associate": f"{P} socks_udp_associate",
    "raw-socket": f"{P} raw_socket",
    "packet-socket": f"{P} packet_socket",
    "net-admin": f"{P} net_admin",
}
FAST_S = 2.0


@pytest.fixture
def outcomes(tools: Any, tmp_path: Path) -> Iterator[dict[str, tuple[int | None, str, float]]]:
    """Each attempt's exit code, output and how long it took, run in one allowlist capsule."""
    root = tmp_path / "srv"
    nf.big_file(root, "small.bin", 10)
    ws = tmp_path / "project"
    ws.mkdir()
    shutil.copy(SUPPORT_DIR / "escape_probes.py", ws / "escape_probes.py")
    with nf.server_namespace(root, "http://denied.example/"), nf.loopback_server() as loop_port:
        async def scenario(t: Any) -> dict[str, tuple[int | None, str, float]]:
            cap = (await t.call("capsule_create", {"workspace": str(ws), "network": [ALLOWED]}))["capsule_id"]
            out = {}
            for name, command in ATTEMPTS.items():
                started = time.monotonic()
                ran = await t.call("capsule_exec", {"capsule_id": cap,
                                                    "cmd": ["sh", "-c", command.format(loop_port=loop_port)]})
                out[name] = (ran["exit_code"], ran["stdout"] + ran["stderr"], time.monotonic() - started)
            return out

        yield tools.run(scenario)


def test_every_network_escape_fails_at_once(outcomes: dict[str, tuple[int | None, str, float]],
                                            record_property: Callable[[str, object], None]) -> None:
    record_property("escapes_tried", len(ATTEMPTS))
    escaped = {name: out for name, (status, out, _) in outcomes.items() if status == 0 or "ESCAPED" in out}
    assert escaped == {}
    # Each probe ran and was refused by the kernel or the proxy (not, say, a missing file).
    unrun = {name: out for name, (_, out, _) in outcomes.items() if "denied:" not in out}
    assert unrun == {}
    slow = {name: round(took, 2) for name, (_, _, took) in outcomes.items() if took > FAST_S}
    assert slow == {}  # a refusal, never a hang
