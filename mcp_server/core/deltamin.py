"""Delta debugging, sans-IO: which part of a change set causes a failure.

``Search`` is the ddmin algorithm (Zeller & Hildebrandt, 2002) written as a state machine
that asks for trials instead of running them: ``next_batch()`` returns the subsets it
wants tested next (up to ``parallel`` at once, as picire does on small machines) and
``report()`` takes their outcomes.  The caller runs each trial however it likes (here:
capsules over the base), which keeps this module pure and its tests synchronous.

Beyond textbook ddmin:
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


@dataclass
class Search:
    """ddmin over ``units`` (a failing configuration), asking for trials in batches."""

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
        self._phase = "relevant" if self.relevant is not None and 0 < len(self.relevant) < len(self.units) else "subsets"
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
        key = frozenset(candidate)
        if key in self.cache:
            return self.cache[key]
        for known, outcome in self.cache.items():
            if outcome == PASS and key <= known:
                return PASS
        return None

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
