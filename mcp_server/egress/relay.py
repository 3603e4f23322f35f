"""What the HTTP proxy and the SOCKS server share: attempts, the gate, upstream, the relay.

A connection from the jail becomes an ``Attempt`` (the record the exec reports) when the
gate admits it; the gate is the ``EgressSession`` (``Gate`` here names only what the
protocol handlers call, so they need not import the session).  ``connect_upstream``
resolves an allowed name from the host's network namespace, reads the host's space
(its addresses and resolvers, ``hostspace.py``) once the answer is in, keeps only the
addresses ``netspace.refusal`` lets through and connects to the first that answers:
the address judged is the address connected to, so a DNS answer that changes between
check and connect changes nothing.  ``relay``
copies bytes both ways until both sides are done, charging them to the exec's byte
budget and cutting the connection when it runs out.

Tunnels and response bodies are normally spliced in a worker thread (``splice.py``,
which has the throughput figures); ``relay`` and ``pump`` here are the trio relay used
when no splice thread is free: each direction reuses one 256 KiB buffer (``recv_into``
and ``send`` on memoryviews, no bytes object per chunk).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import trio

from mcp_server.core import netrules, netspace

BUFFER_SIZE = 256 * 1024
CONNECT_TIMEOUT = 10.0  # seconds for one address; up to MAX_ADDRESSES are tried
MAX_ADDRESSES = 4
DIRECT_REASON = "direct connection outside ccw's proxy (use HTTP_PROXY/ALL_PROXY)"

Protocol_ = Literal["http", "https", "socks5", "tcp", "udp"]
Resolver = Callable[[str, int], Awaitable[list[str]]]
SpaceReader = Callable[[], netspace.HostSpace]


class Wire(Protocol):
    """What the relay reads and writes: a trio socket, or a TLS stream the proxy terminated
    (egress/tlsterm.py ``TlsWire``)."""

    def recv(self, buflen: int, /) -> Awaitable[bytes]: ...

    def recv_into(self, buffer: bytearray, /) -> Awaitable[int]: ...

    def send(self, data: memoryview, /) -> Awaitable[int]: ...

    def shutdown(self, how: int, /) -> None: ...

    def close(self) -> None: ...


@dataclass
class Attempt:
    """One connection attempt of an exec, as its record will say it."""

    seq: int
    host: str
    port: int
    protocol: Protocol_
    allowed: bool
    rule: str | None
    reason: str | None
    address: str | None = None
    bytes_out: int = 0  # jail -> upstream
    bytes_in: int = 0  # upstream -> jail
    cut: str | None = None
    rules: str | None = None  # the id of the rules it was decided by (netrules.rules_id)
    asked: dict[str, object] | None = None  # a miss asked of a person: the question, its answer, who gave it
    request: str | None = None  # method and path of a request judged by method/path rules (egress/ruled.py)
    tls: str | None = None  # "terminated": the proxy decrypted it to judge each request (egress/tlsterm.py)

    def record(self) -> dict[str, object]:
        """The record in the exec result's ``touched.network``."""
        return {
            "host": self.host,
            "port": self.port,
            "protocol": self.protocol,
            "allowed": self.allowed,
            "rule": self.rule,
            "reason": self.reason,
            "address": self.address,
            "bytes_out": self.bytes_out,
            "bytes_in": self.bytes_in,
            "cut": self.cut,
            "rules": self.rules,
            **({"asked": self.asked} if self.asked is not None else {}),
            **({"request": self.request} if self.request is not None else {}),
            **({"tls": self.tls} if self.tls is not None else {}),
        }

    def sort_key(self) -> tuple[str, int, str, int]:
        """Records are sorted by (host, port, protocol, seq)."""
        return (self.host, self.port, self.protocol, self.seq)

    def charge(self, budget: Budget, size: int, outbound: bool) -> int:
        """Charge ``size`` moved bytes to the exec's budget and count what it granted; a
        short grant marks the record cut (the caller stops relaying)."""
        granted = budget.take(size)
        if outbound:
            self.bytes_out += granted
        else:
            self.bytes_in += granted
        if granted < size:
            self.cut = budget.cap_text()
        return granted

    def deny(self, reason: str) -> None:
        """Turn an admitted attempt into a denial (rebinding found after resolution)."""
        self.allowed, self.reason = False, reason

    def note(self) -> str | None:
        """The line the agent reads for a denial or a connection the byte cap cut; None
        for an allowed connection that ran its course."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        if not self.allowed:
            return f"ccw network: denied {self.protocol} {host}:{self.port}: {self.reason}"
        if self.cut is not None:
            return (f"ccw network: cut {self.protocol} {host}:{self.port} "
                    f"after {self.bytes_in + self.bytes_out} bytes: {self.cut}")
        return None


class Refused(Exception):
    """No upstream connection: ``denied`` (policy: 403 / SOCKS 0x02) or a failure (502)."""

    def __init__(self, message: str, *, denied: bool, refused: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.denied = denied
        self.refused = refused  # the upstream said ECONNREFUSED (SOCKS 0x05)


class ByteCapReached(Exception):
    """The exec's byte budget ran out in the middle of a relay."""


class Budget(Protocol):
    """The exec's remaining bytes."""

    def take(self, wanted: int) -> int:
        """Charge up to ``wanted`` bytes; returns how many may pass (0 when spent)."""
        ...

    def refund(self, unused: int) -> None:
        """Give back bytes taken but not moved."""
        ...

    def cap_text(self) -> str:
        """What a cut record says: "byte cap (N bytes)"."""
        ...


class Gate(Protocol):
    """What the protocol handlers ask of the session."""

    @property
    def header_timeout(self) -> float:
        """Seconds a client has for its request head or SOCKS handshake."""
        ...

    @property
    def budget(self) -> Budget:
        """The exec's byte budget."""
        ...

    def admit(self, host: str, port: int, protocol: Protocol_) -> Attempt:
        """Decide (rules, then the connection cap) and record the attempt."""
        ...

    def allowed_text(self) -> str:
        """The rules, for a denial's message."""
        ...

    async def consider(self, attempt: Attempt) -> Attempt:
        """An admitted attempt once final: one that waits on a person's answer (``on_miss:
        ask``) comes back allowed or denied by it; any other as it was."""
        ...

    async def open(self, attempt: Attempt) -> trio.socket.SocketType:
        """Resolve and connect an admitted attempt; raises ``Refused``."""
        ...


async def system_resolver(host: str, port: int) -> list[str]:
    """The host's resolver (getaddrinfo in a thread): distinct addresses, in its order."""
    infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses: list[str] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        if sockaddr[0] not in addresses:
            addresses.append(str(sockaddr[0]))
    return addresses


async def connect_upstream(attempt: Attempt, resolver: Resolver, spec: netrules.NetworkSpec,
                           space: SpaceReader) -> trio.socket.SocketType:
    """Resolve (names only), drop what netspace.refusal refuses, connect to the first that answers."""
    assert attempt.rule is not None
    host, port = attempt.host, attempt.port
    try:
        found = [host] if netrules.is_ip_literal(host) else await resolver(host, port)
    except OSError as exc:
        raise Refused(f"cannot resolve {host}: {exc.strerror or exc}", denied=False) from None
    if not found:
        raise Refused(f"{host} resolves to nothing", denied=False)
    try:
        now = space()
    except OSError as exc:  # unknown host addresses: refuse rather than guess
        raise Refused(f"cannot read this host's addresses: {exc}", denied=False) from None
    refusals = [netspace.refusal(spec, attempt.rule, host, port, address, now) for address in found]
    usable = [address for address, why in zip(found, refusals, strict=True) if why is None]
    if not usable:
        attempt.address = found[0]
        raise Refused(next(why for why in refusals if why is not None), denied=True)
    last: BaseException | None = None
    for address in usable[:MAX_ADDRESSES]:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        sock = trio.socket.socket(family, socket.SOCK_STREAM)
        try:
            with trio.fail_after(CONNECT_TIMEOUT):
                await sock.connect((address, port))
        except (OSError, trio.TooSlowError) as exc:
            sock.close()
            last = exc
            continue
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        attempt.address = address
        return sock
    attempt.address = usable[0]
    if isinstance(last, OSError) and last.errno:
        detail = os.strerror(last.errno)  # trio's message repeats the address
    else:
        detail = "timed out" if isinstance(last, trio.TooSlowError) else str(last)
    refused = isinstance(last, ConnectionRefusedError)
    raise Refused(f"cannot connect to {host}:{port}: {detail}", denied=False, refused=refused)


async def send_all(sock: Wire, data: bytes | memoryview) -> None:
    """Send every byte (a trio socket's send may send part)."""
    view = memoryview(data)
    while view:
        sent = await sock.send(view)
        view = view[sent:]


async def pump(src: Wire, dst: Wire, attempt: Attempt,
               budget: Budget, outbound: bool) -> None:
    """Copy ``src`` to ``dst`` until EOF (then half-close ``dst``) or the budget is spent."""
    buffer = bytearray(BUFFER_SIZE)
    view = memoryview(buffer)
    while True:
        try:
            received = await src.recv_into(buffer)
        except ConnectionResetError:
            received = 0
        if received == 0:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
            return
        allowed = attempt.charge(budget, received, outbound)
        if allowed:
            await send_all(dst, view[:allowed])
        if allowed < received:
            raise ByteCapReached


async def charge_and_send(dst: Wire, data: bytes, attempt: Attempt,
                          budget: Budget, outbound: bool) -> None:
    """Send bytes the handler produced itself (a rewritten head), charged like relayed ones."""
    allowed = attempt.charge(budget, len(data), outbound)
    await send_all(dst, data[:allowed])
    if allowed < len(data):
        raise ByteCapReached


async def relay(jail: trio.socket.SocketType, upstream: trio.socket.SocketType, attempt: Attempt,
                budget: Budget, first: bytes = b"") -> None:
    """Both directions at once until both reach EOF, or one fails or spends the budget."""
    try:
        if first:
            await charge_and_send(upstream, first, attempt, budget, outbound=True)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump, jail, upstream, attempt, budget, True)
            nursery.start_soon(pump, upstream, jail, attempt, budget, False)
    except* (ByteCapReached, OSError):
        pass  # the record says what happened (cut, or the bytes so far); both sides close
    finally:
        upstream.close()
        jail.close()
