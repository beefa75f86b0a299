"""``klb bench solver``: every method on the same seeded instance, timed (KnapsackLB section 6.6).

The paper's Table 6 times the single-step ILP with 10 levels for 10 to 1000 DIPs (20 ms,
194 ms, 645 ms, 5.8 s, 21.1 s) and Table 7 compares 100 levels in one step (36.8 s) with
10 levels in two steps (0.65 s x 2) on 100 DIPs. This runs the same comparison here, adding
the exact solver. ``seconds`` is the median over ``repeat`` runs (each method's own
``Solution.seconds``); ``optimal_objective`` is the best objective any method found and
``gap`` the relative excess ``objective / optimal_objective - 1``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from knapsack_lb.errors import InvalidInputError, KnapsackLBError
from knapsack_lb.solver.api import objective_of, solve
from knapsack_lb.solver.inputs import DipInput
from knapsack_lb.solver.instances import identical_pool, table3_pool

PAPER_ILP_SECONDS = {10: 0.020, 50: 0.194, 100: 0.645, 500: 5.8, 1000: 21.1}
"""Table 6 of the paper: single-step ILP, 10 levels in [0, w_max], equal DIPs at 80% load."""

PAPER_MULTISTEP = {"100 levels, one step": 36.8, "10 levels, two steps (each)": 0.65}
"""Table 7 of the paper: 100 DIPs."""


def make_pool(dips: int, seed: int, pool: str = "table3", kind: str = "queueing") -> list[DipInput]:
    """The benchmark's instance: ``table3`` (heterogeneous, seeded) or ``identical`` (section 6.6)."""
    if pool == "table3":
        return table3_pool(dips, np.random.default_rng(seed), kind=kind)
    if pool == "identical":
        return identical_pool(dips, kind=kind)
    raise InvalidInputError("pool", pool, "must be 'table3' or 'identical'")


def run_solver_bench(
    dips: int,
    *,
    levels: int = 10,
    methods: Sequence[str] = ("exact", "ilp", "ilp-multistep"),
    objective: str = "mean",
    seed: int = 0,
    repeat: int = 3,
    pool: str = "table3",
    kind: str = "queueing",
    units: int = 1_000_000,
    time_limit: float | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Solve one instance with each method ``repeat`` times; one result row per method."""
    if repeat < 1:
        raise InvalidInputError("repeat", repeat, "must be >= 1")
    instance = make_pool(dips, seed, pool, kind)
    rows: list[dict[str, Any]] = []
    for method in methods:
        times: list[float] = []
        row: dict[str, Any] = {"method": method, "dips": dips, "levels": levels, "objective_kind": objective}
        try:
            for _ in range(repeat):
                solution = solve(instance, objective=objective, method=method, levels=levels, units=units,
                                 time_limit=time_limit)
                times.append(solution.seconds)
                if progress is not None:
                    progress(method)
            row.update(
                seconds=statistics.median(times), runs=times, objective=solution.objective, ran=solution.method,
                note=solution.note,
            )
        except KnapsackLBError as exc:
            row.update(seconds=None, runs=times, objective=None, ran=None, note=f"failed: {exc}")
        rows.append(row)
    found = [r["objective"] for r in rows if r["objective"] is not None]
    best = min(found) if found else None
    for row in rows:
        row["optimal_objective"] = best
        row["gap"] = None if row["objective"] is None or not best else row["objective"] / best - 1.0
    return rows


def scaling(
    sizes: Sequence[int],
    methods: Sequence[str],
    *,
    levels: int = 10,
    seed: int = 0,
    repeat: int = 1,
    pool: str = "table3",
    time_limit: float | None = None,
    largest: dict[str, int] | None = None,
) -> dict[str, list[tuple[int, float]]]:
    """Median seconds per method and pool size (a method is skipped above ``largest[method]`` DIPs)."""
    series: dict[str, list[tuple[int, float]]] = {m: [] for m in methods}
    for n in sizes:
        chosen = [m for m in methods if largest is None or n <= largest.get(m, n)]
        for row in run_solver_bench(n, levels=levels, methods=chosen, seed=seed, repeat=repeat, pool=pool,
                                    time_limit=time_limit):
            if row["seconds"] is not None:
                series[row["method"]].append((n, float(row["seconds"])))
    return series


def objective_table(dips: Sequence[DipInput], objectives: Sequence[str] = ("mean", "sum")) -> list[dict[str, Any]]:
    """Solve ``dips`` once per objective and score every plan under every objective (rows per plan)."""
    rows = []
    for objective in objectives:
        solution = solve(dips, objective=objective)
        row: dict[str, Any] = {"solved_for": objective, "weights": solution.weights}
        for score in ("mean", "sum", "max"):
            row[score] = objective_of(dips, solution.weights, score)
        rows.append(row)
    return rows
