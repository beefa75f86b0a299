"""``queueing``: ``a + b / (c - w)`` for ``w < c``, the M/M/1-like blow-up near the capacity
``c`` that a quadratic underestimates (docs/design.md)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from knapsack_lb.curves.base import DropPoint, FloatArray, abc_parameters, finite, scale_factor
from knapsack_lb.errors import InvalidInputError


@dataclass(frozen=True)
class QueueingCurve:
    """``a + b / (c - w)`` for ``w < c``; ``inf`` for ``w >= c``.

    ``c`` is the weight at which the DIP saturates (its capacity as a share of the VIP's
    current traffic), ``a`` the latency floor, ``b > 0`` the scale of the queueing delay.
    """

    a: float
    b: float
    c: float
    kind: str = "queueing"
    parameters: ClassVar[int] = 3
    auto_rank: ClassVar[int] = 0

    def __post_init__(self) -> None:
        for name in ("a", "b", "c"):
            finite(name, getattr(self, name))
        if self.b < 0:
            raise InvalidInputError("b", self.b, "must be >= 0 (latency must not fall as weight rises)")
        if self.c <= 0:
            raise InvalidInputError("c", self.c, "must be > 0 (the saturation weight)")

    @property
    def upper_bound(self) -> float:
        return self.c

    def latency(self, weight: float) -> float:
        if weight >= self.c:
            return math.inf
        return self.a + self.b / (self.c - weight)

    def latencies(self, weights: FloatArray) -> FloatArray:
        w = np.asarray(weights, dtype=np.float64)
        gap = self.c - w
        with np.errstate(divide="ignore"):
            out = self.a + self.b / np.where(gap > 0, gap, 1.0)
        return np.where(gap > 0, out, np.inf)

    def scaled(self, k: float) -> QueueingCurve:
        k = scale_factor(k)
        return QueueingCurve(self.a, self.b * k, self.c * k)

    def cost_is_convex(self, lo: float, hi: float, objective: str) -> bool | None:
        """Convex below saturation; the solver's sampled check decides near it."""
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "a": self.a, "b": self.b, "c": self.c}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> QueueingCurve:
        return cls(*abc_parameters(data, "queueing"))

    @classmethod
    def fit(cls, ws: FloatArray, ls: FloatArray, upper: float, drop: DropPoint | None) -> QueueingCurve:
        """For a fixed ``c`` the model is linear in ``(a, b)``, so ``c`` is found by a bounded 1-D
        search (scipy ``minimize_scalar``) with weighted linear least squares inside; residuals are
        relative (latency spans orders of magnitude near capacity). A drop at weight ``w_d`` bounds
        ``c`` from above: a DIP that dropped there saturates not far above it."""
        from scipy.optimize import minimize_scalar

        if len(ws) < 2:
            raise InvalidInputError("points", len(ws), "a queueing fit needs at least two distinct weights")
        drop_weight = None if drop is None else drop[0]
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
        return cls(a, b, c)
