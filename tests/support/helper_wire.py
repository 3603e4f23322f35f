"""The helper's socket spoken to as raw bytes, for tests of what its framing does with them."""

from __future__ import annotations

import socket
from typing import Any

from sandbox.protocol import FrameDecoder


def raw_exchange(path: str, data: bytes) -> list[Any]:
    """Send ``data`` as it is to the helper socket at ``path``, close our side, and return
    every reply frame the helper wrote before it closed the connection, decoded."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(path)
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        decoder = FrameDecoder("reply")
        while chunk := sock.recv(65536):
            decoder.feed(chunk)
        decoder.feed_eof()
        return list(decoder.messages())
