"""Multi-step ILP (KnapsackLB section 4.4): a coarse step, then a fine step around each pick.

Step 1 feeds the ILP K levels per DIP uniformly in ``[0, w_max]`` (here ``[lo, hi]`` with the
feasibility anchor of ``knapsack_lb.solver.ilp``) and takes each DIP's pick ``w_d``. Step 2 feeds
K levels uniformly in ``[w_d - delta_d, w_d + delta_d]`` with ``delta_d = 10% of w_max_d``
(clipped to the DIP's bounds, rounded to the grid) plus ``w_d`` itself, so step 1's answer stays
feasible and step 2 is never worse than step 1. The paper runs the second step only from 100
DIPs on (``api.solve`` with ``method="auto"`` follows that rule); asked for explicitly, both steps
always run. It is a heuristic: the fine window may not contain the optimum.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from knapsack_lb.solver.grid import IntArray, Problem
from knapsack_lb.solver.ilp import IlpResult, paper_levels, solve_levels, uniform_levels

FINE_WINDOW = 0.10
"""Half-width of the fine step's window as a fraction of w_max (section 4.4: delta = 10% of w_max)."""

FINE_REFINEMENT = 5
"""The fine step's grid is at least this many times finer than the coarse step's (``refinement``)."""


@dataclass(frozen=True)
class MultistepResult:
    k: IntArray
    steps: tuple[IlpResult, ...]

    @property
    def timed_out(self) -> bool:
        return any(step.timed_out for step in self.steps)


def fine_levels(problem: Problem, picks: IntArray, count: int) -> list[IntArray]:
    """Step 2's levels: ``count`` points on ``[pick - delta, pick + delta]`` within bounds, plus the pick."""
    unit = problem.unit if problem.unit > 0 else 1.0
    delta = np.maximum(np.rint(FINE_WINDOW * problem.w_max / unit).astype(np.int64), 1)
    out = []
    for pick, width, lo, hi in zip(picks, delta, problem.lo, problem.hi, strict=True):
        a = max(int(lo), int(pick - width))
        b = min(int(hi), int(pick + width))
        out.append(np.union1d(uniform_levels(a, b, count), [int(pick)]))
    return out


def refinement(coarse_units: int, units: int, factor: int = FINE_REFINEMENT) -> int:
    """How many fine-grid units make one coarse unit: the smallest ``f >= factor`` with ``coarse * f``
    dividing ``units`` (so the fine grid stays nested in the exact one), else 1."""
    if coarse_units <= 0 or units % coarse_units:
        return 1
    ratio = units // coarse_units
    for f in range(factor, min(ratio, 10_000) + 1):
        if ratio % f == 0:
            return f
    return 1


def solve_multistep(
    problem: Problem,
    levels: int,
    *,
    imbalance: float | None = None,
    time_limit: float | None = None,
    fine_problem: Problem | None = None,
) -> MultistepResult:
    """Run the coarse and the fine step; the time limit applies to each step.

    ``fine_problem`` is the same problem on a grid ``f`` times finer than ``problem``'s (see
    ``refinement``): the fine step's levels are about ``0.02 w_max`` apart, closer than the
    coarse grid resolves. The coarse picks are carried over exactly (``k * f``).
    """
    coarse = solve_levels(problem, paper_levels(problem, levels), imbalance=imbalance, time_limit=time_limit)
    target = problem if fine_problem is None else fine_problem
    factor = 1 if fine_problem is None else fine_problem.units // max(problem.units, 1)
    picks = coarse.k * factor
    fine = solve_levels(target, fine_levels(target, picks, levels), imbalance=imbalance, time_limit=time_limit)
    return MultistepResult(fine.k, (coarse, fine))
