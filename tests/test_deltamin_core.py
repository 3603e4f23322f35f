"""The sans-IO searches: exact culprits, 1-minimality, fewer trials than the textbook, and (the
group-testing Search) rounds that use every slot."""

from __future__ import annotations

import itertools
import random
from typing import TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcp_server.core.deltamin import FAIL, PASS, UNRESOLVED, Ddmin, Search, split
from tests.support.textbook_ddmin import TextbookDdmin

S = TypeVar("S", bound=Search | Ddmin | TextbookDdmin)


def _run(search: S, oracle: object) -> S:
    while batch := search.next_batch():
        search.report([oracle(c) for c in batch])  # type: ignore[operator]
    return search


def _culprit_oracle(culprits: set[int]) -> object:
    return lambda subset: FAIL if culprits <= set(subset) else PASS


def test_split_is_contiguous_and_complete() -> None:
    assert split(tuple(range(7)), 3) == [(0, 1), (2, 3), (4, 5, 6)]
    assert split((1,), 4) == [(1,)]


@pytest.mark.parametrize("kind", [Search, Ddmin])
@pytest.mark.parametrize("culprits", [{5}, {3, 29}, {0, 16, 31}, {7, 8}])
def test_finds_exactly_the_culprits_and_is_one_minimal(kind: type[Search] | type[Ddmin], culprits: set[int]) -> None:
    search = _run(kind(tuple(range(32))), _culprit_oracle(culprits))
    assert set(search.result) == culprits and search.one_minimal
    textbook = _run(TextbookDdmin(tuple(range(32))), _culprit_oracle(culprits))
    assert set(textbook.result) == culprits
    textbook_trials = textbook.trials
    # Run one at a time, neither search costs more trials than the textbook;
    # run two at a time, the rounds (wall time) never exceed the textbook's trials.
    serial = _run(kind(tuple(range(32)), parallel=1), _culprit_oracle(culprits))
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


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 40).flatmap(
           lambda n: st.tuples(st.just(n), st.sets(st.integers(0, n - 1), min_size=1, max_size=6))),
       st.sampled_from([1, 2, 3, 4, 8]))
def test_property_result_fails_and_is_one_minimal(case: tuple[int, set[int]], parallel: int) -> None:
    n, culprits = case
    search = _run(Search(tuple(range(n)), parallel=parallel), _culprit_oracle(culprits))
    assert set(search.result) == culprits and search.one_minimal
    for unit in search.result:
        assert not culprits <= set(search.result) - {unit}


def _costs(kind: type[Search] | type[Ddmin], parallel: int, n: int, culprits: set[int]) -> tuple[int, int]:
    search = _run(kind(tuple(range(n)), parallel=parallel), _culprit_oracle(culprits))
    assert set(search.result) == culprits
    return search.trials, search.rounds


def test_a_round_of_four_is_worth_four_answers() -> None:
    # The scale-out bench's wide change (4 culprits of 32, one per quarter): one slot
    # takes 21 trials; four slots answer in 5 rounds, where ddmin needs 14.
    wide = {3, 11, 19, 27}
    one, _ = _costs(Search, 1, 32, wide)
    _, four = _costs(Search, 4, 32, wide)
    _, ddmin_four = _costs(Ddmin, 4, 32, wide)
    assert one >= 4 * four and four * 2 < ddmin_four


def test_on_random_changes_as_few_trials_as_ddmin_and_far_fewer_rounds() -> None:
    rng = random.Random(7)
    totals = {"trials@1": 0, "ddmin trials@1": 0, "rounds@4": 0, "ddmin rounds@4": 0}
    for _ in range(300):
        n = rng.choice([16, 32, 64])
        culprits = set(rng.sample(range(n), rng.randint(1, 6)))
        totals["trials@1"] += _costs(Search, 1, n, culprits)[0]
        totals["ddmin trials@1"] += _costs(Ddmin, 1, n, culprits)[0]
        totals["rounds@4"] += _costs(Search, 4, n, culprits)[1]
        totals["ddmin rounds@4"] += _costs(Ddmin, 4, n, culprits)[1]
    assert totals["trials@1"] <= totals["ddmin trials@1"], totals
    assert totals["rounds@4"] * 1.5 <= totals["ddmin rounds@4"], totals
    assert totals["trials@1"] >= 2.5 * totals["rounds@4"], totals


def test_two_separate_causes_fall_back_to_ddmin_and_still_give_a_failing_one_minimal_set() -> None:
    # Not monotone in the group-testing sense: either pair alone fails, so removing
    # either pair's quarter fails, but removing both (one round's two failing answers
    # taken together) passes.  The end game's check catches it; ddmin finishes.
    def oracle(subset: tuple[int, ...]) -> str:
        return FAIL if {0, 1} <= set(subset) or {14, 15} <= set(subset) else PASS

    fell_back = []
    for parallel in (1, 2, 4):
        search = _run(Search(tuple(range(16)), parallel=parallel), oracle)
        fell_back.append(getattr(search, "_fallback", None) is not None)
        assert oracle(search.result) == FAIL and search.one_minimal
        assert set(search.result) in ({0, 1}, {14, 15})
        for unit in search.result:
            assert oracle(tuple(u for u in search.result if u != unit)) == PASS
    assert fell_back == [False, False, True]  # only rounds of several answers take two removals together


def test_the_final_check_answers_the_searchs_last_question() -> None:
    # deltamin's final check runs the result anyway (journaled, witnessed); a lone
    # decisive last trial is answered by it, so the result is not run twice.
    import trio

    from mcp_server.capsules.deltamin import _search

    culprits = {3, 11}
    oracle = _culprit_oracle(culprits)
    ran: list[frozenset[int]] = []
    checked: list[tuple[int, ...]] = []

    class Trials:
        async def batch(self, subsets: list[tuple[int, ...]]) -> list[str]:
            ran.extend(frozenset(s) for s in subsets)
            return [oracle(s) for s in subsets]  # type: ignore[operator]

    async def finish(subset: tuple[int, ...]) -> str:
        checked.append(subset)
        return oracle(subset)  # type: ignore[operator]

    for parallel in (1, 4):
        ran.clear()
        checked.clear()
        search = trio.run(_search, Search(tuple(range(16)), parallel), Trials(), finish)  # type: ignore[arg-type]
        assert set(search.result) == culprits and search.one_minimal
        assert checked[-1] == search.result and frozenset(search.result) not in ran
        assert search.trials == len(ran) + len(checked)


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 24), st.integers(0, 2**32 - 1), st.sampled_from([1, 2, 4]),
       st.sampled_from([0.2, 0.5, 0.8]))
def test_property_any_oracle_ends_with_a_failing_result(n: int, seed: int, parallel: int, fail_rate: float) -> None:
    # An arbitrary (deterministic, non-monotone, sometimes unresolved) oracle: the search
    # must still end, answer with a configuration a trial saw fail, and claim
    # 1-minimality only when every single removal from it was seen (or implied) not to.
    everything = frozenset(range(n))

    def oracle(subset: tuple[int, ...]) -> str:
        key = frozenset(subset)
        if key == everything:
            return FAIL
        draw = random.Random(hash((seed, key))).random()
        return FAIL if draw < fail_rate else UNRESOLVED if draw < fail_rate + 0.1 else PASS

    search = Search(tuple(range(n)), parallel=parallel)
    for _ in range(10_000):
        batch = search.next_batch()
        if not batch:
            break
        search.report([oracle(c) for c in batch])
    else:
        raise AssertionError("the search did not end")
    assert oracle(search.result) == FAIL
    if search.one_minimal:
        for unit in search.result:
            rest = tuple(u for u in search.result if u != unit)
            assert search.cache.get(frozenset(rest)) != FAIL
