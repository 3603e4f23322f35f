"""What each bearer credential holds on the HTTP transport, so that it all ends when the
credential is revoked (``ccw http token rotate``, an entry removed from ``CCW_TOKENS_FILE``).

A credential is a token under its name (``auth.Principal.key``).  It holds two things:
the requests of it being answered, and the Streamable HTTP sessions it opened.  Some
facts that shape this book:

- The SDK keeps its sessions to itself: ``StreamableHTTPSessionManager`` answers 404 to a
  credential other than the opener's, but which sessions exist, and whose, is private to
  it.  So the book is made from what crosses transports/http.py: a session is booked from
  the ``Mcp-Session-Id`` of the answer that opened it, with the credential that asked.
- The SDK's one public way to end a session is its client's DELETE; the transport sends
  that DELETE itself (``CcwHttpApp._end_session``), with the opener's credential, for
  every session ``revoke`` hands over.  A session the SDK had already ended answers it 404:
  no harm.
- The SDK ends a session by itself once nothing of it has been in flight for its idle
  timeout.  The book counts a session's requests as a superset of the SDK's count (from
  before the SDK sees them until after it is done), so it forgets a session no earlier
  than the SDK does (``forget_idle``): the book stays as small as the SDK's table, and a
  session it forgot is one the SDK has already ended.
- A request being answered is a trio cancel scope: cancelling it cuts the answer (its GET
  event stream, its POST's stream) wherever it is, the SDK's code included, as a client
  that leaves does.  A GET stream is also what shutdown cuts (``close_streams``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import trio

from mcp_server.auth import Principal


@dataclass
class _Session:
    """A session as the book knows it: the credential that opened it, and its requests in
    flight (none: idle since ``idle_since``, on trio's clock)."""

    opener: Principal
    busy: int = 0
    idle_since: float = 0.0


class Holdings:
    """The requests being answered and the sessions opened, by credential."""

    def __init__(self) -> None:
        self._held: dict[trio.CancelScope, tuple[Principal, bool]] = {}  # a request: (whose, a GET stream?)
        self._sessions: dict[str, _Session] = {}  # by Mcp-Session-Id
        self._ending: list[tuple[str, Principal]] = []  # revoked sessions not yet ended
        self.wake = trio.Event()  # set when there are sessions to end

    @contextlib.contextmanager
    def hold(self, principal: Principal, is_stream: bool, session_id: str | None) -> Iterator[trio.CancelScope]:
        """Around answering one request of ``principal``: the scope ``revoke`` cancels.  The
        request counts as its session's when it names one that ``principal`` opened."""
        session = self._sessions.get(session_id or "")
        if session is not None and session.opener.key != principal.key:
            session = None  # not this credential's: the SDK answers 404, and the book is not touched
        with trio.CancelScope() as held:
            self._held[held] = (principal, is_stream)
            if session is not None:
                session.busy += 1
            try:
                yield held
            finally:
                del self._held[held]
                if session is not None:
                    session.busy -= 1
                    session.idle_since = trio.current_time()

    def opened(self, session_id: str, principal: Principal, admitted: frozenset[str]) -> None:
        """Book a session an answer opened; if its credential is no longer among ``admitted``
        (revoked while the answer was made), it is handed over to be ended at once."""
        self._sessions[session_id] = _Session(principal, idle_since=trio.current_time())
        if principal.key not in admitted:
            self.revoke(frozenset({principal.key}))

    def revoke(self, keys: frozenset[str]) -> None:
        """Cut every request of these credentials, and hand their sessions over to be ended."""
        for held, (principal, _) in list(self._held.items()):
            if principal.key in keys:
                held.cancel()
        for session_id, session in list(self._sessions.items()):
            if session.opener.key in keys:
                del self._sessions[session_id]
                self._ending.append((session_id, session.opener))
        if self._ending:
            self.wake.set()

    def take_ending(self) -> list[tuple[str, Principal]]:
        """The sessions to end (id, opener), handed over once; ``wake`` is cleared."""
        ending, self._ending = self._ending, []
        self.wake = trio.Event()
        return ending

    def forget_idle(self, idle_s: float) -> None:
        """Forget the sessions with nothing in flight for ``idle_s``: the SDK has ended them."""
        now = trio.current_time()
        for session_id, session in list(self._sessions.items()):
            if not session.busy and now - session.idle_since > idle_s:
                del self._sessions[session_id]

    def close_streams(self) -> None:
        """Cut every GET event stream (at shutdown, once the other requests are answered)."""
        for held, (_, is_stream) in list(self._held.items()):
            if is_stream:
                held.cancel()

    def sessions(self) -> dict[str, str]:
        """The booked sessions: id -> the name of the token that opened it."""
        return {session_id: session.opener.name for session_id, session in self._sessions.items()}
