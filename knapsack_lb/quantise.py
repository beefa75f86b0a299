"""How each load balancer turns a plan's fractional weights into the integers it takes.

One module for the adapters and the simulated LB of the control loop, so that what the lab
measures is what a real LB would carry (docs/design.md, "Facts about the real load balancers"):

* HAProxy: integers 0-256 per server; the largest weight is scaled to 256 for the finest split;
  weight 0 means no new traffic;
* Nginx: integers >= 1 over a resolution (1000); weight 0 is ``down``;
* Envoy: ``load_balancing_weight`` >= 1 over a resolution; a DIP at 0 is dropped from the assignment;
* PowerDNS: integers >= 1 over a resolution; a DIP at 0 is left out of the record;
* the recording adapter: integers over its resolution (10,000 by default).

Every quantiser keeps a DIP the plan gives a positive weight at a positive integer and a DIP the
plan gives 0 at 0, so a plan never sends traffic to a drained DIP and never starves a live one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from knapsack_lb.errors import InvalidInputError

HAPROXY_MAX_WEIGHT = 256
DEFAULT_RESOLUTION = 1000
RECORDING_RESOLUTION = 10_000


@dataclass(frozen=True)
class Quantised:
    """Integer LB weights and how far their normalised split is from the plan (L1/2, i.e.
    total variation distance: the share of traffic that lands on another DIP than planned)."""

    weights: dict[str, int]
    error: float

    def fractions(self) -> dict[str, float]:
        """The split the LB really carries (the integers normalised)."""
        total = sum(self.weights.values())
        return {d: (w / total if total else 0.0) for d, w in self.weights.items()}


def quantise(weights: Mapping[str, float], total: int, low: int = 0, high: int | None = None) -> Quantised:
    """Largest-remainder rounding of fractional ``weights`` to integers summing to ``total``.

    Each integer stays in ``[low, high]`` for DIPs with a positive weight; DIPs with weight 0
    get 0 (the caller maps 0 to what its LB requires: ``down``, a dropped endpoint, ...).
    Where the bounds make the exact total impossible, the closest feasible sum is used.
    """
    if total < 1:
        raise InvalidInputError("total", total, "must be >= 1")
    positive = {d: w for d, w in weights.items() if w > 0}
    if not positive:
        raise InvalidInputError("weights", dict(weights), "at least one DIP needs a positive weight")
    mass = sum(positive.values())
    lo = max(low, 1)
    hi = high if high is not None else total
    ideal = {d: w / mass * total for d, w in positive.items()}
    base = {d: min(hi, max(lo, math.floor(x))) for d, x in ideal.items()}
    remaining = total - sum(base.values())
    if remaining > 0:
        order = sorted(positive, key=lambda d: (ideal[d] - base[d], d), reverse=True)
        while remaining > 0:
            progressed = False
            for d in order:
                if remaining == 0:
                    break
                if base[d] < hi:
                    base[d] += 1
                    remaining -= 1
                    progressed = True
            if not progressed:
                break
    elif remaining < 0:
        order = sorted(positive, key=lambda d: (ideal[d] - base[d], d))
        while remaining < 0:
            progressed = False
            for d in order:
                if remaining == 0:
                    break
                if base[d] > lo:
                    base[d] -= 1
                    remaining += 1
                    progressed = True
            if not progressed:
                break
    result = {d: base.get(d, 0) for d in weights}
    achieved = sum(result.values())
    error = 0.5 * sum(abs(result[d] / achieved - max(weights[d], 0.0) / mass) for d in weights)
    return Quantised(result, error)


def haproxy_weights(weights: Mapping[str, float], high: int = HAPROXY_MAX_WEIGHT) -> Quantised:
    """Largest-remainder integers in ``[0, high]`` whose largest is ``high``-ish (finest resolution);
    ``weights`` in any scale (fractions, or raw weights such as vCPU counts)."""
    mass = sum(w for w in weights.values() if w > 0)
    top = max(weights.values()) / mass if mass > 0 else 0.0
    total = max(1, int(high / top)) if top > 0 else high
    return quantise(weights, total, low=1, high=high)


def at_least_one(resolution: int) -> Callable[[Mapping[str, float]], Quantised]:
    """The quantiser of LBs whose weights are integers >= 1 over ``resolution`` (0 = left out)."""

    def run(weights: Mapping[str, float]) -> Quantised:
        return quantise(weights, resolution, low=1)

    return run


QUANTISERS: dict[str, Callable[[Mapping[str, float]], Quantised]] = {
    "haproxy": haproxy_weights,
    "nginx": at_least_one(DEFAULT_RESOLUTION),
    "envoy": at_least_one(DEFAULT_RESOLUTION),
    "powerdns": at_least_one(DEFAULT_RESOLUTION),
    "recording": lambda weights: quantise(weights, RECORDING_RESOLUTION),
}


def quantiser(lb: str) -> Callable[[Mapping[str, float]], Quantised]:
    """The quantiser of the LB kind ``lb`` (haproxy, nginx, envoy, powerdns, recording)."""
    try:
        return QUANTISERS[lb]
    except KeyError:
        raise InvalidInputError("lb", lb, f"must be one of {sorted(QUANTISERS)}") from None
