"""Delta debugging, sans-IO: which part of a change set causes a failure.

Two searches, each a state machine that asks for trials instead of running them:
``next_batch()`` returns the subsets it wants tested next (up to ``parallel`` at once)
and ``report()`` takes their outcomes.  The caller runs each trial however it likes
(local capsules, or a REAPI cluster's bots), which keeps this module pure and its tests
synchronous.

- ``Search`` (the one deltamin uses) is group testing on removals: each round's
  questions are independent, so ``parallel`` slots buy ``parallel`` answers a round,
  and one at a time it costs no more trials than ddmin (see its docstring).
- ``Ddmin`` is the ddmin algorithm (Zeller & Hildebrandt, 2002).  Its rounds are
  sequential (each ends at its first failing trial), so extra slots buy little; it is
  ``Search``'s fallback when outcomes are not monotone, and the reference in the bench.

Beyond textbook ddmin (both searches):
- **Cache**: an outcome is never asked for twice (a subset's complement at n = 2 is the
  other subset; complements repeat across granularities).
- **Monotone skipping**: a subset of a set known to pass is assumed to pass and not
  tried (the usual ddmin assumption, made explicit; counted as a cache hit).
- **Evidence first**: units are ordered so that those the failing command read (or
  created) come first, and before ddmin proper the set of just those units is tried:
  a unit the command never read cannot matter unless it was created, so when that
  trial fails every such unit goes in one step.
- **Hierarchy** (HDD): the caller runs one search over whole files, then another over
  the hunks of the files that remain (``Search`` is agnostic: units are opaque ints).

Outcomes: ``FAIL`` (the failure reproduces), ``PASS``, ``UNRESOLVED`` (e.g. the patch
subset did not build).  Only ``FAIL`` shrinks the set.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

FAIL = "fail"
PASS = "pass"
UNRESOLVED = "unresolved"


def split(units: Sequence[int], n: int) -> list[tuple[int, ...]]:
    """``units`` in ``n`` contiguous chunks of near-equal size (ddmin's partition)."""
    out = []
    start = 0
    for i in range(n):
        stop = start + (len(units) - start) // (n - i)
        out.append(tuple(units[start:stop]))
        start = stop
    return [c for c in out if c]


def known_outcome(cache: dict[frozenset[int], str], candidate: Iterable[int]) -> str | None:
    """The cached outcome of ``candidate``, or PASS for a subset of one known to pass (monotone skipping)."""
    key = frozenset(candidate)
    if key in cache:
        return cache[key]
    for known, outcome in cache.items():
        if outcome == PASS and key <= known:
            return PASS
    return None


@dataclass
class Ddmin:
    """ddmin over ``units`` (a failing configuration), asking for trials in batches.

    ``Search`` falls back to it when its outcomes contradict monotonicity; the bench
    keeps it as the reference the group-testing search is measured against.
    """

    units: tuple[int, ...]
    parallel: int = 2
    relevant: frozenset[int] | None = None  # units with evidence; tried alone first
    budget_s: float | None = None
    clock: object = time.monotonic
    cache: dict[frozenset[int], str] = field(default_factory=dict)
    trials: int = 0
    rounds: int = 0  # batches run: the wall-time cost when a batch runs in parallel
    cache_hits: int = 0
    exhausted: bool = False

    def __post_init__(self) -> None:
        self.current: tuple[int, ...] = tuple(self.units)
        self.n = 2
        self.cache[frozenset(self.current)] = FAIL
        self._started = self.clock()  # type: ignore[operator]
        self._phase = ("relevant" if self.relevant is not None and 0 < len(self.relevant) < len(self.units)
                       else "subsets")
        self._candidates: list[tuple[int, ...]] = []
        self._pos = 0
        self._pending: list[tuple[int, ...]] = []
        self.done = len(self.current) <= 1
        self._prepare_round()

    # --- public ------------------------------------------------------------------------
    @property
    def result(self) -> tuple[int, ...]:
        """The smallest failing configuration found so far."""
        return self.current

    @property
    def one_minimal(self) -> bool:
        """True once every single-unit removal was shown not to fail."""
        return self.done and not self.exhausted

    def next_batch(self) -> list[tuple[int, ...]]:
        """The next subsets to try (empty when the search is over)."""
        while not self.done:
            if self.budget_s is not None and self.clock() - self._started > self.budget_s:  # type: ignore[operator]
                self.exhausted = True
                self.done = True
                break
            batch: list[tuple[int, ...]] = []
            while self._pos < len(self._candidates) and len(batch) < self.parallel:
                candidate = self._candidates[self._pos]
                self._pos += 1
                known = self._known(candidate)
                if known is not None:
                    self.cache_hits += 1
                    if known == FAIL:
                        self._shrink_to(candidate)
                        batch = []
                        break
                    continue
                batch.append(candidate)
            if batch:
                self._pending = batch
                return batch
            if self._pos >= len(self._candidates) and not self._pending:
                self._advance()
        return []

    def report(self, outcomes: Sequence[str]) -> None:
        """Outcomes for the last batch, in its order."""
        batch, self._pending = self._pending, []
        if len(outcomes) != len(batch):
            raise ValueError("one outcome per subset of the batch")
        self.trials += len(batch)
        self.rounds += 1
        for candidate, outcome in zip(batch, outcomes, strict=True):
            self.cache[frozenset(candidate)] = outcome
        for candidate, outcome in zip(batch, outcomes, strict=True):
            if outcome == FAIL:
                self._shrink_to(candidate)
                return

    # --- ddmin ---------------------------------------------------------------------------
    def _known(self, candidate: Iterable[int]) -> str | None:
        return known_outcome(self.cache, candidate)

    def _prepare_round(self) -> None:
        self._pos = 0
        if self._phase == "relevant":
            assert self.relevant is not None
            self._candidates = [tuple(u for u in self.current if u in self.relevant)]
            return
        chunks = split(self.current, self.n)
        if self._phase == "subsets":
            self._candidates = chunks
        else:  # complements; at n = 2 they are the subsets again, which the cache knows
            self._candidates = [tuple(u for u in self.current if u not in set(c)) for c in chunks]

    def _shrink_to(self, candidate: tuple[int, ...]) -> None:
        was_complement = self._phase == "complements"
        self.current = tuple(candidate)
        if self._phase == "relevant":
            self.n = 2
        else:
            self.n = max(self.n - 1, 2) if was_complement else 2
        self._phase = "subsets"
        if len(self.current) <= 1:
            self.done = True
            return
        self._prepare_round()

    def _advance(self) -> None:
        if self._phase == "relevant":
            self._phase = "subsets"
        elif self._phase == "subsets":
            self._phase = "complements"
        elif self.n < len(self.current):
            self.n = min(len(self.current), 2 * self.n)
            self._phase = "subsets"
        else:
            self.done = True
            return
        self._prepare_round()


# --- group testing ---------------------------------------------------------------------
PARTS = 4  # a cell of unknown make-up is split this many ways (see Search)


@dataclass(frozen=True)
class _Test:
    """One question of a round: does ``current`` still fail without ``removed``?"""

    kind: str  # relevant | split | bit | rest | check | single
    cell: int  # index into the round's cells (split, bit), else -1
    removed: frozenset[int]
    subset: tuple[int, ...]
    bit: int = -1


@dataclass
class _Cell:
    """Units believed to hold at least one culprit: ``split`` (how many unknown) or ``bit`` (one, by belief)."""

    mode: str
    units: tuple[int, ...]
    parts: tuple[tuple[int, ...], ...] = ()  # a split cell's parts not yet asked about


@dataclass
class Search:
    """Minimise ``units`` (a failing configuration) by group testing on removals, in rounds.

    ddmin asks one question after another: each round ends at its first failing trial
    and the next round starts from it, so however many trials could run at once, one
    search gains little (1.4x at most on the scale-out bench's changes with 4 slots).
    This search asks questions whose answers do not depend on each other, so a round of
    ``parallel`` trials is worth ``parallel`` answers.

    Every question is a removal: does ``current`` still fail without the units ``X``?
    If it fails, ``X`` holds nothing the failure needs and goes; if it passes, ``X``
    holds at least one culprit.  The units live in *cells* believed to hold culprits:

    - a **split** cell (the whole change at first; anything whose make-up is unknown)
      is cut into ``PARTS`` contiguous parts and each part's removal asked; a part whose
      removal passes becomes a bit cell, one whose removal fails goes.
    - a **bit** cell is believed to hold one culprit.  For each bit ``b`` of a unit's
      index in the cell, ask the removal of the units with bit ``b`` set: the answers
      spell the culprit's index, ``log2(size)`` questions in one round, all at once
      (binary search would need as many rounds).  Units that do not match the answers
      go to the **rest**.
    - the **rest** (units believed innocent but not yet shown so) goes in one removal
      when a slot is free: it usually fails, clearing them all; if it passes, the rest
      becomes a split cell.

    Several removals that fail in one round go together, which assumes monotonicity (the
    usual ddmin assumption).  Nothing is concluded on belief alone: the search ends
    with an **end game** that asks whether the result itself fails and every single
    removal from it passes (answered from the cache where possible, as ddmin's
    monotone skipping does), so the result is 1-minimal by the same standard as ddmin's.
    If the result does not fail after all (the command is not monotone in the change),
    the search falls back to ddmin from the smallest configuration seen failing.

    On random culprit sets over 16-64 units this takes about as many trials as ddmin
    one at a time and about half of ddmin's rounds at 4 at once (tests/test_deltamin_core.py,
    bench/suites/scaleout.py).
    """

    units: tuple[int, ...]
    parallel: int = 2
    relevant: frozenset[int] | None = None  # units with evidence; their subset tried alone first
    budget_s: float | None = None
    clock: object = time.monotonic
    cache: dict[frozenset[int], str] = field(default_factory=dict)
    trials: int = 0
    rounds: int = 0
    cache_hits: int = 0
    exhausted: bool = False

    def __post_init__(self) -> None:
        self.current: tuple[int, ...] = tuple(self.units)
        self.best: tuple[int, ...] = self.current  # the smallest configuration a trial saw fail
        self.cache[frozenset(self.current)] = FAIL
        self._started = self.clock()  # type: ignore[operator]
        self._cells: list[_Cell] = [_Cell("split", self.current)]
        self._rest: list[int] = []
        self._round: list[tuple[_Test, str | None]] = []  # the planned round, outcomes known so far
        self._fallback: Ddmin | None = None
        self._answered: set[frozenset[int]] = set()
        self._phase = ("relevant"
                       if self.relevant is not None and 0 < len(self.relevant & set(self.units)) < len(self.units)
                       else "locate")
        self.done = len(self.current) <= 1

    # --- public (as Ddmin's) ---------------------------------------------------------------
    @property
    def result(self) -> tuple[int, ...]:
        """The smallest failing configuration found (tested to fail)."""
        return self._fallback.result if self._fallback is not None else self.best

    @property
    def one_minimal(self) -> bool:
        """True once the result was shown to fail and every single-unit removal not to."""
        if self._fallback is not None:
            return self._fallback.one_minimal
        return self.done and not self.exhausted

    def next_batch(self) -> list[tuple[int, ...]]:
        """The next subsets to try (empty when the search is over)."""
        while not self.done:
            if self._fallback is not None:
                return self._fallback_batch()
            if self.budget_s is not None and self.clock() - self._started > self.budget_s:  # type: ignore[operator]
                self.exhausted = self.done = True
                break
            tests = self._plan()
            if not tests:
                self.done = True
                break
            self._round = [(t, self._known(t.subset)) for t in tests]
            self.cache_hits += sum(o is not None for _, o in self._round)
            batch = [t.subset for t, o in self._round if o is None]
            if batch:
                return batch
            self._apply()
        return []

    def report(self, outcomes: Sequence[str]) -> None:
        """Outcomes for the last batch, in its order."""
        if self._fallback is not None:
            self._fallback_report(outcomes)
            return
        asked = [i for i, (_, o) in enumerate(self._round) if o is None]
        if len(outcomes) != len(asked):
            raise ValueError("one outcome per subset of the batch")
        self.trials += len(asked)
        self.rounds += 1
        for i, outcome in zip(asked, outcomes, strict=True):
            test = self._round[i][0]
            self._round[i] = (test, outcome)
            self.cache[frozenset(test.subset)] = outcome
            if outcome == FAIL and len(test.subset) < len(self.best):
                self.best = test.subset
        self._apply()

    # --- planning ----------------------------------------------------------------------------
    def _known(self, subset: tuple[int, ...]) -> str | None:
        return known_outcome(self.cache, subset)

    def _test(self, kind: str, removed: Iterable[int], cell: int = -1, bit: int = -1) -> _Test:
        gone = frozenset(removed)
        return _Test(kind, cell, gone, tuple(u for u in self.current if u not in gone), bit)

    def _plan(self) -> list[_Test]:
        if self._phase == "relevant":
            assert self.relevant is not None
            return [self._test("relevant", (u for u in self.current if u not in self.relevant))]
        queues: list[list[_Test]] = []
        for i, cell in enumerate(self._cells):
            if len(cell.units) < 2:
                continue
            if cell.mode == "split":
                parts = cell.parts or split(cell.units, min(PARTS, len(cell.units)))
                queues.append([self._test("split", part, i) for part in parts])
            else:
                width = (len(cell.units) - 1).bit_length()
                queues.append([self._test("bit", (u for j, u in enumerate(cell.units) if j >> b & 1), i, b)
                               for b in range(width)])
        tests: list[_Test] = []
        while len(tests) < self.parallel and any(queues):  # round-robin: every cell advances
            for queue in queues:
                if queue and len(tests) < self.parallel:
                    tests.append(queue.pop(0))
        if len(tests) < self.parallel and self._rest:
            tests.append(self._test("rest", self._rest))
        return tests or self._end_game()

    def _end_game(self) -> list[_Test]:
        """Does the result fail, and does every single removal from it not?  Only what is not known."""
        tests = []
        if self._known(self.current) != FAIL:
            tests.append(self._test("check", ()))
        for unit in self.current if len(self.current) > 1 else ():
            without = tuple(u for u in self.current if u != unit)
            if self._known(without) is None:
                if len(tests) < self.parallel:
                    tests.append(self._test("single", (unit,)))
            elif frozenset(without) not in self._answered:  # answered by the cache, counted once
                self._answered.add(frozenset(without))
                self.cache_hits += 1
        return tests

    # --- learning ------------------------------------------------------------------------------
    def _apply(self) -> None:
        """Fold a finished round into the cells, the rest and ``current``."""
        round_, self._round = self._round, []
        dropped: set[int] = set()
        for test, outcome in round_:
            if outcome == FAIL and test.kind != "check":
                dropped |= test.removed
        if self._phase == "relevant":
            [(test, outcome)] = round_
            self._phase = "locate"
            if outcome == FAIL:
                self.current = test.subset
                self._cells = [_Cell("split", self.current)]
                self.done = len(self.current) <= 1
            return
        check = [o for t, o in round_ if t.kind == "check"]
        if check and check[0] != FAIL:
            self._fall_back()
            return
        cells: list[_Cell] = []
        for i, cell in enumerate(self._cells):
            seen = [(t, o) for t, o in round_ if t.cell == i and t.kind in ("split", "bit")]
            if not seen:
                cells.append(cell)
            elif cell.mode == "split":
                cells.extend(self._learn_split(cell, seen, dropped))
            else:
                cells.append(self._learn_bits(cell, seen, dropped))
        for test, outcome in round_:
            if test.kind == "rest":
                if outcome != FAIL:
                    cells.append(_Cell("split", tuple(u for u in self.current if u in test.removed)))
                self._rest = [u for u in self._rest if u not in test.removed]
        self.current = tuple(u for u in self.current if u not in dropped)
        self._rest = [u for u in self._rest if u not in dropped]
        self._cells = [c for c in (_Cell(c.mode, tuple(u for u in c.units if u not in dropped), c.parts) for c in cells)
                       if c.units]
        if len(self.current) <= 1 and self._known(self.current) == FAIL:
            self.done = True

    def _learn_split(self, cell: _Cell, seen: list[tuple[_Test, str | None]], dropped: set[int]) -> list[_Cell]:
        out = [_Cell("bit", tuple(u for u in cell.units if u in t.removed)) for t, o in seen if o != FAIL]
        asked = {t.removed for t, _ in seen}
        parts = cell.parts or tuple(split(cell.units, min(PARTS, len(cell.units))))
        untried = tuple(tuple(u for u in part if u not in dropped) for part in parts if frozenset(part) not in asked)
        untried = tuple(part for part in untried if part)
        if out:  # the culprits found so far may be all: the rest's removal will tell
            self._rest.extend(u for part in untried for u in part)
        elif len(untried) > 1:  # every part asked went: the parts left hold the culprits
            out.append(_Cell("split", tuple(u for part in untried for u in part), untried))
        elif untried:
            out.append(_Cell("split", untried[0]))
        return out

    def _learn_bits(self, cell: _Cell, seen: list[tuple[_Test, str | None]], dropped: set[int]) -> _Cell:
        keep = []
        for j, unit in enumerate(cell.units):
            if unit in dropped:
                continue
            if all(bool(j >> t.bit & 1) == (o != FAIL) for t, o in seen):
                keep.append(unit)
            else:
                self._rest.append(unit)
        return _Cell("bit", tuple(keep))

    # --- when outcomes are not monotone ----------------------------------------------------------
    def _fall_back(self) -> None:
        budget = None if self.budget_s is None else self.budget_s - (self.clock() - self._started)  # type: ignore[operator]
        self._fallback = Ddmin(self.best, self.parallel, budget_s=budget, clock=self.clock, cache=self.cache)

    def _fallback_batch(self) -> list[tuple[int, ...]]:
        assert self._fallback is not None
        hits = self._fallback.cache_hits
        batch = self._fallback.next_batch()
        self.cache_hits += self._fallback.cache_hits - hits
        if not batch:
            self.done, self.exhausted = True, self._fallback.exhausted
        return batch

    def _fallback_report(self, outcomes: Sequence[str]) -> None:
        assert self._fallback is not None
        self._fallback.report(outcomes)
        self.trials += len(outcomes)
        self.rounds += 1


def decisive(search: Search | Ddmin, subset: tuple[int, ...]) -> bool:
    """Would a failing ``subset`` (the only trial of the search's batch) end the search with it as the result?

    Then the caller can answer that trial with the run it makes of the result anyway
    (deltamin's journaled final check) instead of running the same thing twice.
    """
    probe = copy.deepcopy(search)
    probe.report([FAIL])
    return not probe.next_batch() and probe.result == tuple(subset) and not probe.exhausted
