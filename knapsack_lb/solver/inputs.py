"""What the solver is given per DIP, and the checks that refuse bad input early.

A ``DipInput`` carries one DIP's weight-latency curve (KnapsackLB section 4.2), its
largest safe weight ``w_max`` (the largest weight measured without drops, section 4.3),
optional bounds and an optional pin. Scalar fields are checked on construction; the
curve itself is checked by ``knapsack_lb.solver.grid.CurveTable`` (vectorised over all
DIPs) when a problem is built, because evaluating it is the expensive part.

Every error is an ``InvalidInputError`` naming the DIP and the field, or an
``InfeasibleError`` whose message carries the numbers that show why no plan exists.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from knapsack_lb.curves import LatencyCurve, QuadraticCurve, QueueingCurve
from knapsack_lb.errors import InfeasibleError, InvalidInputError
from knapsack_lb.names import NAME_PATTERN

OBJECTIVES = ("mean", "sum", "max")
METHODS = ("auto", "exact", "ilp", "ilp-multistep")


def _weight(dip: str, field: str, value: object, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidInputError(field, value, "must be a finite number", dip=dip)
    if value < 0:
        raise InvalidInputError(field, value, "must be >= 0", dip=dip)
    return float(value)


@dataclass(frozen=True)
class DipInput:
    """One DIP as the solver sees it.

    ``w_max`` is the largest safe weight; the ILP's levels live in ``[0, w_max]`` (section
    4.4) and no method assigns more. ``max_weight`` is an extra cap (the effective cap is
    ``min(w_max, max_weight)``), ``min_weight`` a floor, ``pin`` a fixed weight that
    overrides both (the admin API's pins; a drained DIP is pinned to 0).
    """

    name: str
    curve: LatencyCurve
    w_max: float
    min_weight: float = 0.0
    max_weight: float | None = None
    pin: float | None = None
    numbers: tuple[float, ...] = field(init=False, repr=False, compare=False)
    """Derived on construction for the vectorised solver: ``w_max, min_weight, cap, pin (NaN: none),
    curve kind code (0 quadratic, 1 queueing, 2 other), a, b, c``."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME_PATTERN.fullmatch(self.name):
            raise InvalidInputError(
                "name", self.name, "must be 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit"
            )
        if not callable(getattr(self.curve, "latencies", None)) or not callable(getattr(self.curve, "latency", None)):
            raise InvalidInputError("curve", self.curve, "must be a LatencyCurve (latency and latencies)", self.name)
        w_max = _weight(self.name, "w_max", self.w_max)
        assert w_max is not None
        if w_max <= 0:
            raise InvalidInputError("w_max", self.w_max, "must be > 0 (a DIP that takes no traffic: pin it to 0)",
                                    self.name)
        low = _weight(self.name, "min_weight", self.min_weight)
        assert low is not None
        high = _weight(self.name, "max_weight", self.max_weight, allow_none=True)
        pin = _weight(self.name, "pin", self.pin, allow_none=True)
        if low > w_max:
            raise InvalidInputError("min_weight", self.min_weight, f"must be <= w_max ({w_max!r})", self.name)
        if high is not None and high < low:
            raise InvalidInputError("max_weight", self.max_weight, f"must be >= min_weight ({low!r})", self.name)
        if pin is not None and pin > 1:
            raise InvalidInputError("pin", self.pin, "must be <= 1", self.name)
        kind = type(self.curve)
        code = 0.0 if kind is QuadraticCurve else 1.0 if kind is QueueingCurve else 2.0
        params = _PARAMS(self.curve) if code < 2 else (0.0, 0.0, 0.0)
        cap = w_max if high is None else min(w_max, high)
        object.__setattr__(
            self, "numbers", (w_max, low, cap, math.nan if pin is None else pin, code, *params)
        )

    @property
    def cap(self) -> float:
        """The effective upper bound: ``min(w_max, max_weight)``."""
        return self.w_max if self.max_weight is None else min(self.w_max, self.max_weight)


def check_objective_and_method(objective: str, method: str) -> None:
    if objective not in OBJECTIVES:
        raise InvalidInputError("objective", objective, f"must be one of {list(OBJECTIVES)}")
    if method not in METHODS:
        raise InvalidInputError("method", method, f"must be one of {list(METHODS)}")


@dataclass(frozen=True)
class Columns:
    """The DIPs' scalar fields as numpy columns (one pass over the inputs; NaN for "no pin")."""

    names: list[str]
    w_max: npt.NDArray[np.float64]
    low: npt.NDArray[np.float64]
    cap: npt.NDArray[np.float64]
    pin: npt.NDArray[np.float64]
    curve_params: npt.NDArray[np.float64]
    """Per DIP: kind code (0 quadratic, 1 queueing, 2 other), a, b, c."""

    @property
    def pinned(self) -> npt.NDArray[np.bool_]:
        return ~np.isnan(self.pin)


def columns(dips: Sequence[DipInput]) -> Columns:
    """One pass over the DIPs: their derived ``numbers`` stacked into an array (InvalidInputError on a non-DipInput)."""
    try:
        flat = itertools.chain.from_iterable([d.numbers for d in dips])
    except AttributeError:
        position = next(i for i, d in enumerate(dips) if not isinstance(d, DipInput))
        raise InvalidInputError(f"dips[{position}]", dips[position], "must be a DipInput") from None
    table = np.fromiter(flat, dtype=np.float64, count=8 * len(dips)).reshape(len(dips), 8)
    return Columns(
        names=[d.name for d in dips],
        w_max=table[:, 0],
        low=table[:, 1],
        cap=table[:, 2],
        pin=table[:, 3],
        curve_params=table[:, 4:],
    )


_PARAMS = operator.attrgetter("a", "b", "c")


def check_feasible(cols: Columns, total: float) -> None:
    """Refuse inputs that admit no plan, with the numbers: over-capacity pools, pins, floors.

    Weights are in [min_weight, cap] for free DIPs and exactly ``pin`` for pinned ones; a plan
    exists (in real numbers) iff pins sum to at most ``total``, floors plus pins to at most
    ``total`` and caps plus pins to at least ``total``. The unit grid can add rounding (at most
    one unit per DIP); ``knapsack_lb.solver.grid`` re-checks on integers.
    """
    tolerance = 1e-9 * max(1.0, total)
    names = cols.names
    if len(set(names)) != len(names):
        seen: set[str] = set()
        duplicates = sorted({n for n in names if n in seen or seen.add(n)})  # type: ignore[func-returns-value]
        raise InvalidInputError("name", duplicates, "DIP names must be unique")
    pinned_mask = cols.pinned
    free_mask = ~pinned_mask
    pinned = math.fsum(cols.pin[pinned_mask].tolist())
    n_free = int(free_mask.sum())
    floors = float(cols.low[free_mask].sum())
    caps = float(cols.cap[free_mask].sum())
    if pinned > total + tolerance:
        raise InfeasibleError(f"pinned weights sum to {pinned:.6g}, above the total {total:.6g}")
    if not n_free and abs(pinned - total) > tolerance:
        raise InfeasibleError(f"every DIP is pinned and the pins sum to {pinned:.6g}, not the total {total:.6g}")
    if pinned + floors > total + tolerance:
        raise InfeasibleError(
            f"minimum weights ({floors:.6g}) plus pins ({pinned:.6g}) sum to {floors + pinned:.6g}, "
            f"above the total {total:.6g}"
        )
    if n_free and pinned + caps < total - tolerance:
        raise InfeasibleError(
            f"the pool is over capacity: the sum of w_max (capped by max_weight) over the {n_free} free DIPs is "
            f"{caps:.6g}, plus pins {pinned:.6g} makes {caps + pinned:.6g}, below the total {total:.6g}"
        )
