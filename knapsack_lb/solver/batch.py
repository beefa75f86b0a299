"""``solve_many``: the exact solver for many VIPs in one vectorised pass (KnapsackLB section 6.7, Table 8).

The paper solves one ILP per VIP and reports 851 s on one 8-core VM for the fleet of its
Table 8 (3,330 VIPs, 60,000 DIPs; section 6.7). Solving that fleet one ``solve()`` call at a
time costs about 2 ms per VIP here, nearly all of it fixed per call: the threshold-form
greedy of :mod:`knapsack_lb.solver.exact` makes about five rounds of a dozen small numpy
operations each, and for a 5-DIP VIP every operation costs its call overhead, not its data.

``solve_many`` runs the same greedy for every VIP at once. The DIPs of all VIPs are stacked
into one ``CurveTable``; each VIP keeps its own marginal-cost level ``lam`` and bracket, and
every round of the Illinois search updates all VIPs still open with one numpy operation per
step (counts per VIP by ``np.bincount`` over a DIP-to-VIP index). VIPs leave the search as
their bracket closes; the last units of every VIP are handed out by one ``np.lexsort`` over
(VIP, marginal cost).

**Same plans as ``solve()``.** The greedy's answer does not depend on the path its search
takes: it is the ``units - sum(lo)`` cheapest extra units by marginal cost, ties broken by
DIP order (``exact.greedy`` sorts stably; so does ``np.lexsort`` here), and every marginal
cost is computed by the same elementwise formula on the same numbers. So the plans (weights,
predicted latencies, objective) are bit-for-bit those of ``solve(dips, method="exact")``,
which ``tests/unit/solver/test_solver_batch.py`` checks on a seeded fleet. The batched search
hands out the last units once a VIP's bracket holds at most ``BATCH_ENUMERATE_LIMIT`` of them
(fewer than the single solve's ``exact.ENUMERATE_LIMIT``, so that thousands of VIPs do not
enumerate 16,384 units each); that changes how many rounds run, not the answer.

**What goes the single way.** Only VIPs whose DIPs all have quadratic or queueing curves, no
pins, valid curves, a feasible grid and convex costs (the ``exact-greedy`` case, the common
one) are batched. Any other VIP - pins, other curve kinds, non-convex costs (``exact-dp``),
the ``max`` objective, invalid or infeasible input - is passed to ``solve()`` on its own, so
it gets exactly that function's plan or error. An error raised for one VIP ends the call
(``InvalidInputError`` / ``InfeasibleError`` as ``solve()`` raises them); callers that must
keep going past a bad VIP check it alone first.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from knapsack_lb.errors import KnapsackLBError
from knapsack_lb.solver.api import Solution, _check_parameters, solve
from knapsack_lb.solver.exact import ENUMERATE_LIMIT
from knapsack_lb.solver.grid import CurveTable, FloatArray, IntArray
from knapsack_lb.solver.inputs import DipInput, check_objective_and_method, columns

BATCH_ENUMERATE_LIMIT = 256
"""A VIP's search stops once its bracket holds at most this many units, which are then sorted."""

ILLINOIS_ROUNDS = 40
"""After this many rounds of a VIP's search, plain bisection (as ``exact.greedy``)."""


def solve_many(
    problems: Sequence[Sequence[DipInput]],
    *,
    objective: str = "mean",
    total: float = 1.0,
    units: int = 1_000_000,
) -> list[Solution]:
    """``[solve(dips, objective=objective, method="exact", total=total, units=units) for dips in problems]``, batched.

    Returns one ``Solution`` per problem, in order, with the same weights, predicted
    latencies, objective and method as that list would have (module docstring). A batched
    solution's ``seconds`` is the whole batch's time and its note says it was batched.
    Raises what ``solve()`` raises for the first problem it refuses.
    """
    start = time.perf_counter()
    check_objective_and_method(objective, "exact")
    _check_parameters(total, 10, units, None, None)
    out: list[Solution | None] = [None] * len(problems)
    sizes = np.fromiter((len(p) for p in problems), dtype=np.int64, count=len(problems))
    flat = [d for p in problems for d in p]
    batched = _batched_vips(flat, sizes, objective, total, units) if objective != "max" and flat else None
    if batched is not None:
        for position, solution in batched(start, len(problems)):
            out[position] = solution
    for position, dips in enumerate(problems):
        if out[position] is None:
            out[position] = solve(dips, objective=objective, method="exact", total=total, units=units)
    return [s for s in out if s is not None]


class _Batch:
    """The stacked DIPs of the VIPs that the batched greedy can take, and their unit bounds."""

    def __init__(self, names: list[str], table: CurveTable, vip_of_dip: IntArray,
                 positions: IntArray, sizes: IntArray, objective: str, unit: float, units: int,
                 lo: IntArray, hi: IntArray) -> None:
        self.names = names
        self.table = table  # the batched DIPs only, VIP by VIP
        self.vip_of_dip = vip_of_dip  # per DIP: its VIP, 0..len(positions)-1
        self.positions = positions  # each batched VIP's position in the caller's list
        self.sizes = sizes
        self.objective = objective
        self.unit = unit
        self.units = units
        self.lo = lo
        self.hi = hi

    def marginal(self, local: IntArray, k: IntArray) -> FloatArray:
        """``cost(k + 1) - cost(k)`` of the batched DIPs ``local`` (same closed form as ``Problem.marginal``)."""
        out = self.table.marginal(self.objective, local, k * self.unit, self.unit)
        assert out is not None  # only quadratic and queueing curves are batched
        return out

    def __call__(self, start: float, count: int) -> list[tuple[int, Solution]]:
        k = _greedy_many(self)
        weight = k * self.unit
        latency = self.table._analytic_all(weight)
        ends = np.cumsum(self.sizes)
        begins = ends - self.sizes
        ws, ls = weight.tolist(), latency.tolist()
        seconds = time.perf_counter() - start
        note = (f"exact-greedy: every DIP's {self.objective} cost is convex on the grid, so greedy marginal "
                f"allocation is optimal; {self.units} units; batched with {len(self.positions) - 1} other VIPs "
                f"of {count} (solve_many; seconds is the batch's)")
        out = []
        for position, b, e in zip(self.positions.tolist(), begins.tolist(), ends.tolist(), strict=True):
            names = self.names[b:e]
            # per VIP, as solve() computes it (np.dot and sum over the same numbers in the same order)
            value = float(np.dot(weight[b:e], latency[b:e]) if self.objective == "mean" else latency[b:e].sum())
            out.append((position, Solution(
                weights=dict(zip(names, ws[b:e], strict=True)),
                predicted_latency=dict(zip(names, ls[b:e], strict=True)),
                objective=value, objective_kind=self.objective, method="exact-greedy", seconds=seconds, note=note,
            )))
        return out


def _batched_vips(flat: list[DipInput], sizes: IntArray, objective: str, total: float,
                  units: int) -> _Batch | None:
    """The VIPs the batched greedy takes (module docstring), checked with vectorised copies of ``solve``'s checks."""
    try:
        cols = columns(flat)
    except KnapsackLBError:
        return None  # a non-DipInput somewhere: every VIP goes to solve(), which names it
    n_vips = len(sizes)
    vip_of = np.repeat(np.arange(n_vips, dtype=np.int64), sizes)
    code = cols.curve_params[:, 0]
    plain = code < 2
    ok_dip = plain & np.isnan(cols.pin)
    checks = CurveTable([d.curve for d in flat], cols.curve_params)  # closed-form arrays; generic rows unused
    w_max = cols.w_max
    with np.errstate(all="ignore"):
        zero = checks._analytic(np.arange(len(flat), dtype=np.int64), np.zeros(len(flat)))
    # CurveTable.validate's closed-form checks: below saturation, >= 0 at 0, non-decreasing on [0, w_max]
    ok_dip &= checks.s > w_max
    ok_dip &= zero >= 0
    ok_dip &= checks.b >= 0
    ok_dip &= checks.b + 2 * checks.c * w_max >= 0
    unit = total / units
    eps = 1e-9
    lo = np.maximum(np.ceil(cols.low / unit - eps), 0).astype(np.int64)
    hi = np.minimum(np.floor(np.minimum(cols.cap / unit, units) + eps), units).astype(np.int64)
    ok_dip &= lo <= hi
    lo_w, hi_w = lo * unit, hi * unit
    # CurveTable.convex: the greedy is exact only where every cost is convex on the grid
    if objective == "sum":
        ok_dip &= checks.c >= 0
    else:
        ok_dip &= (2 * checks.b + 6 * checks.c * lo_w >= 0) & (2 * checks.b + 6 * checks.c * hi_w >= 0)
    ok = sizes > 0
    nonempty = np.flatnonzero(ok)
    begins = (np.cumsum(sizes) - sizes)[nonempty]
    ok[nonempty] &= np.logical_and.reduceat(ok_dip, begins)
    ok[nonempty] &= np.add.reduceat(lo, begins) <= units
    ok[nonempty] &= np.add.reduceat(hi, begins) >= units
    tolerance = 1e-9 * max(1.0, total)
    ok[nonempty] &= np.add.reduceat(cols.cap, begins) >= total - tolerance
    ok[nonempty] &= np.add.reduceat(cols.low, begins) <= total + tolerance
    names = cols.names
    ends = np.cumsum(sizes)
    for v in np.flatnonzero(ok).tolist():
        b, e = int(ends[v] - sizes[v]), int(ends[v])
        if len(set(names[b:e])) != e - b:
            ok[v] = False
    positions = np.flatnonzero(ok)
    if positions.size == 0:
        return None
    dips = np.flatnonzero(ok[vip_of])
    local_vip = np.full(n_vips, -1, dtype=np.int64)
    local_vip[positions] = np.arange(positions.size, dtype=np.int64)
    table = CurveTable([flat[i].curve for i in dips.tolist()], cols.curve_params[dips])
    return _Batch([names[i] for i in dips.tolist()], table, local_vip[vip_of[dips]], positions,
                  sizes[positions], objective, unit, units, lo[dips], hi[dips])


def _counts_many(batch: _Batch, local: IntArray, lam: FloatArray, low: IntArray, high: IntArray) -> IntArray:
    """Per DIP in ``local``, how many extra units above ``lo`` cost at most its VIP's ``lam`` (in ``[low, high]``).

    ``exact._counts`` for many VIPs: the closed-form hint, checked at both ends, then
    vectorised bisection over ``k`` for the DIPs it did not settle.
    """
    lo, room = batch.lo[local], batch.hi[local] - batch.lo[local]
    a, b = low.copy(), high.copy()
    idx = np.arange(len(local), dtype=np.int64)
    w = batch.table.marginal_inverse(batch.objective, lam, batch.unit, idx=local)
    assert w is not None
    with np.errstate(all="ignore"):
        t = np.floor(np.clip(w / batch.unit, -1.0, float(batch.units) + 1.0)) + 1 - lo
    guess = np.clip(np.clip(t, 0, room).astype(np.int64), low, high)
    probe = guess > low
    if probe.any():
        sel = idx[probe]
        good = batch.marginal(local[sel], lo[sel] + guess[sel] - 1) <= lam[sel]
        a[sel[good]] = guess[sel[good]]
    probe = guess < high
    if probe.any():
        sel = idx[probe]
        good = batch.marginal(local[sel], lo[sel] + guess[sel]) > lam[sel]
        b[sel[good]] = guess[sel[good]]
    while True:
        open_ = a < b
        if not open_.any():
            return a
        sel = idx[open_]
        mid = (a[sel] + b[sel]) // 2
        below = batch.marginal(local[sel], lo[sel] + mid) <= lam[sel]
        a[sel] = np.where(below, mid + 1, a[sel])
        b[sel] = np.where(below, b[sel], mid)


def _greedy_many(batch: _Batch) -> IntArray:
    """``exact.greedy`` for every batched VIP at once: one marginal-cost level and bracket per VIP."""
    n_vips = len(batch.sizes)
    n_dips = len(batch.lo)
    vip = batch.vip_of_dip
    begins = np.cumsum(batch.sizes) - batch.sizes
    lo, hi = batch.lo, batch.hi
    need = batch.units - np.add.reduceat(lo, begins)
    room = hi - lo
    every = np.arange(n_dips, dtype=np.int64)
    has_room = room > 0
    first = np.full(n_dips, np.inf)
    last = np.full(n_dips, -np.inf)
    first[has_room] = batch.marginal(every[has_room], lo[has_room])
    last[has_room] = batch.marginal(every[has_room], hi[has_room] - 1)
    lam_lo = np.nextafter(np.minimum.reduceat(first, begins), -np.inf)
    lam_hi = np.maximum.reduceat(last, begins)
    n_lo = np.zeros(n_dips, dtype=np.int64)
    n_hi = room.copy()
    total_lo = np.zeros(n_vips, dtype=np.int64)
    total_hi = np.add.reduceat(room, begins)
    weight_lo = (total_lo - need).astype(np.float64)
    weight_hi = (total_hi - need).astype(np.float64)
    side = np.zeros(n_vips, dtype=np.int64)
    rounds = np.zeros(n_vips, dtype=np.int64)
    k = lo.copy()
    found = need == 0
    searching = ~found & (total_hi - total_lo > BATCH_ENUMERATE_LIMIT)
    in_search = np.zeros(n_vips, dtype=bool)
    while searching.any():
        v = np.flatnonzero(searching)
        rounds[v] += 1
        lower, upper = lam_lo[v], lam_hi[v]
        narrow = ~(upper > lower) | (np.nextafter(lower, np.inf) >= upper)
        if narrow.any():
            searching[v[narrow]] = False  # one float wide: every unit left costs the same
            v, lower, upper = v[~narrow], lower[~narrow], upper[~narrow]
            if v.size == 0:
                break
        use_log = lower > 0
        with np.errstate(all="ignore"):
            x_lo = np.where(use_log, np.log(np.where(use_log, lower, 1.0)), lower)
            x_hi = np.where(use_log, np.log(np.where(use_log, upper, 1.0)), upper)
            w_lo, w_hi = weight_lo[v], weight_hi[v]
            differ = w_hi != w_lo
            frac = np.where(differ, w_lo / np.where(differ, w_lo - w_hi, 1.0), 0.5)
            frac = np.clip(frac, 1e-6, 1 - 1e-6)
            x = x_lo + (x_hi - x_lo) * frac
            lam = np.where(use_log, np.exp(x), x)
        stalled = (rounds[v] > ILLINOIS_ROUNDS) | ~((lower < lam) & (lam < upper))
        lam = np.where(stalled, 0.5 * (lower + upper), lam)
        in_search[:] = False
        in_search[v] = True
        local = np.flatnonzero(in_search[vip])
        lam_of_vip = np.empty(n_vips)
        lam_of_vip[v] = lam
        owner = vip[local]
        counts = _counts_many(batch, local, lam_of_vip[owner], n_lo[local], n_hi[local])
        total = np.bincount(owner, weights=counts, minlength=n_vips).astype(np.int64)[v]
        exact_hit = total == need[v]
        above = total > need[v]
        below = total < need[v]
        if exact_hit.any():
            hit = np.zeros(n_vips, dtype=bool)
            hit[v[exact_hit]] = True
            m = hit[owner]
            k[local[m]] = lo[local[m]] + counts[m]
            found[v[exact_hit]] = True
            searching[v[exact_hit]] = False
        for mask, is_upper in ((above, True), (below, False)):
            if not mask.any():
                continue
            chosen = v[mask]
            flag = np.zeros(n_vips, dtype=bool)
            flag[chosen] = True
            m = flag[owner]
            if is_upper:
                n_hi[local[m]] = counts[m]
                lam_hi[chosen], total_hi[chosen] = lam[mask], total[mask]
                weight_hi[chosen] = (total[mask] - need[chosen]).astype(np.float64)
                weight_lo[chosen] = np.where(side[chosen] == 1, weight_lo[chosen] / 2, weight_lo[chosen])
                side[chosen] = 1
            else:
                n_lo[local[m]] = counts[m]
                lam_lo[chosen], total_lo[chosen] = lam[mask], total[mask]
                weight_lo[chosen] = (total[mask] - need[chosen]).astype(np.float64)
                weight_hi[chosen] = np.where(side[chosen] == -1, weight_hi[chosen] / 2, weight_hi[chosen])
                side[chosen] = -1
        searching &= total_hi - total_lo > BATCH_ENUMERATE_LIMIT
    rest = ~found
    if not rest.any():
        return k
    extra = n_hi - n_lo
    left = need - total_lo
    sortable = rest & (total_hi - total_lo <= ENUMERATE_LIMIT)
    if sortable.any():
        local = np.flatnonzero(sortable[vip])
        owner = np.repeat(local, extra[local])
        offsets = np.cumsum(extra[local]) - extra[local]
        step = np.arange(owner.size, dtype=np.int64) - np.repeat(offsets, extra[local])
        marginal = batch.marginal(owner, lo[owner] + n_lo[owner] + step)
        owner_vip = vip[owner]
        order = np.lexsort((marginal, owner_vip))
        sorted_vip = owner_vip[order]
        rank = np.arange(order.size, dtype=np.int64) - np.searchsorted(sorted_vip, sorted_vip, side="left")
        chosen = order[rank < left[sorted_vip]]
        taken = np.bincount(owner[chosen], minlength=n_dips)
        k[local] = lo[local] + n_lo[local] + taken[local]
    tied = rest & ~sortable
    if tied.any():
        # equal marginal costs (to the last bit) across more units than are sorted: fill DIPs in order
        local = np.flatnonzero(tied[vip])
        running = np.cumsum(extra[local]) - extra[local]
        group_start = np.searchsorted(vip[local], vip[local], side="left")
        before = running - running[group_start]
        take = np.minimum(extra[local], np.maximum(left[vip[local]] - before, 0))
        k[local] = lo[local] + n_lo[local] + take
    return k
