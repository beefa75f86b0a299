"""``piecewise``: linear interpolation through ``(w, latency)`` points, extended past the ends
along the end segments; fitted as the lower convex hull of the points, made non-decreasing."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from knapsack_lb.curves.base import DropPoint, FloatArray, finite, scale_factor
from knapsack_lb.errors import InvalidInputError


@dataclass(frozen=True)
class PiecewiseLinearCurve:
    """Linear interpolation through points sorted by weight, extended linearly at both ends."""

    weights: tuple[float, ...]
    values: tuple[float, ...]
    kind: str = "piecewise"
    parameters: ClassVar[int] = 2
    auto_rank: ClassVar[int] = 2

    def __post_init__(self) -> None:
        if len(self.weights) != len(self.values) or len(self.weights) < 2:
            raise InvalidInputError(
                "points", len(self.weights), "need at least two (weight, latency) points of equal count"
            )
        ws = [finite("weights", w) for w in self.weights]
        vs = [finite("values", v) for v in self.values]
        if any(b <= a for a, b in itertools.pairwise(ws)):
            raise InvalidInputError("weights", tuple(ws), "must be strictly increasing")
        object.__setattr__(self, "weights", tuple(ws))
        object.__setattr__(self, "values", tuple(vs))

    @property
    def upper_bound(self) -> float:
        return math.inf

    def _slopes(self) -> tuple[float, float]:
        w, v = self.weights, self.values
        return (v[1] - v[0]) / (w[1] - w[0]), (v[-1] - v[-2]) / (w[-1] - w[-2])

    def latency(self, weight: float) -> float:
        return float(self.latencies(np.array([weight]))[0])

    def latencies(self, weights: FloatArray) -> FloatArray:
        w = np.asarray(weights, dtype=np.float64)
        xs = np.asarray(self.weights)
        ys = np.asarray(self.values)
        out = np.interp(w, xs, ys)
        first, last = self._slopes()
        out = np.where(w < xs[0], ys[0] + first * (w - xs[0]), out)
        return np.where(w > xs[-1], ys[-1] + last * (w - xs[-1]), out)

    def scaled(self, k: float) -> PiecewiseLinearCurve:
        k = scale_factor(k)
        return PiecewiseLinearCurve(tuple(w * k for w in self.weights), self.values)

    def cost_is_convex(self, lo: float, hi: float, objective: str) -> bool | None:
        """The slopes of the pieces meeting ``[lo, hi]`` non-decreasing (for the ``mean`` cost
        ``w * l(w)`` too, as the solver's grid starts at ``w >= 0``)."""
        xs = np.asarray(self.weights)
        slopes = np.diff(np.asarray(self.values)) / np.diff(xs)
        # piece j spans [xs[j], xs[j+1]]; the first and last extend to -inf / +inf
        left = np.concatenate(([-math.inf], xs[1:-1]))
        right = np.concatenate((xs[1:-1], [math.inf]))
        used = slopes[(right > lo) & (left < hi)]
        return bool(np.all(np.diff(used) >= -1e-12 * max(1.0, float(np.abs(used).max(initial=0.0)))))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "weights": list(self.weights), "values": list(self.values)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PiecewiseLinearCurve:
        weights: Sequence[Any] = data.get("weights", ())
        values: Sequence[Any] = data.get("values", ())
        if not isinstance(weights, Sequence) or not isinstance(values, Sequence):
            raise InvalidInputError("curve.weights", weights, "weights and values must be lists")
        return cls(tuple(weights), tuple(values))

    @classmethod
    def fit(cls, ws: FloatArray, ls: FloatArray, upper: float, drop: DropPoint | None) -> PiecewiseLinearCurve:
        """Lower convex hull of the points (plus the drop threshold point), made non-decreasing,
        and flat from the lowest point down to weight 0 when no point is at 0 (a refresh)."""
        pts = list(zip(ws.tolist(), ls.tolist(), strict=True))
        if drop is not None and drop[0] > max(ws):
            pts.append(drop)
        if pts and min(pts)[0] > 0:  # no weight-0 point: flat down to 0, never extrapolated below the data
            pts.append((0.0, min(pts)[1]))
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
        return cls(tuple(x for x, _ in hull), tuple(float(v) for v in values))
