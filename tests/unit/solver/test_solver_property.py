"""Property: on random small instances ``exact`` equals CBC's optimum over every grid level.

The ILP here is the paper's Fig. 7 with every point of the unit grid as a level, solved by
CBC; it is the reference optimum. ``ilp-multistep`` (section 4.4) chooses among fewer levels
on the same grid, so it can never beat ``exact``.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from knapsack_lb.curves import LatencyCurve, PiecewiseLinearCurve, QuadraticCurve, QueueingCurve
from knapsack_lb.errors import InfeasibleError
from knapsack_lb.solver import DipInput, solve
from knapsack_lb.solver.api import objective_of
from knapsack_lb.solver.grid import build_problem
from knapsack_lb.solver.ilp import paper_levels, solve_levels
from knapsack_lb.solver.inputs import columns

unit_floats = st.floats(0.0, 1.0, allow_nan=False, allow_infinity=False)


@st.composite
def curves(draw: st.DrawFn, w_max: float) -> LatencyCurve:
    kind = draw(st.sampled_from(["quadratic", "queueing", "piecewise"]))
    if kind == "quadratic":
        return QuadraticCurve(draw(st.floats(0.0005, 0.01)), draw(st.floats(0.0, 0.05)), draw(st.floats(0.0, 0.5)))
    if kind == "queueing":
        return QueueingCurve(draw(st.floats(0.0005, 0.01)), draw(st.floats(1e-4, 0.01)),
                             w_max * draw(st.floats(1.05, 2.0)))
    # non-decreasing, usually non-convex: random rises at random knots
    knots = sorted(k / 20 for k in draw(st.lists(st.integers(1, 19), min_size=2, max_size=2, unique=True)))
    rises = draw(st.lists(st.floats(0.0, 0.01), min_size=3, max_size=3))
    xs = (0.0, knots[0] * w_max, knots[1] * w_max, w_max)
    ys = tuple(np.cumsum([draw(st.floats(0.0005, 0.005)), *rises]).tolist())
    return PiecewiseLinearCurve(xs, ys)


@st.composite
def instances(draw: st.DrawFn) -> tuple[list[DipInput], int, str]:
    n = draw(st.integers(2, 30))
    units = draw(st.integers(20, 60))
    objective = draw(st.sampled_from(["mean", "sum", "max"]))
    bounded = draw(st.booleans())
    dips = []
    for i in range(n):
        w_max = min(1.0, draw(st.floats(1.5, 4.0)) / n)
        low, high, pin = 0.0, None, None
        if bounded:
            low = draw(st.sampled_from([0.0, 0.0, 0.3])) * w_max
            high = draw(st.sampled_from([None, 0.7, 0.9]))
            high = None if high is None else max(high * w_max, low)
            if i == 0 and draw(st.booleans()):
                pin = draw(st.sampled_from([0.0, 0.5 / n]))
        dips.append(DipInput(f"d{i}", draw(curves(w_max)), w_max, min_weight=low, max_weight=high, pin=pin))
    return dips, units, objective


def cbc_all_levels(dips: list[DipInput], units: int, objective: str) -> float:
    problem = build_problem(dips, columns(dips), objective, 1.0, units)
    result = solve_levels(problem, paper_levels(problem, None))
    weights = {d.name: float(d.pin) for d in dips if d.pin is not None}
    for position, k in zip(problem.free.tolist(), result.k.tolist(), strict=True):
        weights[dips[position].name] = k * problem.unit
    assert abs(math.fsum(weights.values()) - 1.0) < 1e-12
    return objective_of(dips, weights, objective)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(), st.integers(2, 6))
def test_exact_equals_cbc_optimum_and_multistep_never_beats_it(
    case: tuple[list[DipInput], int, str], levels: int
) -> None:
    dips, units, objective = case
    try:
        exact = solve(dips, objective=objective, method="exact", units=units)
    except InfeasibleError:
        assume(False)
        return
    reference = cbc_all_levels(dips, units, objective)
    assert math.isclose(exact.objective, reference, rel_tol=1e-6, abs_tol=1e-12), (exact.note, reference)
    multi = solve(dips, objective=objective, method="ilp-multistep", units=units, levels=levels)
    assert multi.objective >= exact.objective * (1 - 1e-9) - 1e-12
    assert abs(math.fsum(multi.weights.values()) - 1.0) < 1e-9
