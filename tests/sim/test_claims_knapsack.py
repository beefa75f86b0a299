"""The reference the KnapsackLB dynamics rows are read against, on known answers."""

from __future__ import annotations

import math

import pytest

from knapsack_lb.sim.claims.knapsack import optimal_plans, optimal_split
from knapsack_lb.sim.spec import Scenario, load_scenario


def _two_mm1(load: float) -> Scenario:
    return load_scenario("knapsack-dynamics").with_changes(
        dips=[{"name": "slow", "speed": 1.0}, {"name": "fast", "speed": 2.0}], clients={"load": load}, events=[])


def test_the_optimum_of_two_mm1_dips_is_the_square_root_split() -> None:
    """Two M/M/1 DIPs of service rates mu1, mu2 under Poisson lambda: the split of least mean latency
    gives lambda1 = mu1 - sqrt(mu1) (mu1 + mu2 - lambda) / (sqrt(mu1) + sqrt(mu2))."""
    sc = _two_mm1(0.7)
    mu1, mu2 = 1 / sc.service.mean, 2 / sc.service.mean
    rate = 0.7 * (mu1 + mu2)
    lam1 = mu1 - math.sqrt(mu1) * (mu1 + mu2 - rate) / (math.sqrt(mu1) + math.sqrt(mu2))
    weights = optimal_split(sc)
    assert weights["slow"] == pytest.approx(lam1 / rate, abs=1e-3)
    assert sum(weights.values()) == pytest.approx(1.0)


def test_the_optimum_after_an_event_drops_failed_dips_and_follows_the_new_speed_and_load() -> None:
    sc = _two_mm1(0.4)
    failed = optimal_split(sc, failed=frozenset({"slow"}))
    assert "slow" not in failed and failed["fast"] == pytest.approx(1)
    slowed = optimal_split(sc, speeds={"fast": 0.5})  # both DIPs at one service rate: an equal split
    assert slowed["slow"] == pytest.approx(0.5, abs=1e-3)
    assert optimal_split(sc, traffic=1.5)["slow"] > optimal_split(sc)["slow"]  # more load: the slow DIP takes more


def test_the_optimal_plans_follow_the_events() -> None:
    sc = _two_mm1(0.4).with_changes(events=[{"at": 10, "kind": "fail", "dips": ["slow"]},
                                            {"at": 20, "kind": "restart", "dips": ["slow"]},
                                            {"at": 30, "kind": "capacity", "dips": ["fast"], "speed": 0.5},
                                            {"at": 40, "kind": "traffic", "factor": 1.5}])
    plans = optimal_plans(sc)
    assert [p["time"] for p in plans] == [0.0, 10.0, 20.0, 30.0, 40.0]
    assert plans[1]["weights"] == {"fast": pytest.approx(1.0)}
    assert plans[2]["weights"] == pytest.approx(plans[0]["weights"])
    assert plans[3]["weights"]["slow"] == pytest.approx(0.5, abs=1e-3)
    assert plans[4]["weights"]["slow"] == pytest.approx(0.5, abs=1e-3)  # still equal DIPs at any load
