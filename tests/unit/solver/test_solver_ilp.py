"""The paper's ILP (Fig. 7) and multi-step ILP (section 4.4) with the real CBC binaries."""

from __future__ import annotations

import math
import os

import numpy as np
import pulp
import pytest

from knapsack_lb.curves import QuadraticCurve
from knapsack_lb.errors import InfeasibleError
from knapsack_lb.solver import DipInput, solve
from knapsack_lb.solver.grid import build_problem
from knapsack_lb.solver.ilp import cbc_solver, ilp_units, paper_levels
from knapsack_lb.solver.inputs import columns
from knapsack_lb.solver.instances import table3_pool
from knapsack_lb.solver.multistep import fine_levels


def squares() -> list[DipInput]:
    """l_A(w) = w^2 and l_B(w) = 2 w^2 on a 4-unit grid: w_A in {0, .25, .5, .75, 1}."""
    return [DipInput("A", QuadraticCurve(0.0, 0.0, 1.0), 1.0), DipInput("B", QuadraticCurve(0.0, 0.0, 2.0), 1.0)]


def test_hand_computed_ilp_sum_objective() -> None:
    # sum: w_A^2 + 2 (1 - w_A)^2 -> 0.75: 0.5625 + 0.125 = 0.6875; 0.5: 0.75; 1.0: 1.0
    solution = solve(squares(), objective="sum", method="ilp", units=4, levels=5)
    assert solution.method == "ilp"
    assert solution.weights == {"A": 0.75, "B": 0.25}
    assert solution.objective == pytest.approx(0.6875)


def test_hand_computed_ilp_max_objective() -> None:
    # max: 0.75 -> max(0.5625, 0.125) = 0.5625; 0.5 -> max(0.25, 0.5) = 0.5; 0.25 -> 1.125
    solution = solve(squares(), objective="max", method="ilp", units=4, levels=5)
    assert solution.weights == {"A": 0.5, "B": 0.5}
    assert solution.objective == pytest.approx(0.5)


def test_hand_computed_ilp_mean_objective() -> None:
    # mean: w_A^3 + 2 w_B^3 -> 0.5: 0.125 + 0.25 = 0.375; 0.75: 0.421875 + 0.03125 = 0.453125
    solution = solve(squares(), objective="mean", method="ilp", units=4, levels=5)
    assert solution.weights == {"A": 0.5, "B": 0.5}
    assert solution.objective == pytest.approx(0.375)


def test_levels_are_uniform_on_the_bounds_plus_a_feasible_anchor() -> None:
    dips = table3_pool(12, np.random.default_rng(7))
    problem = build_problem(dips, columns(dips), "mean", 1.0, 1000)
    levels = paper_levels(problem, 10)
    anchors = []
    for lv, lo, hi in zip(levels, problem.lo, problem.hi, strict=True):
        assert lv[0] == lo and lv[-1] == hi and len(lv) <= 11
        uniform = np.unique(np.rint(np.linspace(lo, hi, 10)).astype(int))
        extra = np.setdiff1d(lv, uniform)
        anchors.append(int(extra[0]) if extra.size else None)
    assert sum(a for a in anchors if a is not None) <= problem.units


def test_fine_step_keeps_the_coarse_pick_and_stays_in_the_window() -> None:
    dips = table3_pool(10, np.random.default_rng(8))
    problem = build_problem(dips, columns(dips), "mean", 1.0, 10_000)
    picks = problem.lo + (problem.hi - problem.lo) // 2
    for lv, pick, w_max in zip(fine_levels(problem, picks, 10), picks, problem.w_max, strict=True):
        assert pick in lv
        window = 0.1 * w_max / problem.unit
        assert lv.min() >= pick - window - 1 and lv.max() <= pick + window + 1


def test_ilp_grid_is_nested_in_the_exact_grid() -> None:
    assert ilp_units(60, 10, 30) == 60
    grid = ilp_units(1_000_000, 10, 100)
    assert 1_000_000 % grid == 0 and 1800 <= grid <= 3600  # about 4 units per level step: 4 * 9 * 100


def test_multistep_is_never_better_than_exact_and_not_worse_than_its_first_step() -> None:
    dips = table3_pool(40, np.random.default_rng(9))
    exact = solve(dips, method="exact")
    single = solve(dips, method="ilp")
    multi = solve(dips, method="ilp-multistep")
    assert multi.method == "ilp-multistep" and "fine step" in multi.note
    assert exact.objective <= multi.objective * (1 + 1e-12)
    assert multi.objective <= single.objective * (1 + 1e-9)
    assert math.fsum(multi.weights.values()) == pytest.approx(1.0, abs=1e-12)


def test_imbalance_constraint_is_honoured_and_auto_uses_the_ilp_for_it() -> None:
    dips = table3_pool(16, np.random.default_rng(10))
    free = solve(dips)
    spread = max(free.weights.values()) - min(free.weights.values())
    bounded = solve(dips, imbalance=spread / 2)
    assert bounded.method == "ilp"
    assert bounded.note.startswith("auto: the imbalance constraint needs the ILP")
    assert max(bounded.weights.values()) - min(bounded.weights.values()) <= spread / 2 + 1e-9
    assert bounded.objective >= free.objective


def test_auto_uses_multistep_from_100_dips_when_the_ilp_is_needed() -> None:
    dips = table3_pool(100, np.random.default_rng(11))
    solution = solve(dips, imbalance=0.5, levels=3, time_limit=60)
    assert solution.method == "ilp-multistep"
    assert "100 DIPs (>= 100" in solution.note


def test_impossible_imbalance_with_pins_is_infeasible() -> None:
    curve = QuadraticCurve(0.001, 0.0, 0.1)
    dips = [DipInput("a", curve, 0.9, pin=0.6), DipInput("b", curve, 0.9), DipInput("c", curve, 0.9)]
    with pytest.raises(InfeasibleError, match="imbalance"):
        solve(dips, method="ilp", imbalance=0.1, units=100)


def test_debian_cbc_is_used_when_the_bundled_one_is_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(cbc_solver(None), pulp.PULP_CBC_CMD)
    if not os.path.exists("/usr/bin/cbc"):
        pytest.skip("coinor-cbc is not installed")
    monkeypatch.setattr(pulp.PULP_CBC_CMD, "available", lambda self: False)
    solver = cbc_solver(5.0)
    assert isinstance(solver, pulp.COIN_CMD) and solver.path == "/usr/bin/cbc"
    solution = solve(squares(), objective="sum", method="ilp", units=4, levels=5)
    assert solution.weights == {"A": 0.75, "B": 0.25}
