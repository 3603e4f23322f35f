"""capsule_merge holds Python's cyclic garbage collector off while it runs (capsules/merge.py
CollectorPause), and sets it back as it was once the last merge running at once ends, error or not."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any, cast

import pytest
import trio

from mcp_server.capsules import merge
from mcp_server.capsules.service import CapsuleService
from sandbox.errors import CcwError


@pytest.fixture(autouse=True)
def _collector_restored() -> Iterator[None]:
    enabled = gc.isenabled()
    yield
    (gc.enable if enabled else gc.disable)()


def test_off_while_held_and_back_after_the_last_holder() -> None:
    gc.enable()
    pause = merge.CollectorPause()
    with pause.held():
        assert not gc.isenabled()
        with pause.held():  # a second merge at once
            assert not gc.isenabled()
        assert not gc.isenabled()  # the first still runs
    assert gc.isenabled()


def test_back_after_an_error() -> None:
    gc.enable()
    pause = merge.CollectorPause()
    with pytest.raises(CcwError), pause.held():
        raise CcwError("CONFLICT", "merge again")
    assert gc.isenabled()


def test_left_off_when_it_was_off() -> None:
    gc.disable()
    pause = merge.CollectorPause()
    with pause.held():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_a_merge_runs_with_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    gc.enable()
    seen: list[bool] = []

    def inputs(service: Any, ids: tuple[str, ...]) -> Any:
        seen.append(gc.isenabled())
        raise CcwError("INVALID_ARGUMENT", "capsule_merge takes 2 to 16 different capsules")

    monkeypatch.setattr(merge, "_inputs", inputs)
    with pytest.raises(CcwError):
        trio.run(merge.merge, cast(CapsuleService, object()), merge.Question(("cap-a",)))
    assert seen == [False]
    assert gc.isenabled()


def test_an_into_live_merges_promotion_runs_with_it_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """The promotion (its policies' tests may run for minutes) is outside the pause; the merged
    capsule is destroyed after it."""
    gc.enable()
    seen: list[tuple[str, bool]] = []

    class Made:
        capsule_id = "cap-m"

    class Service:
        async def destroy(self, capsule_id: str) -> None:
            seen.append((f"destroy {capsule_id}", gc.isenabled()))

    async def merged(service: Any, question: merge.Question, turns: Any) -> tuple[dict[str, Any], Any]:
        seen.append(("merge", gc.isenabled()))
        return {"clean": True}, Made()

    async def promote(service: Any, request: Any) -> dict[str, Any]:
        seen.append((f"promote {request.capsule_id}", gc.isenabled()))
        return {"promoted": True}

    monkeypatch.setattr(merge, "_merge", merged)
    monkeypatch.setattr(merge, "promote", promote)
    answer = trio.run(merge.merge, cast(CapsuleService, Service()), merge.Question(("cap-a", "cap-b"), into="live"))
    assert seen == [("merge", False), ("promote cap-m", True), ("destroy cap-m", True)]
    assert answer == {"clean": True, "written": True, "promote": {"promoted": True}}
