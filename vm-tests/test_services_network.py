"""A service cannot reach the host's own addresses except through its capsule's allowlist
(issue 36), through a real Runtime and an embedded helper.

The test listens on the host, on ``127.0.0.1`` and on the host's own non-loopback
address, and counts what reaches it.  A service in a ``network: "none"`` capsule tries
both, directly: it reaches only its capsule's own loopback (a listener of its own), and
the host's listeners see nothing.  In an allowlist capsule naming the host's
``127.0.0.1:PORT`` the same direct attempts fail too; through the capsule's proxy the
allowed one passes (the host's listener answers it) and the other is refused, each
recorded as the proxy decided it.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from mcp_server.events import EventLog

# Tries each host:port in argv, directly and (in an allowlist capsule) through the proxy, one
# "=> " line each, then says "probed" and keeps running, as a service does.
PROBE = r"""
import os, socket, sys, time
def direct(host, port):
    try:
        with socket.create_connection((host, port), timeout=5) as s:
            s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        return "connected"
    except OSError as exc:
        return type(exc).__name__
def proxied(host, port):
    proxy_host, proxy_port = os.environ["HTTP_PROXY"].rsplit("/", 1)[-1].rsplit(":", 1)
    with socket.create_connection((proxy_host, int(proxy_port)), timeout=30) as s:
        s.sendall(f"GET http://{host}:{port}/ HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
        return s.recv(4096).split(b"\r\n")[0].decode()
own = socket.create_server(("127.0.0.1", 0))
print("=> own loopback", direct("127.0.0.1", own.getsockname()[1]), flush=True)
port = int(sys.argv[1])
for host in sys.argv[2:]:
    print("=> direct", host, direct(host, port), flush=True)
    if "HTTP_PROXY" in os.environ:
        print("=> proxied", host, proxied(host, port), flush=True)
print("probed", flush=True)
time.sleep(3600)
"""


class HostListeners:
    """Listeners on the host's 127.0.0.1 and its own non-loopback address, on one port, that
    answer an HTTP request ``200`` and note the address each connection came to."""

    def __init__(self, address: str) -> None:
        self.loopback = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.loopback.getsockname()[1]
        self.own = socket.create_server((address, self.port))
        self.reached: list[str] = []
        for listener in (self.loopback, self.own):
            threading.Thread(target=self._serve, args=(listener,), daemon=True).start()

    def _serve(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed
                return
            with conn:
                self.reached.append(conn.getsockname()[0])
                conn.settimeout(10)
                conn.recv(4096)
                conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhost\n")

    def close(self) -> None:
        self.loopback.close()
        self.own.close()


@pytest.fixture
def host() -> Iterator[HostListeners]:
    """The host's listeners, on its first non-loopback IPv4 address."""
    addresses = [a.address for nic in psutil.net_if_addrs().values() for a in nic
                 if a.family == socket.AF_INET and not ipaddress.ip_address(a.address).is_loopback]
    assert addresses, "this host has no non-loopback IPv4 address to listen on"
    listeners = HostListeners(addresses[0])
    yield listeners
    listeners.close()


async def _probed(t: Any, network: dict[str, Any] | None, ws: str, host: HostListeners) -> dict[str, Any]:
    """A capsule's service runs PROBE against the host's listeners; its answers, its journal row."""
    made = await t.call("capsule_create", {"workspace": ws, **({"network": network} if network else {})})
    cap = made["capsule_id"]
    cmd = ["python3", "-c", PROBE, str(host.port), "127.0.0.1", host.own.getsockname()[0]]
    start = await t.call("capsule_service_start", {"capsule_id": cap, "name": "probe", "cmd": cmd,
                                                   "ready": {"line": "probed", "timeout_ms": 60_000}})
    logs = await t.call("capsule_service_logs", {"capsule_id": cap, "name": "probe"})
    await t.call("capsule_service_stop", {"capsule_id": cap, "name": "probe", "grace_ms": 1000})
    decided = [(event.data["host"], event.data["protocol"], event.data["allowed"])
               for event in EventLog(t.runtime.state).since(0, cap)
               if event.kind == "net.connection" and event.data.get("live")]  # as decided, not the row's
    await t.call("capsule_destroy", {"capsule_id": cap})
    lines = [line[3:].split(" ", 2) for line in logs["text"].splitlines() if line.startswith("=> ")]
    return {"start": start, "seen": {f"{how} {where}": what for how, where, what in lines},
            "decided": sorted(decided)}


def test_a_service_reaches_the_host_only_through_its_allowlist(tools: Any, tmp_path: Any,
                                                              host: HostListeners) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    own = host.own.getsockname()[0]

    async def scenario(t: Any) -> dict[str, Any]:
        none = await _probed(t, None, str(ws), host)
        reached_from_none = list(host.reached)
        allowed = await _probed(t, {"allow": [f"127.0.0.1:{host.port}"]}, str(ws), host)
        return {"none": none, "reached_from_none": reached_from_none, "allowed": allowed}

    out = tools.run(scenario)
    none, allowed = out["none"], out["allowed"]
    assert none["start"]["ready"] is True, none["start"]
    # network "none": its own loopback only; the host's two addresses are not there at all.
    assert none["seen"] == {"own loopback": "connected", "direct 127.0.0.1": "ConnectionRefusedError",
                            f"direct {own}": "OSError"}, none["seen"]
    assert out["reached_from_none"] == [], out["reached_from_none"]
    # An allowlist: directly, still nothing; through the proxy, the allowed address alone.
    seen = allowed["seen"]
    assert seen["own loopback"] == "connected" and seen["direct 127.0.0.1"] == "ConnectionRefusedError", seen
    assert seen[f"direct {own}"] != "connected", seen
    assert seen["proxied 127.0.0.1"].split()[1] == "200" and seen[f"proxied {own}"].split()[1] == "403", seen
    assert host.reached == ["127.0.0.1"], host.reached
    # Each attempt that left the capsule is recorded as decided (the live events): the two
    # proxied, and the direct one to the host's address, which the sniffer saw.
    assert allowed["decided"] == sorted([("127.0.0.1", "http", True), (own, "http", False), (own, "tcp", False)]), \
        allowed["decided"]
