"""Where a VIP's probe requests go: more where a DIP's latency is least known, within a load cap.

KnapsackLB (NSDI), section 5 ("KLM"), sends every DIP the same 100 requests every 5 s,
"independent of DIP size", and section 6.7 counts that load as the probes' overhead. The same
total bought where it teaches most learns faster: a DIP whose latency at its current weight is
known to 1 % learns little from 100 more requests, one that was just moved to a new weight (or
is new) learns most. This module decides, per round, how many requests each DIP gets.

The model. DIP ``i``'s estimate at the weight it is run at has a relative standard error
``r_i`` (standard error / mean, from the rounds already taken there; unknown = no round there
yet = infinite). A round of ``n_i`` requests with per-request relative spread ``v_i`` (standard
deviation / mean of one request; 1 when unknown, the spread of exponential service) adds the
information ``n_i / v_i**2``, so after it the relative variance is
``1 / (1 / r_i**2 + n_i / v_i**2)``. Every decision the learner takes is a relative one (a change
of 20 %, a drop at 5x the unloaded latency, caps on ``z`` standard errors), so relative variance
is the currency, equal for every DIP. Minimising the summed relative variance over the VIP for a
fixed total ``B`` is a water-filling problem (Lagrange: the marginal reduction
``(1/v_i**2) / (1/r_i**2 + n_i/v_i**2)**2`` equal across DIPs); its solution is

    n_i = clip(v_i * t - v_i**2 / r_i**2, low_i, high_i),   t chosen so that sum n_i = B.

With nothing known about any DIP (every ``r_i`` infinite, every ``v_i`` equal) it is the uniform
split; with every DIP unknown but for its spread it is Neyman allocation (``n_i`` proportional
to ``v_i``); a DIP already known well gets less, down to its floor.

Bounds per DIP:

* **the total**: ``B`` = the configured uniform share x the number of DIPs: the VIP's probe load
  never grows (it may shrink when caps bind everywhere);
* **the cap**: ``load_cap`` (default 3 %) of the DIP's capacity over one interval,
  ``load_cap x capacity (requests/s) x interval``, read against the uniform share in both
  directions with the evidence each needs: the cap rises above the uniform share only as far as
  the *lower confidence bound* of the capacity allows (never probe a DIP harder than the uniform
  default unless it is known to take it), and falls below it as far as the *best estimate* says
  (a DIP seen to saturate early is known to be small; one whose lower bound is low only because
  its latency has not risen yet keeps the uniform share, which is what it got before any
  learning). A DIP whose capacity is not known at all is capped at the uniform share;
* **the floor**: every DIP keeps ``floor`` requests (default 3, at most the uniform share, and at
  most its cap but never below 1) so that failures and changes are still seen;
* **the LB's timings**: where the LB times the client requests (layer 7), the requests it timed of a
  DIP in its newest round are samples it gets for free: the water level is over a round's samples
  (probes and LB-timed), the probes are what a DIP lacks below it, and the VIP's probes shrink by
  what the LB timed (to every DIP's floor once the LB times more than the total). The floor is
  raised to what the breaker needs to judge a round (``judged``) less what the LB timed;
* a **drained** DIP (drained by the operator, failed, or ejected: out of service, probed only to
  see it come back) gets its floor and nothing more;
* **light requests** (``ProbeSpec.light_path``) are probe load too: the work a DIP's light requests
  cost each round, in probe requests' worth (``light``), comes off its cap and off the VIP's total,
  so probes and light requests together stay within both.

Integers: the real solution is rounded down and the requests left over go, one each, to the DIPs
with the largest remainders (ties by name), never past a cap: deterministic, no randomness.

How it fails: unknown input degrades to the uniform default, never to an empty round. All
uncertainty unknown gives the uniform split; all capacities unknown cap every DIP at the uniform
share, which (the total being uniform x DIPs) is the uniform split again; non-finite or
non-positive numbers count as unknown. ``method="uniform"`` returns the uniform split as it is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from knapsack_lb.errors import InvalidInputError

LearningState = Literal["new", "measuring", "settled", "drained"]
Allocation = Literal["uncertainty", "uniform"]
LEARNING_STATES: tuple[LearningState, ...] = ("new", "measuring", "settled", "drained")
DEFAULT_SPREAD = 1.0  # a request's relative spread when unknown: exponential service (std = mean)
_BISECTIONS = 200


@dataclass(frozen=True)
class DipUncertainty:
    """What the allocator knows of one DIP.

    ``relative_stderr``: standard error / mean of its latency estimate at the weight it is run (or
    measured) at; ``None`` when no round was taken there (nothing known: infinite).
    ``spread``: standard deviation / mean of one probe request's latency (``None``: 1).
    ``capacity``: requests per second it can serve, the best estimate (``None``: unknown).
    ``capacity_low``: a lower confidence bound of it (``None``: the same as ``capacity``).
    ``state``: new (no round yet), measuring, settled, or drained (out of service: floor only).
    ``lb_timed``: the client requests the LB timed of it in its newest round (0 where the LB times none).
    ``light``: the work its light requests cost each round, in probe requests (0: none sent)."""

    name: str
    state: LearningState = "new"
    relative_stderr: float | None = None
    spread: float | None = None
    capacity: float | None = None
    capacity_low: float | None = None
    lb_timed: int = 0  # client requests the LB timed in its newest round: samples that cost no probe
    light: float = 0.0  # its light requests' work per round, in probe requests


def _known(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) and value > 0 else None


def allocate(
    dips: Sequence[DipUncertainty],
    *,
    uniform: int,
    interval: float,
    load_cap: float = 0.03,
    floor: int = 3,
    judged: int = 1,
    method: Allocation = "uncertainty",
) -> dict[str, int]:
    """Requests per round for each DIP of one VIP (see the module docstring).

    ``uniform`` is the VIP's configured ``requests_per_round`` (the total is ``uniform`` x DIPs),
    ``interval`` its probe interval (s), ``load_cap`` the largest share of a DIP's capacity the
    probes may take, ``floor`` the fewest probes a DIP gets, ``judged`` the fewest requests (probes
    and LB-timed ones) a round needs to be judged (the breaker's). Raises :class:`InvalidInputError`
    naming the argument when one is out of range or a DIP name repeats."""
    if not isinstance(uniform, int) or uniform < 1:
        raise InvalidInputError("uniform", uniform, "must be an integer >= 1")
    if not math.isfinite(interval) or interval <= 0:
        raise InvalidInputError("interval", interval, "must be a number of seconds > 0")
    if not math.isfinite(load_cap) or not 0 < load_cap <= 1:
        raise InvalidInputError("load_cap", load_cap, "must be a fraction > 0 and <= 1")
    if not isinstance(floor, int) or floor < 1:
        raise InvalidInputError("floor", floor, "must be an integer >= 1")
    if not isinstance(judged, int) or judged < 1:
        raise InvalidInputError("judged", judged, "must be an integer >= 1")
    names = [d.name for d in dips]
    if len(set(names)) != len(names):
        raise InvalidInputError("dips", names, "DIP names must be unique")
    for d in dips:
        if d.state not in LEARNING_STATES:
            raise InvalidInputError("state", d.state, f"must be one of {', '.join(LEARNING_STATES)}", dip=d.name)
    if method == "uniform" or not dips:
        return {name: uniform for name in names}
    light = {d.name: _known(d.light) or 0.0 for d in dips}
    total = max(0, math.floor(uniform * len(dips) - math.fsum(light.values()) + 1e-9))
    high: dict[str, int] = {}
    low: dict[str, int] = {}
    timed = {d.name: max(0, d.lb_timed) for d in dips}
    for d in dips:
        high[d.name] = max(1, math.floor(_cap(d, uniform, load_cap * interval) - light[d.name] + 1e-9))
        low[d.name] = max(1, min(max(floor, judged - timed[d.name]), uniform, high[d.name]))
        if d.state == "drained":
            high[d.name] = low[d.name]
    spread = {d.name: _known(d.spread) or DEFAULT_SPREAD for d in dips}
    # v**2 / r**2: what the DIP already knows, in requests of its own spread (0 = nothing known)
    known = {d.name: (spread[d.name] / r) ** 2 if (r := _known(d.relative_stderr)) is not None else 0.0 for d in dips}

    v = np.array([spread[n] for n in names])
    k = np.array([known[n] for n in names])
    m = np.array([timed[n] for n in names], dtype=float)
    # the water level is over a round's samples: the LB-timed requests are samples the DIP has for free
    floors = np.array([low[n] for n in names], dtype=float) + m
    caps = np.array([high[n] for n in names], dtype=float) + m

    def share(t: float) -> np.ndarray:
        return np.minimum(caps, np.maximum(floors, v * t - k))

    if caps.sum() <= total:
        real = {n: float(high[n]) for n in names}  # every cap binds: the load shrinks, never grows
    else:
        lo, hi = 0.0, 1.0
        while share(hi).sum() < total:
            hi *= 2
        for _ in range(_BISECTIONS):
            mid = (lo + hi) / 2
            if share(mid).sum() < total:
                lo = mid
            else:
                hi = mid
        real = dict(zip(names, (share(hi) - m).tolist(), strict=True))
    return _integers(real, low, high, max(0, total - int(m.sum())))


def _cap(dip: DipUncertainty, uniform: int, per_capacity: float) -> int:
    """The most requests ``dip`` may get: above ``uniform`` by its capacity's lower bound, below it by
    its best estimate (``per_capacity`` = load cap x interval: requests per request/s of capacity)."""
    best = _known(dip.capacity)
    low = _known(dip.capacity_low) if dip.capacity_low is not None else best
    cap = max(uniform, math.floor(per_capacity * low)) if low is not None else uniform
    return min(cap, math.floor(per_capacity * best)) if best is not None else cap


def _integers(real: Mapping[str, float], low: Mapping[str, int], high: Mapping[str, int], total: int,
              ) -> dict[str, int]:
    """Round down, then hand the requests left over to the largest remainders (ties by name), within caps."""
    counts = {n: max(low[n], min(high[n], math.floor(v + 1e-9))) for n, v in real.items()}
    left = min(total, sum(high.values())) - sum(counts.values())
    order = sorted(real, key=lambda n: (-(real[n] - math.floor(real[n] + 1e-9)), n))
    while left > 0:
        takers = [n for n in order if counts[n] < high[n]]
        if not takers:
            break
        for name in takers[:left]:
            counts[name] += 1
        left -= min(left, len(takers))
    return counts
