"""Turning one probe round's raw samples into a :class:`~knapsack_lb.model.Measurement`.

The one summary every environment uses: the probe worker (live), the simulator's probes and the
fluid model, so what the lab measures is what runs live. KnapsackLB section 5 reports the
*average* latency over the 100 requests of a round; the percentiles (p50/p90/p99, nearest rank)
and the sample standard deviation (so every round carries its own standard error) are kept too,
and failures are timed apart (ELS blog: a fast failure is not fast service, so failure latency
never mixes into the success latency).

Where the load balancer times the client requests itself (layer 7: the simulator's LB, and the
HAProxy, Nginx and Envoy adapters from the LB's access logs), :func:`with_lb_timings` pools what it
timed into the round: thousands of requests a round instead of a handful of probes, at no load.
The probes then fall to their floor (the probe budget counts LB-timed requests as probes already
sent) and still see failures and the DIPs the LB sends nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from knapsack_lb.model import Measurement, TimedRequests


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
              share: float | None = None, light: RoundSamples | None = None) -> Measurement:
    """One round as a :class:`Measurement`: mean, nearest-rank percentiles and standard deviation of
    the successes, counts of errors and timeouts, and the mean latency of the failures; ``share`` is
    the DIP's share of the VIP's requests over the round when the LB's counters tell it; ``light``
    what the round's light requests (``ProbeSpec.light_path``) answered, kept whole (sorted), because
    what they tell is read from rounds pooled at one load (:mod:`knapsack_lb.controller.waiting`)."""
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
        light_latencies=tuple(sorted(light.success_latencies)) if light is not None else (),
        light_failures=light.errors + light.timeouts if light is not None else 0,
    )


def with_lb_timings(m: Measurement, timed: TimedRequests) -> Measurement:
    """The round ``m`` with the client requests the LB timed for its DIP over it pooled in: successes
    and mean exactly (count-weighted), the standard deviation from both groups' sums of squares (the
    LB's spread, when it gives none, taken to be the probes' relative spread at its mean, else that of
    exponential service, std = mean), its failures as errors. The percentiles and the failures'
    latency stay the probes' (a mean cannot be split into ranks); ``lb_timed`` counts what was added.
    How it fails: nothing timed returns ``m`` unchanged; the pooled mean is only as comparable as the
    two clocks are (the LB times from itself to the DIP, a probe from its worker)."""
    added = timed.successes + timed.failures
    if added == 0:
        return m
    n_probe, n_lb = m.successes, timed.successes
    mean, std = m.latency_mean, m.latency_std
    if n_lb:
        assert timed.latency_mean is not None  # TimedRequests checks it
        lb_mean = timed.latency_mean
        if timed.latency_std is not None:
            lb_std = timed.latency_std
        elif mean and std is not None and n_probe >= 2:
            lb_std = lb_mean * std / mean
        else:
            lb_std = lb_mean
        if n_probe == 0 or mean is None:
            mean, std = lb_mean, lb_std if n_lb >= 2 else None
        else:
            total = n_probe + n_lb
            pooled = (n_probe * mean + n_lb * lb_mean) / total
            squares = ((n_probe - 1) * (std or 0.0) ** 2 + (n_lb - 1) * lb_std**2
                       + n_probe * n_lb / total * (mean - lb_mean) ** 2)
            mean, std = pooled, math.sqrt(squares / (total - 1))
    return replace(m, sent=m.sent + added, successes=n_probe + n_lb, errors=m.errors + timed.failures,
                   latency_mean=mean, latency_std=std, lb_timed=m.lb_timed + added)


def pool_lb_timings(rounds: Mapping[str, Measurement], timings: Mapping[str, TimedRequests],
                    ) -> dict[str, Measurement]:
    """Every round of ``rounds`` with what the LB timed for its DIP pooled in (:func:`with_lb_timings`);
    a DIP the LB timed but the probes did not reach gets no round (a round is the probes' to start)."""
    return {dip: with_lb_timings(m, timings[dip]) if dip in timings else m for dip, m in rounds.items()}
