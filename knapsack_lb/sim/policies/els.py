"""Spotify's Expected Latency Selector (ELS) with its relative circuit breaker.

Source: Lukáš Poláček, "ELS: latency based load balancer, part 1" (Spotify engineering blog,
December 2015; ELS blog), sections "Expected Latency Selector (ELS)" and "Relative
circuit breaker"; the metrics and their measurement (success latency ``l``, success rate
``s``, failure latency ``f``, outstanding requests ``q``, parallelism ``p``, forward
exponential decay with a time bias) are named in part 2 of the blog ("What to Measure?",
"How to Measure It?").

What the blog fixes and what we reconstruct
-------------------------------------------
Part 1 states the properties of the weight formula but not the formula: all measurements are
converted into *expected latency from the client's perspective*; a machine's weight falls as
its expected latency rises (probabilistic choice, "a machine with a 2 times higher weight gets
twice as much traffic"); slower machines get less traffic and failing machines much less;
nobody gets zero, so recovery is noticed; fast failures are better than slow failures; only
locally observable data is used. Our reconstruction (documented in docs/simulator-policies.md):

    E = (1 + q / p) * (l + (1 - s) / s * (f + R))        expected latency
    weight = 1 / E                                          (``sharpness`` = 1)

``l + (1 - s)/s * (f + R)`` is the expected time until a successful reply when the client
retries failures: the number of failures before a success is geometric with mean
``(1 - s)/s``; each costs its failure latency ``f`` plus the client's retry cost ``R``
(Spotify's clients retry failed requests; the blog calls fast failures good because "the
Spotify client will do a retry"). ``(1 + q/p)`` accounts for the ``q`` requests this balancer
already has outstanding at the machine, served ``p`` at a time. Fast failures therefore
cost little (small ``f``), slow failures cost as much as slow success, and a failing machine
gets "much less" traffic while the others are idle, and more as the others' queues grow —
which is the blog's second benchmark: ELS' error rate starts far below round robin's 12.5%
and rises with load ("a feature and not a bug"). ``R`` defaults to ``retry_penalty_factor``
times the pool's mean success latency (the cost of a retry is another ordinary request).

How it fails: with only local outstanding counts, several ELS instances sharing machines
herd like any local policy (the blog's own limitation); a slow machine always gets some
traffic; the statistics need samples (``min_samples``) before the breaker trusts them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from knapsack_lb.errors import InvalidInputError
from knapsack_lb.sim.policies.base import LbView, Outcome, Request
from knapsack_lb.sim.policies.registry import PolicyContext

K = TypeVar("K")


def expected_latency(
    success_latency: float,
    success_rate: float,
    failure_latency: float,
    outstanding: int,
    *,
    parallelism: float = 1.0,
    retry_penalty: float = 0.0,
) -> float:
    """ELS' expected latency of a request sent now (reconstruction, see the module docstring).

    ``E = (1 + q/p) * (l + (1 - s)/s * (f + R))``. A machine that never succeeds (``s == 0``)
    has infinite expected latency.
    """
    if success_rate <= 0.0:
        return math.inf
    per_attempt = success_latency + (1.0 - success_rate) / success_rate * (failure_latency + retry_penalty)
    return (1.0 + outstanding / parallelism) * per_attempt


def relative_outliers(
    scores: Mapping[K, float],
    *,
    ratio: float,
    max_fraction: float,
) -> frozenset[K]:
    """The relative circuit breaker's decision (ELS blog, "Relative circuit breaker").

    ``scores`` are "higher is better" (a success rate, or 1 / expected latency) for the
    machines with enough samples to judge. A machine is ejected only if its score is below
    ``ratio`` times the pool's (global) average: four machines all failing 25% of requests
    are equally good, so none is ejected, where an absolute 80%-success breaker would have
    shut the whole service down. At most ``floor(max_fraction * n)`` machines are ejected
    (worst first) and never all of them. Reusable by the controller for DIP ejection.
    """
    if not 0.0 < ratio < 1.0:
        raise InvalidInputError("ratio", ratio, "must be in (0, 1): eject only when worse than the average")
    if not 0.0 <= max_fraction < 1.0:
        raise InvalidInputError("max_fraction", max_fraction, "must be in [0, 1): never eject every machine")
    if len(scores) < 2:
        return frozenset()
    mean = sum(scores.values()) / len(scores)
    candidates = sorted((score, index, key) for index, (key, score) in enumerate(scores.items())
                        if score < ratio * mean)
    budget = min(math.floor(max_fraction * len(scores)), len(scores) - 1)
    return frozenset(key for _, _, key in candidates[:budget])


class DecayedMean:
    """A forward exponentially decayed mean (ELS part 2, "How to Measure It?").

    A sample taken ``a`` seconds ago weighs ``exp(-a / time_bias)`` relative to a new one, so
    with a time bias of one minute about 63.2% of the value comes from the last minute.
    ``weight`` is the decayed sample count (how much evidence there is).
    """

    __slots__ = ("_last", "_sum", "_time_bias", "weight")

    def __init__(self, time_bias: float) -> None:
        self._time_bias = time_bias
        self._sum = 0.0
        self.weight = 0.0
        self._last = -math.inf

    def _decay(self, now: float) -> None:
        if self._last != -math.inf and now > self._last:
            factor = math.exp(-(now - self._last) / self._time_bias)
            self._sum *= factor
            self.weight *= factor
        self._last = max(self._last, now)

    def add(self, now: float, value: float) -> None:
        self._decay(now)
        self._sum += value
        self.weight += 1.0

    def count(self, now: float) -> float:
        """Decayed number of samples as of ``now``."""
        self._decay(now)
        return self.weight

    def value(self, default: float) -> float:
        return self._sum / self.weight if self.weight > 0.0 else default


@dataclass
class _MachineStats:
    success_latency: DecayedMean
    failure_latency: DecayedMean
    success_rate: DecayedMean  # mean of 1 (success) / 0 (failure)


class ElsPolicy:
    """Expected Latency Selector: pick a DIP with probability proportional to 1 / E^sharpness.

    Parameters (defaults in brackets): ``time_bias`` [5 s] forward-decay time bias (the blog's
    example is one minute; simulated runs are minutes long); ``parallelism`` [1.0] requests a
    machine serves at once (the blog measures it; here a constant); ``retry_penalty_factor``
    [1.0] retry cost R as a multiple of the pool's mean success latency; ``sharpness`` [1.0];
    ``prior_samples`` [1.0] pseudo-successes at the pool's latency so that a new machine is
    tried; relative breaker: ``breaker_ratio`` [0.5] of the pool's mean success rate,
    ``breaker_max_fraction`` [0.5], ``min_samples`` [20] decayed samples before judging,
    ``ejection_time`` [10 s] after which the machine returns with fresh statistics,
    ``breaker_interval`` [1 s] between two judgements of the breaker.
    """

    name = "els"

    def __init__(
        self,
        *,
        time_bias: float = 5.0,
        parallelism: float = 1.0,
        retry_penalty_factor: float = 1.0,
        sharpness: float = 1.0,
        prior_samples: float = 1.0,
        breaker_ratio: float = 0.5,
        breaker_max_fraction: float = 0.5,
        min_samples: float = 20.0,
        ejection_time: float = 10.0,
        breaker_interval: float = 1.0,
    ) -> None:
        for field, value in (("time_bias", time_bias), ("parallelism", parallelism),
                             ("ejection_time", ejection_time)):
            if not value > 0.0:
                raise InvalidInputError(field, value, "must be > 0")
        for field, value in (("retry_penalty_factor", retry_penalty_factor), ("sharpness", sharpness),
                             ("prior_samples", prior_samples), ("min_samples", min_samples),
                             ("breaker_interval", breaker_interval)):
            if not value >= 0.0:
                raise InvalidInputError(field, value, "must be >= 0")
        self.time_bias = time_bias
        self.parallelism = parallelism
        self.retry_penalty_factor = retry_penalty_factor
        self.sharpness = sharpness
        self.prior_samples = prior_samples
        self.breaker_ratio = breaker_ratio
        self.breaker_max_fraction = breaker_max_fraction
        self.min_samples = min_samples
        self.ejection_time = ejection_time
        self.breaker_interval = breaker_interval
        self._next_judgement = -math.inf
        self._stats: dict[int, _MachineStats] = {}
        self._ejected_until: dict[int, float] = {}
        relative_outliers({}, ratio=breaker_ratio, max_fraction=breaker_max_fraction)  # validates

    def _machine(self, dip: int) -> _MachineStats:
        stats = self._stats.get(dip)
        if stats is None:
            stats = _MachineStats(DecayedMean(self.time_bias), DecayedMean(self.time_bias),
                                  DecayedMean(self.time_bias))
            self._stats[dip] = stats
        return stats

    def _pool_success_latency(self, dips: Sequence[int]) -> float:
        known = [self._stats[d].success_latency.value(0.0) for d in dips
                 if d in self._stats and self._stats[d].success_latency.weight > 0.0]
        return sum(known) / len(known) if known else 0.0

    def success_rate(self, dip: int) -> float:
        """Decayed success rate with ``prior_samples`` pseudo-successes (1.0 for an unknown machine)."""
        stats = self._stats.get(dip)
        if stats is None:
            return 1.0
        rate = stats.success_rate
        return (rate.value(0.0) * rate.weight + self.prior_samples) / (rate.weight + self.prior_samples) \
            if rate.weight + self.prior_samples > 0.0 else 1.0

    def expected_latency_of(self, dip: int, view: LbView, pool_latency: float | None = None) -> float:
        """This balancer's current expected latency for ``dip``."""
        if pool_latency is None:
            pool_latency = self._pool_success_latency(range(len(view.dip_names)))
        stats = self._stats.get(dip)
        success_latency = stats.success_latency.value(pool_latency) if stats else pool_latency
        failure_latency = stats.failure_latency.value(success_latency) if stats else success_latency
        return expected_latency(
            success_latency, self.success_rate(dip), failure_latency, view.outstanding(dip),
            parallelism=self.parallelism, retry_penalty=self.retry_penalty_factor * pool_latency,
        )

    def weights(self, view: LbView, candidates: Sequence[int]) -> list[float]:
        """Unnormalised selection weights ``1 / E^sharpness`` for ``candidates``."""
        result = []
        pool_latency = self._pool_success_latency(range(len(view.dip_names)))
        for dip in candidates:
            latency = self.expected_latency_of(dip, view, pool_latency)
            if math.isinf(latency):
                result.append(0.0)
            elif latency <= 0.0:
                result.append(math.inf)
            else:
                result.append(latency ** -self.sharpness)
        return result

    def ejected(self, now: float) -> frozenset[int]:
        return frozenset(d for d, until in self._ejected_until.items() if until > now)

    def pick(self, request: Request, view: LbView, rng: random.Random) -> int | None:
        now = view.now
        self._readmit(now)
        ejected = self.ejected(now)
        everyone = [d for d in range(len(view.dip_names)) if d not in request.excluded]
        candidates = [d for d in everyone if d not in ejected] or everyone
        if not candidates:
            return None
        weights = self.weights(view, candidates)
        infinite = [d for d, w in zip(candidates, weights, strict=True) if math.isinf(w)]
        if infinite:
            return rng.choice(infinite)
        total = sum(weights)
        if total <= 0.0:
            return rng.choice(candidates)
        return rng.choices(candidates, weights=weights, k=1)[0]

    def observe(self, outcome: Outcome, view: LbView) -> None:
        if outcome.probe:
            return
        stats = self._machine(outcome.dip)
        now = outcome.finished_at
        if outcome.status == "ok":
            stats.success_latency.add(now, outcome.latency)
            stats.success_rate.add(now, 1.0)
        else:
            # Every failure (error, timeout, 429) is a failure with its own latency: fast
            # failures are not fast service, they lower the success rate.
            stats.failure_latency.add(now, outcome.latency)
            stats.success_rate.add(now, 0.0)
        if now >= self._next_judgement:
            self._next_judgement = now + self.breaker_interval
            self._judge(now)

    def _judge(self, now: float) -> None:
        """Run the relative circuit breaker over the machines with enough evidence."""
        self._readmit(now)
        already = self.ejected(now)
        scores = {d: self.success_rate(d) for d, s in self._stats.items()
                  if d not in already and s.success_rate.count(now) >= self.min_samples}
        total = len(self._stats)
        budget_left = min(math.floor(self.breaker_max_fraction * total), total - 1) - len(already)
        if budget_left <= 0 or len(scores) < 2:
            return
        outliers = relative_outliers(scores, ratio=self.breaker_ratio, max_fraction=self.breaker_max_fraction)
        for dip in sorted(outliers, key=lambda d: scores[d])[:budget_left]:
            self._ejected_until[dip] = now + self.ejection_time

    def _readmit(self, now: float) -> None:
        for dip, until in list(self._ejected_until.items()):
            if until <= now:
                del self._ejected_until[dip]
                self._stats.pop(dip, None)  # back in rotation with fresh statistics

    def probe_targets(self, view: LbView, rng: random.Random) -> Sequence[int]:
        return ()


def make_els(ctx: PolicyContext) -> ElsPolicy:
    """Spotify ELS: pick ~ 1 / expected latency (latencies, success rate, outstanding); relative breaker."""
    return ElsPolicy(**dict(ctx.params))
