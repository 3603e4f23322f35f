"""mcp_server/capsules/ports.py's ``Refusals``: which of a forwarded port's refusals become
events, so that another user's flood of connections cannot push the capsule's other
events out of the bounded log; and the kernel path's asks of the helper."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import trio

from mcp_server.capsules.ports import Ports, Refusals
from mcp_server.state import State
from sandbox.ops import NetForwardRequest
from sandbox.replies import NetForwardReply


def test_the_first_refusal_of_a_uid_is_an_event_and_the_next_within_the_window_are_folded() -> None:
    quiet = Refusals(window=1.0)
    assert quiet.note(1001, 10.0) == 0
    assert [quiet.note(1001, 10.0 + i / 100) for i in range(1, 50)] == [None] * 49
    assert quiet.note(1002, 10.5) == 0  # another uid has its own window
    assert quiet.note(1001, 11.2) == 49  # the next event says how many it stands for
    assert quiet.note(1001, 11.3) is None
    assert quiet.note(None, 11.3) == 0  # nobody (a client gone before the lookup) counts as one peer


def test_the_uids_remembered_are_bounded() -> None:
    quiet = Refusals(window=60.0, most=3)
    for uid in range(10):
        assert quiet.note(uid, 0.0) == 0
    assert quiet.note(9, 1.0) is None  # the latest are remembered
    assert quiet.note(0, 1.0) == 0  # the oldest was forgotten: an event again


def test_a_kernel_path_asked_for_and_cancelled_midway_is_dropped_at_close(tmp_path: Path) -> None:
    # The helper may have made the rules before the call was cancelled; a close that skipped
    # them left them leading the owner's connections into the capsule after the port was freed.
    asked: list[str] = []

    class Helper:
        async def call(self, request: NetForwardRequest) -> NetForwardReply:
            asked.append(request.action)
            if request.action == "open":
                await trio.sleep_forever()
            return NetForwardReply(request.host_port, False, 0)

    async def main() -> None:
        helper = Helper()

        async def get() -> Any:
            return helper

        ports = Ports(State(tmp_path / "state"), get)
        forward: Any = SimpleNamespace(capsule_port=8000, host_port=40000, listener_fd=-1)
        with trio.move_on_after(0.1):
            await ports._kernel_path("cap_x", forward)
        await ports._drop_kernel_path("cap_x", forward)

    trio.run(main)
    assert asked == ["open", "close"]
