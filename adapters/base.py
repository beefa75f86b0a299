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
  nothing;
* optionally ``traffic()`` returns what the LB counted per DIP so far
  (:class:`~knapsack_lb.model.Traffic`, ``None`` when it cannot be read): the controller takes each
  DIP's real share of the traffic between two reads (at layer 4 the weights move new connections
  only, and the share a DIP carries lags them).

Adapters are registered under the entry-point group ``knapsack_lb.adapters``; a third
party adds one with its own distribution, no change to this repository.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict

from knapsack_lb.model import ApplyResult, Balancing, DipConfig, WeightPlan
from knapsack_lb.plugins import ADAPTERS, load_plugin, validate_settings
from knapsack_lb.quantise import Quantised, quantise

ENTRY_POINT_GROUP = ADAPTERS
__all__ = ["AdapterSettings", "ApplyResult", "CheckResult", "Quantised", "load_adapter_class", "make_adapter",
           "parse_settings", "quantise"]
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
class CheckResult:
    """What a read-only check found. ``balancing`` is what the LB does with a weight where the
    adapter can tell (``weighted``: a share of the traffic; ``least_connections``: a scale on a
    server's connection count), for ``klb check`` to hold against the VIP's ``balancing``."""

    ok: bool
    adapter: str
    detail: str = ""
    balancing: Balancing | None = None


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


def load_adapter_class(name: str, field: str = "adapter") -> type[Adapter]:
    """The adapter class registered under ``name`` in the entry-point group."""
    cls: type[Adapter] = load_plugin(ENTRY_POINT_GROUP, name, field)
    return cls


def make_adapter(name: str, settings: Mapping[str, Any]) -> Adapter:
    """Build the adapter ``name`` from its settings (validated by its ``from_config``)."""
    return load_adapter_class(name).from_config(settings)
