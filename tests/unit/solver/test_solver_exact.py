"""The exact methods: known optima, brute force on tiny grids, bounds, pins, the sum, auto's choice."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from knapsack_lb.curves import LatencyCurve, PiecewiseLinearCurve, QuadraticCurve, QueueingCurve
from knapsack_lb.solver import DipInput, solve
from knapsack_lb.solver.instances import table3_counts, table3_pool

from .conftest import capacity_dip


def brute_force(dips: list[DipInput], units: int, objective: str) -> float:
    """Best objective over every way to give each DIP k/units of the traffic within its bounds."""
    best = math.inf
    for ks in itertools.product(range(units + 1), repeat=len(dips)):
        if sum(ks) != units:
            continue
        ws = [k / units for k in ks]
        if any(w > d.cap + 1e-12 or w < d.min_weight - 1e-12 for w, d in zip(ws, dips, strict=True)):
            continue
        lat = [d.curve.latency(w) for w, d in zip(ws, dips, strict=True)]
        if objective == "mean":
            value = sum(w * x for w, x in zip(ws, lat, strict=True))
        elif objective == "sum":
            value = sum(lat)
        else:
            value = max(x for w, x in zip(ws, lat, strict=True) if w > 0)
        best = min(best, value)
    return best


@pytest.mark.parametrize("objective", ["mean", "sum", "max"])
def test_two_identical_dips_split_evenly(objective: str) -> None:
    curve = QuadraticCurve(0.001, 0.002, 0.03)
    solution = solve([DipInput("a", curve, 0.9), DipInput("b", curve, 0.9)], objective=objective)
    assert solution.weights == pytest.approx({"a": 0.5, "b": 0.5}, abs=1e-6)
    assert solution.objective_kind == objective


def test_section_3_4_capacities_1_and_19_get_about_5_and_95_percent() -> None:
    dips = [capacity_dip("c1", 1.0, traffic=14.0), capacity_dip("c19", 19.0, traffic=14.0)]
    for objective in ("mean", "max"):
        solution = solve(dips, objective=objective)
        assert solution.weights["c1"] == pytest.approx(0.05, abs=0.005)
        assert solution.weights["c19"] == pytest.approx(0.95, abs=0.005)
    # the paper's own objective counts each DIP once and starves the small one (docs/design.md)
    assert solve(dips, objective="sum").weights["c1"] < 0.01


def test_greedy_matches_brute_force_on_a_tiny_grid() -> None:
    dips = [
        DipInput("q1", QuadraticCurve(0.002, 0.001, 0.05), 0.7),
        DipInput("q2", QueueingCurve(0.001, 0.002, 0.8), 0.75),
        DipInput("q3", QuadraticCurve(0.0005, 0.01, 0.2), 0.5, min_weight=0.1),
    ]
    for objective in ("mean", "sum", "max"):
        solution = solve(dips, objective=objective, units=20)
        assert solution.method.startswith("exact")
        assert solution.objective == pytest.approx(brute_force(dips, 20, objective), rel=1e-9)


def test_non_convex_curves_run_the_dp_and_match_brute_force() -> None:
    bumpy = PiecewiseLinearCurve((0.0, 0.2, 0.25, 0.6), (0.001, 0.009, 0.0095, 0.011))
    dips = [
        DipInput("bumpy", bumpy, 0.6),
        DipInput("smooth", QuadraticCurve(0.001, 0.004, 0.04), 0.8),
        DipInput("step", PiecewiseLinearCurve((0.0, 0.1, 0.15, 0.5), (0.002, 0.002, 0.01, 0.012)), 0.5),
    ]
    solution = solve(dips, units=20)
    assert solution.method == "exact-dp"
    assert "not convex" in solution.note and "bumpy" in solution.note
    assert solution.objective == pytest.approx(brute_force(dips, 20, "mean"), rel=1e-9)


def test_dp_shrinks_its_grid_for_large_unit_counts_and_says_so() -> None:
    bumpy = PiecewiseLinearCurve((0.0, 0.2, 0.25, 0.6), (0.001, 0.009, 0.0095, 0.011))
    dips = [DipInput(f"d{i}", bumpy, 0.6) for i in range(4)]
    solution = solve(dips)
    assert solution.method == "exact-dp"
    assert "instead of 1000000" in solution.note
    assert math.fsum(solution.weights.values()) == pytest.approx(1.0, abs=1e-12)


def test_pins_and_bounds_are_honoured_and_weights_sum_to_one() -> None:
    dips = table3_pool(30, np.random.default_rng(5))
    first, second, third = dips[0].name, dips[1].name, dips[2].name
    dips[0] = DipInput(first, dips[0].curve, dips[0].w_max, pin=0.0)
    dips[1] = DipInput(second, dips[1].curve, dips[1].w_max, pin=0.01)
    low, high = 0.8 * dips[2].w_max, 0.9 * dips[2].w_max
    dips[2] = DipInput(third, dips[2].curve, dips[2].w_max, min_weight=low, max_weight=high)
    for objective in ("mean", "sum", "max"):
        solution = solve(dips, objective=objective)
        assert solution.weights[first] == 0.0
        assert solution.weights[second] == 0.01
        assert low - 1e-12 <= solution.weights[third] <= high + 1e-12
        assert math.fsum(solution.weights.values()) == pytest.approx(1.0, abs=1e-12)
        for dip in dips:
            assert solution.weights[dip.name] <= dip.w_max + 1e-12 or dip.pin is not None
        plan = solution.to_plan("vip-1", version=3)
        assert plan.method == solution.method and plan.weights == solution.weights


def test_weights_are_whole_units_of_the_grid() -> None:
    solution = solve(table3_pool(12, np.random.default_rng(1)), units=1000)
    ks = [w * 1000 for w in solution.weights.values()]
    assert all(abs(k - round(k)) < 1e-6 for k in ks)
    assert sum(round(k) for k in ks) == 1000


def test_auto_picks_exact_and_says_why() -> None:
    solution = solve(table3_pool(20, np.random.default_rng(2)))
    assert solution.method == "exact-greedy"
    assert solution.note.startswith("auto: exact")
    assert "convex" in solution.note


def test_predicted_latency_is_the_curve_at_the_weight() -> None:
    dips = table3_pool(8, np.random.default_rng(3))
    solution = solve(dips)
    curves: dict[str, LatencyCurve] = {d.name: d.curve for d in dips}
    for name, weight in solution.weights.items():
        assert solution.predicted_latency[name] == pytest.approx(curves[name].latency(weight), rel=1e-12)
    mean = sum(solution.weights[n] * solution.predicted_latency[n] for n in solution.weights)
    assert solution.objective == pytest.approx(mean, rel=1e-12)


def test_max_objective_ignores_dips_without_traffic() -> None:
    slow = DipInput("slow", QuadraticCurve(0.5, 0.0, 0.0), 0.5)
    fast = [DipInput(f"fast{i}", QuadraticCurve(0.001, 0.0, 0.01), 0.6) for i in range(2)]
    solution = solve([slow, *fast], objective="max")
    assert solution.weights["slow"] == 0.0
    assert solution.objective == pytest.approx(0.001 + 0.01 * 0.25, rel=1e-9)


def test_max_objective_ignores_a_slow_dip_pinned_at_zero() -> None:
    # found by the property test: the pinned DIP's latency at weight 0 was taken as a floor
    drained = DipInput("drained", QueueingCurve(0.0078125, 0.0078125, 1.0), 0.5, pin=0.0)
    flat = DipInput("flat", QuadraticCurve(0.0078125, 0.0, 0.0), 0.5)
    slower = DipInput("slower", QuadraticCurve(0.009765625, 0.0, 0.0), 0.5)
    rising = DipInput("rising", QuadraticCurve(0.00390625, 0.0, 0.015625), 0.5)
    solution = solve([drained, flat, slower, rising], objective="max", units=20)
    assert solution.weights == {"drained": 0.0, "flat": 0.5, "slower": 0.0, "rising": 0.5}
    assert solution.objective == pytest.approx(0.0078125, rel=1e-12)


def test_total_below_one_is_split_exactly() -> None:
    dips = table3_pool(10, np.random.default_rng(4))
    solution = solve(dips, total=0.6)
    assert math.fsum(solution.weights.values()) == pytest.approx(0.6, abs=1e-12)


def test_table3_mix_is_16_8_4_2() -> None:
    assert table3_counts(30) == [16, 8, 4, 2]
    assert sum(table3_counts(1000)) == 1000
    assert table3_counts(1000)[0] == pytest.approx(1000 * 16 / 30, abs=1)
