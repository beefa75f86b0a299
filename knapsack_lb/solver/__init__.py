"""The weight solver: per-DIP weight-latency curves in, latency-minimising weights out.

KnapsackLB section 3.3 (the ILP of Fig. 7), section 4.4 (multi-step ILP) and section 6.6
(its running time), plus an exact solver on the same integer unit grid, and ``solve_many``,
that exact solver for a fleet of VIPs in one vectorised pass (section 6.7). See
``knapsack_lb.solver.api`` for objectives and methods, docs/solver.md for measurements.
"""

from knapsack_lb.solver.api import Solution, solve
from knapsack_lb.solver.batch import solve_many
from knapsack_lb.solver.inputs import DipInput

__all__ = ["DipInput", "Solution", "solve", "solve_many"]
