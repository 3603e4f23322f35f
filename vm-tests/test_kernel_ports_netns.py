"""A forwarded port's kernel path asked of a privileged helper in a network namespace of its
own, as deploy/ccw-helper.service's ``PrivateNetwork=yes`` runs it: its NAT rules would be
made in that namespace, which the owner's connections to the front end's port never pass,
so the helper refuses the path (UNSUPPORTED) and the forward relays, listed as ``relay``.
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
from sandbox.ops import NetForwardRequest


@pytest.fixture
def helper(tmp_path: Path, root_required: None,
           launch_helper: Callable[..., subprocess.Popen[bytes]]) -> Iterator[Path]:
    socket_path = tmp_path / "helper.sock"
    process = launch_helper(socket_path, tmp_path / "state", tmp_path / "helper.log", "--privileged",
                            prefix=["unshare", "--net"])
    yield socket_path
    process.terminate()
    assert process.wait(30) == 0, (tmp_path / "helper.log").read_text()


def test_a_helper_in_a_network_namespace_of_its_own_refuses_the_kernel_path(helper: Path, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()

    async def main() -> str:
        client = HelperClient(str(helper))
        try:
            cap = (await client.request("create", {"workspace": str(ws)}))["capsule_id"]
            # A server on the capsule's loopback: a socket of the capsule's namespace, listening.
            (server,) = await client.net_spares(cap, 8765, 1)
            with server, socket.create_server(("127.0.0.1", 0)) as held:
                server.bind(("127.0.0.1", 8765))
                server.listen()
                request = NetForwardRequest(cap, 8765, held.getsockname()[1], "open", listener=held.fileno())
                with pytest.raises(CcwError) as refused:
                    await client.call(request)
            await client.request("destroy", {"capsule_id": cap})
            return f"{refused.value.code}: {refused.value.message}"
        finally:
            await client.aclose()

    assert trio.run(main).startswith("UNSUPPORTED: this helper runs in a network namespace")
