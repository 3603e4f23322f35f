"""mcp_server/egress/peer.py: the sock_diag request and reply on made-up bytes, and who owns
the other end of real loopback connections (IPv4, IPv6, dual-stack; closed, reset, half-closed)."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import struct
from collections.abc import Iterator

import pytest
import trio

from mcp_server.egress import peer

ME = os.geteuid()  # a socket's owner is its maker's fsuid, which follows the euid


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@contextlib.contextmanager
def connection(family: int = socket.AF_INET, host: str = "127.0.0.1",
               client_family: int | None = None, connect_to: str | None = None,
               ) -> Iterator[tuple[socket.socket, socket.socket, socket.socket]]:
    """(listener, client, accepted) on loopback, all closed after."""
    with contextlib.ExitStack() as stack:
        listener = stack.enter_context(socket.socket(family))
        listener.bind((host, 0))
        listener.listen(8)
        client = stack.enter_context(socket.socket(client_family or family))
        client.connect((connect_to or host, listener.getsockname()[1]))
        accepted = stack.enter_context(listener.accept()[0])
        yield listener, client, accepted


def _reply(uid: int, inode: int, src: tuple[str, int], dst: tuple[str, int], family: int = socket.AF_INET) -> bytes:
    """An ``inet_diag_msg`` as the kernel sends it (one attribute after it, as 6.18 adds)."""
    def packed(address: str) -> bytes:
        return socket.inet_pton(family, address).ljust(16, b"\0")

    body = struct.pack("=BBBBHH16s16sIIIIIIII", family, 1, 0, 0, socket.htons(src[1]), socket.htons(dst[1]),
                       packed(src[0]), packed(dst[0]), 0, 1, 2, 0, 0, 0, uid, inode)
    body += struct.pack("=HHB3x", 5, 8, 0)  # INET_DIAG_SHUTDOWN
    return struct.pack("=IHHII", 16 + len(body), peer.SOCK_DIAG_BY_FAMILY, 0, 1, 0) + body


def _error(code: int) -> bytes:
    body = struct.pack("=i", -code) + bytes(16)  # the error, then the request's header
    return struct.pack("=IHHII", 16 + len(body), 2, 0, 1, 0) + body


CLIENT, US = ("127.0.0.1", 40000), ("127.0.0.1", 8080)


def test_the_request_is_an_exact_tcp_lookup_of_the_clients_tuple() -> None:
    data = peer.request(CLIENT, US)
    length, kind, flags = struct.unpack_from("=IHH", data)
    assert (length, kind, flags) == (len(data), peer.SOCK_DIAG_BY_FAMILY, 0x1)  # NLM_F_REQUEST, no NLM_F_DUMP
    family, protocol, _ext, _pad, _states, sport, dport, src, dst, ifindex, *cookie = struct.unpack_from(
        "=BBBBI2s2s16s16sIII", data, 16)
    assert (family, protocol) == (socket.AF_INET, socket.IPPROTO_TCP)
    assert (sport, dport) == (struct.pack("!H", 40000), struct.pack("!H", 8080))  # network order
    assert (src, dst) == (bytes([127, 0, 0, 1]) + bytes(12), bytes([127, 0, 0, 1]) + bytes(12))
    assert (ifindex, cookie) == (0, [0xFFFFFFFF, 0xFFFFFFFF])  # no cookie to match


def test_an_ipv4_mapped_address_is_looked_up_as_ipv4_and_families_do_not_mix() -> None:
    assert peer.request(("::ffff:127.0.0.1", 40000), ("::ffff:127.0.0.1", 8080)) == peer.request(CLIENT, US)
    six = peer.request(("::1", 40000), ("::1", 8080), scope_id=3)
    family, *_, src, dst, ifindex = struct.unpack_from("=BBBBIHH16s16sI", six, 16)
    assert (family, src, dst, ifindex) == (socket.AF_INET6, bytes(15) + b"\1", bytes(15) + b"\1", 3)
    with pytest.raises(ValueError, match="not of one family"):
        peer.request(("::1", 40000), US)


def test_the_reply_gives_the_uid_only_for_a_socket_a_process_holds_with_the_tuple_asked() -> None:
    assert peer.parse_reply(_reply(1234, 99, CLIENT, US), CLIENT, US) == 1234
    # What is left of a closed client: a time-wait mini-socket says uid 0, inode 0.
    assert peer.parse_reply(_reply(0, 0, CLIENT, US), CLIENT, US) is None
    # The kernel's fallback to a listener on the client's old port, with its owner.
    assert peer.parse_reply(_reply(0, 99, CLIENT, ("0.0.0.0", 0)), CLIENT, US) is None
    assert peer.parse_reply(_reply(1234, 99, US, CLIENT), CLIENT, US) is None  # the reversed tuple: ours
    assert peer.parse_reply(_error(errno.ENOENT), CLIENT, US) is None
    with pytest.raises(OSError) as raised:
        peer.parse_reply(_error(errno.EINVAL), CLIENT, US)
    assert raised.value.errno == errno.EINVAL
    # A dual-stack client's socket answers in IPv6 with mapped addresses.
    mapped = _reply(1234, 99, ("::ffff:127.0.0.1", 40000), ("::ffff:127.0.0.1", 8080), socket.AF_INET6)
    assert peer.parse_reply(mapped, CLIENT, US) == 1234
    assert peer.parse_reply(b"", CLIENT, US) is None


def test_an_ipv4_connection_is_the_callers_own() -> None:
    with connection() as (listener, client, accepted):
        assert peer.peer_uid(accepted) == ME
        # The listener itself is found by its own end alone (the forward's start-up check).
        assert peer.socket_uid(listener.getsockname(), ("0.0.0.0", 0)) == ME
        # Our own end, asked as if it were the client's, is our accepted socket: also ours,
        # and found only under the reversed tuple.
        assert peer.socket_uid(accepted.getsockname(), accepted.getpeername()) == ME
        assert client.getsockname() == accepted.getpeername()


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_ipv6_and_a_dual_stack_client() -> None:
    with connection(socket.AF_INET6, "::1") as (_listener, _client, accepted):
        assert peer.peer_uid(accepted) == ME
    # An IPv6 socket connecting to a mapped address: an IPv4 connection the kernel hashes as such.
    with connection(client_family=socket.AF_INET6, connect_to="::ffff:127.0.0.1") as (_listener, _client, accepted):
        assert accepted.getpeername()[0] == "127.0.0.1"
        assert peer.peer_uid(accepted) == ME


def test_a_trio_socket_is_asked_the_same_way() -> None:
    with connection() as (_listener, _client, accepted):
        assert peer.peer_uid(trio.socket.from_stdlib_socket(accepted)) == ME


def test_a_half_closed_client_is_found_and_a_closed_one_is_not() -> None:
    with connection() as (_listener, client, accepted):
        client.shutdown(socket.SHUT_WR)
        assert accepted.recv(1) == b""  # its FIN has arrived
        assert peer.peer_uid(accepted) == ME
        client.close()
        assert peer.peer_uid(accepted) is None  # FIN_WAIT2 / time-wait: inode 0, uid 0 whoever it was


def test_a_client_closed_with_unsent_data_is_not_found() -> None:
    with connection() as (_listener, client, accepted):
        accepted.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            while True:
                client.send(bytes(65536))
        client.close()  # an orphan in FIN_WAIT1 with its real uid, but no process holds it
        assert peer.peer_uid(accepted) is None


def test_a_reset_client_is_not_found_even_with_a_listener_on_its_old_port() -> None:
    with connection() as (_listener, client, accepted):
        ends = (accepted.getpeername(), accepted.getsockname())
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # a reset: the socket is gone at once
        assert peer.socket_uid(*ends) is None
        with socket.socket() as squatter:  # the kernel's listener fallback would name this one
            squatter.bind(ends[0])
            squatter.listen(1)
            assert peer.socket_uid(ends[0], ("0.0.0.0", 0)) == ME
            assert peer.socket_uid(*ends) is None


def test_a_socket_that_is_not_tcp_ip_is_refused_plainly() -> None:
    left, right = socket.socketpair()
    with left, right, pytest.raises(ValueError, match="not a TCP/IP socket address"):
        peer.peer_uid(left)
