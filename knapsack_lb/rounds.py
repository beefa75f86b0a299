"""Turning one probe round's raw samples into a :class:`~knapsack_lb.model.Measurement`.

The one summary every environment uses: the probe worker (live), the simulator's probes and the
fluid model, so what the lab measures is what runs live. KnapsackLB section 5 reports the
*average* latency over the 100 requests of a round; the percentiles (p50/p90/p99, nearest rank)
and the sample standard deviation (so every round carries its own standard error) are kept too,
and failures are timed apart (ELS blog: a fast failure is not fast service, so failure latency
never mixes into the success latency).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from knapsack_lb.model import Measurement


@dataclass
class RoundSamples:
    """What one DIP answered in one round."""

    success_latencies: list[float] = field(default_factory=list)
    failure_latencies: list[float] = field(default_factory=list)
    errors: int = 0
    timeouts: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)

    @property
    def sent(self) -> int:
        return len(self.success_latencies) + self.errors + self.timeouts

    def add_error(self, kind: str, latency: float) -> None:
        self.errors += 1
        self.failure_latencies.append(latency)
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1

    def add_timeout(self, latency: float) -> None:
        self.timeouts += 1
        self.failure_latencies.append(latency)


def nearest_rank(sorted_values: list[float], q: float) -> float | None:
    """The ``q``-quantile (0 < q <= 1) by nearest rank; None for no values."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


def sample_std(values: list[float], mean: float) -> float | None:
    """The sample standard deviation (n - 1); None for fewer than two values."""
    if len(values) < 2:
        return None
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))


def summarise(samples: RoundSamples, *, vip: str, dip: str, time: float, weight: float, worker: str,
              share: float | None = None) -> Measurement:
    """One round as a :class:`Measurement`: mean, nearest-rank percentiles and standard deviation of
    the successes, counts of errors and timeouts, and the mean latency of the failures; ``share`` is
    the DIP's share of the VIP's requests over the round when the LB's counters tell it."""
    ok = sorted(samples.success_latencies)
    mean = math.fsum(ok) / len(ok) if ok else None
    return Measurement(
        vip=vip, dip=dip, time=time, weight=weight, sent=samples.sent, successes=len(ok), errors=samples.errors,
        timeouts=samples.timeouts,
        latency_mean=mean,
        latency_p50=nearest_rank(ok, 0.50), latency_p90=nearest_rank(ok, 0.90), latency_p99=nearest_rank(ok, 0.99),
        failure_latency_mean=(
            math.fsum(samples.failure_latencies) / len(samples.failure_latencies) if samples.failure_latencies else None
        ),
        worker=worker,
        latency_std=None if mean is None else sample_std(ok, mean),
        share=share,
    )
