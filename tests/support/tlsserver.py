"""An HTTPS server of the test's own, for the tests of TLS the proxy terminates (issue 38).

The test's CA signs its leaf (``castore.server_context``), and the front end trusts that
CA through ``SSL_CERT_FILE``, as a host trusts its system store.  The handshake runs on
the request's own thread (``finish_request``), not in ``accept``: a client that connects
and never speaks TLS would otherwise hold up every other connection.
"""

from __future__ import annotations

import ssl
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class TlsServer(ThreadingHTTPServer):
    """``handler``'s HTTP over TLS with ``context`` on ``address`` (port 0: one the kernel picks)."""

    daemon_threads = True

    def __init__(self, address: str, handler: type[BaseHTTPRequestHandler], context: ssl.SSLContext) -> None:
        super().__init__((address, 0), handler)
        self.context = context

    def get_request(self) -> tuple[Any, Any]:
        sock, address = self.socket.accept()
        return self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), address

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(30)
        request.do_handshake()
        super().finish_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away mid-handshake


class QuietHandler(BaseHTTPRequestHandler):
    """A handler that writes no access log: the tests read what the server kept, not stderr."""

    def log_message(self, format: str, *args: Any) -> None:
        pass
