"""sandbox/namespaces.py's SparePool: what waits, what is being made, and what close leaves (no root needed)."""

from __future__ import annotations

import threading

from sandbox.namespaces import SparePool


def test_a_spare_being_made_when_the_pool_closes_is_discarded_not_left() -> None:
    # The helper's exit closes its pools while the janitor may be making a spare cgroup:
    # close waits for it, and the maker discards it (its directories would outlive us).
    started, finish = threading.Event(), threading.Event()
    discarded: list[str] = []

    def make() -> str:
        started.set()
        assert finish.wait(10)
        return "made"

    pool: SparePool[str] = SparePool(make, discarded.append)
    maker = threading.Thread(target=pool.refill)
    maker.start()
    assert started.wait(10)
    closer = threading.Thread(target=pool.close)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive(), "close did not wait for the spare being made"
    finish.set()
    maker.join(10)
    closer.join(10)
    assert discarded == ["made"] and pool.take() is None
    pool.refill()  # closed: makes nothing
    assert pool.take() is None and discarded == ["made"]


def test_close_returns_only_after_the_late_spare_is_discarded() -> None:
    # The maker discards a spare it finishes after close began; close must wait for that
    # discard too, or the interpreter's exit stops the daemon maker halfway (a CI run left
    # a spare cgroup behind this way).
    started, finish, discarding, discard_done = (threading.Event() for _ in range(4))
    discarded: list[str] = []

    def discard(spare: str) -> None:
        discarding.set()
        assert discard_done.wait(10)
        discarded.append(spare)

    def make() -> str:
        started.set()
        assert finish.wait(10)
        return "late"

    pool: SparePool[str] = SparePool(make, discard)
    maker = threading.Thread(target=pool.refill)
    maker.start()
    assert started.wait(10)
    closer = threading.Thread(target=pool.close)
    closer.start()
    finish.set()
    assert discarding.wait(10)
    closer.join(0.2)
    assert closer.is_alive(), "close returned while the late spare was still being discarded"
    discard_done.set()
    closer.join(10)
    maker.join(10)
    assert discarded == ["late"]


def test_a_spare_being_made_counts_toward_the_limit() -> None:
    started, finish = threading.Event(), threading.Event()
    made: list[int] = []

    def make() -> int:
        made.append(len(made))
        started.set()
        assert finish.wait(10)
        return made[-1]

    pool: SparePool[int] = SparePool(make, lambda spare: None)
    maker = threading.Thread(target=pool.refill)
    maker.start()
    assert started.wait(10)
    pool.refill()  # one is being made: a second would exceed the limit of one
    finish.set()
    maker.join(10)
    assert made == [0] and pool.take() == 0 and pool.take() is None


def test_close_gives_up_waiting_after_its_bound() -> None:
    release = threading.Event()
    pool: SparePool[str] = SparePool(lambda: "late" if release.wait(10) else None, lambda spare: None)
    maker = threading.Thread(target=pool.refill)
    maker.start()
    pool.close(wait_s=0.05)  # returns although the maker is still at work
    release.set()
    maker.join(10)
    assert pool.take() is None
