"""The paper's ILP (KnapsackLB section 3.3, Fig. 7) with PuLP and CBC, on the shared unit grid.

Variables: binary ``x[d, j]`` = "DIP d takes its j-th level". Constraints:

* (a) one level per DIP: ``sum_j x[d, j] = 1``;
* (b) total weight: ``sum_{d,j} level[d, j] * x[d, j] = units`` (integers, so it is exact);
* (c)/(d) optional allowed imbalance: ``W_max - W_min <= imbalance`` with
  ``W_min <= weight_d <= W_max`` for every DIP (pinned ones included);
* bounds: the levels themselves lie in ``[lo_d, hi_d]`` (min_weight, w_max, max_weight).

Objective: ``mean`` minimises ``sum x[d, j] * w * l_d(w)``, ``sum`` (the paper's) ``sum x[d, j] *
l_d(w)``, ``max`` an auxiliary ``z >= sum_j l_d(level_j) * x[d, j]`` over levels with positive
weight (a DIP at weight 0 carries no request and does not count). Costs are scaled so the
largest is ``OBJECTIVE_SCALE`` before they reach CBC, so its absolute tolerances act relative
to the data.

**Levels and feasibility.** The paper feeds K levels uniformly spaced in ``[0, w_max]``
(section 4.4). On their own such levels rarely add up to exactly 1 (two DIPs with levels
``{0, w_max/9, ...}`` almost never do), so constraint (b) would make the ILP infeasible.
Here each DIP's levels are the K uniformly spaced points of ``[lo_d, hi_d]`` rounded to the unit
grid, **plus one anchor level**: the DIP's share of a capacity-proportional split of the units
(``lo_d`` plus the rest in proportion to ``hi_d - lo_d``, rounded by largest remainder). The
anchors sum to exactly ``units``, so every ILP has a feasible point, and all levels are grid
points, so the ILP can never beat the exact solver on the same grid. With ``levels=None``
every grid point is a level (the tests' reference).

Failure: CBC's "infeasible" (only possible with the imbalance constraint) raises
InfeasibleError; no solution within ``time_limit`` raises SolverError; a solution cut short by
the time limit is returned and flagged ``timed_out``.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import numpy as np
import pulp

from knapsack_lb.errors import InfeasibleError, SolverError
from knapsack_lb.solver.grid import IntArray, Problem, proportional

DEBIAN_CBC = "/usr/bin/cbc"

OBJECTIVE_SCALE = 1e4
"""CBC sees costs scaled so the largest is this. CBC prunes nodes that cannot improve the incumbent by
its cutoff increment (1e-5 absolute by default); at this scale that is 1e-9 of the largest cost."""

UNITS_PER_LEVEL_STEP = 4
"""The ILP's grid has about this many units per level step per DIP (see ``ilp_units``)."""

MIN_ILP_UNITS = 1000


def ilp_units(units: int, levels: int, dips: int) -> int:
    """The ILP's grid: at most ``units``, nested in it, about ``4 * (K - 1) * dips`` units.

    CBC slows sharply when constraint (b) has large integer coefficients (30 DIPs x 10 levels,
    ``sum`` objective, on this machine: 0.14 s at 250 units, 0.4 s at 1250, 20 s at 5000, and
    48 s at 10^6 for ``mean``), while the ILP's levels only need a grid fine enough to round
    them well: a level step is about ``1 / (dips * (K - 1))`` of the total, so 4 units per step
    put each level within 1/8 of a step of its exact place. The grid divides ``units`` (so
    every ILP plan is a plan of the exact solver too and can never beat it); if ``units`` has
    no suitable divisor the coarse grid is used as is.
    """
    target = max(MIN_ILP_UNITS, UNITS_PER_LEVEL_STEP * (levels - 1) * max(dips, 1))
    if units <= target:
        return units
    first = -(-units // target)
    for factor in range(first, min(units, first + 10_000) + 1):
        if units % factor == 0:
            return units // factor
    return target


@dataclass(frozen=True)
class IlpResult:
    """Units per free DIP, the solver's wall time, and whether CBC stopped on its time limit."""

    k: IntArray
    seconds: float
    timed_out: bool
    variables: int


def cbc_solver(time_limit: float | None) -> pulp.LpSolver_CMD:
    """PuLP's bundled CBC; Debian's ``coinor-cbc`` via ``COIN_CMD`` only if the bundled binary is absent."""
    options: dict[str, object] = {"msg": False, "gapRel": 0.0, "gapAbs": 0.0}
    if time_limit is not None:
        options["timeLimit"] = time_limit
    bundled = pulp.PULP_CBC_CMD(**options)
    if bundled.available():
        return bundled
    if os.path.exists(DEBIAN_CBC):
        return pulp.COIN_CMD(path=DEBIAN_CBC, **options)
    raise SolverError("no CBC binary: PuLP's bundled one is missing and /usr/bin/cbc (coinor-cbc) is not installed")


def uniform_levels(lo: int, hi: int, count: int) -> IntArray:
    """``count`` points evenly spaced on ``[lo, hi]``, rounded to the grid, without duplicates."""
    return np.unique(np.rint(np.linspace(lo, hi, count)).astype(np.int64))


def paper_levels(problem: Problem, count: int | None) -> list[IntArray]:
    """Per free DIP: K uniform levels on ``[lo, hi]`` plus the capacity-proportional anchor (or every point)."""
    if count is None:
        return [np.arange(int(a), int(b) + 1, dtype=np.int64) for a, b in zip(problem.lo, problem.hi, strict=True)]
    anchor = proportional(problem.lo, problem.hi, problem.units)
    return [
        np.union1d(uniform_levels(int(a), int(b), count), [int(c)])
        for a, b, c in zip(problem.lo, problem.hi, anchor, strict=True)
    ]


def solve_levels(
    problem: Problem,
    levels: list[IntArray],
    *,
    imbalance: float | None = None,
    time_limit: float | None = None,
) -> IlpResult:
    """Solve Fig. 7 over the given per-DIP levels (grid units) with CBC."""
    start = time.perf_counter()
    n = len(levels)
    if n == 0:
        return IlpResult(np.zeros(0, dtype=np.int64), 0.0, False, 0)
    owner = np.repeat(np.arange(n, dtype=np.int64), [len(lv) for lv in levels])
    flat = np.concatenate(levels)
    objective = problem.objective
    coeff = problem.latency(owner, flat) if objective == "max" else problem.cost(owner, flat)
    if not np.isfinite(coeff).all():
        raise SolverError("a level's latency is not finite; the curve checks should have caught this")
    scale = (float(np.abs(coeff).max()) or 1.0) / OBJECTIVE_SCALE
    coeff = coeff / scale

    model = pulp.LpProblem("knapsacklb_fig7", pulp.LpMinimize)
    names = [f"x_{d}_{j}" for d, j in zip(owner.tolist(), flat.tolist(), strict=True)]
    xs = [pulp.LpVariable(name, cat=pulp.LpBinary) for name in names]
    starts = np.concatenate(([0], np.cumsum([len(lv) for lv in levels])))
    for d in range(n):
        model += pulp.lpSum(xs[int(starts[d]) : int(starts[d + 1])]) == 1, f"a_one_level_{d}"
    flat_list = flat.tolist()
    model += pulp.LpAffineExpression(list(zip(xs, flat_list, strict=True))) == problem.units, "b_total"
    coeff_list = coeff.tolist()
    if objective == "max":
        z = pulp.LpVariable("z_max_latency", lowBound=0)
        model += z
        for d in range(n):
            terms = [
                (xs[i], coeff_list[i]) for i in range(int(starts[d]), int(starts[d + 1])) if flat_list[i] > 0
            ]
            if terms:
                model += z >= pulp.LpAffineExpression(terms), f"max_{d}"
        pinned_lat = [
            problem.dips[int(i)].curve.latency(float(problem.dips[int(i)].pin))  # type: ignore[arg-type]
            for i in problem.pinned if (problem.dips[int(i)].pin or 0.0) > 0
        ]
        if pinned_lat:
            model += z >= max(pinned_lat) / scale, "max_pinned"
    else:
        model += pulp.LpAffineExpression(list(zip(xs, coeff_list, strict=True)))
    if imbalance is not None:
        _add_imbalance(model, problem, xs, flat_list, starts, imbalance)

    solver = cbc_solver(time_limit)
    status = model.solve(solver)
    seconds = time.perf_counter() - start
    has_solution = model.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    if status == pulp.LpStatusInfeasible or model.sol_status == pulp.LpSolutionInfeasible:
        raise InfeasibleError(
            f"CBC: the ILP over {len(xs)} levels of {n} DIPs is infeasible"
            + (f" with the allowed imbalance {imbalance:.6g}" if imbalance is not None else "")
        )
    if not has_solution:
        raise SolverError(f"CBC returned no solution (status {pulp.LpStatus.get(status, status)}) in {seconds:.3g} s")
    values = np.array([x.value() or 0.0 for x in xs])
    picked = values > 0.5
    k = np.zeros(n, dtype=np.int64)
    np.add.at(k, owner[picked], flat[picked])
    if np.bincount(owner[picked], minlength=n).max(initial=1) != 1 or int(k.sum()) != problem.units:
        raise SolverError("CBC's solution breaks constraint (a) or (b); refusing it")
    timed_out = model.sol_status == pulp.LpSolutionIntegerFeasible
    return IlpResult(k, seconds, timed_out, len(xs))


def _add_imbalance(
    model: pulp.LpProblem,
    problem: Problem,
    xs: list[pulp.LpVariable],
    flat: list[int],
    starts: np.ndarray,
    imbalance: float,
) -> None:
    """Constraints (c) and (d) of Fig. 7 in grid units: every weight within ``[W_min, W_max]``, spread bounded."""
    unit = problem.unit if problem.unit > 0 else 1.0
    w_hi = pulp.LpVariable("W_max")
    w_lo = pulp.LpVariable("W_min")
    model += w_hi - w_lo <= imbalance / unit, "c_imbalance"
    for d in range(len(starts) - 1):
        weight = pulp.LpAffineExpression(list(zip(xs[int(starts[d]) : int(starts[d + 1])],
                                                  flat[int(starts[d]) : int(starts[d + 1])], strict=True)))
        model += weight <= w_hi, f"d_max_{d}"
        model += weight >= w_lo, f"d_min_{d}"
    for i in problem.pinned:
        pin = float(problem.dips[int(i)].pin or 0.0) / unit
        if math.isfinite(pin):
            model += w_hi >= pin, f"d_pin_max_{int(i)}"
            model += w_lo <= pin, f"d_pin_min_{int(i)}"
