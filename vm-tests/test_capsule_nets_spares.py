"""``net_connect`` with ``spares`` through a real privileged helper (sandbox/capsule_nets.py):
unconnected sockets of the capsule's own namespace, which reach the capsule's loopback and
not the host's.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio

from sandbox.client import HelperClient
from sandbox.errors import CcwError
from sandbox.ops import MAX_SPARES, ExecRequest


@pytest.fixture
def helper(tmp_path: Path, root_required: None,
           launch_helper: Callable[..., subprocess.Popen[bytes]]) -> Iterator[Path]:
    socket_path = tmp_path / "helper.sock"
    process = launch_helper(socket_path, tmp_path / "state", tmp_path / "helper.log")
    yield socket_path
    process.terminate()
    process.wait(30)


def _connects(sock: socket.socket, port: int) -> bool:
    """Whether ``sock`` (non-blocking) connects to ``port`` on its namespace's loopback."""
    sock.setblocking(True)
    sock.settimeout(5)
    try:
        sock.connect(("127.0.0.1", port))
    except ConnectionRefusedError:
        return False
    return True


def test_spares_are_of_the_capsules_namespace(helper: Path, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    code = ("import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 8765)); s.listen();"
            " print('up', flush=True); time.sleep(60)")

    async def main() -> None:
        client = HelperClient(str(helper))
        cap = (await client.request("create", {"workspace": str(ws)}))["capsule_id"]
        host = socket.socket()
        host.bind(("127.0.0.1", 0))
        host.listen()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.call, ExecRequest(cap, ("python3", "-c", code), timeout_ms=0, service="listen"))
            with trio.fail_after(20):
                while True:  # until the service listens
                    try:
                        (await client.net_connect(cap, 8765)).close()
                        break
                    except CcwError:
                        await trio.sleep(0.05)
            spares = await client.net_spares(cap, 8765, 3)
            assert len(spares) == 3
            assert _connects(spares[0], 8765)  # the capsule's service, on the capsule's loopback
            assert not _connects(spares[1], host.getsockname()[1])  # the host's loopback is not there
            for sock in spares:
                sock.close()
            plain = await client.net_spares(cap, 8765, MAX_SPARES)  # a whole refill, in one reply
            assert len(plain) == MAX_SPARES and all(sock.family == socket.AF_INET for sock in plain)
            six = await client.net_spares(cap, 8765, 2, v6=True)
            assert [sock.family for sock in six] == [socket.AF_INET6] * 2
            six[0].setblocking(True)
            six[0].settimeout(5)
            with pytest.raises(ConnectionRefusedError):  # the service listens on 127.0.0.1 alone
                six[0].connect(("::1", 8765))
            for sock in six:
                sock.close()
            for sock in plain:
                sock.close()
            await client.request("signal", {"capsule_id": cap, "service": "listen", "signal": "SIGKILL"})
        host.close()
        await client.request("destroy", {"capsule_id": cap})
        await client.aclose()

    trio.run(main)
