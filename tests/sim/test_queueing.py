"""Queueing sanity: the simulated DIPs match textbook results."""

from __future__ import annotations

import pytest

from knapsack_lb.sim.simulation import run
from knapsack_lb.sim.spec import parse_scenario


def single_queue(discipline: str, rate: float, mean: float, duration: float, workers: int = 1) -> dict:
    return {
        "name": f"m-m-{workers}-{discipline}",
        "duration": duration,
        "warmup": 20.0,
        "service": {"kind": "exponential", "mean": mean},
        "dips": [{"name": "d", "workers": workers, "discipline": discipline}],
        "clients": {"kind": "open", "rate": rate},
    }


@pytest.mark.parametrize("discipline", ["fcfs", "ps"])
def test_mm1_mean_latency_is_one_over_mu_minus_lambda(discipline: str) -> None:
    # mu = 100/s, lambda = 50/s: E[T] = 1 / (mu - lambda) = 20 ms for FCFS and for PS alike
    sc = parse_scenario(single_queue(discipline, rate=50.0, mean=0.01, duration=700.0))
    result = run(sc, "round_robin", seed=3)
    assert result.requests > 30_000
    assert result.mean == pytest.approx(0.020, rel=0.05)
    assert result.dip_utilization[0] == pytest.approx(0.5, abs=0.02)


def test_fixed_service_without_queueing_is_exact() -> None:
    sc = parse_scenario(
        {
            **single_queue("fcfs", rate=1.0, mean=0.25, duration=50.0, workers=64),
            "service": {"kind": "fixed", "mean": 0.25},
            "network": {"rtt": 0.01},
        }
    )
    result = run(sc, "round_robin", seed=1)
    assert result.p50 == pytest.approx(0.26) and result.p99 == pytest.approx(0.26)


def test_lognormal_service_keeps_its_mean() -> None:
    sc = parse_scenario(
        {
            **single_queue("fcfs", rate=20.0, mean=0.01, duration=400.0, workers=64),
            "service": {"kind": "lognormal", "mean": 0.01, "sigma": 1.0},
        }
    )
    result = run(sc, "round_robin", seed=2)
    assert result.mean == pytest.approx(0.01, rel=0.06)
    assert result.p99 > 5 * result.p50  # heavy tail


def test_processor_sharing_on_c_cores_runs_c_jobs_at_full_speed() -> None:
    # two jobs of 1 s each on 2 cores finish after 1 s; on 1 core (PS) both after 2 s
    for workers, expected in ((2, 1.0), (1, 2.0)):
        sc = parse_scenario(
            {
                "duration": 0.5,
                "service": {"kind": "fixed", "mean": 1.0},
                "dips": [{"name": "d", "workers": workers, "discipline": "ps"}],
                "clients": {"kind": "closed", "concurrency": 2, "count": 2},
            }
        )
        result = run(sc, "round_robin", seed=1)
        assert result.ok == 2
        assert result.mean == pytest.approx(expected, rel=0.01)
