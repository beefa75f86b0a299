"""Pooling the requests a load balancer timed into a probe round (knapsack_lb.rounds): known answers."""

from __future__ import annotations

import math
import statistics

import pytest

from knapsack_lb.errors import InvalidInputError
from knapsack_lb.model import Measurement, TimedRequests
from knapsack_lb.rounds import RoundSamples, pool_lb_timings, summarise, with_lb_timings

PROBES = [0.010, 0.030, 0.020, 0.050]
TIMED = [0.012, 0.018, 0.025, 0.040, 0.033, 0.015]


def _round(latencies: list[float], errors: int = 0) -> Measurement:
    samples = RoundSamples(success_latencies=list(latencies))
    for _ in range(errors):
        samples.add_error("reset", 0.001)
    return summarise(samples, vip="web", dip="d1", time=5.0, weight=0.25, worker="w1")


def _timed(latencies: list[float], failures: int = 0, *, spread: bool = True) -> TimedRequests:
    std = statistics.stdev(latencies) if spread else None
    return TimedRequests(len(latencies), statistics.fmean(latencies), std, failures)


def test_pooling_gives_the_mean_and_spread_of_all_the_requests_together() -> None:
    pooled = with_lb_timings(_round(PROBES), _timed(TIMED))
    every = PROBES + TIMED
    assert pooled.successes == pooled.sent == len(every) and pooled.lb_timed == len(TIMED)
    assert pooled.latency_mean == pytest.approx(statistics.fmean(every), rel=1e-12)
    assert pooled.latency_std == pytest.approx(statistics.stdev(every), rel=1e-12)
    assert pooled.latency_stderr == pytest.approx(statistics.stdev(every) / math.sqrt(len(every)), rel=1e-12)
    # the ranks stay the probes' own
    assert pooled.latency_p50 == _round(PROBES).latency_p50


def test_the_lbs_failures_are_errors_and_a_mean_without_spread_borrows_the_probes_relative_spread() -> None:
    probes = _round(PROBES, errors=1)
    pooled = with_lb_timings(probes, _timed(TIMED, failures=2, spread=False))
    assert (pooled.sent, pooled.successes, pooled.errors, pooled.lb_timed) == (13, 10, 3, 8)
    assert probes.latency_mean is not None and probes.latency_std is not None
    lb_mean = statistics.fmean(TIMED)
    lb_std = lb_mean * probes.latency_std / probes.latency_mean
    n1, n2 = len(PROBES), len(TIMED)
    mean = (n1 * probes.latency_mean + n2 * lb_mean) / (n1 + n2)
    gap = probes.latency_mean - lb_mean
    squares = (n1 - 1) * probes.latency_std**2 + (n2 - 1) * lb_std**2 + n1 * n2 / (n1 + n2) * gap**2
    assert pooled.latency_mean == pytest.approx(mean) and pooled.latency_std == pytest.approx(math.sqrt(squares / 9))


def test_a_round_without_successful_probes_takes_the_lbs_timings() -> None:
    pooled = with_lb_timings(_round([], errors=2), _timed(TIMED, spread=False))
    assert pooled.latency_mean == pytest.approx(statistics.fmean(TIMED))
    assert pooled.latency_std == pytest.approx(statistics.fmean(TIMED))  # exponential service: std = mean
    assert pooled.success_rate == pytest.approx(6 / 8)


def test_nothing_timed_leaves_the_round_and_a_dip_without_a_round_gets_none() -> None:
    probes = _round(PROBES)
    assert with_lb_timings(probes, TimedRequests(0, None)) is probes
    pooled = pool_lb_timings({"d1": probes}, {"d1": _timed(TIMED), "d2": _timed(TIMED)})
    assert set(pooled) == {"d1"} and pooled["d1"].lb_timed == len(TIMED)


def test_bad_timings_and_counts_are_named() -> None:
    with pytest.raises(InvalidInputError, match="latency_mean"):
        TimedRequests(3, None)
    with pytest.raises(InvalidInputError, match="latency_std"):
        TimedRequests(3, 0.01, float("nan"))
    with pytest.raises(InvalidInputError, match="failures"):
        TimedRequests(3, 0.01, None, -1)
    with pytest.raises(InvalidInputError, match="lb_timed"):
        Measurement(vip="web", dip="d1", time=1.0, weight=0.5, sent=2, successes=2, errors=0, timeouts=0,
                    latency_mean=0.01, latency_p50=None, latency_p90=None, latency_p99=None,
                    failure_latency_mean=None, worker="w", lb_timed=3)
    pooled = with_lb_timings(_round(PROBES), _timed(TIMED))
    assert Measurement.from_dict(pooled.to_dict()) == pooled
