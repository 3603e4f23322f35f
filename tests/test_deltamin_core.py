"""ddmin as a sans-IO search: exact culprits, 1-minimality, fewer trials than the textbook."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcp_server.core.deltamin import FAIL, PASS, UNRESOLVED, Search, split


def textbook_ddmin(units: tuple[int, ...], test: object) -> tuple[tuple[int, ...], int]:
    """Plain ddmin (Zeller & Hildebrandt), no cache, one trial at a time: the reference."""
    trials = 0
    current, n = tuple(units), 2
    while len(current) >= 2:
        chunks = split(current, n)
        reduced = False
        for candidate, next_n in [(c, 2) for c in chunks] + [
            (tuple(u for u in current if u not in set(c)), max(n - 1, 2)) for c in chunks
        ]:
            trials += 1
            if test(candidate) == FAIL:  # type: ignore[operator]
                current, n, reduced = candidate, next_n, True
                break
        if not reduced:
            if n >= len(current):
                break
            n = min(len(current), 2 * n)
    return current, trials


def _run(search: Search, oracle: object) -> Search:
    while batch := search.next_batch():
        search.report([oracle(c) for c in batch])  # type: ignore[operator]
    return search


def _culprit_oracle(culprits: set[int]) -> object:
    return lambda subset: FAIL if culprits <= set(subset) else PASS


def test_split_is_contiguous_and_complete() -> None:
    assert split(tuple(range(7)), 3) == [(0, 1), (2, 3), (4, 5, 6)]
    assert split((1,), 4) == [(1,)]


@pytest.mark.parametrize("culprits", [{5}, {3, 29}, {0, 16, 31}, {7, 8}])
def test_finds_exactly_the_culprits_and_is_one_minimal(culprits: set[int]) -> None:
    search = _run(Search(tuple(range(32))), _culprit_oracle(culprits))
    assert set(search.result) == culprits and search.one_minimal
    textbook, textbook_trials = textbook_ddmin(tuple(range(32)), _culprit_oracle(culprits))
    assert set(textbook) == culprits
    # Run one at a time, the cache alone never costs more trials than the textbook;
    # run two at a time, the rounds (wall time) never exceed the textbook's trials.
    serial = _run(Search(tuple(range(32)), parallel=1), _culprit_oracle(culprits))
    assert serial.trials <= textbook_trials
    assert search.rounds <= textbook_trials


def test_evidence_first_removes_every_unread_unit_in_one_trial() -> None:
    culprits = {4, 20}
    relevant = frozenset({1, 4, 9, 20})
    with_evidence = _run(Search(tuple(range(32)), relevant=relevant), _culprit_oracle(culprits))
    without = _run(Search(tuple(range(32))), _culprit_oracle(culprits))
    assert set(with_evidence.result) == culprits
    assert with_evidence.trials < without.trials


def test_misleading_evidence_still_gives_the_right_answer() -> None:
    search = _run(Search(tuple(range(16)), relevant=frozenset({0, 1})), _culprit_oracle({9}))
    assert search.result == (9,)


def test_cache_answers_repeated_questions() -> None:
    asked: list[frozenset[int]] = []

    def oracle(subset: tuple[int, ...]) -> str:
        asked.append(frozenset(subset))
        return FAIL if {2, 5} <= set(subset) else PASS

    search = _run(Search(tuple(range(8))), oracle)
    assert len(asked) == len(set(asked)) == search.trials
    assert search.cache_hits > 0


def test_unresolved_trials_do_not_shrink() -> None:
    def oracle(subset: tuple[int, ...]) -> str:
        if len(subset) < 3:
            return UNRESOLVED
        return FAIL if 1 in subset else PASS

    search = _run(Search(tuple(range(6))), oracle)
    assert 1 in search.result and len(search.result) >= 3


def test_budget_exhaustion_returns_the_best_so_far() -> None:
    ticks = itertools.count()
    search = Search(tuple(range(32)), budget_s=8, clock=lambda: next(ticks))
    _run(search, _culprit_oracle({3, 30}))
    assert search.exhausted and not search.one_minimal
    assert {3, 30} <= set(search.result) and len(search.result) < 32


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 40).flatmap(lambda n: st.tuples(st.just(n), st.sets(st.integers(0, n - 1), min_size=1, max_size=4))))
def test_property_result_fails_and_is_one_minimal(case: tuple[int, set[int]]) -> None:
    n, culprits = case
    search = _run(Search(tuple(range(n)), parallel=2), _culprit_oracle(culprits))
    assert set(search.result) == culprits
    for unit in search.result:
        assert not culprits <= set(search.result) - {unit}
