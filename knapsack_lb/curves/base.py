"""What a curve model is: the protocol every kind implements, and their shared checks.

A curve maps a weight ``w`` in [0, 1] (the DIP's share of the VIP's traffic) to the latency
(seconds) a request to that DIP sees. A curve *model* is a class that carries everything the
controller and the solver need of its kind, so that adding a kind is one module and one entry
point (group ``knapsack_lb.curves``):

* ``kind`` and ``parameters`` (the number of free parameters: leave-one-out model selection
  needs more points than that);
* ``fit(ws, ls, upper, drop)``: the curve through measured ``(weight, latency)`` points;
* ``from_dict`` / ``to_dict``: the stored form;
* ``latency`` / ``latencies``: evaluation (the solver uses the vectorised one);
* ``scaled(k)``: the weight axis multiplied by ``k`` (KnapsackLB section 4.5's shift and rescale);
* ``upper_bound``: the weight at which latency becomes infinite (``inf`` for none);
* ``cost_is_convex(lo, hi, objective)``: whether the solver's per-DIP cost is convex on
  ``[lo, hi]``, or ``None`` when the model cannot say exactly (the solver then samples).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from knapsack_lb.errors import InvalidInputError

FloatArray = npt.NDArray[np.float64]
DropPoint = tuple[float, float]  # (smallest weight above the data where the DIP dropped, drop latency)


@runtime_checkable
class LatencyCurve(Protocol):
    """A DIP's latency (seconds) as a function of its weight."""

    @property
    def kind(self) -> str: ...

    @property
    def upper_bound(self) -> float: ...

    def latency(self, weight: float) -> float: ...

    def latencies(self, weights: FloatArray) -> FloatArray: ...

    def scaled(self, k: float) -> LatencyCurve: ...

    def cost_is_convex(self, lo: float, hi: float, objective: str) -> bool | None: ...

    def to_dict(self) -> dict[str, Any]: ...


class CurveModel(Protocol):
    """A curve kind as a class: what the registry holds (see the module docstring)."""

    parameters: ClassVar[int]
    auto_rank: ClassVar[int]  # order of preference of ``curve_model: auto`` among equal errors

    @classmethod
    def fit(cls, ws: FloatArray, ls: FloatArray, upper: float, drop: DropPoint | None) -> LatencyCurve: ...

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LatencyCurve: ...


def finite(name: str, value: object, dip: str | None = None) -> float:
    """``value`` as a float; :class:`InvalidInputError` naming ``name`` unless it is a finite number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidInputError(name, value, "must be a finite number", dip=dip)
    return float(value)


def scale_factor(k: float) -> float:
    """``k`` checked for ``scaled``: a finite number > 0."""
    if isinstance(k, bool) or not isinstance(k, (int, float)) or not k > 0 or not math.isfinite(k):
        raise InvalidInputError("k", k, "must be a finite number > 0")
    return float(k)


def abc_parameters(data: Mapping[str, Any], kind: str) -> tuple[float, float, float]:
    """The ``a``, ``b``, ``c`` of a stored three-parameter curve, each required and finite."""
    missing = [k for k in ("a", "b", "c") if k not in data]
    if missing:
        raise InvalidInputError(f"curve.{missing[0]}", None, f"is required for a {kind} curve")
    return finite("curve.a", data["a"]), finite("curve.b", data["b"]), finite("curve.c", data["c"])
