"""Random DIP selection (KnapsackLB section 6.2 "RD": uniformly at random), and a weighted variant.

How they fail: no load awareness; with several LB instances the load per DIP is binomial noise.
"""

from __future__ import annotations

import random

from knapsack_lb.sim.policies.base import LbView, Request, StatelessPolicy
from knapsack_lb.sim.policies.registry import PolicyContext


class RandomChoice(StatelessPolicy):
    name = "random"

    def pick(self, request: Request, view: LbView, rng: random.Random) -> int | None:
        n = len(view.dip_names)
        if not request.excluded:
            return rng.randrange(n) if n else None
        allowed = [d for d in range(n) if d not in request.excluded]
        return rng.choice(allowed) if allowed else None


class WeightedRandom(StatelessPolicy):
    name = "weighted_random"

    def pick(self, request: Request, view: LbView, rng: random.Random) -> int | None:
        n = len(view.dip_names)
        allowed = [d for d in range(n) if d not in request.excluded and view.weight(d) > 0]
        if not allowed:
            return None
        total = sum(view.weight(d) for d in allowed)
        x = rng.random() * total
        for d in allowed:
            x -= view.weight(d)
            if x < 0:
                return d
        return allowed[-1]


def make_random(ctx: PolicyContext) -> RandomChoice:
    """Uniformly random DIP."""
    return RandomChoice(**ctx.params)


def make_weighted_random(ctx: PolicyContext) -> WeightedRandom:
    """Random DIP with probability ~ weight."""
    return WeightedRandom(**ctx.params)
