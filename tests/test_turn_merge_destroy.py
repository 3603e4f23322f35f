"""A merge and a destroy of one of its inputs, sent together (capsules/turns.py ``parent_too``).

Found in a trial: ``capsule_merge [F0, F1]`` and ``capsule_destroy F1`` pipelined.  The merge
took places in F0's and F1's lines on arrival and the turn of their parent P (the common
ancestor, capsules/merge.py ``_read``) only when it ran; the destroy, read second, had taken
a place in P's line on arrival, which it holds until it answers.  So the merge waited in P's
line behind the destroy, the destroy in F1's behind the merge, for good: both calls hung,
every later call on the three capsules too, and the server's drain on SIGTERM with them.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import trio

from mcp_server.config import Config
from mcp_server.context import CallContext, Runtime
from mcp_server.state import State
from mcp_server.tools.registry import Registry

PARENTS = {"F0": ["P"], "F1": ["P"], "Q": ["P"], "G": ["Q"]}


# Two forks of P; a fork of a fork of P named first, whose own parent is not the ancestor.
@pytest.mark.parametrize("first", ["F0", "G"])
def test_a_merge_and_a_destroy_of_its_input_sent_after_it_both_answer(tmp_path: Path, first: str) -> None:
    registry = Registry.load(["capsule"])
    merge, destroy = (registry.lookup(name) for name in ("capsule_merge", "capsule_destroy"))
    assert merge is not None and destroy is not None and merge.turn is not None and destroy.turn is not None
    config = Config.from_env({"CCW_STATE_DIR": str(tmp_path / "state")})
    runtime = Runtime(config, State(config.state_dir))
    queue = runtime.capsule_queue
    ran: list[str] = []

    def parents_of(capsule_id: str) -> list[str]:
        return PARENTS.get(capsule_id, [])

    async def merging(ctx: CallContext) -> None:
        async with contextlib.AsyncExitStack() as turns:  # as capsules/merge.py _read takes them
            for one in sorted([first, "F1", "P"]):
                await turns.enter_async_context(ctx.capsule_turn(one, merge.turn.label))
            await trio.sleep(0.05)
            ran.append("merge")

    async def destroying(ctx: CallContext) -> None:
        async with ctx.capsule_turn("F1", destroy.turn.label):
            ran.append("destroy")

    async def main() -> None:
        # Both read before either handler runs, as a transport reads a pipelined batch.
        merged = queue.arrive(merge.turn, {"capsule_ids": [first, "F1"]}, parents_of)
        destroyed = queue.arrive(destroy.turn, {"capsule_id": "F1"}, parents_of)
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(merging, CallContext(runtime, ticket=merged))
                nursery.start_soon(destroying, CallContext(runtime, ticket=destroyed))
        queue.give_back(merged)
        queue.give_back(destroyed)

    trio.run(main)
    assert ran == ["merge", "destroy"]
    assert [queue.line(one) for one in (first, "F1", "P", "Q")] == [[], [], [], []]
