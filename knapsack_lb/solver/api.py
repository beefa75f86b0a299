"""``solve``: per-DIP weight-latency curves in, weights out (KnapsackLB sections 3.3, 4.4, 6.6).

Objectives (``objective=``):

* ``mean`` (default): ``sum_d w_d * l_d(w_d)``, the latency the average request sees (with
  ``total=1``). docs/design.md explains why this, not the paper's, is the default.
* ``sum``: ``sum_d l_d(w_d)``, the paper's Fig. 7 objective; every DIP counts once whatever
  its traffic, including DIPs left at weight 0 (at ``l_d(0)``).
* ``max``: the largest latency among DIPs that carry traffic (weight > 0; pinned DIPs with a
  positive pin included), the paper's footnote 2. Among the plans that reach it, the exact
  method takes the one with the lowest mean (greedy within the caps; a proportional split
  when the mean's costs are not convex).

Methods (``method=``), all on the same integer unit grid (``knapsack_lb.solver.grid``):

* ``exact``: the optimum on the grid. ``exact-greedy`` when every DIP's cost is convex on it
  (decided per instance by ``CurveTable.convex``), ``exact-dp`` otherwise (on a grid of at
  most ``exact.DP_MAX_UNITS`` units chosen by ``exact.dp_units``; the note says which),
  ``exact-bisection`` for ``max``. No imbalance constraint.
* ``ilp``: Fig. 7 with K ``levels`` per DIP and CBC (``knapsack_lb.solver.ilp``).
* ``ilp-multistep``: section 4.4's two steps (``knapsack_lb.solver.multistep``).
* ``auto``: ``exact``, unless an ``imbalance`` is asked for, which only the ILP models; then
  ``ilp`` below 100 DIPs and ``ilp-multistep`` from 100 on (section 4.4). ``Solution.note`` says
  which ran and why.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from knapsack_lb.errors import InvalidInputError
from knapsack_lb.model import PlanFlag, PlanMethod, WeightPlan
from knapsack_lb.solver import exact
from knapsack_lb.solver.grid import IntArray, Problem, build_problem
from knapsack_lb.solver.ilp import ilp_units, paper_levels, solve_levels
from knapsack_lb.solver.inputs import Columns, DipInput, check_objective_and_method, columns
from knapsack_lb.solver.multistep import refinement, solve_multistep

MULTISTEP_FROM = 100
"""Section 4.4: the multi-step ILP runs only when the VIP has at least this many DIPs."""


@dataclass(frozen=True)
class Solution:
    """Weights (summing to ``total``), predicted latency per DIP, the objective, and what ran."""

    weights: dict[str, float]
    predicted_latency: dict[str, float]
    objective: float
    objective_kind: str
    method: str
    seconds: float
    note: str

    def to_plan(
        self,
        vip: str,
        *,
        version: int = 0,
        computed_at: float = 0.0,
        reasons: Sequence[str] = (),
        flags: Sequence[PlanFlag] = (),
    ) -> WeightPlan:
        """This solution as a ``WeightPlan`` (which requires ``total == 1``)."""
        return WeightPlan(
            vip=vip,
            weights=self.weights,
            predicted_latency=self.predicted_latency,
            objective=self.objective,
            objective_kind=self.objective_kind,
            method=PlanMethod(self.method),
            solve_seconds=self.seconds,
            version=version,
            computed_at=computed_at,
            reasons=tuple(reasons),
            flags=tuple(flags),
        )


def _check_parameters(
    total: float, levels: int, units: int, imbalance: float | None, time_limit: float | None
) -> None:
    if isinstance(total, bool) or not isinstance(total, (int, float)) or not math.isfinite(total) or total <= 0:
        raise InvalidInputError("total", total, "must be a finite number > 0")
    if isinstance(levels, bool) or not isinstance(levels, int) or levels < 2:
        raise InvalidInputError("levels", levels, "must be an integer >= 2")
    if isinstance(units, bool) or not isinstance(units, int) or not 1 <= units <= 10**9:
        raise InvalidInputError("units", units, "must be an integer in 1..10^9")
    if imbalance is not None and (not isinstance(imbalance, (int, float)) or not imbalance >= 0):
        raise InvalidInputError("imbalance", imbalance, "must be a number >= 0 or None")
    if time_limit is not None and (not isinstance(time_limit, (int, float)) or not time_limit > 0):
        raise InvalidInputError("time_limit", time_limit, "must be a number > 0 or None")


def _pinned_latency(dips: Sequence[DipInput], cols: Columns) -> dict[int, float]:
    out: dict[int, float] = {}
    for i in np.flatnonzero(cols.pinned).tolist():
        dip = dips[i]
        value = float(dip.curve.latency(float(cols.pin[i])))
        if not math.isfinite(value) or value < 0:
            raise InvalidInputError("pin", dip.pin, f"the curve gives latency {value!r} at the pin", dip.name)
        out[i] = value
    return out


def solve(
    dips: Sequence[DipInput],
    *,
    objective: str = "mean",
    method: str = "auto",
    total: float = 1.0,
    levels: int = 10,
    units: int = 1_000_000,
    imbalance: float | None = None,
    time_limit: float | None = None,
) -> Solution:
    """Weights for ``dips`` that minimise ``objective``, summing to ``total`` on a grid of ``units``.

    ``levels`` is K of the ILP methods; ``imbalance`` bounds ``max(w) - min(w)`` (ILP only);
    ``time_limit`` (seconds) bounds each CBC run. Raises InvalidInputError (naming DIP and
    field), InfeasibleError (with the numbers) or SolverError.
    """
    start = time.perf_counter()
    check_objective_and_method(objective, method)
    _check_parameters(total, levels, units, imbalance, time_limit)
    if not dips:
        raise InvalidInputError("dips", [], "need at least one DIP")
    cols = columns(dips)
    problem = build_problem(dips, cols, objective, total, units)
    pinned_latency = _pinned_latency(dips, cols)
    n = len(dips)

    chosen = method
    note = ""
    if method == "auto":
        if imbalance is not None:
            chosen = "ilp-multistep" if n >= MULTISTEP_FROM else "ilp"
            note = (f"auto: the imbalance constraint needs the ILP; {chosen} because the VIP has {n} DIPs "
                    f"({'>=' if n >= MULTISTEP_FROM else '<'} {MULTISTEP_FROM}, section 4.4). ")
        else:
            chosen = "exact"
            note = "auto: exact, the optimum on the unit grid and the fastest method. "
    if chosen == "exact" and imbalance is not None:
        raise InvalidInputError("imbalance", imbalance, "the exact method does not model it; use method ilp or auto")

    coarse = ""
    if chosen in ("ilp", "ilp-multistep"):
        grid_units = ilp_units(units, levels, len(problem.free))
        if grid_units != problem.units:
            coarse = f" (nested in the {units}-unit grid: CBC slows sharply with large coefficients in constraint (b))"
            problem = problem.with_units(grid_units)
    if chosen == "exact":
        # a DIP pinned at weight 0 serves nothing, so its latency does not bound the largest one
        carrying = [value for i, value in pinned_latency.items() if cols.pin[i] > 0]
        k, ran, detail, problem = _exact(problem, objective, units, max(carrying, default=-math.inf))
    elif chosen == "ilp":
        result = solve_levels(problem, paper_levels(problem, levels), imbalance=imbalance, time_limit=time_limit)
        k, ran = result.k, "ilp"
        detail = (f"ilp: CBC over {levels} levels per DIP plus a capacity-proportional anchor ({result.variables} "
                  f"binaries), {problem.units} units{coarse}")
        if result.timed_out:
            detail += "; CBC stopped at the time limit (best plan found, not proven optimal)"
    else:
        factor = refinement(problem.units, units)
        fine_problem = problem.with_units(problem.units * factor) if factor > 1 else problem
        multi = solve_multistep(problem, levels, imbalance=imbalance, time_limit=time_limit,
                                fine_problem=fine_problem)
        k, ran = multi.k, "ilp-multistep"
        detail = (f"ilp-multistep: coarse step {multi.steps[0].seconds:.3g} s on {problem.units} units + fine step "
                  f"(+-10% of w_max) {multi.steps[1].seconds:.3g} s on {fine_problem.units} units, {levels} levels "
                  f"per DIP{coarse}")
        problem = fine_problem
        if multi.timed_out:
            detail += "; CBC stopped at the time limit in a step"
    weights, latency, value = _evaluate(problem, k, pinned_latency, objective)
    return Solution(
        weights=weights,
        predicted_latency=latency,
        objective=value,
        objective_kind=objective,
        method=ran,
        seconds=time.perf_counter() - start,
        note=note + detail,
    )


def _exact(problem: Problem, objective: str, units: int, pinned_max: float) -> tuple[IntArray, str, str, Problem]:
    lo_w = problem.lo * problem.unit
    hi_w = problem.hi * problem.unit
    if objective == "max":
        caps, threshold = exact.minimise_max(problem, floor=pinned_max)
        mean_convex = bool(problem.table.convex("mean", lo_w, hi_w).all())
        k = exact.fill_within(problem, caps, mean_convex)
        how = "the mean-latency greedy" if mean_convex else "a proportional split (mean costs not convex)"
        return k, "exact-bisection", (
            f"exact-bisection: smallest largest latency {threshold:.6g} s by bisection over the threshold, units "
            f"split within it by {how}, {problem.units} units"
        ), problem
    convex = problem.table.convex(objective, lo_w, hi_w)
    if bool(convex.all()):
        return exact.greedy(problem), "exact-greedy", (
            f"exact-greedy: every DIP's {objective} cost is convex on the grid, so greedy marginal allocation is "
            f"optimal; {problem.units} units"
        ), problem
    bad = [problem.dips[int(problem.free[i])].name for i in np.flatnonzero(~convex)]
    grid_units = exact.dp_units(problem, units)
    dp_problem = problem if grid_units == problem.units else problem.with_units(grid_units)
    shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
    return exact.dynamic_program(dp_problem), "exact-dp", (
        f"exact-dp: the {objective} cost of {len(bad)} DIP(s) is not convex ({shown}), so a multiple-choice "
        f"knapsack DP (exact on its grid) ran on {dp_problem.units} units"
        + (f" instead of {units} to stay tractable" if dp_problem.units != units else "")
    ), dp_problem


def objective_of(dips: Sequence[DipInput], weights: dict[str, float], objective: str = "mean") -> float:
    """The objective of given weights (e.g. an equal split, or another solver's plan) under the DIPs' curves."""
    check_objective_and_method(objective, "auto")
    ws = np.array([float(weights[d.name]) for d in dips])
    ls = np.array([float(d.curve.latency(w)) for d, w in zip(dips, ws.tolist(), strict=True)])
    if objective == "mean":
        return float(np.dot(ws, ls))
    if objective == "sum":
        return float(ls.sum())
    positive = ws > 0
    return float(ls[positive].max()) if positive.any() else 0.0


def _evaluate(
    problem: Problem, k: IntArray, pinned_latency: dict[int, float], objective: str
) -> tuple[dict[str, float], dict[str, float], float]:
    names = problem.cols.names
    weight = k * problem.unit
    lat = problem.table.latency_all(weight) if len(k) else np.zeros(0)
    if problem.pinned.size == 0:
        ws, ls = weight, lat
    else:
        ws = problem.cols.pin.copy()
        ls = np.empty(len(names))
        ws[problem.free] = weight
        ls[problem.free] = lat
        for i, value in pinned_latency.items():
            ls[i] = value
    weights = dict(zip(names, ws.tolist(), strict=True))
    latency = dict(zip(names, ls.tolist(), strict=True))
    if objective == "mean":
        value = float(np.dot(ws, ls))
    elif objective == "sum":
        value = float(ls.sum())
    else:
        positive = ws > 0
        value = float(ls[positive].max()) if positive.any() else 0.0
    return weights, latency, value
