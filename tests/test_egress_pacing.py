"""The jail's side of the proxy is not paced: its listeners hand out Reno connections.

Whatever the host allows: a listener first gets a congestion control other than Reno
that this process may set (the allowed list, and the available one for root; BBR on this
VM), so that Reno afterwards is ``unpaced``'s doing, not the default's.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from pathlib import Path

import trio

from mcp_server.egress import splice
from mcp_server.egress.session import EgressSession
from tests.support.egress_harness import network

SYSCTL = Path("/proc/sys/net/ipv4")


def _congestion(sock: socket.socket) -> bytes:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0")


def _away_from_reno(sock: socket.socket) -> bytes:
    """Give ``sock`` the first congestion control other than Reno the kernel lets us set, and
    return what it has then (Reno only on a host that offers nothing else)."""
    offered = [(SYSCTL / name).read_bytes().split() for name in
               ("tcp_allowed_congestion_control", "tcp_available_congestion_control")]
    for name in dict.fromkeys(offered[0] + offered[1]):  # in order, each once
        if name != splice.UNPACED_CC:
            with contextlib.suppress(OSError):  # not allowed to us, or its module not loaded
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, name)
                break
    return _congestion(sock)


def test_an_unpaced_listener_accepts_reno_connections_whatever_the_default() -> None:
    with socket.socket() as plain:
        listener = trio.socket.from_stdlib_socket(plain)
        before = _away_from_reno(plain)
        plain.bind(("127.0.0.1", 0))
        plain.listen(4)
        splice.unpaced(listener)
        with socket.create_connection(plain.getsockname()) as client:
            accepted, _ = plain.accept()
            with accepted:
                assert _congestion(accepted) == splice.UNPACED_CC == b"reno", before
            default = (SYSCTL / "tcp_congestion_control").read_bytes().strip()
            assert _congestion(client) == default  # others keep the default


class RefusingListener:
    """A listener whose kernel refuses every congestion control: what ``unpaced`` asks of it."""

    def __init__(self) -> None:
        self.asked: list[tuple[int, int, bytes]] = []

    def setsockopt(self, level: int, option: int, value: bytes) -> None:
        self.asked.append((level, option, value))
        raise OSError(errno.EPERM, "not allowed")


def test_a_listener_refused_reno_keeps_its_default_and_nothing_fails() -> None:
    listener = RefusingListener()
    splice.unpaced(listener)  # type: ignore[arg-type]
    assert listener.asked == [(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"reno")]


def test_the_session_makes_both_of_its_listeners_unpaced() -> None:
    listeners = []
    for _ in range(2):
        sock = socket.socket()
        _away_from_reno(sock)
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
