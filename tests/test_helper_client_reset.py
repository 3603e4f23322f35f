"""The helper client: a helper that dies mid-request is UNAVAILABLE, however its socket ends."""

from __future__ import annotations

import socket

import pytest
import trio

from sandbox.client import TrioConnection
from sandbox.errors import CcwError


async def _receive_after(peer_ends: str) -> CcwError:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    connection = TrioConnection(trio.socket.from_stdlib_socket(ours))
    await connection.send(b"a request the helper never read\n")
    if peer_ends == "reset":
        theirs.close()  # with our bytes unread: the kernel resets the connection (ECONNRESET)
    else:
        theirs.recv(4096)
        theirs.close()  # a plain EOF
    try:
        with pytest.raises(CcwError) as info:
            await connection.receive([])
    finally:
        connection.close()
    return info.value


@pytest.mark.parametrize("peer_ends", ["reset", "eof"])
def test_a_helper_gone_mid_request_is_unavailable(peer_ends: str) -> None:
    error = trio.run(_receive_after, peer_ends)
    assert error.code == "UNAVAILABLE" and "retry" in error.message


def test_sending_to_a_helper_that_is_gone_is_unavailable() -> None:
    async def main() -> CcwError:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        theirs.close()
        connection = TrioConnection(trio.socket.from_stdlib_socket(ours))
        try:
            with pytest.raises(CcwError) as info:
                await connection.send(b"x\n")
        finally:
            connection.close()
        return info.value

    assert trio.run(main).code == "UNAVAILABLE"
