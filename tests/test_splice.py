"""mcp_server/egress/splice.py's ``tunnel`` over real loopback sockets: bytes both ways beyond
the socket buffers at once (an echo of 4 MiB), a 16 MiB upload to a slow reader that answers
at EOF, and a half-close passed on; each spliced in its worker thread."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import trio

from mcp_server.egress import splice
from mcp_server.egress.relay import Attempt
from tests.support.egress_harness import (
    Upstream,
    echo_both_ways,
    read_all,
    shout,
    slow_reader,
    upstream,
)


class NoByteCap:
    """A relay budget (``relay.Budget``) that grants every byte: only the relay is under test."""

    def take(self, wanted: int) -> int:
        return wanted

    def refund(self, unused: int) -> None:
        pass

    def cap_text(self) -> str:
        return "no byte cap"


@asynccontextmanager
async def tunnelled(service: Upstream) -> AsyncIterator[trio.SocketStream]:
    """A client stream whose connection ``splice.tunnel`` relays to ``service``."""
    done = trio.Event()

    async def handle(jail: trio.SocketStream) -> None:
        capsule = trio.socket.socket()
        await capsule.connect(("127.0.0.1", service.port))
        attempt = Attempt(1, "127.0.0.1", service.port, "tcp", True, None, None)
        assert splice.threads_free()  # the thread path, not the trio relay's
        await splice.tunnel(jail.socket, capsule, attempt, NoByteCap())
        done.set()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
        client = await trio.open_tcp_stream("127.0.0.1", listeners[0].socket.getsockname()[1])
        yield client
        with trio.fail_after(10):
            await done.wait()
        nursery.cancel_scope.cancel()


def test_megabytes_both_ways_at_once_do_not_stall() -> None:
    # Both directions wait on the capsule's socket at once: one to write it, one to read it.
    payload = os.urandom(4 << 20)

    async def main() -> None:
        async with upstream(shout) as service, tunnelled(service) as client:
            echoed = await echo_both_ways(client, payload)
        assert bytes(echoed) == payload.upper()

    trio.run(main)


def test_an_upload_beyond_the_buffers_to_a_slow_reader_is_answered_after_its_eof() -> None:
    size = 16 << 20

    async def main() -> None:
        async with upstream(slow_reader) as service, tunnelled(service) as client:
            with trio.fail_after(60):
                await client.send_all(bytes(size))
                await client.send_eof()
                assert await read_all(client) == b"%d" % size

    trio.run(main)
