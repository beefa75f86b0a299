"""Weight-to-latency curves: what the controller learns per DIP and the solver consumes.

Kinds (one module each; :mod:`knapsack_lb.curves.base` says what a kind must provide):

* ``quadratic`` - ``a + b*w + c*w^2``, the paper's degree-2 polynomial (section 4.2).
* ``queueing`` - ``a + b / (c - w)`` for ``w < c`` (infinite at and beyond ``c``): the
  M/M/1-like blow-up near capacity that a quadratic underestimates (docs/design.md).
* ``piecewise`` - linear interpolation through ``(w, latency)`` points, extended past the
  last point along the last segment: a convex piecewise-linear fit, or any tabulated curve.

Kinds are found through the entry point group ``knapsack_lb.curves`` (the project's own are
listed in pyproject.toml), so a third party adds one with its own distribution.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from knapsack_lb.curves.base import CurveModel, DropPoint, FloatArray, LatencyCurve
from knapsack_lb.curves.piecewise import PiecewiseLinearCurve
from knapsack_lb.curves.quadratic import QuadraticCurve
from knapsack_lb.curves.queueing import QueueingCurve
from knapsack_lb.errors import InvalidInputError

__all__ = [
    "CurveModel", "DropPoint", "FloatArray", "LatencyCurve", "PiecewiseLinearCurve", "QuadraticCurve",
    "QueueingCurve", "curve_from_dict", "curve_models",
]

CURVES_GROUP = "knapsack_lb.curves"


@functools.cache
def curve_models() -> dict[str, type[CurveModel]]:
    """Every installed curve kind by name, in order of ``curve_model: auto`` preference."""
    models: dict[str, type[CurveModel]] = {ep.name: ep.load() for ep in entry_points(group=CURVES_GROUP)}
    return dict(sorted(models.items(), key=lambda item: (item[1].auto_rank, item[0])))


def curve_model(kind: object, field: str = "curve.kind") -> type[CurveModel]:
    """The class of curve kind ``kind``; :class:`InvalidInputError` naming ``field`` when unknown."""
    models = curve_models()
    if not isinstance(kind, str) or kind not in models:
        raise InvalidInputError(field, kind, f"must be one of {sorted(models)}")
    return models[kind]


def curve_from_dict(data: Mapping[str, Any], dip: str | None = None) -> LatencyCurve:
    """Build a curve from its ``to_dict`` form; errors name the DIP and the field."""
    if not isinstance(data, Mapping):
        raise InvalidInputError("curve", data, "must be an object with a 'kind'", dip=dip)
    try:
        return curve_model(data.get("kind", "quadratic")).from_dict(data)
    except InvalidInputError as exc:
        if exc.dip is None and dip is not None:
            raise InvalidInputError(
                exc.field if exc.field.startswith("curve") else f"curve.{exc.field}", exc.value, exc.problem, dip
            ) from None
        raise
