"""A terminated connection's response body, from the upstream's TLS to the jail's (issue 38).

Split from egress/tlsterm.py along the seam between making the two TLS connections and
relaying a body through them; it works ``TlsWire``'s records and socket below the wire's
socket-like face (``_decrypted``, ``_seal``, ``_read_socket``, ``_flush``), which are
this module's to use as much as tlsterm.py's.

**A short response body is relayed in trio, a long one's rest in a worker thread.**  The
first ``BUFFER_SIZE`` of a body (``_copy_first``: most often all of it, read with its
head) goes in trio, waiting there as any socket does, so a short answer takes no
thread's round trip (its start, an eventfd, two wakeups); its last bytes and close_notify
leave in one send.  The rest of a longer body (``copy_to_eof``, as splice.py relays a
tunnel's) goes in a thread once the request has been sent whole: decrypted from the
upstream and encrypted for the jail in a plain loop of ``poll``, ``readv`` and ``write``, where the trio relay took
about four scheduler rounds a 256 KiB chunk.  The work per byte is the same (two AES-GCM
passes, the memory BIOs' copies, the kernel's), but the interpreter, trio's rounds mostly,
was a fifth of the proxy's CPU (perf: libpython 19% of its samples, libcrypto 33%, the
kernel 26%, libc's copies 17%).  The thread's loop takes the GIL only between its calls
into OpenSSL and the kernel, which release it.  A 200 MiB download of curl through the
proxy from ``openssl s_server``, both relays in the same runs beside a tunnel (7
interleaved rounds each, on the 2-core VM at load 3-6 from other work), medians: the
proxy's user CPU 0.68 -> 0.50 s, 0.61 -> 0.46 s, 0.59 -> 0.43 s; throughput against the
tunnel's 0.47x -> 0.51x, 0.44x -> 0.50x, 0.58x -> 0.73x.  The
thread is the only user of both TLS objects while it runs: the request's body has been sent
(nothing writes the upstream or reads the jail), and what a read of the upstream makes for
it to answer (a TLS 1.3 key update) is sent from the thread too.  kTLS would move the
encryption into the kernel and let the relay splice; this kernel is built without
``CONFIG_TLS`` and this Python has no ``OP_ENABLE_KTLS`` (3.12 added it), so neither is tried.
AES-128-GCM instead of AES-256-GCM (OpenSSL's first choice) would need ctypes to set TLS 1.3
suites; ``openssl speed`` gives 4.1 against 3.1 GB/s at 16 KiB, about 0.03 s of the
proxy's 0.2-0.45 s of CPU on 200 MiB: not tried in the repo.

**What a relay of any form reaches here.**  A prototype outside the repo (curl, a relay
process, ``openssl s_server``; 200 MiB; 15-31 interleaved rounds a run, eight runs at load
2-4) measured against a splice tunnel: memory BIOs as here 0.57-0.63x the tunnel's
throughput; a non-blocking ``ssl.SSLSocket`` filling 256 KiB with ``recv_into`` then
``sendall`` 0.56-0.71x, about 0.03x better on average (the BIOs' copies are saved, but a
syscall and a Python round come with every 16 KiB record); AES-128 on the jail's leg
(reachable in 3.11 only through ctypes on CPython's ``SSL_CTX``, not sound here) at most
0.03x more; 4 MiB socket buffers nothing; a relay written in C (OpenSSL's socket BIOs,
read-ahead, a 256 KiB buffer) 0.65-0.69x, 0.66-0.71x with AES-128 on the jail's leg.
Every form costs about 0.3 s of CPU per 200 MiB (two AES-GCM passes and the kernel's
copies; a splice tunnel 0.02-0.04 s), beside curl's and s_server's own 0.3-0.4 s on the
same two cores: about 0.7x is this machine's ceiling for termination in user space, and
the bench's target of 0.7x needs kTLS (``CONFIG_TLS`` and Python 3.12) to be met reliably.
So the relay stays as it is: rebuilding ``TlsWire`` on an ``SSLSocket`` (the ClientHello
then read with ``MSG_PEEK``, the close_notify and byte-cap rules redone) would buy 0.03x.
"""

from __future__ import annotations

import os
import select
import threading

import trio

from mcp_server.egress.relay import BUFFER_SIZE, Attempt, Budget, ByteCapReached, pump
from mcp_server.egress.splice import in_thread, threads_free
from mcp_server.egress.tlsterm import RECORD, TlsWire


def _wait(fd: int, event: int, stop: int) -> None:
    """Block until ``fd`` is ready for ``event``; BrokenPipeError once ``stop`` is readable (cancelled)."""
    poller = select.poll()
    poller.register(fd, event)
    poller.register(stop, select.POLLIN)
    if stop in dict(poller.poll()):
        raise BrokenPipeError("the relay was cancelled")


def _write_all(fd: int, data: bytes, stop: int) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            _wait(fd, select.POLLOUT, stop)


def _copy(src: TlsWire, dst: TlsWire, attempt: Attempt, budget: Budget, stop: int,
          stopping: threading.Event) -> bool:
    """``src``'s plaintext into ``dst`` until its end (``copy_to_eof``, in a worker thread); True if
    the budget cut it.  Blocking: waits in ``poll`` beside ``stop``, and a cancel ends it."""
    buffer = bytearray(BUFFER_SIZE)
    view = memoryview(buffer)
    upstream, jail = src.raw.fileno(), dst.raw.fileno()
    while not stopping.is_set():
        size, more = src._decrypted(view)
        if size:
            granted = dst._seal(view[:size], attempt, budget)
            _write_all(jail, dst.outgoing.read(), stop)
            if granted < size:
                return True
            continue
        if not more:
            return False
        _write_all(upstream, src.outgoing.read(), stop)  # what the reads made to answer, if anything
        try:
            src._read_socket()
        except BlockingIOError:
            _wait(upstream, select.POLLIN, stop)
    return False


async def _copy_first(src: TlsWire, dst: TlsWire, attempt: Attempt, budget: Budget) -> bool | None:
    """``src``'s plaintext into ``dst`` in trio, until its end (False), the budget's (True), or
    ``BUFFER_SIZE`` relayed (None: the rest is a bulk body, ``copy_to_eof``'s thread takes it on).
    Waits in trio, not in a thread; between waits it does at most ``BUFFER_SIZE`` of work."""
    buffer = bytearray(RECORD)
    view = memoryview(buffer)
    relayed = 0
    while relayed < BUFFER_SIZE:
        size, more = src._decrypted(view)
        if size:
            granted = dst._seal(view[:size], attempt, budget)
            relayed += granted
            if granted < size:
                await dst._flush()
                return True
            continue
        if not more:  # the body's end is the connection's (``Connection: close``): its last bytes and
            if src.peer_closed:  # close_notify go in one send, and ``finish`` has nothing left to say
                dst._notify_close()
            await dst._flush()
            return False
        await dst._flush()  # what the jail may have now, before any wait
        await src._flush()  # what the reads made to answer, if anything
        try:
            src._read_socket()
        except BlockingIOError:
            await trio.lowlevel.wait_readable(src.raw)
    await dst._flush()
    return None


async def copy_to_eof(src: TlsWire, dst: TlsWire, attempt: Attempt, budget: Budget) -> None:
    """A response body from the upstream's TLS to the jail's until its end (or the budget's:
    ByteCapReached).  Its first ``BUFFER_SIZE`` in trio (``_copy_first``): a short body, most
    often already read whole with its head, ends there, without a thread's round trip.  The
    rest in a worker thread while one is free (the module's notes), else by the trio relay.
    Only once the request has been sent whole: the thread must be the TLS objects' only user."""
    first = await _copy_first(src, dst, attempt, budget)
    if first is not None:
        if first:
            raise ByteCapReached
        return
    if not threads_free():
        await pump(src, dst, attempt, budget, outbound=False)
        return
    cut = []
    await in_thread(lambda stop, stopping: cut.append(_copy(src, dst, attempt, budget, stop, stopping)))
    if cut and cut[0]:
        raise ByteCapReached
