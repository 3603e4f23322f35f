"""What a secret costs a plain HTTP request through the egress proxy (issue 38, egress/credentials.py).

One small GET through a real EgressSession on loopback (client connect, the proxy's admit
and upstream connect, a 2-byte answer relayed, both closes), three ways, interleaved in one
run: the session holding no secrets; holding one, the request carrying no placeholder (the
cost every other request of such a capsule pays: a ``bytes.find`` and a search); and the
request carrying the placeholder, swapped for the value read from a real secret store (its
file read, the rewrite on a thread, the masked response).  ``python bench/parts/credentials.py``
prints the rows.

Measured on the project's 2-core VM (kernel 6.18), medians of 1000 interleaved rounds, two
runs: no secrets 3.26 and 3.25 ms a request; a secret held, none sent, 3.33 and 3.34 ms
(1.02x, 1.03x); the placeholder swapped, 4.54 and 4.51 ms (1.39x both): about 1.2 ms
more, most of it the store read and the hop to a thread and back.
"""

from __future__ import annotations

import socket
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import trio

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import Report, Row, interleaved_async, median_ms
from mcp_server.capsules import capsecrets
from mcp_server.core.netrules import parse_network
from mcp_server.core.secretbind import make_binding
from mcp_server.egress.session import EgressSession
from mcp_server.fs.secretstore import SecretStore

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


async def _answer(stream: trio.SocketStream) -> None:
    received = b""
    while b"\r\n\r\n" not in received and (data := await stream.receive_some()):
        received += data
    await stream.send_all(ANSWER)
    await stream.aclose()


def _listening() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock.detach()


async def _request(port: int, data: bytes) -> float:
    start = time.perf_counter()
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(data)
    received = b""
    while chunk := await stream.receive_some():
        received += chunk
    await stream.aclose()
    assert received.startswith(b"HTTP/1.1 200"), received[:80]
    return time.perf_counter() - start


async def _measure(repeat: int, root: Path) -> dict[str, list[float]]:
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, _answer, 0, host="127.0.0.1"))
        up = listeners[0].socket.getsockname()[1]
        SecretStore(root).put(make_binding("TOKEN", [f"127.0.0.1:{up}"]), "stdin", b"t0ken-" + b"v" * 34)
        given = capsecrets.credentials(root, ["TOKEN"])
        http_fd = _listening()
        spec = parse_network({"allow": [f"127.0.0.1:{up}"], "max_connections": 1 << 30})
        assert spec is not None
        session = EgressSession(spec, http_fd, _listening(), None, ["10.99.0.2"])
        await nursery.start(session.serve)
        port = session._http.getsockname()[1]
        line = f"GET http://127.0.0.1:{up}/simple/ HTTP/1.1\r\nHost: 127.0.0.1:{up}\r\n"
        plain = (line + "Authorization: Bearer mine\r\n\r\n").encode()
        swapped = (line + f"Authorization: Bearer {given.capsule.env()['TOKEN']}\r\n\r\n").encode()

        async def run(credentials: object, data: bytes) -> float:
            session.credentials = credentials  # type: ignore[assignment]
            return await _request(port, data)

        times = await interleaved_async({
            "none": partial(run, None, plain),
            "held": partial(run, given, plain),
            "swapped": partial(run, given, swapped),
        }, repeat)
        await session.aclose()
        nursery.cancel_scope.cancel()
    return times


def measure(repeat: int) -> list[Row]:
    """The rows: each way's median beside the session holding no secrets, from one interleaved run."""
    with tempfile.TemporaryDirectory(prefix="ccw-bench-secrets-") as tmp:
        times = trio.run(_measure, repeat, Path(tmp))
    none = median_ms(times["none"])
    return [Row("plain HTTP request, capsule holds a secret, none sent", median_ms(times["held"]),
                "same, no secrets", none, "(no target)"),
            Row("plain HTTP request, placeholder swapped (store read)", median_ms(times["swapped"]),
                "same, no secrets", none, "(no target)")]


if __name__ == "__main__":
    report = Report("credentials")
    report.rows.extend(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 500))
    print(report.to_text())
