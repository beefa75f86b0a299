"""Least connections (JSQ), weighted least connections, and power of two choices.

``LeastConnections``: the DIP with the fewest requests (connections at layer 4) outstanding at this LB
instance; ties are broken uniformly at random (L7 report, "Server Selection"; KnapsackLB 2.1.2 "LCA").
``WeightedLeastConnections``: the smallest ``(outstanding + 1) / weight`` (HAProxy ``leastconn`` with
weights, the L7 report's "fewest active connections divided by the weight"); weight 0 = never.
``PowerOfTwo``: Envoy's ``least_request`` (and Istio's default): draw ``choices`` (2) distinct DIPs at
random and take the one with fewer outstanding; ties go to the first drawn.
How they fail: they count only this instance's requests (other MUXes/sidecars are invisible), and at
layer 4 they balance connection counts, not load (docs/design.md, "When weights can beat least-connections");
a DIP that fails fast empties its queue and attracts traffic (ELS blog).
"""

from __future__ import annotations

import random

from knapsack_lb.sim.policies.base import LbView, Request, StatelessPolicy
from knapsack_lb.sim.policies.registry import PolicyContext


class LeastConnections(StatelessPolicy):
    name = "least_connections"

    def pick(self, request: Request, view: LbView, rng: random.Random) -> int | None:
        best: list[int] = []
        best_n = 0
        excluded = request.excluded
        outstanding = view.outstanding  # bound once: this loop runs for every placement
        for dip in range(len(view.dip_names)):
            if dip in excluded:
                continue
            n = outstanding(dip)
            if not best or n < best_n:
                best, best_n = [dip], n
            elif n == best_n:
                best.append(dip)
        if not best:
            return None
        return best[0] if len(best) == 1 else best[rng.randrange(len(best))]


class WeightedLeastConnections(StatelessPolicy):
    name = "weighted_least_connections"

    def pick(self, request: Request, view: LbView, rng: random.Random) -> int | None:
        best: list[int] = []
        best_score = 0.0
        excluded = request.excluded
        for dip in range(len(view.dip_names)):
            w = view.weight(dip)
            if w <= 0 or dip in excluded:
                continue
            score = (view.outstanding(dip) + 1) / w
            if not best or score < best_score - 1e-12:
                best, best_score = [dip], score
            elif abs(score - best_score) <= 1e-12:
                best.append(dip)
        if not best:
            return None
        return best[0] if len(best) == 1 else best[rng.randrange(len(best))]


class PowerOfTwo(StatelessPolicy):
    name = "power_of_two"

    def __init__(self, choices: int = 2) -> None:
        if choices < 1:
            raise ValueError(f"choices must be >= 1 (got {choices})")
        self.choices = choices

    def pick(self, request: Request, view: LbView, rng: random.Random) -> int | None:
        n = len(view.dip_names)
        excluded = request.excluded
        allowed = range(n) if not excluded else [d for d in range(n) if d not in excluded]
        k = len(allowed)
        if k == 0:
            return None
        drawn = rng.sample(allowed, min(self.choices, k))
        best = drawn[0]
        for dip in drawn[1:]:
            if view.outstanding(dip) < view.outstanding(best):
                best = dip
        return best


def make_least_connections(ctx: PolicyContext) -> LeastConnections:
    """Join the shortest queue: fewest outstanding at this LB (ties random)."""
    return LeastConnections(**ctx.params)


def make_weighted_least_connections(ctx: PolicyContext) -> WeightedLeastConnections:
    """Fewest (outstanding + 1) / weight (HAProxy leastconn with weights)."""
    return WeightedLeastConnections(**ctx.params)


def make_power_of_two(ctx: PolicyContext) -> PowerOfTwo:
    """Envoy least_request: two random DIPs, the one with fewer outstanding."""
    return PowerOfTwo(**ctx.params)
