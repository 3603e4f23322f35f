"""Zero-copy relay for tunnels: ``splice(2)`` through a pipe, in a worker thread.

Some facts about splice, as the relay uses it:

- ``splice`` moves data between a pipe and another descriptor without bringing it into
  user space.  Socket to socket takes two calls through a pipe: the receive side hands
  the socket's buffer pages to the pipe (no copy), and the send side copies them once
  into the outgoing socket's buffers.  A recv/send relay copies twice, through Python
  objects, and pays trio's scheduling per chunk; on loopback the difference is the
  difference between meeting the 0.8x target and missing it (figures below).
- A pipe holds 64 KiB by default; ``F_SETPIPE_SZ`` raises it up to
  ``/proc/sys/fs/pipe-max-size`` (1 MiB by default, for root too without
  CAP_SYS_RESOURCE).  Bigger pipes mean fewer calls per byte.
- With ``SPLICE_F_NONBLOCK`` and non-blocking sockets nothing blocks, so one thread
  serves both directions of a tunnel with ``poll``; it also polls an eventfd that trio
  writes when the relay is cancelled (``aclose``), and the sockets are closed only
  after the thread has returned, so it never touches a reused descriptor number.
- Bytes are charged to the exec's budget before they enter the pipe (``take`` grants at
  most what is left; what a short splice did not use is refunded), so the byte cap is
  exact here as in the trio relay.  The budget is shared with trio tasks and other
  threads, hence its lock.

Throughput (measured for issue 15): a 200 MiB download by curl from a loopback server
that answers with sendfile, direct and through an EgressSession on loopback listeners,
rounds interleaved (direct, then each path), on the project's 2-core VM while other
work shared it.  Medians, as time and as direct/proxied:

    run (rounds)  direct   spliced: absolute-form  CONNECT      SOCKS5       trio relay: CONNECT
    A (7)         131 ms   165 ms 0.80x            160 ms 0.82x 183 ms 0.72x 208 ms 0.63x
    B (11)         84 ms   166 ms 0.50x            158 ms 0.53x 148 ms 0.57x 196 ms 0.43x

Splicing is 20-25% faster than the trio relay (recv_into/send on 256 KiB memoryviews)
and is kept.  The proxy itself is not the bottleneck: strace counts about 450 splices
of ~450 KiB each per download, and the relay thread uses about 0.05-0.08 s of CPU per
200 MiB, like curl's own 0.07 s and the server's 0.06 s.  The gap to direct is three
busy parties (server, relay, curl) on two cores against two, and a second pass through
the loopback TCP stack; it is widest when the direct download is fastest (run B, 2.5
GB/s).  Two threads per direction (reader and writer around the pipe) measured no
better.  The 0.8x target is met only when the machine is otherwise quiet (run A).

The same through a real capsule (wire's ``bench/run.py network``: curl in the jail,
across the capsule's veth to this relay, then the host's veth to a server namespace,
100 MiB, 15 interleaved rounds): spliced 1084 MiB/s against the host's 1718, 0.63x;
with the trio relay 701 against 1452, 0.48x.  An MTU of 65535 on the capsule's veth
(a scratch change to the helper) measured 0.58x, no better.

Pacing, and why the jail's side uses Reno (``unpaced``).  ``perf record -a -g`` during
those downloads put the relay thread at about 2.4 times curl's CPU (35% of all samples
on the 2 cores against curl's 15%), and a third of the relay's samples at one spot:
``tcp_write_xmit`` releasing an irq-safe lock, under ``splice_to_socket``, with
``tcp_pace_kick``/``tcp_tsq_handler`` from the hrtimer softirq beside it.  That is TCP's
internal pacing: this system's default congestion control is BBR (as on many hosts),
BBR asks for pacing, and without an ``fq`` qdisc the kernel paces each socket itself,
arming an hrtimer per burst; in a VM every timer reprogramming is a trap to the
hypervisor.  The jail's side of a tunnel is a veth in memory, where pacing buys nothing,
so its connections use Reno (no pacing); the upstream side keeps the system's choice,
since it is the real network.  It has to be set on the listeners: a connection that
starts with BBR stays paced after a switch.  With it the relay's share of samples fell
from 35% to 19% (curl's stayed), about 0.11 s of relay CPU per 400 MiB by its
/proc stat, some 800 fills of ~520 KiB and 100 polls.  Interleaved in one run (the
listeners switched between BBR and Reno before each download, host direct beside
them, 11 rounds, medians):

    size      host       BBR (before)    Reno (kept)
    400 MiB   2207 MiB/s 1265 0.57x      1916 0.87x
    100 MiB   2119 MiB/s 1203 0.57x      1733 0.82x

The bench itself (``bench/run.py network``, 100 MiB, 15 rounds), run alternately with
the listeners' congestion control forced to BBR and left at Reno, three times each on a
quiet VM: BBR 0.648x, 0.556x, 0.629x (about 1000 MiB/s against the host's 1520-1840);
Reno 0.831x, 0.820x, 0.938x (1450-1550 MiB/s against 1620-1860); two more Reno runs,
0.711x (other sessions busy) and 0.919x.  So the target is met on a quiet machine and
missed when the two cores are shared.  With the server's link shaped to 1 Gbit/s (the
bench's second row) the proxy costs nothing: 114.2 against 114.4 MiB/s, 0.998x, every run.

Tried and not kept, each interleaved against the same run's baseline on the loaded
VM: SO_SNDBUF of 4 MiB on the jail's socket (0.61x against 0.64x), that with
SO_RCVBUF 4 MiB on the upstream socket (0.53x); no better, within the noise.
PACKET_IGNORE_OUTGOING on the sniffer (its filter drops outgoing packets, but only
after the kernel has cloned each one for it; ``dev_queue_xmit_nit`` was about 2% of
the relay's samples): three runs of 11 rounds, 400 MiB, medians 1570/1944/1476 MiB/s
without against 1758/2245/1527 with, and the relay's CPU per download 106/101 ms
without against 98/107 ms with; not clearly better, so the helper's sniffer is left
as it is.  What is
left of the gap is the second TCP stack pass: the relay's send carries curl's receive
processing (the veth hands each packet to the receiving socket in the sender's softirq).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass

import trio

from mcp_server.egress.relay import Attempt, Budget, ByteCapReached, charge_and_send, pump, relay

F_SETPIPE_SZ = 1031  # linux/fcntl.h (F_LINUX_SPECIFIC_BASE + 7)
PIPE_SIZE = 1 << 20
_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
# Worker threads for spliced relays at once; a tunnel beyond them uses the trio relay.
THREADS = trio.CapacityLimiter(64)
UNPACED_CC = b"reno"  # the jail side's congestion control (``unpaced``)
ENABLED = True  # False: always the trio relay (tests cover both; a bench compares them)


def threads_free() -> bool:
    """True if a relay may run in a worker thread now: ``THREADS`` has one, and ``ENABLED``."""
    return ENABLED and THREADS.available_tokens >= 1


def _pipe() -> tuple[int, int]:
    read_end, write_end = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    with contextlib.suppress(OSError):  # above pipe-max-size: keep the default 64 KiB
        fcntl.fcntl(write_end, F_SETPIPE_SZ, PIPE_SIZE)
    return read_end, write_end


@dataclass
class Direction:
    """One way of a tunnel: ``src`` into the pipe, the pipe into ``dst``."""

    src: int
    dst: int
    outbound: bool  # jail -> upstream
    half_close: Callable[[], None]  # shutdown(SHUT_WR) of dst, at src's EOF
    pipe_read: int = -1
    pipe_write: int = -1
    pending: int = 0  # bytes in the pipe, already charged and counted
    eof: bool = False
    closed: bool = False

    @property
    def done(self) -> bool:
        return self.eof and not self.pending


def _fill(way: Direction, attempt: Attempt, budget: Budget) -> bool | None:
    """Splice what ``src`` has into the pipe, charged after the fact: True if bytes moved
    (or EOF), None if there were none yet, False when the budget ran out (cut)."""
    try:
        moved = os.splice(way.src, way.pipe_write, PIPE_SIZE, flags=_FLAGS)
    except BlockingIOError:
        return None
    except ConnectionResetError:
        moved = 0
    if moved == 0:
        way.eof = True
        return True
    granted = attempt.charge(budget, moved, way.outbound)
    way.pending += granted  # bytes past the cap stay in the pipe and die with it
    return granted == moved


def _drain(way: Direction) -> bool:
    """Splice the pipe into ``dst``; True if anything moved (or the EOF was passed on)."""
    before = way.pending
    with contextlib.suppress(BlockingIOError):
        while way.pending:
            way.pending -= os.splice(way.pipe_read, way.dst, way.pending, flags=_FLAGS)
    if way.done and not way.closed:
        way.closed = True
        with contextlib.suppress(OSError):
            way.half_close()
        return True
    return way.pending < before


def _wait(ways: list[Direction], stop: int) -> bool:
    """Poll until some direction can move; False when ``stop`` says to give up.

    A tunnel's two directions use the same two sockets, and ``poll`` keeps one mask per
    descriptor (a second ``register`` replaces the first): so the masks are ORed per
    descriptor, else one direction waiting to write a socket and the other waiting to
    read it would wake on only one of the two, and traffic both ways beyond the socket
    buffers could stall for good."""
    masks: dict[int, int] = {stop: select.POLLIN}
    for way in ways:
        if way.done:
            continue
        fd, event = (way.dst, select.POLLOUT) if way.pending else (way.src, select.POLLIN)
        masks[fd] = masks.get(fd, 0) | event
    poller = select.poll()
    for fd, mask in masks.items():
        poller.register(fd, mask)
    return stop not in dict(poller.poll())


def _step(way: Direction, attempt: Attempt, budget: Budget) -> bool | None:
    """One round for one direction: fill if the pipe is empty, then drain.  True if it
    moved anything, None if it had nothing to do, False when cut."""
    filled: bool | None = None
    if not way.pending and not way.eof:
        filled = _fill(way, attempt, budget)
    drained = _drain(way) if way.pending or (way.eof and not way.closed) else False
    if filled is False:
        return False
    return True if filled or drained else None


def splice_relay(ways: list[Direction], stop: int, stopping: threading.Event, attempt: Attempt,
                 budget: Budget) -> None:
    """Move bytes every way until all reach EOF, the budget runs out, a socket fails or
    ``stop`` becomes readable (trio also sets ``stopping``, checked while data flows).  Runs
    in a worker thread; closes only its pipes.

    While data flows it splices without polling (a poll per chunk costs more than the
    chunk on loopback); it polls only when no direction moved anything."""
    for way in ways:
        way.pipe_read, way.pipe_write = _pipe()
    try:
        while not all(way.done for way in ways) and not stopping.is_set():
            moved = False
            for way in ways:
                if way.done:
                    continue
                step = _step(way, attempt, budget)
                if step is False:
                    return
                moved = moved or bool(step)
            if not moved and not _wait(ways, stop):
                return
    except OSError as exc:
        if exc.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
            raise
    finally:
        for way in ways:
            os.close(way.pipe_read)
            os.close(way.pipe_write)


def unpaced(listener: socket.socket | trio.socket.SocketType) -> None:
    """Give the connections ``listener`` accepts a congestion control without pacing.

    The jail's side of a tunnel is a veth in memory; pacing it only costs timers (see
    the module's notes).  Set on the listener, before the handshake: a connection made
    with BBR stays paced after a switch, since the kernel never clears the pacing
    status BBR set.  Reno is built into every kernel and open to unprivileged callers
    (cubic is not, for uid 65534 on this VM); if even Reno fails, the connection keeps
    the system's default."""
    with contextlib.suppress(OSError):
        listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, UNPACED_CC)


def _direction(src: trio.socket.SocketType, dst: trio.socket.SocketType, outbound: bool) -> Direction:
    return Direction(src.fileno(), dst.fileno(), outbound, lambda: dst.shutdown(socket.SHUT_WR))


async def _run(ways: list[Direction], attempt: Attempt, budget: Budget) -> None:
    """``splice_relay`` in a worker thread; cancelling this wakes the thread and waits for it."""
    await in_thread(lambda stop, stopping: splice_relay(ways, stop, stopping, attempt, budget))


async def in_thread(work: Callable[[int, threading.Event], None]) -> None:
    """``work(stop, stopping)`` in a worker thread (one of ``THREADS``); cancelling this sets
    ``stopping`` and makes the eventfd ``stop`` readable (for a thread waiting in ``poll``), then
    waits for the thread to return, so the caller closes its sockets only once it has."""
    stop = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
    stopping = threading.Event()

    async def wake_on_cancel() -> None:
        try:
            await trio.sleep_forever()
        finally:
            stopping.set()
            os.eventfd_write(stop, 1)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wake_on_cancel)
            await trio.to_thread.run_sync(work, stop, stopping, limiter=THREADS)
            nursery.cancel_scope.cancel()
    finally:
        os.close(stop)


async def tunnel(jail: trio.socket.SocketType, upstream: trio.socket.SocketType, attempt: Attempt,
                 budget: Budget, first: bytes = b"") -> None:
    """Relay a tunnel both ways (``first``: bytes already read from the jail), then close
    both sockets; spliced in a thread while one is free, else ``relay.relay``."""
    if not threads_free():
        await relay(jail, upstream, attempt, budget, first)
        return
    try:
        if first:
            await charge_and_send(upstream, first, attempt, budget, outbound=True)
        await _run([_direction(jail, upstream, True), _direction(upstream, jail, False)], attempt, budget)
    except* (ByteCapReached, OSError):
        pass  # the record says what happened
    finally:
        upstream.close()
        jail.close()


async def copy_to_eof(src: trio.socket.SocketType, dst: trio.socket.SocketType, attempt: Attempt,
                      budget: Budget, outbound: bool) -> None:
    """One way until ``src``'s EOF (a response body); spliced when a thread is free."""
    if not threads_free():
        await pump(src, dst, attempt, budget, outbound)
        return
    await _run([_direction(src, dst, outbound)], attempt, budget)
