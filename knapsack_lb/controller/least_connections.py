"""Weights for a load balancer that balances by least connections: the DIPs' relative capacities.

KnapsackLB (NSDI, sections 3 and 4.4) drives a weighted round-robin MUX: a weight is the share of
the VIP's connections a DIP gets, so the weights that minimise the VIP's mean latency are the
solver's, a point on every DIP's weight-latency curve. Behind HAProxy ``leastconn``, Nginx
``least_conn`` or Envoy ``LEAST_REQUEST`` a weight is something else: the LB sends the next
request to the DIP with the fewest active connections per unit of weight, so a DIP that slows
down gets fewer requests by itself, and the weight says how many concurrent requests a DIP may
hold relative to the others - its relative capacity. Pushing the latency-minimising shares there
skews a feedback loop that already balances: on the gauge's layer-7 pools the solver's shares
were up to 22 % slower than weights by vCPU, while weights by the true capacities gain a median
0.4 % over them (docs/results/robustness.md). So behind such an LB the controller sends
capacities, and only what the rounds prove.

The split. Each DIP has a confidence interval on its saturation weight ``[low, high]`` (the
learner's lower bound, its cap, and its upper bound: infinite until its knee is seen) and a
``prior``, its share of the weights the operator had configured (the LB's own split before the
controller's first plan). The capacity the split gives a DIP is ``scale * prior`` clamped to its
interval: the operator's weights stand wherever the rounds do not contradict them. ``scale`` (the
pool's capacity over the VIP's traffic, unknown) is the one the evidence contradicts least: it
minimises the prior-weighted log distance of ``scale * prior`` outside the intervals, a convex
piecewise-linear function whose minimum lies at an interval's end. A DIP with no prior (added
after the controller started) gets its lower bound, the cautious cap the learner grows.

Slower hosts (:func:`slow_hosts`). At 50-80 % load no knee is seen, so the intervals rarely move
a DIP, and a DIP on a slower host (a noisy neighbour) keeps the share its size got from the
operator. Least connections shows it anyway: DIPs the operator weighted alike hold alike many
requests in flight, ``N``, and one that serves them at ``min(N, c)`` times its speed answers each
in ``N / throughput`` (Little's law) - so while their weights are alike, the latencies of DIPs of
one size are inversely proportional to their speeds at any load, processor sharing or FCFS. A DIP
whose latency, its rounds pooled, lies above the median of its alike peers by more than ``z``
standard errors of both has its prior scaled by that median over its latency before the split:
its capacity, as far as its peers show it. Only down: a DIP faster than its peers is what the
operator's weights assumed.

How it fails: it cannot beat the operator's weights where they are already the capacities, and
it learns a DIP's capacity only as fast as its interval narrows (a DIP that never nears its knee
keeps its prior). Intervals that contradict every common scale (the operator's weights far from
the capacities) are resolved in favour of the larger prior mass, and the DIPs outside move to
their bounds. A slower host is found only among at least ``MIN_PEERS`` DIPs of its share (with
two, the slower may be the normal one), only as precisely as its rounds pool (behind an LB that
times its requests, thousands a round), and only where the operator's equal weights mean equal
sizes; a DIP added after the controller started has no prior and no peers. Once a slower host's
weight is cut it holds fewer requests: where its workers are free that leaves its latency as it is,
where they are full (92 % load) its latency falls with its weight and the cut is undone in part,
so its share moves between the operator's and its speed's.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from knapsack_lb.errors import InvalidInputError


@dataclass(frozen=True)
class CapacityInterval:
    """What the rounds say about one DIP's saturation weight, and the operator's share for it."""

    low: float
    high: float = math.inf
    prior: float | None = None

    def __post_init__(self) -> None:
        if not math.isfinite(self.low) or self.low < 0:
            raise InvalidInputError("low", self.low, "must be a finite weight >= 0")
        if math.isnan(self.high) or self.high <= 0:
            raise InvalidInputError("high", self.high, "must be a weight > 0 (inf: no knee seen)")
        if self.prior is not None and (not math.isfinite(self.prior) or self.prior < 0):
            raise InvalidInputError("prior", self.prior, "must be a finite share >= 0")

    def clamp(self, capacity: float) -> float:
        """``capacity`` moved into the interval (the lower bound wins where the bounds cross)."""
        return max(min(capacity, self.high), self.low)

    def violation(self, capacity: float) -> float:
        """How far (in log) ``capacity`` lies outside the interval; 0 inside."""
        if self.low > 0 and capacity < self.low:
            return math.log(self.low / capacity)
        if capacity > self.high:
            return math.log(capacity / self.high)
        return 0.0


@dataclass(frozen=True)
class CapacitySplit:
    """The weights (summing to the total asked for), the scale chosen and the DIPs the rounds moved off it."""

    weights: dict[str, float]
    scale: float
    moved: tuple[str, ...]

    def describe(self) -> str:
        moved = ", ".join(self.moved) if self.moved else "none"
        return f"relative capacities (operator's weights x {self.scale:.3f}, moved by the rounds: {moved})"


def best_scale(intervals: Mapping[str, CapacityInterval]) -> float:
    """The scale that puts ``scale * prior`` least outside the DIPs' intervals (prior-weighted log
    distance; the smallest of equally good ones); 1 when no DIP has a prior and a finite bound."""
    with_prior = [(iv, iv.prior) for iv in intervals.values() if iv.prior]
    ends = sorted({end / prior for iv, prior in with_prior for end in (iv.low, iv.high) if 0 < end < math.inf})
    if not ends:
        return 1.0

    def cost(scale: float) -> float:
        return sum(prior * iv.violation(scale * prior) for iv, prior in with_prior)

    return min(ends, key=lambda scale: (round(cost(scale), 12), scale))


def capacity_split(intervals: Mapping[str, CapacityInterval], total: float = 1.0) -> CapacitySplit:
    """Weights in proportion to each DIP's capacity, ``scale * prior`` clamped to its interval
    (:func:`best_scale`), or its lower bound without a prior; they sum to ``total``. Raises
    :class:`InvalidInputError` for no DIP, a total outside (0, 1] or capacities that are all zero."""
    if not intervals:
        raise InvalidInputError("intervals", intervals, "no DIP to split over")
    if not 0 < total <= 1:
        raise InvalidInputError("total", total, "must be in (0, 1]")
    scale = best_scale(intervals)
    capacity = {name: iv.clamp(scale * iv.prior) if iv.prior else iv.low for name, iv in intervals.items()}
    mass = sum(capacity.values())
    if mass <= 0:
        raise InvalidInputError("intervals", {n: iv.low for n, iv in intervals.items()},
                                "every capacity is 0: nothing to split by")
    moved = tuple(sorted(name for name, iv in intervals.items()
                         if iv.prior and not math.isclose(capacity[name], scale * iv.prior, rel_tol=1e-9)))
    return CapacitySplit({name: total * c / mass for name, c in capacity.items()}, scale, moved)


MIN_PEERS = 3  # the median of three or more alike DIPs is one of the majority, not the slow one


@dataclass(frozen=True)
class PeerLatency:
    """A DIP's latency behind least connections (its rounds pooled: mean and standard error, s) and
    the operator's share for it; DIPs of one share are taken to be alike."""

    prior: float
    mean: float
    stderr: float


def slow_hosts(latencies: Mapping[str, PeerLatency], z: float) -> dict[str, float]:
    """For each DIP significantly slower than the median of the DIPs of its share (at least
    ``MIN_PEERS`` of them), that median over its latency (below 1): its speed relative to its peers
    (module docstring). A DIP is significantly slower when its mean exceeds the median by more than
    ``z`` times the root sum of squares of its standard error and the median standard error of its
    group. DIPs with a non-finite or non-positive mean or a non-finite error are left out; raises
    :class:`InvalidInputError` for ``z`` not a positive number."""
    if not math.isfinite(z) or z <= 0:
        raise InvalidInputError("z", z, "must be a positive number of standard errors")
    groups: dict[float, list[tuple[str, PeerLatency]]] = {}
    for name, peer in latencies.items():
        if peer.mean > 0 and math.isfinite(peer.mean) and math.isfinite(peer.stderr) and peer.prior > 0:
            groups.setdefault(round(peer.prior, 9), []).append((name, peer))
    slower: dict[str, float] = {}
    for members in groups.values():
        if len(members) < MIN_PEERS:
            continue
        median = statistics.median(p.mean for _, p in members)
        median_error = statistics.median(p.stderr for _, p in members)
        for name, peer in members:
            if peer.mean - median > z * math.hypot(peer.stderr, median_error):
                slower[name] = median / peer.mean
    return slower
