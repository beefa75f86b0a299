"""Weight-latency curve fitting: KnapsackLB section 4.2, plus better models.

Each curve kind fits itself (``fit`` of its class: the paper's quadratic regression, the
queueing model's 1-D search, the piecewise convex hull; see their modules). This module
merges the points, adds the drop threshold, and chooses a kind:

* a named kind: that kind's fit;
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

from knapsack_lb.curves import curve_model, curve_models
from knapsack_lb.curves.base import DropPoint, FloatArray, LatencyCurve
from knapsack_lb.errors import InvalidInputError

FALLBACK = "piecewise"  # always positive at weight 0 and fits any two points


@dataclass(frozen=True)
class FitResult:
    """A fitted curve, the model that made it and its leave-one-out errors (None = undefined)."""

    curve: LatencyCurve
    model: str
    error: float | None
    errors: dict[str, float | None] = field(default_factory=dict)


def _merge(points: Sequence[tuple[float, float]]) -> tuple[FloatArray, FloatArray]:
    """Sort by weight and average latencies measured at the same weight."""
    by_weight: dict[float, list[float]] = {}
    for w, latency in points:
        if math.isfinite(w) and math.isfinite(latency) and latency > 0 and w >= 0:
            by_weight.setdefault(round(w, 12), []).append(latency)
    ws = np.array(sorted(by_weight), dtype=np.float64)
    ls = np.array([float(np.mean(by_weight[w])) for w in sorted(by_weight)], dtype=np.float64)
    return ws, ls


def leave_one_out_error(
    model: str, ws: FloatArray, ls: FloatArray, upper: float, drop: DropPoint | None
) -> float | None:
    """Relative RMS error at each point of a fit on the other points; None if too few points."""
    kind = curve_model(model, "curve_model")
    n = len(ws)
    if n - 1 < kind.parameters:
        return None
    errors = []
    for i in range(n):
        keep = np.arange(n) != i
        try:
            curve = kind.fit(ws[keep], ls[keep], upper, drop)
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
    if model != "auto":
        curve_model(model, "curve_model")  # refuses an unknown kind by name before any fitting
    ws, ls = _merge(points)
    if len(ws) < 2:
        raise InvalidInputError("points", list(points), "need drop-free latencies at two or more weights")
    top = float(ws.max())
    above = [w for w, _ in drop_points if w > top]
    drop: DropPoint | None = None
    if above:
        threshold = drop_latency if drop_latency is not None else 5 * float(ls.min())
        drop = (min(above), max(threshold, float(ls.max())))
    upper = max(w_max or 0.0, top, drop[0] if drop else 0.0)
    models = curve_models()
    if model == "auto":
        candidates = [m for m in models if getattr(models[m], "auto", True)]  # in order of preference
        errors = {m: leave_one_out_error(m, ws, ls, upper, drop) for m in candidates}
        if all(errors[m] is not None for m in candidates):
            order = sorted(candidates, key=lambda m: (errors[m], candidates.index(m)))
        else:  # too few points to compare every model fairly: the preferred ones that can be fitted
            order = [m for m in candidates if len(ws) >= models[m].parameters or m == FALLBACK]
        for chosen in order:
            curve = models[chosen].fit(ws, ls, upper, drop)
            if _usable(curve):
                break
    else:
        chosen = model
        errors = {model: leave_one_out_error(model, ws, ls, upper, drop)}
        curve = models[chosen].fit(ws, ls, upper, drop)
    if not _usable(curve):  # a fit extrapolated below 0 towards weight 0 (points far from 0): flat there
        chosen, curve = FALLBACK, models[FALLBACK].fit(ws, ls, upper, drop)
    return FitResult(curve=curve, model=chosen, error=errors.get(chosen), errors=errors)


def _usable(curve: LatencyCurve) -> bool:
    """A latency curve the solver accepts: finite and positive at weight 0."""
    at_zero = float(curve.latency(0.0))
    return math.isfinite(at_zero) and at_zero > 0
