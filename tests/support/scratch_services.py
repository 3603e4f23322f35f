"""Services beside a scratch capsule's runs, the helper's side faked: what
capsules/service_scratch.py needs of ``Services``, for the tests of replays' and trials' use of it.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import trio

from sandbox.ops import ExecRequest
from sandbox.replies import ExecReply, Touched, Truncated, Usage


class FakeServices:
    """A service "runs" from its helper call until ``end`` signals it, as the helper's do; a call
    cancelled instead (its connection closed) leaves it running, as the helper ends such a one
    only when it next looks, after whatever the caller did next.  ``ready`` says whether each
    gets ready.  ``running`` names those running now."""

    def __init__(self, tmp: Path, ready: bool = True) -> None:
        self.state = SimpleNamespace(tmp_dir=tmp)
        self.ready = ready
        self.running: list[str] = []
        self.requests: list[ExecRequest] = []
        self._signalled: dict[str, trio.Event] = {}
        self.in_capsule: dict[str, list[dict[str, Any]]] = {}  # capsule id: its services running now (``beside``)

    def beside(self, capsule_id: str) -> list[dict[str, Any]]:
        """The witness forms of the capsule's services running now (Services.beside)."""
        return self.in_capsule.get(capsule_id, [])

    async def await_ready(self, run: Any) -> dict[str, Any]:
        await trio.sleep(0.01)
        if self.ready:
            return {"ready": True}
        return {"ready": False, "why": "it exited before it was ready"}

    async def call_helper(self, network: Any, request: ExecRequest, run: Any) -> Any:
        self.requests.append(request)
        name = request.service or ""
        self.running.append(name)
        signalled = self._signalled[name] = trio.Event()
        await signalled.wait()
        self.running.remove(name)
        return SimpleNamespace(exit_code=None, signal="SIGTERM")

    async def end(self, run: Any, grace_ms: int) -> None:
        self._signalled[run.spec.name].set()
        await run.finished.wait()


def exec_reply(exit_code: int = 0, stdout: bytes = b"") -> ExecReply:
    """A helper's reply to an exec that touched nothing."""
    return ExecReply(
        exit_code=exit_code, signal=None, timed_out=False, oom_killed=False, duration_ms=5, stdout=stdout,
        stderr=b"", stdout_bytes=len(stdout), stderr_bytes=0, truncated=Truncated(False, False),
        usage=Usage(cpu_ms=1, rss_max_kb=2, rss_max_process_kb=2, io_read_kb=0, io_write_kb=0),
        usage_unavailable={}, usage_sources={}, disk=None, touched=Touched((), (), (), ()), touched_unavailable={},
    )
