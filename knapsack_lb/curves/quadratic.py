"""``quadratic``: ``a + b*w + c*w^2``, the paper's degree-2 polynomial (KnapsackLB section 4.2),
fitted by scikit-learn's polynomial regression and made monotone the paper's way."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from knapsack_lb.curves.base import DropPoint, FloatArray, LatencyCurve, abc_parameters, finite, scale_factor
from knapsack_lb.curves.piecewise import PiecewiseLinearCurve
from knapsack_lb.errors import InvalidInputError

MONOTONE_GRID = 41  # points of the running-maximum grid a non-monotone fit is stored as


@dataclass(frozen=True)
class QuadraticCurve:
    """``a + b*w + c*w^2`` (section 4.2)."""

    a: float
    b: float
    c: float
    kind: str = "quadratic"
    parameters: ClassVar[int] = 3
    auto_rank: ClassVar[int] = 1

    def __post_init__(self) -> None:
        for name in ("a", "b", "c"):
            finite(name, getattr(self, name))

    @property
    def upper_bound(self) -> float:
        return math.inf

    def latency(self, weight: float) -> float:
        return self.a + self.b * weight + self.c * weight * weight

    def latencies(self, weights: FloatArray) -> FloatArray:
        w = np.asarray(weights, dtype=np.float64)
        return self.a + self.b * w + self.c * w * w

    def scaled(self, k: float) -> QuadraticCurve:
        k = scale_factor(k)
        return QuadraticCurve(self.a, self.b / k, self.c / (k * k))

    def cost_is_convex(self, lo: float, hi: float, objective: str) -> bool | None:
        """``sum``/``max``: ``c >= 0``; ``mean`` (``w l(w)``): ``2b + 6cw >= 0`` at both ends."""
        if objective != "mean":
            return self.c >= 0
        return 2 * self.b + 6 * self.c * lo >= 0 and 2 * self.b + 6 * self.c * hi >= 0

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "a": self.a, "b": self.b, "c": self.c}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> QuadraticCurve:
        return cls(*abc_parameters(data, "quadratic"))

    @classmethod
    def fit(cls, ws: FloatArray, ls: FloatArray, upper: float, drop: DropPoint | None) -> LatencyCurve:
        """Degree-2 regression, made monotone non-decreasing on ``[0, upper]`` (section 6.1: the
        latency at a weight is the max of the regression and the latency at the previous weight);
        a fit that is not monotone there is returned as that running maximum on a grid."""
        from sklearn.linear_model import LinearRegression
        from sklearn.preprocessing import PolynomialFeatures

        if len(ws) < 2:
            raise InvalidInputError("points", len(ws), "a quadratic fit needs at least two distinct weights")
        features = PolynomialFeatures(degree=min(2, len(ws) - 1), include_bias=False).fit_transform(ws.reshape(-1, 1))
        model = LinearRegression().fit(features, ls)
        coef = list(model.coef_) + [0.0] * (2 - len(model.coef_))
        curve = cls(float(model.intercept_), float(coef[0]), float(coef[1]))
        grid = np.linspace(0.0, upper, MONOTONE_GRID)
        values = curve.latencies(grid)
        if np.all(np.diff(values) >= -1e-15):
            return curve
        running = np.maximum.accumulate(values)
        return PiecewiseLinearCurve(tuple(float(x) for x in grid), tuple(float(v) for v in running))
