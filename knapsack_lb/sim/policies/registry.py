"""Policy names -> factories, so scenarios and the CLI can name a policy.

A factory takes a ``PolicyContext`` (the DIP names, the configured weights, which LB instance it
serves, its params from the scenario) and returns a fresh ``Policy``: every LB instance gets its own
object, so state (round-robin position, EWMAs, chips) is per instance, as in a sidecar or MUX.

Entries are "module:function" strings imported on first use, so a module that is missing or broken
only fails when its policy is asked for. To add a policy: write the module, add one line to
``_ENTRIES`` (name, "module:factory", one-line description).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from knapsack_lb.errors import InvalidInputError
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
    description: str

    def factory(self) -> PolicyFactory:
        module_name, _, attr = self.target.partition(":")
        module = importlib.import_module(module_name)
        factory: PolicyFactory = getattr(module, attr)
        return factory


_ENTRIES: tuple[tuple[str, str, str], ...] = (
    # classic policies (student L7 report, L7 load balancer report)
    ("round_robin", "knapsack_lb.sim.policies.round_robin:make_round_robin", "Round robin over DIPs (not excluded)."),
    (
        "weighted_round_robin",
        "knapsack_lb.sim.policies.round_robin:make_smooth_wrr",
        "Smooth weighted round robin (nginx) over the pushed/configured weights.",
    ),
    (
        "block_weighted_round_robin",
        "knapsack_lb.sim.policies.round_robin:make_block_wrr",
        "Weighted round robin as in the L7 report: each DIP gets `weight` turns in a row.",
    ),
    ("random", "knapsack_lb.sim.policies.random_choice:make_random", "Uniformly random DIP."),
    (
        "weighted_random",
        "knapsack_lb.sim.policies.random_choice:make_weighted_random",
        "Random DIP with probability ~ weight.",
    ),
    (
        "least_connections",
        "knapsack_lb.sim.policies.least_connections:make_least_connections",
        "Join the shortest queue: fewest outstanding at this LB (ties random).",
    ),
    (
        "weighted_least_connections",
        "knapsack_lb.sim.policies.least_connections:make_weighted_least_connections",
        "Fewest (outstanding + 1) / weight (HAProxy leastconn with weights).",
    ),
    (
        "power_of_two",
        "knapsack_lb.sim.policies.least_connections:make_power_of_two",
        "Envoy least_request: two random DIPs, the one with fewer outstanding.",
    ),
    (
        "least_response_time",
        "knapsack_lb.sim.policies.least_response_time:make_least_response_time",
        "Lowest EWMA response time / weight (L7 report).",
    ),
    (
        "hash_ring",
        "knapsack_lb.sim.policies.hash_ring:make_hash_ring",
        "Consistent hash ring on the client address, 100 points per DIP (L7 report).",
    ),
    # KnapsackLB: weights pushed by the controller into smooth WRR (knapsack_lb.sim.knapsack)
    (
        "knapsack",
        "knapsack_lb.sim.policies.round_robin:make_smooth_wrr",
        "KnapsackLB: the project's controller pushes weights into smooth WRR.",
    ),
    # part B: document policies (els, bloc, dl3, grpc_wrr, prequal) add their lines here
    (
        "els",
        "knapsack_lb.sim.policies.els:make_els",
        "Spotify ELS: pick ~ 1 / expected latency (latencies, success rate, outstanding); relative breaker.",
    ),
    (
        "bloc",
        "knapsack_lb.sim.policies.bloc:make_bloc",
        "BLOC (ACSOS'22 IV): confidence chips, Active/Inactive lists, backoff on 429, P2C least connections.",
    ),
    (
        "dl3",
        "knapsack_lb.sim.policies.dl3:make_dl3",
        "DL3: piggybacked server load (T_load) + RTT EWMA (T_RTT), healthy list, probe retraction, P2C.",
    ),
    (
        "grpc_wrr",
        "knapsack_lb.sim.policies.grpc_wrr:make_grpc_wrr",
        "gRPC weighted_round_robin (gRFC A58): ORCA qps/utilisation weights, blackout, expiry, EDF.",
    ),
    (
        "prequal",
        "knapsack_lb.sim.policies.prequal:make_prequal",
        "Prequal (NSDI'24): probes of requests-in-flight and latency, hot-cold lexicographic selection.",
    ),
)

REGISTRY: dict[str, PolicyEntry] = {name: PolicyEntry(name, target, desc) for name, target, desc in _ENTRIES}


def register(name: str, target: str, description: str) -> None:
    """Add a policy at run time (plugins, tests)."""
    REGISTRY[name] = PolicyEntry(name, target, description)


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
