"""Exact solvers on the unit grid: greedy (convex costs), a knapsack DP (any costs), bisection (max).

The problem is the paper's Fig. 7 (KnapsackLB section 3.3) with every grid point as a level:
choose ``k_d`` units per free DIP in ``[lo_d, hi_d]``, ``sum k_d = units``, minimising
``sum_d cost_d(k_d)``. It is a separable resource-allocation problem (a multiple-choice
knapsack with one item per DIP):

* **Greedy** (``greedy``): when every ``cost_d`` has non-decreasing differences on the grid
  (convex), handing out units one at a time to the DIP whose next unit costs least is optimal
  (Gross 1956; Ibaraki & Katoh, *Resource Allocation Problems*, 1988). A per-unit heap would
  take ``units * log(DIPs)`` steps; this implements the same greedy in threshold form: find the
  marginal-cost level ``lam`` at which the DIPs together want ``units`` units (each DIP's count
  of units with marginal cost ``<= lam`` is found by vectorised bisection over ``k``), then hand
  the last few units, whose marginal costs straddle ``lam``, out in ascending order. Same
  optimum as the heap. Fails (returns a wrong, feasible plan) only if a cost is not convex,
  which ``CurveTable.convex`` rules out before it runs.
* **DP** (``dynamic_program``): exact for any costs, ``O(units * sum_d (hi_d - lo_d))`` work by
  min-plus convolution, one numpy operation per DIP; the caller picks a grid that keeps this
  tractable (``dp_units``).
* **Bisection for max** (``minimise_max``): the smallest threshold ``L`` such that every DIP
  that carries traffic can stay at or below ``L`` while the DIPs still take all units
  (latency curves are non-decreasing, so each DIP's largest admissible ``k`` is a bisection).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from knapsack_lb.errors import InfeasibleError, SolverError
from knapsack_lb.solver.grid import IntArray, Problem, proportional

ENUMERATE_LIMIT = 1 << 14
"""Greedy hands out the last units by sorting their marginal costs once at most this many remain."""

DP_BUDGET = 60_000_000
"""Largest number of (state, choice) pairs the DP evaluates; bounds its grid (``dp_units``)."""

DP_MAX_UNITS = 4096


def _counts(
    problem: Problem, lam: float, low: IntArray, high: IntArray
) -> IntArray:
    """Per DIP, how many extra units above ``lo`` have marginal cost ``<= lam``, known to lie in ``[low, high]``."""
    n = len(problem.lo)
    idx = np.arange(n, dtype=np.int64)
    a, b = low.copy(), high.copy()
    hint = problem.count_hint(lam)
    if hint is not None:
        # try the closed-form count as both ends of the bracket; keep only the ends that check out
        guess = np.clip(hint, low, high)
        probe = guess > low  # count >= guess  <=>  the guess-th unit's marginal cost <= lam
        if probe.any():
            sel = idx[probe]
            ok = problem.marginal(sel, problem.lo[sel] + guess[sel] - 1) <= lam
            a[sel[ok]] = guess[sel[ok]]
        probe = guess < high  # count <= guess  <=>  the next unit's marginal cost > lam
        if probe.any():
            sel = idx[probe]
            ok = problem.marginal(sel, problem.lo[sel] + guess[sel]) > lam
            b[sel[ok]] = guess[sel[ok]]
    while True:
        open_ = a < b
        if not open_.any():
            return a
        sel = idx[open_] if not open_.all() else idx
        mid = (a[sel] + b[sel]) // 2
        k = problem.lo[sel] + mid
        marginal = problem.marginal(sel, k)
        ok = marginal <= lam
        a[sel] = np.where(ok, mid + 1, a[sel])
        b[sel] = np.where(ok, b[sel], mid)


def greedy(problem: Problem) -> IntArray:
    """Greedy marginal allocation (threshold form); exact when every DIP's cost is convex on the grid."""
    lo, hi = problem.lo, problem.hi
    n = len(lo)
    need = problem.units - int(lo.sum())
    if n == 0 or need == 0:
        return lo.copy()
    room = hi - lo
    idx = np.arange(n, dtype=np.int64)
    has_room = room > 0
    first = np.full(n, np.inf)
    last = np.full(n, -np.inf)
    first[has_room] = problem.marginal(idx[has_room], lo[has_room])
    last[has_room] = problem.marginal(idx[has_room], hi[has_room] - 1)
    lam_lo = float(first[has_room].min())
    lam_lo = np.nextafter(lam_lo, -np.inf)
    lam_hi = float(last[has_room].max())
    n_lo = np.zeros(n, dtype=np.int64)
    n_hi = room.copy()
    total_lo, total_hi = 0, int(n_hi.sum())
    # Illinois (regula falsi that halves a stale end's weight) on log(lam) while lam > 0, else on lam
    weight_lo, weight_hi = float(total_lo - need), float(total_hi - need)
    side = 0
    rounds = 0
    while total_hi - total_lo > ENUMERATE_LIMIT:
        rounds += 1
        if not (lam_hi > lam_lo) or np.nextafter(lam_lo, np.inf) >= lam_hi:
            break  # the bracket is one float wide: every remaining unit costs the same
        use_log = lam_lo > 0
        x_lo, x_hi = (math.log(lam_lo), math.log(lam_hi)) if use_log else (lam_lo, lam_hi)
        frac = weight_lo / (weight_lo - weight_hi) if weight_hi != weight_lo else 0.5
        frac = min(max(frac, 1e-6), 1 - 1e-6)
        x = x_lo + (x_hi - x_lo) * frac
        lam = math.exp(x) if use_log else x
        if rounds > 40 or not (lam_lo < lam < lam_hi):
            lam = 0.5 * (lam_lo + lam_hi)  # plain bisection if interpolation has stalled
        counts = _counts(problem, lam, n_lo, n_hi)
        total = int(counts.sum())
        if total == need:
            return lo + counts  # exactly the units with marginal cost <= lam: the greedy's choice
        if total >= need:
            lam_hi, n_hi, total_hi, weight_hi = lam, counts, total, float(total - need)
            if side == 1:
                weight_lo /= 2
            side = 1
        else:
            lam_lo, n_lo, total_lo, weight_lo = lam, counts, total, float(total - need)
            if side == -1:
                weight_hi /= 2
            side = -1
    extra = n_hi - n_lo
    left = need - total_lo
    if total_hi - total_lo <= ENUMERATE_LIMIT:
        owner = np.repeat(idx, extra)
        starts = np.cumsum(extra) - extra
        k = lo[owner] + n_lo[owner] + (np.arange(owner.size) - starts[owner])
        marginal = problem.marginal(owner, k)
        chosen = np.argsort(marginal, kind="stable")[:left]
        return lo + n_lo + np.bincount(owner[chosen], minlength=n)
    # equal marginal costs (to the last bit) across more units than we enumerate: any split is optimal
    take = np.minimum(extra, np.maximum(left - (np.cumsum(extra) - extra), 0))
    return lo + n_lo + take


def dp_units(problem: Problem, requested: int) -> int:
    """The DP's grid: the requested units, or fewer so that ``units * sum(room)`` stays within ``DP_BUDGET``.

    The work is about ``units^2 * sum_d cap_d / free_total`` pairs (plus one row per DIP), so the
    grid is at most ``sqrt(DP_BUDGET / sum_caps)`` and at most ``DP_MAX_UNITS`` units.
    """
    if problem.unit == 0.0:
        return requested
    free_total = problem.units * problem.unit
    caps = problem.cols.cap[problem.free] / free_total
    spread = max(float(caps.sum()), 1.0)
    n = len(problem.free)
    limit = int(math.sqrt(DP_BUDGET / spread))
    limit = min(limit, DP_MAX_UNITS, max(DP_BUDGET // max(n, 1) // 4, 16))
    return max(1, min(requested, limit))


def dynamic_program(problem: Problem) -> IntArray:
    """Exact multiple-choice knapsack over the grid by min-plus convolution (any costs)."""
    lo, hi, units = problem.lo, problem.hi, problem.units
    n = len(lo)
    if n == 0:
        return lo.copy()
    best = np.full(units + 1, np.inf)
    best[0] = 0.0
    reach = 0
    choices: list[tuple[int, np.ndarray]] = []
    for d in range(n):
        width = int(hi[d] - lo[d]) + 1
        ks = np.arange(int(hi[d]), int(lo[d]) - 1, -1, dtype=np.int64)  # hi .. lo
        cost_rev = problem.cost(np.full(width, d, dtype=np.int64), ks)
        reach = min(units, reach + int(hi[d]))
        padded = np.concatenate((np.full(int(hi[d]), np.inf), best))
        windows = sliding_window_view(padded, width)[: reach + 1]
        totals = windows + cost_rev
        arg = np.argmin(totals, axis=1)
        new = np.full(units + 1, np.inf)
        new[: reach + 1] = totals[np.arange(reach + 1), arg]
        best = new
        dtype = np.int16 if width < 32767 else np.int32
        choices.append((int(hi[d]), arg.astype(dtype)))
    if not math.isfinite(best[units]):
        raise SolverError(f"the DP found no allocation of {units} units (costs infinite at every reachable point)")
    k = np.zeros(n, dtype=np.int64)
    j = units
    for d in range(n - 1, -1, -1):
        top, arg = choices[d]
        k[d] = top - int(arg[j])
        j -= int(k[d])
    if j != 0:
        raise SolverError(f"the DP's backtrack left {j} units unassigned")
    return k


def _caps_at(problem: Problem, threshold: float, low: IntArray, high: IntArray) -> IntArray | None:
    """Per DIP the largest ``k`` whose latency is ``<= threshold`` (0 if none; DIPs at 0 do not count).

    The answer is known to lie in ``[low, high]`` (caps grow with the threshold). None if a DIP
    with a floor ``lo > 0`` cannot stay below the threshold.
    """
    lo = problem.lo
    n = len(lo)
    idx = np.arange(n, dtype=np.int64)
    forced = lo > 0
    if forced.any() and (problem.latency(idx[forced], lo[forced]) > threshold).any():
        return None
    a = np.maximum(low, np.where(forced, lo, 0))  # largest known admissible k (0 always admissible when lo == 0)
    b = high.copy()
    while True:
        open_ = a < b
        if not open_.any():
            return a
        sel = idx[open_]
        mid = (a[sel] + b[sel] + 1) // 2
        ok = problem.latency(sel, mid) <= threshold
        a[sel] = np.where(ok, mid, a[sel])
        b[sel] = np.where(ok, b[sel], mid - 1)


def minimise_max(problem: Problem, floor: float = -math.inf) -> tuple[IntArray, float]:
    """Smallest achievable largest latency over DIPs with positive weight; returns per-DIP caps at it.

    Bisection over the threshold (to 1e-12 relative): feasibility at ``L`` is ``sum caps(L) >=
    units``. ``floor`` is a latency already fixed elsewhere (pinned DIPs), below which
    tightening gains nothing. The caller splits the units within the returned caps.
    """
    n = len(problem.lo)
    if n == 0 or problem.units == 0:
        return problem.lo.copy(), floor
    idx = np.arange(n, dtype=np.int64)
    zeros = np.zeros(n, dtype=np.int64)
    top = float(problem.latency(idx, problem.hi).max())
    high = max(top, floor)
    caps = _caps_at(problem, high, zeros, problem.hi)
    if caps is None or int(caps.sum()) < problem.units:
        raise InfeasibleError("no threshold lets the DIPs take every unit (check floors and caps)")
    low_lat = problem.latency(idx, np.maximum(problem.lo, 1))
    low = max(float(low_lat.min()) * (1 - 1e-12) - 1e-300, floor)
    below = zeros
    if floor > -math.inf:
        at_floor = _caps_at(problem, floor, zeros, caps)
        if at_floor is not None and int(at_floor.sum()) >= problem.units:
            return at_floor, floor
    for _ in range(200):
        if high - low <= 1e-12 * max(abs(high), 1e-300):
            break
        mid = 0.5 * (low + high)
        if not (low < mid < high):
            break
        trial = _caps_at(problem, mid, below, caps)
        if trial is not None and int(trial.sum()) >= problem.units:
            high, caps = mid, trial
        else:
            low = mid
            if trial is not None:
                below = trial
    return caps, high


def fill_within(problem: Problem, caps: IntArray, convex: bool) -> IntArray:
    """Split the units within ``[lo, caps]``: by the mean-latency greedy when convex, else proportionally."""
    bounded = Problem(
        problem.dips, problem.cols, "mean", problem.total, problem.free, problem.pinned, problem.table,
        problem.units, problem.unit, problem.lo, caps, problem.w_max,
    )
    if convex:
        return greedy(bounded)
    return proportional(problem.lo, caps, problem.units)
