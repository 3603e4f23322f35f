"""Textbook ddmin (Zeller & Hildebrandt, 2002): the reference ccw's delta-minimising searches
are measured against, in tests/test_deltamin_core.py and ``bench/run.py deltamin``.

As the paper writes it: no cache, no evidence, one trial at a time.  It speaks the same
sans-IO interface as ``mcp_server.core.deltamin.Search`` (``next_batch``, ``report``), so
a test answers its trials with a function and the bench with real capsules.
"""

from __future__ import annotations

from collections.abc import Sequence

from mcp_server.core.deltamin import FAIL, split


class TextbookDdmin:
    """ddmin over ``units``: ``result`` is 1-minimal among the subsets it tried that fail."""

    def __init__(self, units: Sequence[int]) -> None:
        self.result = tuple(units)
        self.trials = 0
        self._n = 2
        self._candidates: list[tuple[tuple[int, ...], int]] = []  # (subset, granularity after it fails)
        self._round()

    def _round(self) -> None:
        """The candidates of one pass at granularity n: each chunk, then each complement."""
        current, n = self.result, self._n
        if len(current) < 2:
            self._candidates = []
            return
        chunks = split(current, n)
        self._candidates = [(chunk, 2) for chunk in chunks] + [
            (tuple(u for u in current if u not in set(chunk)), max(n - 1, 2)) for chunk in chunks
        ]

    def next_batch(self) -> list[tuple[int, ...]]:
        """The one subset to try next, or nothing when the search is over."""
        return [self._candidates[0][0]] if self._candidates else []

    def report(self, outcomes: Sequence[str]) -> None:
        """The outcome of the subset ``next_batch`` gave."""
        (outcome,) = outcomes
        self.trials += 1
        candidate, next_n = self._candidates.pop(0)
        if outcome == FAIL:
            self.result, self._n = candidate, next_n
        elif self._candidates:
            return
        elif self._n >= len(self.result):
            return  # no chunk and no complement fails at the finest granularity: 1-minimal
        else:
            self._n = min(len(self.result), 2 * self._n)
        self._round()
