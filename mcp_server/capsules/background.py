"""A nursery for work that outlives every call: a capsule's services and forwarded ports.

No task of the server lives as long as the process (each transport has its own
nursery; the CLI and the tests run one call at a time), so the first user starts a trio
*system task* that holds a nursery, and its work is started there (``Nursery.start``
may be called from any task).  The system task ends with the trio run; ``aclose`` ends
it sooner.  capsules/networks.py keeps one of its own, which also closes its sessions.
"""

from __future__ import annotations

import trio


class Background:
    """One system task's nursery, started on first use."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._nursery: trio.Nursery | None = None
        self._scope: trio.CancelScope | None = None

    async def nursery(self) -> trio.Nursery:
        """The nursery, started (as a system task) on first use."""
        if self._nursery is not None:
            return self._nursery
        ready = trio.Event()

        async def host() -> None:
            try:
                with trio.CancelScope() as self._scope:
                    async with trio.open_nursery() as nursery:
                        self._nursery = nursery
                        ready.set()
                        await trio.sleep_forever()
            finally:
                self._nursery, self._scope = None, None

        trio.lowlevel.spawn_system_task(host, name=self.name)
        await ready.wait()
        assert self._nursery is not None
        return self._nursery

    def cancel(self) -> None:
        """End the nursery and everything running in it."""
        if self._scope is not None:
            self._scope.cancel()
