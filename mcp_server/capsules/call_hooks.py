"""What the capsule service needs of the call it serves, and the hooks of work no call waits for.

A ``CapsuleService`` (capsules/service.py) serves one call: the call's context
(mcp_server/context.py ``CallContext``) reports its progress, takes the capsule's turns
and knows the client to ask about an exec's misses.  Each is a typed hook, decided by
whoever makes the service; ``Unattended`` is the call of background work (a service's
restart), and a race has hooks of its own (capsules/race.py).
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Protocol

from mcp_server.capsules.asker import Asker
from mcp_server.capsules.turns import Ticket
from sandbox.errors import CcwError
from sandbox.replies import ExecProgress


class CallHooks(Protocol):
    """What the service needs of the call it serves: progress reports, the capsule's turn, its client."""

    async def progress(self, progress: float, total: float | None = None, message: str | None = None,
                       output: ExecProgress | None = None) -> None:
        """Report progress to the caller, if it asked for reports (``output``: a streaming exec's report)."""

    def capsule_turn(self, capsule_id: str, label: str) -> AbstractAsyncContextManager[Ticket]:
        """Hold the capsule's turn (mcp_server.capsules.turns) for the block."""

    def asker(self) -> Asker | None:
        """The client that made the call, to be asked about its exec's misses (capsules/asker.py);
        None: no client is asked (the question still waits for a person: capsules/misses.py)."""


class Unattended:
    """The call hooks of work no call waits for: progress goes nowhere, it takes no turn, and
    no client is asked."""

    async def progress(self, progress: float, total: float | None = None, message: str | None = None,
                       output: ExecProgress | None = None) -> None:
        return None

    def capsule_turn(self, capsule_id: str, label: str) -> AbstractAsyncContextManager[Ticket]:
        raise CcwError("INTERNAL", "background work on a capsule takes no turn")

    def asker(self) -> Asker | None:
        return None
