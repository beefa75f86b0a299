"""The reference the KnapsackLB dynamics rows are read against, on known answers."""

from __future__ import annotations

import math

import pytest
from scipy.optimize import brentq

from knapsack_lb.errors import InvalidInputError
from knapsack_lb.lab.fluid import FluidDip, FluidModel
from knapsack_lb.sim.claims.knapsack import first_event, optimal_plans, optimal_split
from knapsack_lb.sim.spec import Scenario, load_scenario


def _two_mm1(load: float, kind: str = "open") -> Scenario:
    return load_scenario("knapsack-dynamics").with_changes(
        dips=[{"name": "slow", "speed": 1.0}, {"name": "fast", "speed": 2.0}], clients={"kind": kind, "load": load},
        lb={"layer": 4 if kind == "sessions" else 7}, events=[])


def test_the_optimum_of_two_mm1_dips_is_the_square_root_split() -> None:
    """Two M/M/1 DIPs of service rates mu1, mu2 under Poisson lambda: the split of least mean latency
    gives lambda1 = mu1 - sqrt(mu1) (mu1 + mu2 - lambda) / (sqrt(mu1) + sqrt(mu2))."""
    sc = _two_mm1(0.7)
    mu1, mu2 = 1 / sc.service.mean, 2 / sc.service.mean
    rate = 0.7 * (mu1 + mu2)
    lam1 = mu1 - math.sqrt(mu1) * (mu1 + mu2 - rate) / (math.sqrt(mu1) + math.sqrt(mu2))
    weights = optimal_split(sc)
    assert weights["slow"] == pytest.approx(lam1 / rate, abs=5e-3)  # the oracle samples each curve at 48 points
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


def test_sessions_run_at_the_rate_their_closed_loop_allows() -> None:
    """Layer-4 sessions wait for each answer: the rate r solves r = N / (think + rtt + T(r)), with N the
    connections and T the optimum's mean latency at r; the split is the open optimum at that rate."""
    sc = _two_mm1(0.7, kind="sessions")
    c = sc.clients
    connections = 0.7 * sc.total_capacity() * (c.think_time + sc.mean_service())
    dips = [FluidDip("slow", 1, 1 / sc.service.mean), FluidDip("fast", 1, 2 / sc.service.mean)]

    def gap(rate: float) -> float:
        latency = FluidModel(dips, total_rate=rate).oracle().quality.mean_latency
        return rate - connections / (c.think_time + sc.network.rtt + latency)

    rate = brentq(gap, 1.0, 0.7 * sc.total_capacity())
    assert rate < 0.7 * sc.total_capacity()
    expected = FluidModel(dips, total_rate=rate).oracle().weights
    assert optimal_split(sc) == pytest.approx(expected, abs=5e-3)  # one step from the bound, curves at 48 points
    assert optimal_split(sc)["slow"] < optimal_split(_two_mm1(0.7))["slow"]  # less load than open traffic's


def test_the_rows_read_each_change_from_the_scenario_after_the_one_before_settled() -> None:
    """The capacity row reads the drop, not the return after it; each experiment starts at least a
    minute after the change before it (the returned DIPs' slow start and the next plans)."""
    sc = load_scenario("knapsack-dynamics")
    failure, slowdown, surge = (first_event(sc, "fail"), first_event(sc, "capacity", slower=True),
                                first_event(sc, "traffic"))
    restart = first_event(sc, "restart")
    restored = max(e.at for e in sc.events if e.kind == "capacity")
    assert failure < restart <= slowdown - 60 < restored <= surge - 60
    with pytest.raises(InvalidInputError, match="events"):
        first_event(sc.with_changes(events=[]), "traffic")
