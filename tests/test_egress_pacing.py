"""The jail's side of the proxy is not paced: its listeners hand out Reno connections."""

from __future__ import annotations

import os
import socket

import trio

from mcp_server.egress import splice
from mcp_server.egress.session import EgressSession
from tests.support.egress_harness import network


def _congestion(sock: socket.socket) -> bytes:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0")


def test_an_unpaced_listener_accepts_reno_connections_whatever_the_default() -> None:
    with socket.socket() as plain:
        listener = trio.socket.from_stdlib_socket(plain)
        listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"bbr")  # paced, as on this VM
        plain.bind(("127.0.0.1", 0))
        plain.listen(4)
        splice.unpaced(listener)
        with socket.create_connection(plain.getsockname()) as client:
            accepted, _ = plain.accept()
            with accepted:
                assert _congestion(accepted) == splice.UNPACED_CC == b"reno"
            with open("/proc/sys/net/ipv4/tcp_congestion_control", "rb") as default:
                assert _congestion(client) == default.read().strip()  # others keep the default


def test_the_session_makes_both_of_its_listeners_unpaced() -> None:
    listeners = []
    for _ in range(2):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(4)
        listeners.append(sock)
    # The session takes the descriptors over; duplicates show what it did to the sockets.
    duplicates = [socket.socket(fileno=os.dup(sock.fileno())) for sock in listeners]
    sniffer, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    session = EgressSession(network("127.0.0.1"), listeners[0].detach(), listeners[1].detach(),
                            sniffer.detach(), ["10.99.0.2"])
    try:
        assert [_congestion(sock) for sock in duplicates] == [b"reno", b"reno"]
    finally:
        trio.run(session.aclose)
        for sock in (*duplicates, peer):
            sock.close()
