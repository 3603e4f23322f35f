"""The test servers of the network tests, run as one process inside the server namespace.

Started by ``netfixtures.ServerNamespace`` with ``ip netns exec``, so every socket here
belongs to the namespace the test made (10.98.0.2), never to the host's network.  One
process serves:

- ``--http PORT``: files under ``--root`` (``/files/...``) and a PEP 503 simple index
  (``/simple/`` and ``/simple/<project>/``) over the wheels in ``--root/wheels``;
- ``--https PORT``: the same over TLS with ``--cert``/``--key``;
- ``--redirect PORT``: every request answered with ``302`` to ``--redirect-to``.

It prints ``ready`` on stdout once every socket listens, and serves until killed.
"""

from __future__ import annotations

import argparse
import html
import http.server
import os
import ssl
import sys
import threading
from pathlib import Path
from typing import Any


def handler_for(root: Path, redirect_to: str | None) -> type[http.server.BaseHTTPRequestHandler]:
    """A request handler class serving ``root`` (or redirecting everything to ``redirect_to``)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the test reads what the capsule recorded, not this log

        def do_GET(self) -> None:
            if redirect_to is not None:
                self._send(302, b"moved\n", {"Location": redirect_to})
            elif self.path.startswith("/simple"):
                self._simple(self.path.removeprefix("/simple").strip("/"))
            elif self.path.startswith("/files/"):
                self._file(root / "files" / self.path.removeprefix("/files/"))
            elif self.path.startswith("/wheels/"):
                self._file(root / "wheels" / self.path.removeprefix("/wheels/"))
            else:
                self._send(404, b"not found\n")

        def _simple(self, project: str) -> None:
            wheels = sorted(p.name for p in (root / "wheels").glob("*.whl"))
            if not project:
                names = sorted({w.split("-")[0].lower().replace("_", "-") for w in wheels})
                links = "".join(f'<a href="/simple/{n}/">{n}</a>\n' for n in names)
            else:
                mine = [w for w in wheels if w.split("-")[0].lower().replace("_", "-") == project]
                if not mine:
                    self._send(404, b"no such project\n")
                    return
                links = "".join(f'<a href="/wheels/{html.escape(w)}">{html.escape(w)}</a>\n' for w in mine)
            self._send(200, f"<!DOCTYPE html><html><body>\n{links}</body></html>\n".encode(),
                       {"Content-Type": "text/html"})

        def _file(self, path: Path) -> None:
            if ".." in path.parts or not path.is_file():
                self._send(404, b"not found\n")
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(path.stat().st_size))
            self.end_headers()
            self.wfile.flush()
            with path.open("rb") as f:
                # sendfile: the server costs almost no CPU, so on a 2-core machine the
                # download benchmark's ratio is the proxy's, not the server's share.
                self.connection.sendfile(f)

        def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


def main() -> None:
    """Listen on every port asked for, say ``ready``, and serve until killed."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--bind", default="0.0.0.0")
    parser.add_argument("--http", type=int)
    parser.add_argument("--https", type=int)
    parser.add_argument("--cert")
    parser.add_argument("--key")
    parser.add_argument("--redirect", type=int)
    parser.add_argument("--redirect-to")
    args = parser.parse_args()
    servers = []
    if args.http:
        servers.append(http.server.ThreadingHTTPServer((args.bind, args.http), handler_for(args.root, None)))
    if args.https:
        tls = http.server.ThreadingHTTPServer((args.bind, args.https), handler_for(args.root, None))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.cert, args.key)
        tls.socket = context.wrap_socket(tls.socket, server_side=True)
        servers.append(tls)
    if args.redirect:
        servers.append(http.server.ThreadingHTTPServer((args.bind, args.redirect),
                                                       handler_for(args.root, args.redirect_to)))
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    print("ready", flush=True)
    sys.stdin.read()  # until the test closes our stdin (or kills us)
    os._exit(0)


if __name__ == "__main__":
    main()
