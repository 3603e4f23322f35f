"""Forwarded ports and other users, as root on the real kernel: peer.py names the uid of a
connection another user made, and a forward lets its owner's connections through and
closes everyone else's unread.

The other user is made for the test (the ``user_dir`` fixture) and runs ``CLIENT`` through
``run_as`` (tests/support/users.py); the forward and the capsule's stand-in run here, in
trio, while that process runs in a worker thread.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from mcp_server.egress import peer
from mcp_server.egress.forward import Client, Connect, PortForward
from tests.support.egress_harness import Told, read_all, shout, upstream

# Connect, send argv[2], shut the sending side (the socket stays held), read to the end;
# "ended" says how: "eof", or the error of a connection the other side cut.
CLIENT = r"""
import errno, json, socket, sys
with socket.create_connection(("127.0.0.1", int(sys.argv[1]))) as sock:
    own_port, received, ended = sock.getsockname()[1], b"", "eof"
    try:
        sock.sendall(sys.argv[2].encode())
        sock.shutdown(socket.SHUT_WR)
        while data := sock.recv(65536):
            received += data
    except OSError as exc:
        ended = errno.errorcode.get(exc.errno, str(exc.errno))
print(json.dumps({"port": own_port, "received": received.decode(), "ended": ended}))
"""

RunAs = Callable[..., Any]


async def _as_user(run_as: RunAs, uid: int, gid: int, port: int, message: str) -> dict[str, Any]:
    result: dict[str, Any] = await trio.to_thread.run_sync(run_as, uid, gid, CLIENT, str(port), message)
    return result


async def _connect_to(port: int) -> trio.socket.SocketType:
    sock = trio.socket.socket()
    try:
        await sock.connect(("127.0.0.1", port))
    except BaseException:
        sock.close()
        raise
    return sock


@asynccontextmanager
async def forwarding(connect: Connect, owner_uid: int, told: Told) -> AsyncIterator[PortForward]:
    """A forward serving for the block, closed after it however the block ends."""
    port = PortForward(connect, owner_uid, 8000, on_refused=told.on_refused)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(port.serve)
            yield port
            await port.aclose()
    finally:
        await port.aclose()


def test_peer_uid_names_another_users_connection(run_as: RunAs, user_dir: tuple[int, int, Path]) -> None:
    uid, gid, _ = user_dir

    async def main() -> None:
        listener = trio.socket.socket()
        await listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        found: list[int | None] = []
        async with trio.open_nursery() as nursery:
            async def serve_one() -> None:
                conn, _ = await listener.accept()
                with conn:
                    received = b""
                    while data := await conn.recv(100):  # to the user's EOF: its socket is still held
                        received += data
                    found.append(peer.peer_uid(conn))
                    await conn.send(received[::-1])

            nursery.start_soon(serve_one)
            with trio.fail_after(120):
                result = await _as_user(run_as, uid, gid, listener.getsockname()[1], "abc")
        listener.close()
        assert uid != 0 and found == [uid]
        assert (result["received"], result["ended"]) == ("cba", "eof")

    trio.run(main)


def test_a_root_forward_refuses_another_user_and_passes_root(run_as: RunAs, user_dir: tuple[int, int, Path]) -> None:
    uid, gid, _ = user_dir

    async def main() -> None:
        told = Told()
        calls: list[int] = []
        async with upstream(shout) as service:
            async def connect() -> trio.socket.SocketType:
                calls.append(1)
                return await _connect_to(service.port)

            async with forwarding(connect, 0, told) as port:
                with trio.fail_after(120):
                    theirs = await _as_user(run_as, uid, gid, port.host_port, "let me in")
                assert theirs["received"] == ""  # closed, or cut (it had sent bytes): nothing answered
                await told.until(refused=1)  # told after their client saw its end
                assert told.refused == [Client("127.0.0.1", theirs["port"], uid)]
                assert calls == [] and service.seen == []  # no connect, no byte reached the capsule
                ours = await trio.open_tcp_stream("127.0.0.1", port.host_port)
                await ours.send_all(b"root here")
                await ours.send_eof()
                assert await read_all(ours) == b"ROOT HERE"
                counts = await port.counts()
                assert (counts.accepted, counts.refused, counts.errors) == (1, 1, 0)

    trio.run(main)


def test_a_forward_for_another_user_passes_them_and_refuses_root(run_as: RunAs,
                                                                  user_dir: tuple[int, int, Path]) -> None:
    uid, gid, _ = user_dir

    async def main() -> None:
        told = Told()
        async with upstream(shout) as service, forwarding(lambda: _connect_to(service.port), uid, told) as port:
            with trio.fail_after(120):
                theirs = await _as_user(run_as, uid, gid, port.host_port, "owner here")
            assert (theirs["received"], theirs["ended"]) == ("OWNER HERE", "eof")
            with socket.create_connection(("127.0.0.1", port.host_port)) as ours:
                ours.shutdown(socket.SHUT_WR)  # held open until the forward has judged it
                own_port = ours.getsockname()[1]
                assert await trio.to_thread.run_sync(ours.recv, 1) == b""
            await told.until(refused=1)  # told after our client saw its end
            assert told.refused == [Client("127.0.0.1", own_port, 0)]
            counts = await port.counts()
            assert (counts.accepted, counts.refused) == (1, 1)

    trio.run(main)
