"""A page fetched from the host, as a person's client reaches a forwarded port (capsule_port)."""

from __future__ import annotations

import urllib.request


def page(url: str, timeout: float = 30) -> bytes:
    """The body at ``url`` (an error status raises, as urllib does)."""
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return bytes(answer.read())
