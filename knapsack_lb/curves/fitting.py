"""Weight-latency curve fitting: KnapsackLB section 4.2, plus better models.

* ``quadratic`` (the paper): degree-2 polynomial regression (scikit-learn
  ``PolynomialFeatures`` + ``LinearRegression``) on the drop-free points, made monotone
  non-decreasing the paper's way (section 6.1: the latency at a weight is the max of the
  regression and the latency at the previous weight). A quadratic that is not monotone on
  the weights that matter is stored as that running maximum on a grid (a piecewise curve).
* ``queueing`` (ours): ``a + b / (c - w)``, the M/M/1-like blow-up near the capacity ``c``
  that a quadratic underestimates (docs/design.md). For a fixed ``c`` the model is linear in
  ``(a, b)``, so ``c`` is found by a bounded 1-D search (scipy ``minimize_scalar``) with a
  weighted linear least-squares fit inside; residuals are relative (latency spans orders of
  magnitude near capacity). Drop points bound ``c`` from above: a DIP that dropped at
  weight ``w_d`` saturates not far above it.
* ``piecewise`` (ours): the lower convex hull of the points, made non-decreasing, with the
  drop threshold added at the smallest drop weight so extrapolation rises like the real DIP,
  and flat from the lowest point down to weight 0 when no point is at 0 (a refresh).
* ``auto``: each model is scored by its leave-one-out error (relative RMS of the latency
  predicted at a held-out point by a fit on the others); the lowest wins, and the error is
  stored beside the curve (``CurveRecord.fit_error``).

How it fails: with fewer points than parameters plus one, leave-one-out is undefined for
some model; auto then does not compare (a 2-parameter model would always win on 3 points)
and takes the first of queueing, quadratic, piecewise that can be fitted. Points far from
weight 0 (a refresh that starts at the current weight) can make a quadratic or queueing fit
negative at 0; such a fit is skipped (the piecewise one is always positive there). All fits see only a handful of
noisy points (the paper: 4-5): fit_error says how much to trust them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import minimize_scalar
from sklearn.linear_model import LinearRegression
from sklearn.preprocessing import PolynomialFeatures

from knapsack_lb.curves import LatencyCurve, PiecewiseLinearCurve, QuadraticCurve, QueueingCurve
from knapsack_lb.errors import InvalidInputError

MODELS = ("quadratic", "queueing", "piecewise")
AUTO_PREFERENCE = ("queueing", "quadratic", "piecewise")
PARAMETERS = {"quadratic": 3, "queueing": 3, "piecewise": 2}


@dataclass(frozen=True)
class FitResult:
    """A fitted curve, the model that made it and its leave-one-out errors (None = undefined)."""

    curve: LatencyCurve
    model: str
    error: float | None
    errors: dict[str, float | None] = field(default_factory=dict)


def _merge(points: Sequence[tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
    """Sort by weight and average latencies measured at the same weight."""
    by_weight: dict[float, list[float]] = {}
    for w, latency in points:
        if math.isfinite(w) and math.isfinite(latency) and latency > 0 and w >= 0:
            by_weight.setdefault(round(w, 12), []).append(latency)
    ws = np.array(sorted(by_weight), dtype=np.float64)
    ls = np.array([float(np.mean(by_weight[w])) for w in sorted(by_weight)], dtype=np.float64)
    return ws, ls


def _monotone_grid(curve: LatencyCurve, upper: float) -> PiecewiseLinearCurve:
    grid = np.linspace(0.0, upper, 41)
    values = np.maximum.accumulate(curve.latencies(grid))
    return PiecewiseLinearCurve(tuple(float(x) for x in grid), tuple(float(v) for v in values))


def fit_quadratic(ws: np.ndarray, ls: np.ndarray, upper: float) -> LatencyCurve:
    """Section 4.2: degree-2 polynomial regression, made monotone non-decreasing on [0, upper]."""
    if len(ws) < 2:
        raise InvalidInputError("points", len(ws), "a quadratic fit needs at least two distinct weights")
    features = PolynomialFeatures(degree=min(2, len(ws) - 1), include_bias=False).fit_transform(ws.reshape(-1, 1))
    model = LinearRegression().fit(features, ls)
    coef = list(model.coef_) + [0.0] * (2 - len(model.coef_))
    curve = QuadraticCurve(float(model.intercept_), float(coef[0]), float(coef[1]))
    grid = np.linspace(0.0, upper, 41)
    if np.all(np.diff(curve.latencies(grid)) >= -1e-15):
        return curve
    return _monotone_grid(curve, upper)


def fit_queueing(ws: np.ndarray, ls: np.ndarray, drop_weight: float | None = None) -> QueueingCurve:
    """``a + b / (c - w)`` by a 1-D search over ``c`` with weighted linear least squares inside."""
    if len(ws) < 2:
        raise InvalidInputError("points", len(ws), "a queueing fit needs at least two distinct weights")
    w_hi = float(ws.max())
    scale = max(w_hi, 1e-6)
    c_hi = 1.25 * drop_weight if drop_weight is not None and drop_weight > w_hi else w_hi + 20 * scale
    c_hi = max(c_hi, w_hi + 1e-3 * scale)
    inv = 1.0 / ls

    def solve_ab(c: float) -> tuple[float, float, float]:
        x = 1.0 / (c - ws)
        design = np.column_stack([np.ones_like(ws), x]) * inv[:, None]
        (a, b), *_ = np.linalg.lstsq(design, np.ones_like(ws), rcond=None)
        if b < 0:  # latency must not fall with weight: flat curve
            b = 0.0
            a = float(np.sum(inv) / np.sum(inv * inv))
        resid = (a + b * x) * inv - 1.0
        return float(a), float(b), float(np.sum(resid * resid))

    lo, hi = math.log(1e-4 * scale), math.log(c_hi - w_hi)
    found = minimize_scalar(lambda u: solve_ab(w_hi + math.exp(u))[2], bounds=(lo, hi), method="bounded",
                            options={"xatol": 1e-4})
    c = w_hi + math.exp(float(found.x))
    a, b, _ = solve_ab(c)
    return QueueingCurve(a, b, c)


def fit_piecewise(
    ws: np.ndarray, ls: np.ndarray, drop_point: tuple[float, float] | None = None
) -> PiecewiseLinearCurve:
    """Lower convex hull of the points (plus the drop threshold point), made non-decreasing."""
    pts = list(zip(ws.tolist(), ls.tolist(), strict=True))
    if drop_point is not None and drop_point[0] > max(ws):
        pts.append(drop_point)
    if pts and min(pts)[0] > 0:  # no weight-0 point: flat down to 0, never extrapolated below the data
        first = min(pts)
        pts.append((0.0, first[1]))
    if len(pts) < 2:
        raise InvalidInputError("points", len(pts), "a piecewise fit needs at least two distinct weights")
    hull: list[tuple[float, float]] = []
    for p in sorted(pts):
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (x2 - x1) * (p[1] - y1) - (y2 - y1) * (p[0] - x1) <= 0:
                hull.pop()
            else:
                break
        hull.append(p)
    values = np.maximum.accumulate(np.array([y for _, y in hull]))
    return PiecewiseLinearCurve(tuple(x for x, _ in hull), tuple(float(v) for v in values))


def _fit(model: str, ws: np.ndarray, ls: np.ndarray, upper: float, drop: tuple[float, float] | None) -> LatencyCurve:
    if model == "quadratic":
        return fit_quadratic(ws, ls, upper)
    if model == "queueing":
        return fit_queueing(ws, ls, None if drop is None else drop[0])
    if model == "piecewise":
        return fit_piecewise(ws, ls, drop)
    raise InvalidInputError("curve_model", model, f"must be one of {(*MODELS, 'auto')}")


def leave_one_out_error(
    model: str, ws: np.ndarray, ls: np.ndarray, upper: float, drop: tuple[float, float] | None
) -> float | None:
    """Relative RMS error at each point of a fit on the other points; None if too few points."""
    n = len(ws)
    if n - 1 < PARAMETERS[model]:
        return None
    errors = []
    for i in range(n):
        keep = np.arange(n) != i
        try:
            curve = _fit(model, ws[keep], ls[keep], upper, drop)
        except InvalidInputError:
            return None
        predicted = curve.latency(float(ws[i]))
        errors.append(min(10.0, abs(predicted - ls[i]) / ls[i]) if math.isfinite(predicted) else 10.0)
    return float(math.sqrt(float(np.mean(np.square(errors)))))


def fit_curve(
    points: Sequence[tuple[float, float]],
    *,
    model: str = "auto",
    w_max: float | None = None,
    drop_points: Sequence[tuple[float, float]] = (),
    drop_latency: float | None = None,
) -> FitResult:
    """Fit one DIP's drop-free ``(weight, latency)`` points with ``model`` (or choose by LOO error).

    ``drop_points`` are the weights (and latencies) where drops were seen; the smallest one
    above the fitted range bounds the queueing model's capacity and, with ``drop_latency``
    (the drop threshold, e.g. 5x l_0), adds the piecewise model's last point.
    """
    if model not in (*MODELS, "auto"):
        raise InvalidInputError("curve_model", model, f"must be one of {(*MODELS, 'auto')}")
    ws, ls = _merge(points)
    if len(ws) < 2:
        raise InvalidInputError("points", list(points), "need drop-free latencies at two or more weights")
    top = float(ws.max())
    above = [w for w, _ in drop_points if w > top]
    drop: tuple[float, float] | None = None
    if above:
        threshold = drop_latency if drop_latency is not None else 5 * float(ls.min())
        drop = (min(above), max(threshold, float(ls.max())))
    upper = max(w_max or 0.0, top, drop[0] if drop else 0.0)
    candidates = MODELS if model == "auto" else (model,)
    errors = {m: leave_one_out_error(m, ws, ls, upper, drop) for m in candidates} if model == "auto" else {}
    if model == "auto":
        if all(errors[m] is not None for m in candidates):
            order = sorted(candidates, key=lambda m: (errors[m], AUTO_PREFERENCE.index(m)))
        else:  # too few points to compare every model fairly: the preferred ones that can be fitted
            order = [m for m in AUTO_PREFERENCE if len(ws) >= PARAMETERS[m] or m == "piecewise"]
        for chosen in order:
            curve = _fit(chosen, ws, ls, upper, drop)
            if _usable(curve):
                break
    else:
        chosen = model
        errors = {model: leave_one_out_error(model, ws, ls, upper, drop)}
        curve = _fit(chosen, ws, ls, upper, drop)
    if not _usable(curve):  # a fit extrapolated below 0 towards weight 0 (points far from 0): flat there
        chosen, curve = "piecewise", fit_piecewise(ws, ls, drop)
    return FitResult(curve=curve, model=chosen, error=errors.get(chosen), errors=errors)


def _usable(curve: LatencyCurve) -> bool:
    """A latency curve the solver accepts: finite and positive at weight 0."""
    at_zero = float(curve.latency(0.0))
    return math.isfinite(at_zero) and at_zero > 0
