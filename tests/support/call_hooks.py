"""A call as CapsuleService serves it (capsules/call_hooks.py CallHooks), for tests without a server:
its progress reports recorded, its turns taken from a real CapsuleQueue."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from mcp_server.capsules.asker import Asker
from mcp_server.capsules.turns import CapsuleQueue, Ticket


class Hooks:
    """The call the service serves: progress recorded, turns from a real queue."""

    def __init__(self) -> None:
        self.queue = CapsuleQueue()
        self.reports: list[tuple[float, float | None, str | None]] = []

    async def progress(self, progress: float, total: float | None = None, message: str | None = None,
                       output: Any = None) -> None:
        self.reports.append((progress, total, message))

    @contextlib.asynccontextmanager
    async def capsule_turn(self, capsule_id: str, label: str) -> AsyncIterator[Ticket]:
        async with self.queue.turn(capsule_id, label) as ticket:
            yield ticket

    def asker(self) -> Asker | None:
        return None  # no client: a miss waits for a person, as a call without a session's would
