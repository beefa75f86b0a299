"""The adapter contract: how a ``WeightPlan`` reaches a real load balancer.

KnapsackLB changes nothing in the LB but its weights, through the interface the LB
already has (KnapsackLB paper, sections 3.2 and 6.5). An adapter:

* declares its settings as a pydantic model, ``Settings`` (a subclass of
  :class:`AdapterSettings`). Everything in it that names a binary, a file, a directory, a
  socket, a listen address, a URL or an environment variable is the operator's: it is set in
  the configuration file's ``load_balancers`` section, never through the admin API. The few
  fields a VIP may set (``Settings.vip_fields``, e.g. the DIP-to-server mapping) are names or
  addresses, validated like everything else;
* is built by ``from_config(raw)`` from the operator's settings merged with the VIP's; building
  has no side effect (no connection, no listener, no file written); validating settings never
  builds an adapter;
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict

from knapsack_lb.errors import InvalidInputError
from knapsack_lb.model import DipConfig, WeightPlan
from knapsack_lb.plugins import ADAPTERS, load_plugin, validate_settings

ENTRY_POINT_GROUP = ADAPTERS
SETTINGS_PREFIX = "adapter.settings"


class AdapterSettings(BaseModel):
    """Base of every adapter's settings: frozen, unknown keys refused, no NaN or infinity.

    ``vip_fields`` names the fields a VIP may set through the admin API; every other field is
    operator-owned (the configuration file's ``load_balancers`` section).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    vip_fields: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def defaults_for(cls, dips: Sequence[DipConfig]) -> dict[str, Any]:
        """Per-VIP defaults derived from the VIP's DIPs (e.g. each DIP's address as its
        upstream server); the VIP's own settings override them."""
        return {}


Settings = TypeVar("Settings", bound=AdapterSettings)


def parse_settings(model: type[Settings], raw: Mapping[str, Any], prefix: str = SETTINGS_PREFIX) -> Settings:
    """``raw`` validated by the adapter's settings model; errors name ``prefix.<field>``."""
    return validate_settings(model, raw, prefix)


@dataclass(frozen=True)
class ApplyResult:
    """What ``apply`` did. ``ok`` False means nothing changed on the LB and ``reason`` says why."""

    ok: bool
    adapter: str
    lb_weights: Mapping[str, int] = field(default_factory=dict)
    quantisation_error: float = 0.0
    seconds: float = 0.0
    reason: str = ""
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    adapter: str
    detail: str = ""


@runtime_checkable
class Adapter(Protocol):
    """A load balancer that takes weights. See the module docstring for the contract."""

    name: str
    Settings: ClassVar[type[AdapterSettings]]

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


def load_adapter_class(name: str, field: str = "adapter") -> type[Adapter]:
    """The adapter class registered under ``name`` in the entry-point group."""
    cls: type[Adapter] = load_plugin(ENTRY_POINT_GROUP, name, field)
    return cls


def make_adapter(name: str, settings: Mapping[str, Any]) -> Adapter:
    """Build the adapter ``name`` from its settings (validated by its ``from_config``)."""
    return load_adapter_class(name).from_config(settings)
