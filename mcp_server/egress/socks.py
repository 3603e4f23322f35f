"""The SOCKS5 server the jail reaches at 10.99.0.1:1080 (RFC 1928, no authentication).

Only CONNECT is served; BIND and UDP ASSOCIATE get reply 0x07 (command not supported),
an unknown address type 0x08.  A request the rules deny gets 0x02 ("connection not
allowed by ruleset"), as does one past the exec's connection cap; the reason is in the
exec's record and notes, since SOCKS has no room for text.  Upstream failures: 0x05
(refused), 0x04 (host unreachable: no address, timeout), 0x01 otherwise.

Names (ATYP 3) travel to the proxy unresolved: with ``socks5h://`` (the jail's
``ALL_PROXY``) the client never looks them up itself, and the rules see the name.  A
client that resolves names first sends IP literals, which only IP rules allow.
"""

from __future__ import annotations

import contextlib
import ipaddress
import struct

import trio

from mcp_server.egress.relay import Gate, Refused, send_all
from mcp_server.egress.ruled import Ruled, unread
from mcp_server.egress.splice import tunnel

VERSION = 5
NO_AUTH = 0x00
NO_ACCEPTABLE = 0xFF
CMD_CONNECT = 1
ATYP_IPV4, ATYP_DOMAIN, ATYP_IPV6 = 1, 3, 4
REP_OK = 0x00
REP_FAILURE = 0x01
REP_NOT_ALLOWED = 0x02
REP_HOST_UNREACHABLE = 0x04
REP_REFUSED = 0x05
REP_COMMAND = 0x07
REP_ATYP = 0x08


class SocksError(Exception):
    """The client broke the protocol; ``reply`` is what to answer (None: just close)."""

    def __init__(self, message: str, reply: int | None = REP_FAILURE) -> None:
        super().__init__(message)
        self.reply = reply


class Reader:
    """Exact-size reads from a socket; keeps what arrived beyond the handshake."""

    def __init__(self, sock: trio.socket.SocketType) -> None:
        self.sock = sock
        self.buffer = bytearray()

    async def exactly(self, size: int) -> bytes:
        """The next ``size`` bytes; SocksError(None) if the client closes first."""
        while len(self.buffer) < size:
            data = await self.sock.recv(4096)
            if not data:
                raise SocksError("the client closed during the handshake", reply=None)
            self.buffer += data
        taken = bytes(self.buffer[:size])
        del self.buffer[:size]
        return taken


def reply(code: int) -> bytes:
    """A reply with an unspecified bound address (clients ignore it for CONNECT)."""
    return bytes([VERSION, code, 0, ATYP_IPV4, 0, 0, 0, 0, 0, 0])


async def read_request(reader: Reader) -> tuple[str, int]:
    """The greeting and the CONNECT request -> (host, port); answers the greeting itself."""
    version, count = await reader.exactly(2)
    if version != VERSION:
        raise SocksError(f"not SOCKS5 (version {version})", reply=None)
    methods = await reader.exactly(count)
    if NO_AUTH not in methods:
        await send_all(reader.sock, bytes([VERSION, NO_ACCEPTABLE]))
        raise SocksError("the client offers no method without authentication", reply=None)
    await send_all(reader.sock, bytes([VERSION, NO_AUTH]))
    version, command, _reserved, atyp = await reader.exactly(4)
    if version != VERSION:
        raise SocksError(f"request version {version}")
    if atyp == ATYP_IPV4:
        host = str(ipaddress.IPv4Address(await reader.exactly(4)))
    elif atyp == ATYP_IPV6:
        host = str(ipaddress.IPv6Address(await reader.exactly(16)))
    elif atyp == ATYP_DOMAIN:
        (length,) = await reader.exactly(1)
        host = (await reader.exactly(length)).decode("latin-1")
    else:
        raise SocksError(f"address type {atyp}", reply=REP_ATYP)
    (port,) = struct.unpack("!H", await reader.exactly(2))
    if command != CMD_CONNECT:
        raise SocksError(f"command {command} (only CONNECT)", reply=REP_COMMAND)
    return host, port


async def handle_socks(gate: Gate, sock: trio.socket.SocketType) -> None:
    """Serve one SOCKS5 client connection, then close it."""
    reader = Reader(sock)
    try:
        with trio.move_on_after(gate.header_timeout) as deadline:
            host, port = await read_request(reader)
        if deadline.cancelled_caught:
            return
        attempt = await gate.consider(gate.admit(host, port, "socks5"))
        if (why := unread(gate, attempt)) is not None and isinstance(gate, Ruled):
            gate.refuse(attempt, why)  # its requests would pass its method/path rules unread
        if not attempt.allowed:
            await send_all(sock, reply(REP_NOT_ALLOWED))
            return
        try:
            upstream = await gate.open(attempt)
        except Refused as exc:
            code = REP_NOT_ALLOWED if exc.denied else REP_REFUSED if exc.refused else REP_HOST_UNREACHABLE
            await send_all(sock, reply(code))
            return
        try:
            await send_all(sock, reply(REP_OK))
        except OSError:
            upstream.close()
            raise
        await tunnel(sock, upstream, attempt, gate.budget, bytes(reader.buffer))
    except SocksError as exc:
        if exc.reply is not None:
            with contextlib.suppress(OSError):
                await send_all(sock, reply(exc.reply))
    except OSError:
        pass  # the client went away
    finally:
        sock.close()
