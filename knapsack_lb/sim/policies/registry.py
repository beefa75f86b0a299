"""Policy names -> factories, so scenarios and the CLI can name a policy.

A factory takes a ``PolicyContext`` (the DIP names, the configured weights, which LB instance it
serves, its params from the scenario) and returns a fresh ``Policy``: every LB instance gets its own
object, so state (round-robin position, EWMAs, chips) is per instance, as in a sidecar or MUX.

Policies are entry points of the group ``knapsack_lb.policies`` (the project's own are listed in
pyproject.toml), so a third party adds one with its own distribution. A factory is imported on
first use, so a module that is missing or broken only fails when its policy is asked for; the
first line of its docstring is the policy's description. To add a policy: write the module with
its factory, add one entry point line.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from knapsack_lb.errors import InvalidInputError
from knapsack_lb.plugins import POLICIES
from knapsack_lb.sim.policies.base import Policy


@dataclass(frozen=True)
class PolicyContext:
    """What a factory may use to build a policy for one LB instance."""

    dip_names: tuple[str, ...]
    weights: tuple[float, ...]  # configured weights (scenario), one per DIP
    lb_index: int = 0
    lb_count: int = 1
    seed: int = 0
    params: Mapping[str, Any] = field(default_factory=dict)


PolicyFactory = Callable[[PolicyContext], Policy]


@dataclass(frozen=True)
class PolicyEntry:
    name: str
    target: str  # "module:factory"

    def factory(self) -> PolicyFactory:
        module_name, _, attr = self.target.partition(":")
        module = importlib.import_module(module_name)
        factory: PolicyFactory = getattr(module, attr)
        return factory

    @property
    def description(self) -> str:
        """The first line of the factory's docstring (imports the policy's module)."""
        doc = (self.factory().__doc__ or "").strip()
        return doc.splitlines()[0] if doc else ""


REGISTRY: dict[str, PolicyEntry] = {ep.name: PolicyEntry(ep.name, ep.value) for ep in entry_points(group=POLICIES)}


def register(name: str, target: str) -> None:
    """Add a policy at run time (tests; distributions use the entry point group)."""
    REGISTRY[name] = PolicyEntry(name, target)


def policy_names() -> list[str]:
    return list(REGISTRY)


def make_policy(name: str, ctx: PolicyContext) -> Policy:
    """A fresh policy for one LB instance; unknown names raise InvalidInputError."""
    entry = REGISTRY.get(name)
    if entry is None:
        raise InvalidInputError("policy", name, f"unknown policy (known: {', '.join(REGISTRY)})")
    try:
        return entry.factory()(ctx)
    except TypeError as exc:
        raise InvalidInputError(
            "policy.params", dict(ctx.params), f"policy {name!r} rejected its params: {exc}"
        ) from exc
