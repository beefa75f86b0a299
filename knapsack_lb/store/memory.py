"""In-memory latency store, for the simulator and offline tools only.

Implements :class:`knapsack_lb.store.LatencyStore` with the same semantics as
:class:`knapsack_lb.store.redis.RedisLatencyStore` (retention by count and age, bounded
plan history, leases, heartbeats and statuses with TTLs) but in one process and without
durability: every real run uses Redis. Time for leases, heartbeats and statuses comes
from the injected clock (default: a :class:`~knapsack_lb.clock.SystemClock`), so tests and
the simulator control it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from knapsack_lb.clock import Clock, SystemClock
from knapsack_lb.errors import InvalidInputError, StalePlanError
from knapsack_lb.model import Measurement, VipConfig, WeightPlan
from knapsack_lb.names import validate_name
from knapsack_lb.store import (
    DEFAULT_PLAN_HISTORY,
    DEFAULT_RETENTION_COUNT,
    DEFAULT_RETENTION_SECONDS,
    CurveRecord,
    InForce,
    VipSnapshot,
    check_probe_budget,
)


@dataclass
class _VipData:
    config: VipConfig | None = None
    measurements: dict[str, list[Measurement]] = field(default_factory=dict)
    plan: WeightPlan | None = None
    history: list[WeightPlan] = field(default_factory=list)
    curves: dict[str, CurveRecord] = field(default_factory=dict)
    state: dict[str, Any] | None = None
    remeasure: set[str] = field(default_factory=set)
    in_force: InForce | None = None
    budget: tuple[dict[str, int], float] | None = None  # the probe budget and when it expires


class MemoryLatencyStore:
    """The latency store in a dict (see the module docstring). Not shared across processes."""

    def __init__(
        self,
        *,
        retention_count: int = DEFAULT_RETENTION_COUNT,
        retention_seconds: float = DEFAULT_RETENTION_SECONDS,
        plan_history_limit: int = DEFAULT_PLAN_HISTORY,
        clock: Clock | None = None,
    ) -> None:
        if retention_count < 1:
            raise InvalidInputError("retention_count", retention_count, "must be >= 1")
        if retention_seconds <= 0:
            raise InvalidInputError("retention_seconds", retention_seconds, "must be > 0")
        if plan_history_limit < 1:
            raise InvalidInputError("plan_history_limit", plan_history_limit, "must be >= 1")
        self.retention_count = retention_count
        self.retention_seconds = retention_seconds
        self.plan_history_limit = plan_history_limit
        self._clock: Clock = clock or SystemClock()
        self._vips: dict[str, _VipData] = {}
        self._members: dict[str, dict[str, float]] = {}
        self._leases: dict[tuple[str, str], tuple[str, float]] = {}
        self._statuses: dict[str, dict[str, tuple[dict[str, Any], float]]] = {}

    def _vip(self, vip: str) -> _VipData:
        validate_name("vip", vip)
        return self._vips.setdefault(vip, _VipData())

    # --- configuration -----------------------------------------------------------------
    async def put_vip(self, config: VipConfig) -> None:
        self._vip(config.name).config = config

    async def get_vip(self, vip: str) -> VipConfig | None:
        data = self._vips.get(validate_name("vip", vip))
        return data.config if data else None

    async def list_vips(self) -> list[str]:
        return sorted(name for name, data in self._vips.items() if data.config is not None)

    async def delete_vip(self, vip: str) -> None:
        self._vips.pop(validate_name("vip", vip), None)

    # --- measurements --------------------------------------------------------------------
    async def put_measurements(self, measurements: Sequence[Measurement], now: float | None = None) -> None:
        """Store a round and trim each DIP to ``retention_count`` and ``retention_seconds``.

        Age is judged against ``now`` when given, else the newest measurement of the DIP
        in this call (the measurements' own time line).
        """
        touched: dict[tuple[str, str], float] = {}
        for m in measurements:
            series = self._vip(m.vip).measurements.setdefault(m.dip, [])
            series.append(m)
            key = (m.vip, m.dip)
            touched[key] = max(touched.get(key, m.time), m.time)
        for (vip, dip), newest in touched.items():
            series = self._vips[vip].measurements[dip]
            series.sort(key=lambda x: x.time)
            cutoff = (newest if now is None else now) - self.retention_seconds
            kept = [m for m in series if m.time >= cutoff][-self.retention_count :]
            self._vips[vip].measurements[dip] = kept

    async def measurements(
        self, vip: str, dip: str | None = None, since: float | None = None, limit: int | None = None
    ) -> list[Measurement]:
        data = self._vips.get(validate_name("vip", vip))
        if data is None:
            return []
        if dip is not None:
            series = list(data.measurements.get(validate_name("dip", dip), []))
        else:
            series = sorted((m for s in data.measurements.values() for m in s), key=lambda x: (x.time, x.dip))
        if since is not None:
            series = [m for m in series if m.time >= since]
        if limit is not None:
            series = series[-limit:] if limit > 0 else []
        return series

    # --- plans, curves, state -------------------------------------------------------------
    async def put_plan(self, plan: WeightPlan) -> None:
        data = self._vip(plan.vip)
        if plan.version > 0 and data.plan is not None and data.plan.version >= plan.version:
            raise StalePlanError(plan.vip, plan.version, data.plan.version)
        data.plan = plan
        data.history.append(plan)
        del data.history[: -self.plan_history_limit]

    async def current_plan(self, vip: str) -> WeightPlan | None:
        data = self._vips.get(validate_name("vip", vip))
        return data.plan if data else None

    async def plan_history(self, vip: str, limit: int = 100) -> list[WeightPlan]:
        """The last ``limit`` plans, oldest first."""
        data = self._vips.get(validate_name("vip", vip))
        return list(data.history[-limit:]) if data and limit > 0 else []

    async def put_curves(self, vip: str, curves: Sequence[CurveRecord], replace: bool = False) -> None:
        """Upsert curves by DIP; ``replace=True`` drops the VIP's other curves."""
        data = self._vip(vip)
        if replace:
            data.curves = {}
        for record in curves:
            if record.vip != vip:
                raise InvalidInputError("vip", record.vip, f"curve record belongs to another VIP than {vip!r}",
                                        dip=record.dip)
            data.curves[validate_name("dip", record.dip)] = record

    async def curves(self, vip: str) -> dict[str, CurveRecord]:
        data = self._vips.get(validate_name("vip", vip))
        return dict(data.curves) if data else {}

    async def put_controller_state(self, vip: str, state: Mapping[str, Any]) -> None:
        try:
            self._vip(vip).state = json.loads(json.dumps(dict(state)))
        except (TypeError, ValueError) as bad:
            raise InvalidInputError("controller_state", dict(state), f"must be JSON-serialisable: {bad}") from bad

    async def controller_state(self, vip: str) -> dict[str, Any] | None:
        data = self._vips.get(validate_name("vip", vip))
        return copy.deepcopy(data.state) if data and data.state is not None else None

    async def put_in_force(self, vip: str, in_force: InForce) -> None:
        self._vip(vip).in_force = in_force

    async def in_force(self, vip: str) -> InForce | None:
        data = self._vips.get(validate_name("vip", vip))
        return data.in_force if data else None

    async def put_probe_budget(self, vip: str, budget: Mapping[str, int], ttl: float) -> None:
        checked = check_probe_budget(budget, ttl)
        self._vip(vip).budget = (checked, self._clock.now() + ttl)

    async def probe_budget(self, vip: str) -> Any:
        data = self._vips.get(validate_name("vip", vip))
        if data is None or data.budget is None or data.budget[1] <= self._clock.now():
            return None
        return dict(data.budget[0])

    async def request_remeasure(self, vip: str, dip: str) -> None:
        self._vip(vip).remeasure.add(validate_name("dip", dip))

    async def take_remeasure_requests(self, vip: str) -> set[str]:
        data = self._vips.get(validate_name("vip", vip))
        if data is None:
            return set()
        taken, data.remeasure = data.remeasure, set()
        return taken

    async def snapshot(self, vip: str, measurements_since: float | None = None) -> VipSnapshot:
        data = self._vips.get(validate_name("vip", vip)) or _VipData()
        latest = {dip: series[-1] for dip, series in data.measurements.items() if series}
        if measurements_since is not None:
            latest = {dip: m for dip, m in latest.items() if m.time >= measurements_since}
        return VipSnapshot(
            config=data.config, latest=latest, current_plan=data.plan, curves=dict(data.curves),
            controller_state=copy.deepcopy(data.state), remeasure=frozenset(data.remeasure),
            in_force=data.in_force,
        )

    # --- leases and membership -------------------------------------------------------------
    async def heartbeat(self, group: str, member: str, ttl: float) -> None:
        validate_name("group", group)
        validate_name("member", member)
        self._members.setdefault(group, {})[member] = self._clock.now() + ttl

    async def live_members(self, group: str) -> list[str]:
        now = self._clock.now()
        members = self._members.get(validate_name("group", group), {})
        for member in [m for m, expiry in members.items() if expiry <= now]:
            del members[member]
        return sorted(members)

    async def acquire_lease(self, group: str, resource: str, owner: str, ttl: float) -> bool:
        key = (validate_name("group", group), resource)
        validate_name("owner", owner)
        held = self._leases.get(key)
        now = self._clock.now()
        if held is not None and held[1] > now and held[0] != owner:
            return False
        self._leases[key] = (owner, now + ttl)
        return True

    async def release_lease(self, group: str, resource: str, owner: str) -> None:
        key = (group, resource)
        held = self._leases.get(key)
        if held is not None and held[0] == owner:
            del self._leases[key]

    async def lease_owner(self, group: str, resource: str) -> str | None:
        held = self._leases.get((group, resource))
        return held[0] if held is not None and held[1] > self._clock.now() else None

    # --- status --------------------------------------------------------------------------
    async def put_status(self, component: str, member: str, status: Mapping[str, Any], ttl: float) -> None:
        validate_name("component", component)
        validate_name("member", member)
        self._statuses.setdefault(component, {})[member] = (
            json.loads(json.dumps(dict(status))), self._clock.now() + ttl
        )

    async def statuses(self, component: str) -> dict[str, dict[str, Any]]:
        now = self._clock.now()
        entries = self._statuses.get(validate_name("component", component), {})
        return {member: copy.deepcopy(s) for member, (s, expiry) in entries.items() if expiry > now}

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None
