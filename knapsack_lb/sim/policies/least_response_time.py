"""Least response time (L7 report, "Server Selection"): the DIP with the lowest average response time
divided by its weight; the average is an exponentially weighted moving average of the latencies this
LB instance observed (successful responses and health-check probes alike, as in the report's health
service). DIPs never measured have average 0 and are therefore tried first.
How it fails: the average lags; a DIP that was fast gets a burst of traffic until its average
catches up (herding), which is why the report found it worse than least connections.
"""

from __future__ import annotations

import random

from knapsack_lb.sim.policies.base import LbView, Outcome, Request


class LeastResponseTime:
    name = "least_response_time"

    def __init__(self, alpha: float = 0.2) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1] (got {alpha})")
        self.alpha = alpha
        self.average: dict[int, float] = {}

    def pick(self, request: Request, view: LbView, rng: random.Random) -> int | None:
        best: list[int] = []
        best_score = 0.0
        for dip in range(len(view.dip_names)):
            w = view.weight(dip)
            if w <= 0 or dip in request.excluded:
                continue
            score = self.average.get(dip, 0.0) / w
            if not best or score < best_score:
                best, best_score = [dip], score
            elif score == best_score:
                best.append(dip)
        if not best:
            return None
        return best[0] if len(best) == 1 else best[rng.randrange(len(best))]

    def observe(self, outcome: Outcome, view: LbView) -> None:
        if outcome.status != "ok":
            return
        old = self.average.get(outcome.dip)
        lat = outcome.latency
        self.average[outcome.dip] = lat if old is None else old + self.alpha * (lat - old)

    def probe_targets(self, view: LbView, rng: random.Random) -> tuple[int, ...]:
        return ()


def make_least_response_time(ctx: object) -> LeastResponseTime:
    """Lowest EWMA response time / weight (L7 report)."""
    return LeastResponseTime(**getattr(ctx, "params", {}))
