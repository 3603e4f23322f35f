"""Attacks on the egress proxy's HTTP framing from a jail, through the real tools, helper and
proxy: what the upstream receives against what the method/path rules and the credentials allowed.

Two servers of the test's on the host's 127.0.0.1, reached by exact-address rules: one
that records every byte each connection brings (rules ``GET /simple/*`` only, a secret
bound to it), and a bound host's echo endpoint as Python's http.server serves HTTP/1.1,
which answers ``Expect: 100-continue`` itself and compresses its echo of the request's
headers whatever the request asked.

- A request framed both by Content-Length and by chunks, whose chunks hold a ``DELETE``:
  the proxy read the chunks and sent the length on beside them, so an upstream reading the
  length would take the DELETE as a second request on the connection that carried the value.
- A chunked request whose trailer holds the placeholder: it went upstream, unrecorded.
- ``Expect: 100-continue`` to the echo: the masker judged the 100's head only, and the
  gzip'd echo of the value behind it reached the jail's curl.
"""

from __future__ import annotations

import gzip
import os
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from mcp_server.core.secretbind import make_binding
from mcp_server.fs.secretstore import SecretStore

PYTHON = "/usr/bin/python3"
VALUE = b"sk-framing-" + b"Q8w" * 10

# Run in the jail: raw requests to the proxy (HTTP_PROXY names it), each answer's first line printed.
RAW = r"""
import os, socket, sys
proxy = os.environ["HTTP_PROXY"].split("//", 1)[1].rstrip("/").rsplit(":", 1)
up, ph = sys.argv[1], os.environ["API_KEY"].encode()
head = b"GET http://%s/simple/x HTTP/1.1\r\nHost: %s\r\nX-Api-Key: %s\r\n" % (up.encode(), up.encode(), ph)
smuggled = b"DELETE /admin HTTP/1.1\r\nHost: " + up.encode() + b"\r\n\r\n"
for raw in (head + b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"%x\r\n%s\r\n0\r\n\r\n" % (len(smuggled), smuggled),
            head + b"Transfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\nX-Leak: " + ph + b"\r\n\r\n"):
    conn = socket.create_connection((proxy[0], int(proxy[1])), timeout=10)
    conn.sendall(raw)
    answer = b""
    while data := conn.recv(65536):
        answer += data
    print(answer.split(b"\r\n", 1)[0].decode(), "|", answer.rsplit(b"\r\n\r\n", 1)[-1].decode().strip())
"""


class Raw:
    """Records every byte each connection brings; answers each with a short 200 and closes."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        self.seen: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                got = b""
                try:
                    while data := conn.recv(65536):
                        got += data
                        if b"\r\n0\r\n" in got or (b"\r\n\r\n" in got and b"chunked" not in got):
                            break
                except OSError:
                    pass
                self.seen.append(got)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n")


class GzipEcho(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # http.server then answers Expect: 100-continue

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = gzip.compress(str(self.headers).encode())
        self.send_response(200)
        self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def servers() -> Iterator[tuple[Raw, ThreadingHTTPServer]]:
    raw, echo = Raw(), ThreadingHTTPServer(("127.0.0.1", 0), GzipEcho)
    threading.Thread(target=echo.serve_forever, daemon=True).start()
    try:
        yield raw, echo
    finally:
        raw.sock.close()
        echo.shutdown()
        echo.server_close()


def test_smuggled_framing_trailers_and_an_echo_behind_100_continue_give_nothing_away(
        tools: Any, tmp_path: Path, servers: tuple[Raw, ThreadingHTTPServer]) -> None:
    raw, echo = servers
    up, echoed = f"127.0.0.1:{raw.port}", f"127.0.0.1:{echo.server_address[1]}"
    os.chmod(tools.runtime.state.root, 0o700)
    store = SecretStore(tools.runtime.state.root)
    store.put(make_binding("API_KEY", [up], "X-Api-Key", None), "stdin", VALUE)
    store.put(make_binding("ECHO_KEY", [echoed], "X-Api-Key", None), "stdin", VALUE)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    curl = ("curl -sS --noproxy '' --compressed -H \"X-Api-Key: $ECHO_KEY\" -H 'Expect: 100-continue' "
            f"-d x=1 http://{echoed}/echo")

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(workspace), "secrets": ["API_KEY", "ECHO_KEY"],
                                               "network": [f"GET http://{up}/simple/*", echoed]}))["capsule_id"]
        framed = await t.call("capsule_exec", {"capsule_id": cap, "cmd": [PYTHON, "-c", RAW, up]})
        continued = await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", curl]})
        await t.call("capsule_destroy", {"capsule_id": cap})
        return {"framed": framed, "continued": continued}

    out = tools.run(scenario)
    lines = out["framed"]["stdout"].splitlines()
    assert lines[0].startswith("HTTP/1.1 400 ") and "both Content-Length and Transfer-Encoding" in lines[0], lines
    assert lines[1].startswith("HTTP/1.1 403 ") and "secret API_KEY in the trailers" in lines[1], lines
    # The framed request never left; the trailer's request went with its head alone, cut before its end.
    assert len(raw.seen) <= 1 and all(b"DELETE" not in got and b"ccwph_" not in got for got in raw.seen), raw.seen
    records = out["framed"]["touched"]["network"]
    assert any("exfiltration attempt" in str(r["reason"]) and not r["allowed"] for r in records), records
    # Behind the 100 Continue the gzip'd echo is judged as a final answer: a 502, none of it passing.
    assert VALUE.decode() not in out["continued"]["stdout"] + out["continued"]["stderr"], out["continued"]
    assert "compressed a response" in out["continued"]["stdout"], out["continued"]
