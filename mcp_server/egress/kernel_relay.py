"""A forwarded connection relayed by the kernel: its two sockets entered in the socket hashes
the helper made (sandbox/sockmap.py), and this process watching only for their ends.

Some facts this module follows from (kernel 6.18; sandbox/sockmap.py has the rest):

- Once a socket is in ``members``, the verdict takes each skb it receives before ``recv``
  could, and the kernel's worker sends it out of the peer.  Bytes a socket received
  *before* it was entered wait in its receive queue until the next arrival wakes the
  verdict, which then takes the whole queue in order.  A client may well have sent its
  request and be waiting for the answer, so nothing would arrive: setting
  ``SO_RCVLOWAT`` (to its default, 1) makes TCP check for readable data at once, which
  runs the verdict over the queue (``tcp_set_rcvlowat`` calls ``sk_data_ready``).  The
  queue is never read here, so no byte can overtake another.
- Order of entry: both sockets into ``peers`` first (no program there), then both into
  ``members``; a verdict whose peer is missing would drop bytes.
- Half-close.  The verdict drops a FIN's empty skb; the socket reads EOF (``recv``
  returns 0) and polls readable, which is all this process waits for.  Its bytes may
  still sit in the peer's queue for the kernel's worker, so the EOF is passed on
  (``shutdown(SHUT_WR)`` of the peer) only when the peer has taken every byte the
  socket received: ``tcpi_bytes_received`` of the socket (less one for the FIN, which
  counts as a byte there) against what the peer's TCP has been given since the entry,
  ``tcpi_bytes_acked`` plus ``SIOCOUTQ`` (read in that order: an ACK in between can only
  make it seem less).  Nothing wakes a process when the worker is done, so the wait
  polls: ``YIELDS`` turns of the trio loop, then sleeps doubling up to ``MAX_WAIT_S``.
- A reset (``recv`` fails) ends both sides.  Closing a socket takes it out of both maps.
- No backpressure: the worker's queue for a peer that sends slowly is not bounded by
  the peer's buffers (the receiving socket's window stays open while the verdict takes
  its bytes, and the queued skbs are charged to no socket).  An upload to a service that
  reads slowly, or a download to a client that reads slowly, is held in kernel memory
  until read (tried: 96 MiB sent to a service that did not read were all taken within
  about 0.1 s).  Only the capsule's owner's connections pass the forward, but the memory
  is the host's.  Tried and not kept: a guard that took a socket out of ``members`` past
  a bound and put it back (kicked) under half of it, with the verdict counting the bytes
  it handed on in a third map so that the rest could be told exactly.  Across such a
  pause the kernel delivered bytes twice (a 96 MiB upload arrived as 96.7 MiB, nothing
  read in user space), so a socket is never taken out of a map while its pair lives.

Cost, on the project's 2-core VM: see forward.py (the bench's figures).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import socket
import struct
import termios

import trio

from mcp_server.egress.relay import send_all
from sandbox import syscalls

BPF_MAP_UPDATE_ELEM = 2
BPF_NOEXIST = 1  # a cookie is never reused, so an entry is only ever added
SO_COOKIE = 57  # <asm-generic/socket.h>
TCP_CLOSE = 7
# struct tcp_info: tcpi_state is its first byte; tcpi_bytes_acked and tcpi_bytes_received
# are u64s at 120 and 128 (since 4.1 / 4.2).
_INFO_SIZE = 136
_ACKED_RECEIVED = struct.Struct("=QQ")
_ACKED_AT = 120
MAX_WAIT_S = 0.01
YIELDS = 8  # turns of the trio loop before the wait for the worker sleeps
_COOKIE = struct.Struct("=Q")


def cookie(sock: socket.socket | trio.socket.SocketType) -> int:
    """The socket's kernel-wide unique id (``SO_COOKIE``)."""
    value: int = _COOKIE.unpack(sock.getsockopt(socket.SOL_SOCKET, SO_COOKIE, _COOKIE.size))[0]
    return value


def _info(sock: trio.socket.SocketType) -> tuple[int, int, int]:
    """(state, bytes acked, bytes received) from ``TCP_INFO``."""
    raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _INFO_SIZE)
    acked, received = _ACKED_RECEIVED.unpack_from(raw, _ACKED_AT)
    return raw[0], acked, received


def written(sock: trio.socket.SocketType) -> int:
    """Bytes given to the socket's TCP so far: acknowledged, then still queued."""
    _state, acked, _received = _info(sock)
    queued = struct.unpack("=i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
    return acked + queued


class NotJoined(OSError):
    """The kernel would not take a pair; neither socket is diverted."""


class Sockmap:
    """The two socket hashes of one forward (their descriptors are this object's to close)."""

    def __init__(self, peers: int, members: int) -> None:
        self.peers = peers
        self.members = members
        self.joined = 0  # pairs the kernel took
        self.read_here = 0  # bytes of joined pairs that reached this process all the same (none should)

    def _enter(self, map_fd: int, key: int, sock: trio.socket.SocketType) -> None:
        key_buf = ctypes.create_string_buffer(_COOKIE.pack(key), _COOKIE.size)
        value = ctypes.create_string_buffer(_COOKIE.pack(sock.fileno()), _COOKIE.size)
        syscalls.bpf(BPF_MAP_UPDATE_ELEM, struct.pack("=IIQQQ", map_fd, 0, ctypes.addressof(key_buf),
                                                       ctypes.addressof(value), BPF_NOEXIST))

    def join(self, one: trio.socket.SocketType, other: trio.socket.SocketType) -> None:
        """From now on the kernel moves what either receives out of the other.  ``NotJoined``
        if the kernel refused before either was diverted (the caller may relay them itself),
        OSError if after."""
        first, second = cookie(one), cookie(other)
        try:
            self._enter(self.peers, first, other)
            self._enter(self.peers, second, one)
            self._enter(self.members, first, one)
        except OSError as exc:
            raise NotJoined(exc.errno, f"the socket hashes refused a connection: {exc.strerror}") from None
        self._enter(self.members, second, other)
        for sock in (one, other):  # run the verdict over what arrived before (module notes)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
        self.joined += 1

    async def relay(self, client: trio.socket.SocketType, capsule: trio.socket.SocketType) -> None:
        """Relay both ways until both ends are done or one fails, then close both; but
        ``NotJoined``, both left open, if the kernel would not take them."""
        marks = {client: written(client), capsule: written(capsule)}
        try:
            self.join(client, capsule)
        except NotJoined:
            raise
        except BaseException:
            capsule.close()
            client.close()
            raise
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch, client, capsule, marks[capsule], nursery.cancel_scope)
                nursery.start_soon(self._watch, capsule, client, marks[client], nursery.cancel_scope)
        finally:
            capsule.close()
            client.close()

    async def _watch(self, src: trio.socket.SocketType, dst: trio.socket.SocketType, mark: int,
                     both: trio.CancelScope) -> None:
        """Wait for ``src``'s EOF and pass it on once ``dst`` has taken its bytes; a failure ends both."""
        try:
            while data := await src.recv(1 << 16):  # wakes at EOF: the verdict takes every byte
                self.read_here += len(data)
                await send_all(dst, data)  # not diverted (it should not happen): passed on in order
            target = _info(src)[2] - 1  # the FIN counts as one
            turns = 0
            while written(dst) - mark < target:
                if _info(dst)[0] == TCP_CLOSE:
                    raise ConnectionResetError("the other side is gone")
                # The worker usually needs a moment: let others run a few times, then sleep longer and longer.
                await trio.sleep(0 if turns < YIELDS else min(MAX_WAIT_S, 25e-6 * (1 << min(turns - YIELDS, 9))))
                turns += 1
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            both.cancel()

    def close(self) -> None:
        for fd in (self.peers, self.members):
            with contextlib.suppress(OSError):
                os.close(fd)
