"""Round robin and weighted round robin.

``RoundRobin``: rotates over DIPs, skipping excluded ones (L7 report, "Server Selection").
``SmoothWeightedRoundRobin``: nginx's smooth WRR: every pick adds each DIP's weight to its current
value, picks the largest, and subtracts the total; over any cycle DIP i gets w_i / sum(w) of the
picks, interleaved (weights 5,1,1 give a a b a c a a, not a a a a a b c). Weights are read from the
view at every pick, so weights pushed by a controller apply at once (to new connections at layer 4).
``BlockWeightedRoundRobin``: the L7 report's variant, "giving each server as many turns in a row as
its weight" (weights rounded to integers >= 1).
How they fail: they ignore load, so a slow DIP gets its full share (the baseline the documents beat).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from knapsack_lb.sim.policies.base import LbView, Request, StatelessPolicy
from knapsack_lb.sim.policies.registry import PolicyContext


class RoundRobin(StatelessPolicy):
    name = "round_robin"

    def __init__(self, start: int = 0) -> None:
        self._next = start

    def pick(self, request: Request, view: LbView, rng: random.Random) -> int | None:
        n = len(view.dip_names)
        for step in range(n):
            dip = (self._next + step) % n
            if dip not in request.excluded:
                self._next = dip + 1
                return dip
        return None


class SmoothWeightedRoundRobin(StatelessPolicy):
    """``weights``: fixed weights that override the view's (an oracle plan for reference runs)."""

    name = "weighted_round_robin"

    def __init__(self, weights: Sequence[float] | None = None) -> None:
        self._current: list[float] = []
        if weights is not None and any(w < 0 for w in weights):
            raise ValueError(f"weights must be >= 0 (got {list(weights)})")
        self._fixed = None if weights is None else [float(w) for w in weights]

    def pick(self, request: Request, view: LbView, rng: random.Random) -> int | None:
        n = len(view.dip_names)
        if len(self._current) != n:
            self._current = [0.0] * n
        current = self._current
        excluded = request.excluded
        total = 0.0
        best = -1
        best_value = 0.0
        fixed = self._fixed
        if fixed is not None and len(fixed) != n:
            raise ValueError(f"{len(fixed)} fixed weights for {n} DIPs")
        for dip in range(n):
            w = fixed[dip] if fixed is not None else view.weight(dip)
            if w <= 0 or dip in excluded:
                continue
            current[dip] += w
            total += w
            if best < 0 or current[dip] > best_value:
                best, best_value = dip, current[dip]
        if best < 0:
            return None
        current[best] -= total
        return best


class BlockWeightedRoundRobin(StatelessPolicy):
    name = "block_weighted_round_robin"

    def __init__(self) -> None:
        self._dip = 0
        self._turns_left = -1

    def pick(self, request: Request, view: LbView, rng: random.Random) -> int | None:
        n = len(view.dip_names)
        if self._turns_left < 0:
            self._turns_left = max(1, round(view.weight(0))) if n else 0
        for _ in range(2 * n + 1):
            if self._turns_left > 0 and self._dip not in request.excluded and view.weight(self._dip) > 0:
                self._turns_left -= 1
                return self._dip
            self._dip = (self._dip + 1) % n
            self._turns_left = max(1, round(view.weight(self._dip)))
        return None


def make_round_robin(ctx: PolicyContext) -> RoundRobin:
    """Round robin over DIPs (not excluded)."""
    # each LB instance starts at a different position, as independent MUXes/sidecars do
    return RoundRobin(start=(ctx.lb_index * 7919 + ctx.seed) % max(1, len(ctx.dip_names)), **ctx.params)


def make_smooth_wrr(ctx: PolicyContext) -> SmoothWeightedRoundRobin:
    """Smooth weighted round robin (nginx) over the pushed/configured weights."""
    return SmoothWeightedRoundRobin(**ctx.params)


def make_block_wrr(ctx: PolicyContext) -> BlockWeightedRoundRobin:
    """Weighted round robin as in the L7 report: each DIP gets `weight` turns in a row."""
    return BlockWeightedRoundRobin(**ctx.params)
