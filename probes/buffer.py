"""Rounds waiting for Redis: a bounded FIFO that drops (and counts) the oldest beyond its bound."""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Sequence

from knapsack_lb.model import Measurement


class RoundBuffer:
    """Up to ``max_rounds`` rounds of measurements, oldest first, each numbered as it comes.

    ``push`` returns how many rounds it dropped to stay within the bound (0 or 1); the
    totals are in ``dropped_rounds`` and ``dropped_measurements``. A write takes
    :meth:`pending` (the rounds and the number of the newest) and, once it has succeeded,
    :meth:`written` with that number: rounds pushed while the write was in flight stay, even
    when the bound dropped older ones meanwhile (counting rounds instead would remove a new,
    unwritten round for each dropped one). How it fails: a round dropped while its write was
    in flight is counted as dropped though the write may still store it.
    """

    def __init__(self, max_rounds: int) -> None:
        if not isinstance(max_rounds, int) or max_rounds < 1:
            raise ValueError(f"max_buffered_rounds must be an integer >= 1, got {max_rounds!r}")
        self.max_rounds = max_rounds
        self._rounds: deque[tuple[int, tuple[Measurement, ...]]] = deque()
        self._pushed = 0  # the number of the newest round pushed
        self.dropped_rounds = 0
        self.dropped_measurements = 0

    def __len__(self) -> int:
        return len(self._rounds)

    def push(self, round_: Sequence[Measurement]) -> int:
        self._pushed += 1
        self._rounds.append((self._pushed, tuple(round_)))
        dropped = 0
        while len(self._rounds) > self.max_rounds:
            self.dropped_measurements += len(self._rounds.popleft()[1])
            self.dropped_rounds += 1
            dropped += 1
        return dropped

    def peek_all(self) -> list[Measurement]:
        """Every buffered measurement, oldest round first (to write in one pipeline)."""
        return [m for _, round_ in self._rounds for m in round_]

    def pending(self) -> tuple[list[Measurement], int]:
        """Every buffered measurement (as :meth:`peek_all`) and the number of the newest round, for
        :meth:`written` once they are stored; 0 when nothing is buffered."""
        return self.peek_all(), (self._rounds[-1][0] if self._rounds else 0)

    def written(self, through: int) -> None:
        """Forget the rounds numbered ``through`` or lower (a write of :meth:`pending` succeeded)."""
        while self._rounds and self._rounds[0][0] <= through:
            self._rounds.popleft()

    async def write(self, put: Callable[[list[Measurement]], Awaitable[None]]) -> list[Measurement]:
        """Write every buffered round in one call of ``put`` (a store's ``put_measurements``) and forget
        them; returns what was written (empty when nothing was buffered). When ``put`` raises, the
        rounds stay for the next write and the error propagates."""
        pending, newest = self.pending()
        if newest:
            await put(pending)
            self.written(newest)
        return pending
