"""The shared integer unit grid every method solves on, and vectorised curve evaluation.

Pinned DIPs are taken out first (their weight is exact); the remaining weight
``total - sum(pins)`` is cut into ``units`` equal units, and every free DIP gets an
integer number of units ``k`` in ``[lo, hi]`` with ``lo = ceil(min_weight / unit)`` and
``hi = floor(min(w_max, max_weight) / unit)``. A plan is a vector of integers summing to
``units``, so "the weights sum to the total" (constraint (b) of the paper's Fig. 7) holds
exactly, for the exact solvers and the ILP alike: they all choose among the same points,
which is what lets the tests compare them.

``CurveTable`` evaluates every free DIP's curve at once: quadratic and queueing curves
(section 4.2 and docs/design.md) share one formula ``a + b*w + c*w^2 + q/(s - w)`` over parameter
arrays; any other ``LatencyCurve`` is evaluated through its own ``latencies``. It also checks
each curve on ``[0, w_max]`` (finite, non-negative, non-decreasing) and decides per DIP
whether the objective's cost is convex on the grid, which is what makes greedy exact.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from knapsack_lb.curves import LatencyCurve, QuadraticCurve, QueueingCurve
from knapsack_lb.curves.utilisation import UtilisationCurve
from knapsack_lb.errors import InfeasibleError, InvalidInputError
from knapsack_lb.solver.inputs import Columns, DipInput, check_feasible

FloatArray = npt.NDArray[np.floating[Any]]
IntArray = npt.NDArray[np.int64]

SAMPLES = 129
"""Points per DIP at which a curve of an unknown kind is checked (monotone, finite, convex)."""

MONOTONE_TOLERANCE = 1e-9
"""A curve may dip by this fraction of its largest value on [0, w_max] (float noise) and still count as monotone."""


def _describe(curve: LatencyCurve) -> object:
    try:
        return curve.to_dict()
    except Exception:  # a foreign curve's to_dict is not ours to trust
        return repr(curve)


class CurveTable:
    """Vectorised latency of a list of DIPs' curves.

    ``latency(idx, w)`` returns the latency of DIP ``idx[i]`` at weight ``w[i]``. Curves of
    kind quadratic and queueing are evaluated from parameter arrays in one numpy expression;
    other curves through their own ``latencies``, one call per DIP present in ``idx``.
    """

    def __init__(self, curves: Sequence[LatencyCurve], params: npt.NDArray[np.float64] | None = None) -> None:
        n = len(curves)
        self.curves = list(curves)
        self.a = np.zeros(n)
        self.b = np.zeros(n)
        self.c = np.zeros(n)
        self.q = np.zeros(n)
        self.s = np.full(n, np.inf)
        if params is None:
            kinds = [type(curve) for curve in curves]
            params = np.zeros((n, 4))
            params[:, 0] = [0.0 if k is QuadraticCurve else 1.0 if k is QueueingCurve else 2.0 for k in kinds]
            known = np.flatnonzero(params[:, 0] < 2)
            if known.size:
                params[known, 1:] = [operator.attrgetter("a", "b", "c")(curves[i]) for i in known.tolist()]
        code = params[:, 0]
        quad = code == 0
        queue = code == 1
        self.a = np.where(code < 2, params[:, 1], 0.0)
        self.b = np.where(quad, params[:, 2], 0.0)
        self.c = np.where(quad, params[:, 3], 0.0)
        self.q = np.where(queue, params[:, 2], 0.0)
        self.s = np.where(queue, params[:, 3], np.inf)
        generic = np.flatnonzero(code == 2).tolist()
        self.generic = np.array(generic, dtype=np.int64)
        self.is_generic = np.zeros(n, dtype=bool)
        self.is_generic[self.generic] = True
        self.has_poly = bool((self.b != 0).any() or (self.c != 0).any())
        self.has_queue = bool((self.q != 0).any())
        # a finite stand-in for "no saturation" keeps the marginal-cost formula free of inf*0
        self.s_finite = np.where(np.isinf(self.s), 1e300, self.s)
        # the learner's utilisation curves are "generic" for the closed forms, but evaluated in one expression
        utilisation = np.array([(c.s, c.c, c.k) if isinstance(c, UtilisationCurve) else (0.0, 0.0, 0.0)
                                for c in self.curves], dtype=np.float64).reshape(n, 3)
        self.is_utilisation = utilisation[:, 1] > 0  # every utilisation curve has c > 0
        self.u_s, self.u_c, self.u_k = utilisation.T

    def marginal(self, objective: str, idx: IntArray, w: FloatArray, unit: float) -> FloatArray | None:
        """Cost of one more unit at weight ``w`` (``cost(w + unit) - cost(w)``) in closed form, or None.

        Only for quadratic and queueing curves (None if any curve is of another kind). For
        ``mean``, ``cost = w*l(w)``: ``u*(a + b*(2w+u) + c*(3w^2+3wu+u^2)) + q*u*s/((s-w)(s-w-u))``;
        for ``sum``: ``u*(b + c*(2w+u)) + q*u/((s-w)(s-w-u))``. Exact algebra, no cancellation.
        Requires ``w + unit < s`` (true on the grid: ``w_max < c`` is checked).
        """
        if self.generic.size:
            return None
        u = unit
        if objective == "mean":
            out = u * self.a[idx]
            if self.has_poly:
                out = out + u * (self.b[idx] * (2 * w + u) + self.c[idx] * (3 * w * w + 3 * w * u + u * u))
            if self.has_queue:
                s = self.s_finite[idx]
                out = out + self.q[idx] * u * (s / (s - w)) / (s - w - u)
            return out
        out = np.zeros(len(w))
        if self.has_poly:
            out = u * (self.b[idx] + self.c[idx] * (2 * w + u))
        if self.has_queue:
            s = self.s_finite[idx]
            out = out + self.q[idx] * u / (s - w) / (s - w - u)
        return out

    def __len__(self) -> int:
        return len(self.curves)

    def latency(self, idx: IntArray, w: FloatArray) -> FloatArray:
        if self.generic.size == 0:
            return self._analytic(idx, w)
        out = np.empty(len(w))
        mask = self.is_generic[idx]
        plain = ~mask
        if plain.any():
            out[plain] = self._analytic(idx[plain], w[plain])
        util = self.is_utilisation[idx]
        if util.any():
            i = idx[util]
            rho = np.clip(w[util], 0.0, None) / self.u_c[i]
            with np.errstate(divide="ignore", over="ignore"):
                out[util] = np.where(rho < 1.0, self.u_s[i] / (1.0 - rho ** self.u_k[i]), np.inf)
        for d in np.unique(idx[mask & ~util]):
            sel = idx == d
            out[sel] = np.asarray(self.curves[int(d)].latencies(w[sel]), dtype=np.float64)
        return out

    def latency_all(self, w: FloatArray) -> FloatArray:
        """Latency of DIP ``i`` at ``w[i]`` for every DIP (``len(w) == len(self)``)."""
        if self.generic.size == 0:
            return self._analytic_all(w)
        return self.latency(np.arange(len(self), dtype=np.int64), w)

    def marginal_inverse(self, objective: str, lam: float | FloatArray, unit: float,
                         idx: IntArray | None = None) -> FloatArray | None:
        """Per DIP, the real weight ``w`` at which ``marginal(w) == lam`` (-inf/+inf if none), or None.

        A hint for the greedy's bisection (which verifies it): quadratic curves solve
        ``A w^2 + B w + C = 0`` as ``w = -2C / (B + sqrt(B^2 - 4AC))``; queueing curves solve
        ``x (x - u) = R`` for ``x = s - w``. With ``idx``, only for those DIPs, and ``lam`` may
        then hold one level per entry of ``idx`` (the batched greedy: one level per VIP).
        """
        if self.generic.size:
            return None
        u = unit
        if idx is None:
            a, b, c, q, s_finite = self.a, self.b, self.c, self.q, self.s_finite
        else:
            a, b, c, q, s_finite = self.a[idx], self.b[idx], self.c[idx], self.q[idx], self.s_finite[idx]
        n = len(a)
        with np.errstate(all="ignore"):
            if objective == "mean":
                qa, qb = 3 * c * u, u * (2 * b + 3 * c * u)
                qc = u * (a + b * u + c * u * u)
                rest = lam - u * a
                r = q * u * s_finite / rest
            else:
                qa, qb, qc = np.zeros(n), 2 * c * u, u * (b + c * u)
                rest = np.broadcast_to(np.asarray(lam, dtype=np.float64), (n,))
                r = q * u / rest
            out = np.full(n, -np.inf)
            if self.has_poly or not self.has_queue:
                qc = qc - lam
                denom = qb + np.sqrt(qb * qb - 4 * qa * qc)
                out = np.where(denom > 0, -2 * qc / denom, np.where(qc <= 0, np.inf, -np.inf))
            if self.has_queue:
                queue = np.where(rest > 0, s_finite - (u + np.sqrt(u * u + 4 * r)) / 2, -np.inf)
                out = np.where(q > 0, queue, out) if self.has_poly else queue
        return np.where(np.isnan(out), -np.inf, out)

    def _analytic_all(self, w: FloatArray) -> FloatArray:
        gap = self.s - w
        with np.errstate(divide="ignore", invalid="ignore"):
            queue = np.where(gap > 0, self.q / np.where(gap > 0, gap, 1.0), np.inf)
        return self.a + w * (self.b + self.c * w) + queue

    def _analytic(self, idx: IntArray, w: FloatArray) -> FloatArray:
        gap = self.s[idx] - w
        with np.errstate(divide="ignore", invalid="ignore"):
            queue = np.where(gap > 0, self.q[idx] / np.where(gap > 0, gap, 1.0), np.inf)
        return self.a[idx] + w * (self.b[idx] + self.c[idx] * w) + queue

    def validate(self, names: Sequence[str], w_max: FloatArray) -> None:
        """Each curve must be finite, >= 0 and non-decreasing on ``[0, w_max]``; else InvalidInputError.

        Quadratic and queueing curves are checked in closed form (the slope of a quadratic is
        linear, so its two ends decide; a queueing curve needs ``w_max < c``); other curves at
        ``SAMPLES`` evenly spaced points.
        """
        n = len(self)
        plain = np.flatnonzero(~self.is_generic)
        if plain.size:
            queue_bad = plain[(self.s[plain] <= w_max[plain])]
            if queue_bad.size:
                i = int(queue_bad[0])
                raise InvalidInputError(
                    "w_max", float(w_max[i]),
                    f"must be below the queueing curve's saturation weight c={self.s[i]!r} (latency is infinite there)",
                    names[i],
                )
            zero = self._analytic(plain, np.zeros(plain.size))
            slope0 = self.b[plain]
            slope1 = self.b[plain] + 2 * self.c[plain] * w_max[plain]
            for label, bad in (
                ("is negative at weight 0", ~(zero >= 0)),
                ("decreases at weight 0 (slope b < 0)", slope0 < 0),
                ("decreases before w_max (slope b + 2*c*w_max < 0)", slope1 < 0),
            ):
                if bad.any():
                    i = int(plain[np.flatnonzero(bad)[0]])
                    raise InvalidInputError("curve", _describe(self.curves[i]), f"{label} on [0, w_max]", names[i])
        for i in self.generic:
            i = int(i)
            ws = np.linspace(0.0, float(w_max[i]), SAMPLES)
            try:
                values = np.asarray(self.curves[i].latencies(ws), dtype=np.float64)
            except Exception as exc:
                raise InvalidInputError(
                    "curve", _describe(self.curves[i]), f"cannot be evaluated: {exc}", names[i]
                ) from exc
            if values.shape != ws.shape:
                raise InvalidInputError("curve", _describe(self.curves[i]), "latencies() returned a wrong shape",
                                        names[i])
            if not np.isfinite(values).all():
                at = float(ws[np.flatnonzero(~np.isfinite(values))[0]])
                raise InvalidInputError("curve", _describe(self.curves[i]), f"is NaN or infinite at weight {at:.6g}",
                                        names[i])
            if (values < 0).any():
                at = float(ws[np.flatnonzero(values < 0)[0]])
                raise InvalidInputError("curve", _describe(self.curves[i]), f"is negative at weight {at:.6g}",
                                        names[i])
            drop = np.diff(values)
            tolerance = MONOTONE_TOLERANCE * max(float(np.abs(values).max()), 1e-300)
            if (drop < -tolerance).any():
                j = int(np.flatnonzero(drop < -tolerance)[0])
                raise InvalidInputError(
                    "curve", _describe(self.curves[i]),
                    f"is not monotone on [0, w_max]: {values[j]:.6g} at weight {ws[j]:.6g} > {values[j + 1]:.6g} "
                    f"at {ws[j + 1]:.6g}",
                    names[i],
                )
        del n

    def convex(self, objective: str, lo_w: FloatArray, hi_w: FloatArray) -> npt.NDArray[np.bool_]:
        """Per DIP: is the objective's cost convex in the weight on ``[lo_w, hi_w]``?

        A curve that is non-decreasing and convex makes both costs convex: ``l(w)`` for
        ``sum`` and ``w*l(w)`` (second derivative ``2 l' + w l''``) for ``mean``; a convex
        function sampled on an evenly spaced grid has non-decreasing differences, so greedy
        is exact there. Quadratic: ``sum`` needs ``c >= 0``, ``mean`` needs
        ``2b + 6cw >= 0`` at both ends. Queueing curves are convex below saturation.
        Other kinds answer for themselves (``LatencyCurve.cost_is_convex``) or, when they cannot
        say exactly, get non-decreasing cost differences at ``SAMPLES`` grid-spaced points (a sampled check).
        """
        n = len(self)
        out = np.ones(n, dtype=bool)
        if objective == "sum":
            out &= self.c >= 0
        else:
            out &= (2 * self.b + 6 * self.c * lo_w >= 0) & (2 * self.b + 6 * self.c * hi_w >= 0)
        for i in self.generic:
            i = int(i)
            curve = self.curves[i]
            exact = curve.cost_is_convex(float(lo_w[i]), float(hi_w[i]), objective)
            if exact is not None:
                out[i] = exact
                continue
            ws = np.linspace(float(lo_w[i]), float(hi_w[i]), SAMPLES)
            values = np.asarray(curve.latencies(ws), dtype=np.float64)
            cost = values * ws if objective == "mean" else values
            second = np.diff(cost, 2)
            out[i] = bool(np.all(second >= -1e-9 * max(float(np.abs(cost).max()), 1e-300)))
        return out


@dataclass
class Problem:
    """A solve on the unit grid: free DIPs ``free`` (indices into ``dips``), their unit bounds, the pins.

    ``unit`` is the weight of one unit; a free DIP with ``k`` units gets weight ``k * unit``.
    ``cost(idx, k)`` is the objective's cost of DIP ``idx`` at ``k`` units: ``w*l(w)`` for
    ``mean``, ``l(w)`` for ``sum`` (and ``max``, whose exact solver works on latencies).
    """

    dips: Sequence[DipInput]
    cols: Columns
    objective: str
    total: float
    free: IntArray
    pinned: IntArray
    table: CurveTable
    units: int
    unit: float
    lo: IntArray
    hi: IntArray
    w_max: FloatArray

    def cost(self, idx: IntArray, k: IntArray) -> FloatArray:
        w = k * self.unit
        lat = self.table.latency(idx, w)
        return w * lat if self.objective == "mean" else lat

    def latency(self, idx: IntArray, k: IntArray) -> FloatArray:
        return self.table.latency(idx, k * self.unit)

    def count_hint(self, lam: float) -> IntArray | None:
        """Per DIP, about how many units above ``lo`` have marginal cost ``<= lam`` (closed form), or None."""
        w = self.table.marginal_inverse(self.objective, lam, self.unit)
        if w is None:
            return None
        with np.errstate(all="ignore"):
            t = np.floor(np.clip(w / self.unit, -1.0, float(self.units) + 1.0)) + 1 - self.lo
        return np.clip(t, 0, self.hi - self.lo).astype(np.int64)

    def marginal(self, idx: IntArray, k: IntArray) -> FloatArray:
        """``cost(idx, k + 1) - cost(idx, k)``: closed form for quadratic/queueing curves, else by difference."""
        fast = self.table.marginal(self.objective, idx, k * self.unit, self.unit)
        if fast is not None:
            return fast
        return self.cost(idx, k + 1) - self.cost(idx, k)

    @property
    def free_names(self) -> list[str]:
        return [self.dips[int(i)].name for i in self.free]

    def with_units(self, units: int) -> Problem:
        """The same problem on a grid of ``units`` units (the DP's coarser grid)."""
        return build_problem(self.dips, self.cols, self.objective, self.total, units, table=self.table)


def build_problem(
    dips: Sequence[DipInput],
    cols: Columns,
    objective: str,
    total: float,
    units: int,
    *,
    table: CurveTable | None = None,
) -> Problem:
    """Take pins out, cut the rest of ``total`` into ``units`` units, and bound every free DIP.

    Builds and checks the curve table (then the totals, ``check_feasible``) unless a table is
    given. Raises InfeasibleError when the
    integer bounds cannot reach ``units`` (rounding ``hi`` down and ``lo`` up loses at most one
    unit per DIP; more units help).
    """
    pinned_mask = cols.pinned
    free = np.flatnonzero(~pinned_mask).astype(np.int64)
    pinned = np.flatnonzero(pinned_mask).astype(np.int64)
    pin_total = math.fsum(cols.pin[pinned].tolist())
    remaining = max(total - pin_total, 0.0)
    all_free = pinned.size == 0
    w_max = cols.w_max if all_free else cols.w_max[free]
    cap = cols.cap if all_free else cols.cap[free]
    low = cols.low if all_free else cols.low[free]
    if table is None:
        free_dips = dips if all_free else [dips[i] for i in free.tolist()]
        table = CurveTable([d.curve for d in free_dips], cols.curve_params if all_free else cols.curve_params[free])
        table.validate(cols.names if all_free else [cols.names[i] for i in free.tolist()], w_max)
        check_feasible(cols, total)
    if remaining <= 1e-12 * max(1.0, total):
        lo = np.zeros(free.size, dtype=np.int64)
        hi = np.zeros(free.size, dtype=np.int64)
        if (low > 1e-12).any():
            i = int(free[np.flatnonzero(low > 1e-12)[0]])
            raise InfeasibleError(
                f"pins use the whole total {total:.6g}, but DIP {cols.names[i]!r} has min_weight {cols.low[i]:.6g}"
            )
        return Problem(dips, cols, objective, total, free, pinned, table, 0, 0.0, lo, hi, w_max)
    unit = remaining / units
    eps = 1e-9
    lo = np.maximum(np.ceil(low / unit - eps), 0).astype(np.int64)
    hi = np.minimum(np.floor(np.minimum(cap / unit, units) + eps), units).astype(np.int64)
    if (lo > hi).any():
        j = int(np.flatnonzero(lo > hi)[0])
        raise InfeasibleError(
            f"DIP {cols.names[int(free[j])]!r}: min_weight {low[j]:.6g} and cap {cap[j]:.6g} leave no point on the "
            f"grid of {units} units of {unit:.6g}"
        )
    if int(lo.sum()) > units or int(hi.sum()) < units:
        raise InfeasibleError(
            f"on the grid of {units} units of {unit:.6g} for the free weight {remaining:.6g}, the DIPs' bounds allow "
            f"{int(lo.sum())} to {int(hi.sum())} units (sum of w_max {float(cap.sum()):.6g}, sum of min_weight "
            f"{float(low.sum()):.6g}); use more units"
        )
    return Problem(dips, cols, objective, total, free, pinned, table, units, unit, lo, hi, w_max)


def largest_remainder(share: FloatArray, lo: IntArray, hi: IntArray, units: int) -> IntArray:
    """Integers in ``[lo, hi]`` summing to ``units``, close to the real ``share`` (largest remainder).

    ``share`` must lie in ``[lo, hi]`` and sum to ``units``; used for the capacity-proportional
    allocation that anchors the ILP and fills ties.
    """
    base = np.clip(np.floor(share + 1e-9).astype(np.int64), lo, hi)
    short = units - int(base.sum())
    if short > 0:
        room = hi - base
        order = np.argsort(-(share - base), kind="stable")
        order = order[room[order] > 0]
        base[order[:short]] += 1
    elif short < 0:
        room = base - lo
        order = np.argsort(share - base, kind="stable")
        order = order[room[order] > 0]
        base[order[:-short]] -= 1
    return base


def proportional(lo: IntArray, hi: IntArray, units: int) -> IntArray:
    """``lo`` plus the remaining units split in proportion to each DIP's room ``hi - lo``."""
    room = (hi - lo).astype(np.float64)
    rest = units - int(lo.sum())
    share = lo + (room * (rest / room.sum()) if room.sum() > 0 else room)
    return largest_remainder(share, lo, hi, units)
