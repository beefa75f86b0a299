"""The adapter contract: how a ``WeightPlan`` reaches a real load balancer.

KnapsackLB changes nothing in the LB but its weights, through the interface the LB
already has (KnapsackLB paper, sections 3.2 and 6.5). An adapter:

* is built from its VIP's ``adapter.settings`` by ``from_config(raw)``, which fills
  defaults and validates every name that will reach a command or a file;
* ``apply(plan)`` applies the whole plan or nothing: on any failure the last good
  weights stay in place and the result says why. It never raises for an unreachable LB;
* ``read()`` returns the weights the LB really uses now (as fractions summing to 1 over
  the DIPs it knows), so the controller can verify and re-apply on a mismatch;
* ``check()`` tells whether the LB is reachable and configured as expected, changing
  nothing.

Adapters are registered under the entry-point group ``knapsack_lb.adapters``; a third
party adds one with its own distribution, no change to this repository.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

from knapsack_lb.errors import InvalidInputError
from knapsack_lb.model import WeightPlan

ENTRY_POINT_GROUP = "knapsack_lb.adapters"


@dataclass(frozen=True)
class ApplyResult:
    """What ``apply`` did. ``ok`` False means nothing changed on the LB and ``reason`` says why."""

    ok: bool
    adapter: str
    lb_weights: Mapping[str, int] = field(default_factory=dict)
    quantisation_error: float = 0.0
    seconds: float = 0.0
    reason: str = ""


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    adapter: str
    detail: str = ""


@runtime_checkable
class Adapter(Protocol):
    """A load balancer that takes weights. See the module docstring for the contract."""

    name: str

    @classmethod
    def from_config(cls, raw: Mapping[str, Any]) -> Adapter: ...

    def apply(self, plan: WeightPlan) -> ApplyResult: ...

    def read(self) -> dict[str, float]: ...

    def check(self) -> CheckResult: ...


@dataclass(frozen=True)
class Quantised:
    """Integer LB weights and how far their normalised split is from the plan (L1/2, i.e.
    total variation distance: the share of traffic that lands on another DIP than planned)."""

    weights: dict[str, int]
    error: float


def quantise(weights: Mapping[str, float], total: int, low: int = 0, high: int | None = None) -> Quantised:
    """Largest-remainder rounding of fractional ``weights`` to integers summing to ``total``.

    Each integer stays in ``[low, high]`` for DIPs with a positive weight; DIPs with weight 0
    get 0 (the caller maps 0 to what its LB requires: ``down``, a dropped endpoint, ...).
    Where the bounds make the exact total impossible, the closest feasible sum is used.
    """
    if total < 1:
        raise InvalidInputError("total", total, "must be >= 1")
    positive = {d: w for d, w in weights.items() if w > 0}
    if not positive:
        raise InvalidInputError("weights", dict(weights), "at least one DIP needs a positive weight")
    mass = sum(positive.values())
    lo = max(low, 1)
    hi = high if high is not None else total
    ideal = {d: w / mass * total for d, w in positive.items()}
    base = {d: min(hi, max(lo, math.floor(x))) for d, x in ideal.items()}
    remaining = total - sum(base.values())
    if remaining > 0:
        order = sorted(positive, key=lambda d: (ideal[d] - base[d], d), reverse=True)
        while remaining > 0:
            progressed = False
            for d in order:
                if remaining == 0:
                    break
                if base[d] < hi:
                    base[d] += 1
                    remaining -= 1
                    progressed = True
            if not progressed:
                break
    elif remaining < 0:
        order = sorted(positive, key=lambda d: (ideal[d] - base[d], d))
        while remaining < 0:
            progressed = False
            for d in order:
                if remaining == 0:
                    break
                if base[d] > lo:
                    base[d] -= 1
                    remaining += 1
                    progressed = True
            if not progressed:
                break
    result = {d: base.get(d, 0) for d in weights}
    achieved = sum(result.values())
    error = 0.5 * sum(abs(result[d] / achieved - max(weights[d], 0.0) / mass) for d in weights)
    return Quantised(result, error)


def load_adapter_class(name: str) -> type[Adapter]:
    """The adapter class registered under ``name`` in the entry-point group."""
    found = entry_points(group=ENTRY_POINT_GROUP)
    for ep in found:
        if ep.name == name:
            cls = ep.load()
            return cls
    known = sorted(ep.name for ep in found)
    raise InvalidInputError("adapter.name", name, f"no adapter of that name; installed: {known}")


def make_adapter(name: str, settings: Mapping[str, Any]) -> Adapter:
    """Build the adapter ``name`` from its settings (validated by its ``from_config``)."""
    return load_adapter_class(name).from_config(settings)
