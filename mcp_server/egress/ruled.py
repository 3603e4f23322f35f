"""The proxy's side of method/path rules (core/httprules.py): the check per request, and tunnels refused.

A session whose capsule has method/path rules (``Ruled``: egress/session.py) has each
request the proxy reads judged by them before any upstream connection is made
(``refusal``, from egress/proxy.py's plain-HTTP path, and for the requests of a TLS
connection it terminated).  A request no rule allows becomes a refused attempt: the
jail's 403 and the run's connection record name the rules it missed, and the record
keeps the request's method and path (``Attempt.request``), never a header or the body.

A tunnel carries requests the proxy cannot read, so a tunnel to a host:port that has
method/path rules would carry them past the rules: a SOCKS connection there is refused
(``unread``), and so is a CONNECT the proxy does not terminate.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from mcp_server.core.httprules import RequestRules
from mcp_server.egress.relay import Attempt


@runtime_checkable
class Ruled(Protocol):
    """What the proxy asks of a session that may have method/path rules (egress/session.py)."""

    @property
    def requests(self) -> RequestRules:
        """The capsule's method/path rules now in force."""
        ...

    def refuse(self, attempt: Attempt, reason: str) -> None:
        """Turn an admitted attempt into a denial for ``reason`` and tell the watcher now."""
        ...


def refusal(gate: object, attempt: Attempt, scheme: str, method: bytes | str, target: bytes | str) -> str | None:
    """Why the request ``method target`` on the admitted ``attempt`` may not be sent (None: it
    may, or its host has no method/path rules); records its request line, and the rule that allowed it."""
    if not isinstance(gate, Ruled):
        return None
    verdict = gate.requests.check(attempt.host, attempt.port, scheme, method, target)
    if verdict is None:
        return None
    attempt.request = verdict.line
    if not verdict.allowed:
        return verdict.reason
    attempt.rule = verdict.rule
    return None


def unread(gate: object, attempt: Attempt) -> str | None:
    """Why a tunnel to the admitted ``attempt``'s host may not be made (its requests would pass
    its method/path rules unread), or None."""
    if not attempt.allowed or not isinstance(gate, Ruled) or (attempt.host, attempt.port) not in gate.requests.hosts():
        return None
    shown = f"[{attempt.host}]" if ":" in attempt.host else attempt.host
    return (f"{shown}:{attempt.port} has method/path rules, and a {attempt.protocol} tunnel would carry its requests "
            "unread: send them through the HTTP proxy (HTTP_PROXY/HTTPS_PROXY)")
