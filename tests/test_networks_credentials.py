"""A capsule's placeholders reach its proxy session however the two race (capsules/networks.py).

A fork's session is opened in the background at create (``open_soon``), and its first exec
makes its placeholders meanwhile (capsules/capsecrets.py ``env``): credentials given while the
open was still awaiting found no session to update, and the session started with none, so the
fork's own placeholder went out unswapped (the index answered 401; CI, vm-tests/test_network_secrets.py).
"""

from __future__ import annotations

import socket
from typing import Any

import trio

from mcp_server.capsules.networks import Networks
from mcp_server.core import netrules
from sandbox.replies import NetOpenReply


class _SlowHelper:
    """net_open that answers once let go; no ``runs`` (an older helper: owners unknown)."""

    def __init__(self) -> None:
        self.go = trio.Event()
        self.asked = trio.Event()
        self.made: list[socket.socket] = []

    async def net_open(self, capsule_id: str) -> tuple[NetOpenReply, list[int]]:
        self.asked.set()
        await self.go.wait()
        for _ in range(2):
            listener = socket.socket()
            listener.bind(("127.0.0.1", 0))
            listener.listen()
            listener.setblocking(False)
            self.made.append(listener)
        sniffer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sniffer.setblocking(False)
        self.made.append(sniffer)
        reply = NetOpenReply("10.99.0.1:3128", "10.99.0.1:1080", ("10.99.0.2",), {}, "test")
        return reply, [sock.detach() for sock in self.made]

    async def net_runs(self, capsule_id: str) -> Any:
        raise RuntimeError("no runs here")


def test_credentials_given_while_the_session_opens_reach_it() -> None:
    given = object()

    async def main() -> Any:
        networks = Networks()
        helper = _SlowHelper()
        spec = netrules.parse_network(["example.com"])
        host = networks._host

        async def host_then_the_exec_gives() -> trio.Nursery:
            # The open made its session and awaits its serving: the first exec's placeholders land now.
            nursery = await host()
            networks.give_credentials("cap_fork", given)  # type: ignore[arg-type]
            return nursery

        networks._host = host_then_the_exec_gives  # type: ignore[method-assign]
        helper.go.set()
        session = await networks.open(helper, "cap_fork", spec)
        try:
            return session.credentials
        finally:
            await networks.aclose()

    assert trio.run(main) is given
