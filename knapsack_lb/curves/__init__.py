"""Weight-to-latency curves: what the controller learns per DIP and the solver consumes.

A curve maps a weight ``w`` in [0, 1] (the DIP's share of the VIP's traffic) to the
latency (seconds) a request to that DIP sees. The solver only needs ``latency`` (and the
vectorised ``latencies``); it checks monotonicity and convexity on its own grid, so any
curve that can be evaluated works.

Kinds:

* ``quadratic`` - ``a + b*w + c*w^2``, the paper's degree-2 polynomial (section 4.2).
* ``queueing`` - ``a + b / (c - w)`` for ``w < c`` (infinite at and beyond ``c``): the
  M/M/1-like blow-up near capacity that a quadratic underestimates (docs/design.md).
* ``piecewise`` - linear interpolation through ``(w, latency)`` points, extended past the
  last point along the last segment: a convex piecewise-linear fit, or any tabulated curve.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from knapsack_lb.errors import InvalidInputError

FloatArray = npt.NDArray[np.float64]


@runtime_checkable
class LatencyCurve(Protocol):
    """A DIP's latency (seconds) as a function of its weight."""

    @property
    def kind(self) -> str: ...

    def latency(self, weight: float) -> float: ...

    def latencies(self, weights: FloatArray) -> FloatArray: ...

    def to_dict(self) -> dict[str, Any]: ...


def _finite(name: str, value: object, dip: str | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidInputError(name, value, "must be a finite number", dip=dip)
    return float(value)


@dataclass(frozen=True)
class QuadraticCurve:
    """``a + b*w + c*w^2`` (section 4.2)."""

    a: float
    b: float
    c: float
    kind: str = "quadratic"

    def __post_init__(self) -> None:
        for name in ("a", "b", "c"):
            _finite(name, getattr(self, name))

    def latency(self, weight: float) -> float:
        return self.a + self.b * weight + self.c * weight * weight

    def latencies(self, weights: FloatArray) -> FloatArray:
        w = np.asarray(weights, dtype=np.float64)
        return self.a + self.b * w + self.c * w * w

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "a": self.a, "b": self.b, "c": self.c}


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

    def __post_init__(self) -> None:
        for name in ("a", "b", "c"):
            _finite(name, getattr(self, name))
        if self.b < 0:
            raise InvalidInputError("b", self.b, "must be >= 0 (latency must not fall as weight rises)")
        if self.c <= 0:
            raise InvalidInputError("c", self.c, "must be > 0 (the saturation weight)")

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

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "a": self.a, "b": self.b, "c": self.c}


@dataclass(frozen=True)
class PiecewiseLinearCurve:
    """Linear interpolation through points sorted by weight, extended linearly at both ends."""

    weights: tuple[float, ...]
    values: tuple[float, ...]
    kind: str = "piecewise"

    def __post_init__(self) -> None:
        if len(self.weights) != len(self.values) or len(self.weights) < 2:
            raise InvalidInputError(
                "points", len(self.weights), "need at least two (weight, latency) points of equal count"
            )
        ws = [_finite("weights", w) for w in self.weights]
        vs = [_finite("values", v) for v in self.values]
        if any(b <= a for a, b in itertools.pairwise(ws)):
            raise InvalidInputError("weights", tuple(ws), "must be strictly increasing")
        object.__setattr__(self, "weights", tuple(ws))
        object.__setattr__(self, "values", tuple(vs))

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

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "weights": list(self.weights), "values": list(self.values)}


CURVE_KINDS: dict[str, type] = {
    "quadratic": QuadraticCurve,
    "queueing": QueueingCurve,
    "piecewise": PiecewiseLinearCurve,
}


def curve_from_dict(data: Mapping[str, Any], dip: str | None = None) -> LatencyCurve:
    """Build a curve from its ``to_dict`` form; errors name the DIP and the field."""
    if not isinstance(data, Mapping):
        raise InvalidInputError("curve", data, "must be an object with a 'kind'", dip=dip)
    kind = data.get("kind", "quadratic")
    try:
        if kind in ("quadratic", "queueing"):
            cls = QuadraticCurve if kind == "quadratic" else QueueingCurve
            missing = [k for k in ("a", "b", "c") if k not in data]
            if missing:
                raise InvalidInputError(f"curve.{missing[0]}", None, f"is required for a {kind} curve", dip)
            return cls(
                _finite("curve.a", data["a"], dip), _finite("curve.b", data["b"], dip),
                _finite("curve.c", data["c"], dip),
            )
        if kind == "piecewise":
            weights: Sequence[Any] = data.get("weights", ())
            values: Sequence[Any] = data.get("values", ())
            if not isinstance(weights, Sequence) or not isinstance(values, Sequence):
                raise InvalidInputError("curve.weights", weights, "weights and values must be lists", dip)
            return PiecewiseLinearCurve(tuple(weights), tuple(values))
    except InvalidInputError as exc:
        if exc.dip is None and dip is not None:
            raise InvalidInputError(
                exc.field if exc.field.startswith("curve") else f"curve.{exc.field}", exc.value, exc.problem, dip
            ) from None
        raise
    raise InvalidInputError("curve.kind", kind, f"must be one of {sorted(CURVE_KINDS)}", dip=dip)
