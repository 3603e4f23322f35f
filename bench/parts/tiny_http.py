"""A small, fast HTTP server and a client that times sequential GETs: one file, two programs.

``python3 tiny_http.py serve PORT`` answers every request on ``127.0.0.1:PORT`` with the
same two-byte page, keeping connections alive unless asked to close (asyncio, one
thread).  It is fast on purpose: the slower the server, the less a relay in front of it
shows.  ``python3 tiny_http.py get PORT N fresh|keepalive`` sends ``N`` GETs one after
another and prints the seconds they took (measured inside the client, so its own start
is not counted): ``fresh``, each on a new connection with ``Connection: close``, read to
the server's EOF, so any HTTP server will do (``python3 -m http.server`` too);
``keepalive``, all on one connection, which only this file's server answers as expected.

Only the standard library: the server runs in a capsule under the system's python3, and
the suite copies this file into the capsule's workspace.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import time

HOST = "127.0.0.1"
REQUEST = b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n"
REQUEST_CLOSE = b"GET / HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer each request on the connection until the client closes it."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            writer.write(RESPONSE)
            await writer.drain()
            if b"connection: close" in head.lower():
                break
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def serve(port: int) -> None:
    """Listen on ``HOST:port`` and answer until killed."""
    server = await asyncio.start_server(_answer, HOST, port, reuse_address=True, backlog=128)
    print(f"listening on {HOST}:{port}", flush=True)
    async with server:
        await server.serve_forever()


def _receive_answer(sock: socket.socket) -> None:
    """Read one whole answer of this file's server (its length is fixed)."""
    got = b""
    while len(got) < len(RESPONSE):
        chunk = sock.recv(4096)
        if not chunk:
            raise SystemExit(f"the connection closed after {len(got)} bytes of an answer")
        got += chunk
    if got != RESPONSE:
        raise SystemExit(f"unexpected answer: {got[:200]!r}")


def _receive_to_eof(sock: socket.socket) -> None:
    """Read an answer until the server closes; it must be a 200."""
    got = b""
    while chunk := sock.recv(65536):
        got += chunk
    if not (got.startswith(b"HTTP/1.") and got[8:13] == b" 200 "):
        raise SystemExit(f"unexpected answer: {got[:200]!r}")


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection((HOST, port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def get(port: int, count: int, mode: str) -> float:
    """Seconds for ``count`` sequential GETs: each on a new connection (``fresh``) or all on one."""
    start = time.perf_counter()
    if mode == "fresh":
        for _ in range(count):
            with _connect(port) as sock:
                sock.sendall(REQUEST_CLOSE)
                _receive_to_eof(sock)
    else:
        with _connect(port) as sock:
            for _ in range(count):
                sock.sendall(REQUEST)
                _receive_answer(sock)
    return time.perf_counter() - start


def main(argv: list[str]) -> int:
    """``serve PORT`` or ``get PORT N fresh|keepalive``."""
    if len(argv) == 2 and argv[0] == "serve":
        asyncio.run(serve(int(argv[1])))
        return 0
    if len(argv) == 4 and argv[0] == "get" and argv[3] in ("fresh", "keepalive"):
        print(f"{get(int(argv[1]), int(argv[2]), argv[3]):.6f}")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
