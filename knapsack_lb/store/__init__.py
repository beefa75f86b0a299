"""The latency store contract (KnapsackLB paper, section 5 "Latency store").

Probes write measurements; the controller reads them and writes curves, plans and its
own state; the admin API reads everything and writes configuration and operator
overrides. One store is the single source of truth, so a restart of any process loses
nothing. ``RedisLatencyStore`` (:mod:`knapsack_lb.store.redis`) is used by every real run;
``MemoryLatencyStore`` (:mod:`knapsack_lb.store.memory`) only by the simulator and
offline tools.

All methods are coroutines. Keys are namespaced and hash-tagged per VIP
(``klb:{vip}:...``) so one VIP's keys live in one Redis Cluster slot; the writes of one
probe round are one pipeline and ``snapshot(vip)`` is one round trip.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from knapsack_lb.errors import InvalidInputError
from knapsack_lb.model import Measurement, VipConfig, WeightPlan
from knapsack_lb.names import validate_name

# Group and component names shared by the writers (controllers, probe workers) and the readers (API)
# Retention: the one source of these defaults (the configuration's ``redis`` block uses them too).
# 120 rounds at the 5 s interval is 10 minutes, the learner's 600 s window (the controller keeps
# its own evidence in its state; the stored rounds are for the API, the dashboard and debugging).
# Sized so that a 60,000-DIP fleet fits in well under 8 GB of Redis: docs/sizing.md has the arithmetic.
DEFAULT_RETENTION_COUNT = 120
DEFAULT_RETENTION_SECONDS = 600.0
DEFAULT_PLAN_HISTORY = 100
CONTROLLER_LEASES = "controllers"  # lease group of the VIPs controllers own, and their heartbeats
CONTROLLER_STATUS = "controller"  # status component the controllers report under
PROBE_STATUS = "probe"  # status component the probe workers report under


def is_request_count(value: object, most: int | None = None) -> bool:
    """A probe budget entry: an integer (not a bool) from 1 to ``most``."""
    return not isinstance(value, bool) and isinstance(value, int) and 1 <= value <= (most or value)


def check_probe_budget(budget: Mapping[str, int], ttl: float) -> dict[str, int]:
    """A probe budget as the stores accept it (see :meth:`LatencyStore.put_probe_budget`)."""
    if not isinstance(ttl, (int, float)) or not math.isfinite(ttl) or ttl <= 0:
        raise InvalidInputError("ttl", ttl, "must be a number of seconds > 0")
    checked = {}
    for dip, count in budget.items():
        validate_name("dip", dip)
        if not is_request_count(count):
            raise InvalidInputError("probe_budget", count, "requests per round must be an integer >= 1", dip=dip)
        checked[dip] = count
    return checked


@dataclass(frozen=True)
class CurveRecord:
    """A fitted curve as stored: the curve (``curves.curve_from_dict`` form), the DIP's
    ``w_max``, the points it was fitted on, and the fit's quality (held-out error)."""

    vip: str
    dip: str
    curve: Mapping[str, Any]
    w_max: float
    points: Sequence[tuple[float, float]] = ()
    model: str = "quadratic"
    fit_error: float | None = None
    fitted_at: float = 0.0
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class InForce:
    """The weights a load balancer confirmed it carries for a VIP: fractions per DIP, the plan
    version they came from, and when the LB confirmed them (seconds, wall clock). The probe workers
    stamp their rounds with these weights, never with a plan that did not reach the LB."""

    weights: Mapping[str, float]
    version: int
    at: float

    def to_dict(self) -> dict[str, Any]:
        return {"weights": dict(self.weights), "version": self.version, "at": self.at}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> InForce:
        return cls({str(k): float(v) for k, v in data["weights"].items()}, int(data["version"]), float(data["at"]))


@dataclass(frozen=True)
class VipSnapshot:
    """Everything about one VIP, read in one round trip."""

    config: VipConfig | None
    latest: Mapping[str, Measurement]
    current_plan: WeightPlan | None
    curves: Mapping[str, CurveRecord]
    controller_state: Mapping[str, Any] | None
    remeasure: frozenset[str]
    in_force: InForce | None = None


@runtime_checkable
class LatencyStore(Protocol):
    # --- configuration -------------------------------------------------------------
    async def put_vip(self, config: VipConfig) -> None: ...

    async def get_vip(self, vip: str) -> VipConfig | None: ...

    async def list_vips(self) -> list[str]: ...

    async def delete_vip(self, vip: str) -> None: ...

    # --- measurements (probe rounds) -----------------------------------------------
    async def put_measurements(self, measurements: Sequence[Measurement]) -> None:
        """Store one round (any number of DIPs, any VIPs) in one pipeline, applying retention."""
        ...

    async def measurements(
        self, vip: str, dip: str | None = None, since: float | None = None, limit: int | None = None
    ) -> list[Measurement]:
        """Oldest first; ``dip=None`` means all DIPs of the VIP."""
        ...

    # --- plans, curves, controller state -------------------------------------------
    async def put_plan(self, plan: WeightPlan) -> None:
        """Make ``plan`` current and append it to the bounded plan history; a versioned plan (version
        >= 1) not newer than the stored one raises :class:`~knapsack_lb.errors.StalePlanError`."""
        ...

    async def current_plan(self, vip: str) -> WeightPlan | None: ...

    async def plan_history(self, vip: str, limit: int = 100) -> list[WeightPlan]: ...

    async def put_curves(self, vip: str, curves: Sequence[CurveRecord], replace: bool = False) -> None: ...

    async def curves(self, vip: str) -> dict[str, CurveRecord]: ...

    async def put_controller_state(self, vip: str, state: Mapping[str, Any]) -> None: ...

    async def put_in_force(self, vip: str, in_force: InForce) -> None:
        """Record the weights the VIP's load balancer confirmed it carries."""
        ...

    async def in_force(self, vip: str) -> InForce | None: ...

    async def controller_state(self, vip: str) -> dict[str, Any] | None: ...

    async def put_probe_budget(self, vip: str, budget: Mapping[str, int], ttl: float) -> None:
        """Store the requests per round each DIP of ``vip`` gets (the controller's allocation,
        :mod:`knapsack_lb.controller.budget`) for ``ttl`` seconds, so that a dead controller's budget
        expires and the probes go back to the uniform ``requests_per_round``. Refuses
        (:class:`~knapsack_lb.errors.InvalidInputError`) a DIP name that is not one or a count that is
        not an integer >= 1."""
        ...

    async def probe_budget(self, vip: str) -> Any:
        """The stored budget as written (JSON: a DIP -> count object), ``None`` when there is none or it
        expired. Readers validate it (:func:`probes.worker.valid_budget`); unreadable JSON raises
        ``ValueError``."""
        ...

    async def request_remeasure(self, vip: str, dip: str) -> None: ...

    async def take_remeasure_requests(self, vip: str) -> set[str]: ...

    async def snapshot(self, vip: str, measurements_since: float | None = None) -> VipSnapshot: ...

    # --- leases (probe workers share DIPs, controllers share VIPs) ------------------
    async def heartbeat(self, group: str, member: str, ttl: float) -> None:
        """Announce ``member`` alive in ``group`` for ``ttl`` seconds."""
        ...

    async def live_members(self, group: str) -> list[str]: ...

    async def acquire_lease(self, group: str, resource: str, owner: str, ttl: float) -> bool:
        """Take or renew ``resource`` for ``owner``; False if another live owner holds it."""
        ...

    async def release_lease(self, group: str, resource: str, owner: str) -> None: ...

    async def lease_owner(self, group: str, resource: str) -> str | None: ...

    # --- status --------------------------------------------------------------------
    async def put_status(self, component: str, member: str, status: Mapping[str, Any], ttl: float) -> None: ...

    async def statuses(self, component: str) -> dict[str, dict[str, Any]]: ...

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...
