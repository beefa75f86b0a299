"""``solve_many`` gives every VIP the plan ``solve(method="exact")`` gives it alone, or its error."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from knapsack_lb.curves import PiecewiseLinearCurve, QuadraticCurve
from knapsack_lb.errors import InfeasibleError
from knapsack_lb.lab.fleet import make_fleet
from knapsack_lb.solver import DipInput, Solution, solve, solve_many
from knapsack_lb.solver.instances import identical_pool, table3_pool

from .conftest import capacity_dip


def plan(solution: Solution) -> tuple[object, ...]:
    return solution.weights, solution.predicted_latency, solution.objective, solution.objective_kind, solution.method


def one_by_one(problems: Sequence[Sequence[DipInput]], objective: str, units: int = 1_000_000) -> list[Solution]:
    return [solve(dips, objective=objective, method="exact", units=units) for dips in problems]


@pytest.mark.parametrize("objective", ["mean", "sum"])
@pytest.mark.parametrize(("shape", "kind"), [("table8", "quadratic"), ("lognormal", "queueing")])
def test_seeded_fleet_gets_exactly_the_per_vip_plans(objective: str, shape: str, kind: str) -> None:
    fleet = make_fleet(7, shape=shape, scale=0.03, vips=120, dips=2400, kind=kind)
    problems = fleet.problems()
    batched = solve_many(problems, objective=objective)
    assert [plan(s) for s in batched] == [plan(s) for s in one_by_one(problems, objective)]
    assert {s.method for s in batched} == {"exact-greedy"}
    assert all("batched" in s.note for s in batched)


def test_ties_between_identical_dips_are_broken_as_solve_breaks_them() -> None:
    problems = [identical_pool(n) for n in (2, 3, 7, 40)] + [identical_pool(5, kind="quadratic")]
    for units in (1000, 997, 1_000_000):
        batched = solve_many(problems, units=units)
        assert [plan(s) for s in batched] == [plan(s) for s in one_by_one(problems, "mean", units)]


def test_flat_curves_where_every_unit_costs_the_same_fill_dips_in_the_same_order() -> None:
    def flat(latencies: list[float], w_max: float) -> list[DipInput]:
        return [DipInput(f"d{i}", QuadraticCurve(a, 0.0, 0.0), w_max) for i, a in enumerate(latencies)]

    problems = [flat([0.01] * 4, 0.4), flat([0.01, 0.02, 0.01, 0.02, 0.01], 0.3), flat([0.005] * 30, 0.05)]
    for units in (1000, 100_000, 1_000_000):
        for objective in ("mean", "sum"):
            batched = solve_many(problems, objective=objective, units=units)
            assert [plan(s) for s in batched] == [plan(s) for s in one_by_one(problems, objective, units)]


def test_vips_the_batch_cannot_take_are_solved_alone_in_their_place() -> None:
    rng = np.random.default_rng(3)
    pinned = [DipInput(d.name, d.curve, d.w_max, pin=0.05 if i == 0 else None)
              for i, d in enumerate(table3_pool(6, rng))]
    bumpy = [DipInput("bumpy", PiecewiseLinearCurve((0.0, 0.2, 0.25, 0.6), (0.001, 0.009, 0.0095, 0.011)), 0.6),
             DipInput("flat", QuadraticCurve(0.002, 0.001, 0.01), 0.7)]
    floors = [DipInput(d.name, d.curve, d.w_max, min_weight=0.01) for d in table3_pool(5, rng)]
    problems = [table3_pool(8, rng), pinned, bumpy, floors, table3_pool(12, rng, kind="quadratic")]
    batched = solve_many(problems)
    alone = one_by_one(problems, "mean")
    assert [plan(s) for s in batched] == [plan(s) for s in alone]
    assert [s.method for s in batched] == ["exact-greedy", "exact-greedy", "exact-dp", "exact-greedy", "exact-greedy"]
    assert ["batched" in s.note for s in batched] == [True, False, False, True, True]
    maximum = solve_many(problems[:2], objective="max")
    assert [plan(s) for s in maximum] == [plan(s) for s in one_by_one(problems[:2], "max")]


def test_an_infeasible_vip_raises_what_solve_raises() -> None:
    over = [capacity_dip("a", 1.0, 10.0), capacity_dip("b", 1.0, 10.0)]
    with pytest.raises(InfeasibleError) as alone:
        solve(over, method="exact")
    with pytest.raises(InfeasibleError) as batched:
        solve_many([table3_pool(5, np.random.default_rng(0)), over])
    assert str(batched.value) == str(alone.value)


def test_empty_list_and_same_seed_same_fleet() -> None:
    assert solve_many([]) == []
    first, second = make_fleet(11, scale=0.01), make_fleet(11, scale=0.01)
    assert first == second
