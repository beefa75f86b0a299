"""Rounds waiting for Redis: a bounded FIFO that drops (and counts) the oldest beyond its bound."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from knapsack_lb.model import Measurement


class RoundBuffer:
    """Up to ``max_rounds`` rounds of measurements, oldest first.

    ``push`` returns how many rounds it dropped to stay within the bound (0 or 1); the
    totals are in ``dropped_rounds`` and ``dropped_measurements``.
    """

    def __init__(self, max_rounds: int) -> None:
        if not isinstance(max_rounds, int) or max_rounds < 1:
            raise ValueError(f"max_buffered_rounds must be an integer >= 1, got {max_rounds!r}")
        self.max_rounds = max_rounds
        self._rounds: deque[tuple[Measurement, ...]] = deque()
        self.dropped_rounds = 0
        self.dropped_measurements = 0

    def __len__(self) -> int:
        return len(self._rounds)

    def push(self, round_: Sequence[Measurement]) -> int:
        self._rounds.append(tuple(round_))
        dropped = 0
        while len(self._rounds) > self.max_rounds:
            self.dropped_measurements += len(self._rounds.popleft())
            self.dropped_rounds += 1
            dropped += 1
        return dropped

    def peek_all(self) -> list[Measurement]:
        """Every buffered measurement, oldest round first (to write in one pipeline)."""
        return [m for round_ in self._rounds for m in round_]

    def pop_rounds(self, count: int) -> None:
        for _ in range(min(count, len(self._rounds))):
            self._rounds.popleft()
