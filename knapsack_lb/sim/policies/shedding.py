"""Load shedding at the LB (L7 report, "Load Shedding").

``sim_conn`` is the number of simultaneous requests (connections at layer 4) at this LB instance,
counting the new one. ``hard``: shed when ``sim_conn > threshold``. ``exponential``: shed with
probability ``1 - e^(-K (sim_conn - threshold))`` when above the threshold (K = 0.3 in the report).
A shed request is answered by the LB itself (503) without reaching a DIP; the simulator counts it
as dropped. How it fails: the threshold is global, not per DIP, so an overloaded DIP behind a
non-adaptive inner policy still gets its share; the exponential rule admits a random excess
(the report found it worse and less consistent than hard).
"""

from __future__ import annotations

import math
import random

from knapsack_lb.sim.policies.base import LbView, Policy, Request
from knapsack_lb.sim.policies.wrapper import PolicyWrapper


def shed_probability(sim_conn: int, threshold: int, strategy: str, k: float = 0.3) -> float:
    """Probability of shedding a new request when ``sim_conn`` (including it) are at the LB."""
    if sim_conn <= threshold:
        return 0.0
    if strategy == "hard":
        return 1.0
    return 1.0 - math.exp(-k * (sim_conn - threshold))


class LoadShedding(PolicyWrapper):
    def __init__(self, inner: Policy, *, threshold: int = 5, strategy: str = "hard", k: float = 0.3) -> None:
        super().__init__(inner)
        if strategy not in ("hard", "exponential"):
            raise ValueError(f"shedding strategy must be 'hard' or 'exponential' (got {strategy!r})")
        self.threshold = threshold
        self.strategy = strategy
        self.k = k
        self.shed = 0
        self.name = f"{inner.name}+shed-{strategy}"

    def pick(self, request: Request, view: LbView, rng: random.Random) -> int | None:
        if request.attempt == 0:
            sim_conn = sum(view.outstanding(d) for d in range(len(view.dip_names))) + 1
            p = shed_probability(sim_conn, self.threshold, self.strategy, self.k)
            if p >= 1.0 or (p > 0.0 and rng.random() < p):
                self.shed += 1
                return None
        return self.inner.pick(request, view, rng)
