"""``utilisation``: ``s / (1 - (w / c) ** k)`` for ``w < c``: a DIP with ``k``-ish parallel servers.

``s`` is the unloaded latency, ``c`` the weight at which the DIP saturates (its capacity as a share
of the VIP's traffic), ``k`` the sharpness of the knee. ``k = 1`` is M/M/1's ``s / (1 - rho)``;
``k = 2`` is M/M/2's mean response time exactly; for M/M/c with larger ``c`` the form
``s / (1 - rho ** c)`` is the classic approximation (the latency stays near ``s`` until the knee).

The model is linear after a change of variables: ``1 / latency = 1/s - (1/s) * (w / c) ** k``, so
for a fixed ``k`` it is a weighted least-squares line in ``x = w ** k``, ``y = 1 / latency``
(:func:`shape_fit`). Fitting tries every ``k`` of ``SHAPES`` and keeps the best; the controller's
estimator (:mod:`knapsack_lb.controller.estimation`) uses the same line with the rounds' standard
errors to get confidence bounds.

How it fails: with every point in the flat part of the curve the slope is zero within noise and
``c`` is unbounded (the fit returns a ``c`` far beyond the data: the data say nothing about it);
the estimator then bounds it from the slope's confidence interval instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from knapsack_lb.curves.base import DropPoint, FloatArray, finite, scale_factor
from knapsack_lb.errors import InvalidInputError

SHAPES = (1.0, 2.0, 4.0, 8.0, 16.0)  # knee sharpness tried: servers per DIP, up to 16 (more look like 16)
UNBOUNDED = 1e3  # "no rise seen": a saturation this many times beyond the largest weight


@dataclass(frozen=True)
class ShapeFit:
    """The line ``y = alpha - beta * x`` (``x = w ** k``, ``y = 1 / latency``) with its covariance.

    ``beta >= 0`` (latency never falls with load); ``chi2`` is the weighted sum of squared
    residuals, comparable across shapes fitted to the same points."""

    k: float
    alpha: float
    beta: float
    var_alpha: float
    var_beta: float
    cov: float
    chi2: float

    def saturation(self, beta: float | None = None) -> float:
        """``c = (alpha / beta) ** (1 / k)``, ``inf`` when ``beta <= 0``."""
        b = self.beta if beta is None else beta
        if b <= 0 or self.alpha <= 0:
            return math.inf
        return float((self.alpha / b) ** (1.0 / self.k))


def shape_fit(ws: FloatArray, latencies: FloatArray, variances: FloatArray, k: float) -> ShapeFit:
    """Weighted least squares of ``1 / latency`` on ``w ** k``; ``variances`` are those of the
    latencies (each point weighs ``latency ** 4 / variance``, the delta method for ``1 / latency``).
    Raises :class:`InvalidInputError` naming ``points`` with fewer than two distinct weights."""
    x = np.asarray(ws, dtype=np.float64) ** k
    y = 1.0 / np.asarray(latencies, dtype=np.float64)
    var_y = np.asarray(variances, dtype=np.float64) / np.asarray(latencies, dtype=np.float64) ** 4
    if len(np.unique(x)) < 2:
        raise InvalidInputError("points", len(np.unique(x)), "a shape fit needs latencies at two or more weights")
    weight = 1.0 / np.maximum(var_y, 1e-300)
    sw, sx, sy = weight.sum(), (weight * x).sum(), (weight * y).sum()
    sxx, sxy = (weight * x * x).sum(), (weight * x * y).sum()
    det = sw * sxx - sx * sx
    slope = (sw * sxy - sx * sy) / det  # y = alpha + slope * x
    alpha = (sy - slope * sx) / sw
    var_alpha, var_beta, cov = sxx / det, sw / det, -sx / det
    if slope > 0:  # latency falling with load is noise: a flat line through the weighted mean
        slope, alpha = 0.0, sy / sw
        var_alpha = 1.0 / sw
    residual = y - (alpha + slope * x)
    chi2 = float((weight * residual * residual).sum())
    return ShapeFit(k, float(alpha), float(-slope), float(var_alpha), float(var_beta), float(-cov), chi2)


@dataclass(frozen=True)
class UtilisationCurve:
    """``s / (1 - (w / c) ** k)`` for ``w < c``; ``inf`` for ``w >= c``."""

    s: float
    c: float
    k: float
    kind: str = "utilisation"
    parameters: ClassVar[int] = 3
    auto_rank: ClassVar[int] = 3
    auto: ClassVar[bool] = False  # the estimator's model; ``curve_model: auto`` compares the others

    def __post_init__(self) -> None:
        for name in ("s", "c", "k"):
            finite(name, getattr(self, name))
        if self.s <= 0:
            raise InvalidInputError("s", self.s, "must be > 0 (the unloaded latency)")
        if self.c <= 0:
            raise InvalidInputError("c", self.c, "must be > 0 (the saturation weight)")
        if self.k < 1:
            raise InvalidInputError("k", self.k, "must be >= 1 (the knee's sharpness)")

    @property
    def upper_bound(self) -> float:
        return self.c

    def latency(self, weight: float) -> float:
        if weight >= self.c:
            return math.inf
        return self.s / (1.0 - (max(weight, 0.0) / self.c) ** self.k)

    def latencies(self, weights: FloatArray) -> FloatArray:
        rho = np.clip(np.asarray(weights, dtype=np.float64), 0.0, None) / self.c
        with np.errstate(divide="ignore"):
            out = self.s / (1.0 - rho ** self.k)
        return np.where(rho < 1.0, out, np.inf)

    def scaled(self, k: float) -> UtilisationCurve:
        return UtilisationCurve(self.s, self.c * scale_factor(k), self.k)

    def cost_is_convex(self, lo: float, hi: float, objective: str) -> bool | None:
        """``w * latency(w)`` and ``latency(w)`` are convex below saturation for ``k >= 1``."""
        return True if hi < self.c else None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "s": self.s, "c": self.c, "k": self.k}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UtilisationCurve:
        missing = [key for key in ("s", "c", "k") if key not in data]
        if missing:
            raise InvalidInputError(f"curve.{missing[0]}", None, "is required for a utilisation curve")
        return cls(finite("curve.s", data["s"]), finite("curve.c", data["c"]), finite("curve.k", data["k"]))

    @classmethod
    def fit(cls, ws: FloatArray, ls: FloatArray, upper: float, drop: DropPoint | None) -> UtilisationCurve:
        """Relative least squares (every point's variance proportional to its latency squared) for
        each shape of ``SHAPES``, the lowest residual wins; a drop at ``w_d`` caps ``c`` at ``w_d``."""
        return curve_from_fit(best_shape(ws, ls, np.asarray(ls, dtype=np.float64) ** 2), ws, drop)


def shape_fits(ws: FloatArray, ls: FloatArray, variances: FloatArray) -> list[ShapeFit]:
    """:func:`shape_fit` for every shape of ``SHAPES`` whose ``w ** k`` still tells the weights apart
    (none when every weight is (nearly) the same)."""
    return [shape_fit(ws, ls, variances, k) for k in SHAPES if len(np.unique(np.asarray(ws) ** k)) >= 2]


def best_shape(ws: FloatArray, ls: FloatArray, variances: FloatArray) -> ShapeFit:
    """The shape of ``SHAPES`` with the smallest ``chi2`` (the sharper knee on a tie)."""
    fits = shape_fits(ws, ls, variances)
    if not fits:
        raise InvalidInputError("points", len(np.unique(ws)), "a shape fit needs latencies at two or more weights")
    return min(fits, key=lambda f: (round(f.chi2, 9), -f.k))


def curve_from_fit(fit: ShapeFit, ws: FloatArray, drop: DropPoint | None = None,
                   saturation: float | None = None) -> UtilisationCurve:
    """The curve of a shape fit; ``saturation`` overrides its ``c`` (e.g. a confidence bound), an
    unbounded one is put ``UNBOUNDED`` times beyond the data, a drop caps it."""
    top = float(np.max(ws)) if len(ws) else 1.0
    c = fit.saturation() if saturation is None else saturation
    if not math.isfinite(c):
        c = UNBOUNDED * max(top, 1e-6)
    if drop is not None:
        c = min(c, drop[0])
    c = max(c, top * (1 + 1e-6), 1e-9)
    return UtilisationCurve(1.0 / fit.alpha, c, fit.k)  # alpha > 0: a non-rising line through positive y
