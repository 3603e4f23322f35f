"""services.reads, the helper's side of the ``run_reads`` op: what a running service has touched
so far, found by its cgroup, or why not; a reply too large for one frame says so instead of
failing to send.  The recording is faked here (fanotify.so_far); the real one, through the
dispatcher, is in vm-tests/test_replies_wire.py."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from sandbox import fanotify, services
from sandbox.errors import CcwError
from sandbox.fanotify import Traced
from sandbox.protocol import MAX_FRAME
from sandbox.replies import RunReadsReply, Touched

CGROUP = object()  # the run's cgroup: its recording is found by it


def _capsule(cgroup: object | None = CGROUP) -> Any:
    run = SimpleNamespace(cgroup=cgroup)
    return SimpleNamespace(capsule_id="cap_1", services={"web": run}, path=lambda name: f"/state/cap_1/{name}")


def _answer(monkeypatch: pytest.MonkeyPatch, traced: Traced | str) -> list[tuple[str, object]]:
    asked: list[tuple[str, object]] = []

    def so_far(merged_dir: str, cgroup: object) -> Traced | str:
        asked.append((merged_dir, cgroup))
        return traced

    monkeypatch.setattr(fanotify, "so_far", so_far)
    return asked


def test_a_running_service_s_sets_so_far(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _answer(monkeypatch, Traced(["app.py", "static/a.css"], ["web.log"], False, listed=["static"],
                                        executed=[]))
    reply = services.reads(_capsule(), "web", threading.Lock())
    assert reply == RunReadsReply("web", Touched(("app.py", "static/a.css"), ("web.log",), ("static",), ()))
    assert asked == [("/state/cap_1/merged", CGROUP)]


def test_what_is_not_known_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    _answer(monkeypatch, Traced(["a"], [], True, listed=[], executed=[]))
    overflowed = services.reads(_capsule(), "web", threading.Lock())
    assert overflowed.touched is None and "overflowed" in (overflowed.unavailable or "")
    _answer(monkeypatch, "not recorded: no privilege")
    assert (services.reads(_capsule(), "web", threading.Lock())
            == RunReadsReply("web", None, "not recorded: no privilege"))
    unstarted = services.reads(_capsule(cgroup=None), "web", threading.Lock())
    assert unstarted.touched is None and "not started" in (unstarted.unavailable or "")


def test_a_reply_over_one_frame_says_it_is_incomplete(monkeypatch: pytest.MonkeyPatch) -> None:
    many = [f"node_modules/pkg{i:06}/" + "x" * 80 + ".js" for i in range(MAX_FRAME // 80)]
    _answer(monkeypatch, Traced(many, [], False, listed=[], executed=[]))
    reply = services.reads(_capsule(), "web", threading.Lock())
    assert reply.touched is None and "too many paths" in (reply.unavailable or "")
    _answer(monkeypatch, Traced(many[: len(many) // 2], [], False, listed=[], executed=[]))
    assert services.reads(_capsule(), "web", threading.Lock()).touched is not None  # half of it fits


def test_an_unknown_service_is_not_found() -> None:
    with pytest.raises(CcwError) as info:
        services.reads(_capsule(), "db", threading.Lock())
    assert info.value.code == "NOT_FOUND" and info.value.details["running"] == ["web"]
