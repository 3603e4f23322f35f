"""The sniffer parser and EgressSession fed real packets from an AF_PACKET socket.

In a network namespace the test makes (``unshare --net``; nothing leaves it), a child
raises ``lo``, opens an AF_PACKET SOCK_DGRAM socket on it as the helper's sniffer would
be (without the helper's BPF filter, so the session's own checks are what is tested:
SYN-ACKs, RSTs and the kernel's PACKET_OUTGOING copies must all be ignored), makes
proxy listeners on 127.0.0.1, and then: a TCP connect to a closed port (a SYN, refused
by RST), a UDP datagram on v4 and on v6, and one real connection to the proxy's own
listener.  The records come back as JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, socket, sys, trio
from sandbox.namespaces import loopback_up
from mcp_server.core.netrules import parse_network
from mcp_server.egress import sniff
from mcp_server.egress.session import EgressSession

loopback_up()
ETH_P_ALL = 0x0003
sniffer = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_ALL))
sniffer.bind(("lo", 0))
sniffer.setblocking(False)

def listener():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    return sock

http, socks_ = listener(), listener()
http_port = http.getsockname()[1]
spare = socket.socket()
spare.bind(("127.0.0.1", 0))
closed_port = spare.getsockname()[1]
spare.close()

raw = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_ALL))
raw.bind(("lo", 0))
raw.settimeout(2)

async def main():
    spec = parse_network(["127.0.0.1"])
    session = EgressSession(spec, http.detach(), socks_.detach(), sniffer.detach(), ["10.99.0.2"])
    seen = []
    async with trio.open_nursery() as nursery:
        await nursery.start(session.serve)
        session.begin_exec()
        probe = trio.socket.socket()
        try:
            await probe.connect(("127.0.0.1", closed_port))
        except ConnectionRefusedError:
            pass
        probe.close()
        for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            udp = trio.socket.socket(family, socket.SOCK_DGRAM)
            await udp.sendto(b"dns?", (address, 53))
            udp.close()
        client = await trio.open_tcp_stream("127.0.0.1", http_port)
        await client.send_all(b"CONNECT 10.9.9.9:80 HTTP/1.1\r\nHost: x\r\n\r\n")
        await client.receive_some()
        await client.aclose()
        await trio.sleep(0.3)
        records = session.end_exec()
        await session.aclose()
        nursery.cancel_scope.cancel()
    while True:
        try:
            packet, address = raw.recvfrom(65536)
        except TimeoutError:
            break
        parsed = sniff.parse_packet(packet)
        seen.append([address[2], None if parsed is None else [parsed.protocol, parsed.address, parsed.port]])
    print(json.dumps({"records": records, "raw": seen, "closed": closed_port, "http": http_port}))

trio.run(main)
"""


def test_real_packets_through_the_sniffer(require: object) -> None:
    require(os.geteuid() == 0, "needs root to make a network namespace")  # type: ignore[operator]
    require(shutil.which("unshare") is not None, "needs unshare(1)")  # type: ignore[operator]
    done = subprocess.run(
        ["unshare", "--net", sys.executable, "-c", CHILD],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    closed, http_port = result["closed"], result["http"]
    direct = [(r["protocol"], r["host"], r["port"], r["allowed"])
              for r in result["records"] if r["protocol"] in ("tcp", "udp")]
    assert sorted(direct) == [("tcp", "127.0.0.1", closed, False), ("udp", "127.0.0.1", 53, False),
                              ("udp", "::1", 53, False)]
    # The proxy's own connection (denied: no upstream connect to be seen) is an https record.
    proxied = [r for r in result["records"] if r["protocol"] == "https"]
    assert [(r["host"], r["port"], r["allowed"]) for r in proxied] == [("10.9.9.9", 80, False)]
    # What the raw socket saw: each packet twice on lo (outgoing, then host), the SYN to
    # the closed port and the one to the proxy parsed as attempts, the RST and SYN-ACK not.
    parsed = [tuple(entry[1]) for entry in result["raw"] if entry[1] is not None]
    assert ("tcp", "127.0.0.1", closed) in parsed and ("tcp", "127.0.0.1", http_port) in parsed
    assert {entry[0] for entry in result["raw"]} >= {0, 4}  # PACKET_HOST and PACKET_OUTGOING
    assert all(p[0] in ("tcp", "udp") for p in parsed)


pytestmark = pytest.mark.privileged
