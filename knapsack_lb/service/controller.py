"""The controller service: a thin asyncio loop around ``VipController.step`` (section 5).

Every ``interval`` seconds the service

1. announces itself (heartbeat in group ``controllers``) and takes or renews the lease of
   every VIP it can (``acquire_lease``); a VIP leased by another live controller is left
   alone, a dead controller's leases expire after ``lease_ttl`` and its VIPs are taken over,
   resuming from the controller state it stored;
2. steps its VIPs, those whose curves changed first (the paper prioritises VIPs "with a
   change in the weight-latency curve"): one ``store.snapshot`` round trip, the pure
   ``step``, then the plan, curves and state go back to the store;
3. pushes a new plan through the VIP's adapter (entry point ``knapsack_lb.adapters``), or,
   with no new plan, reads the LB's weights back and re-applies the current plan on a
   mismatch (someone or something changed the LB behind our back).

Operator overrides in the VIP config are honoured: ``paused`` (nothing is computed or
pushed), ``dry_run`` (plans are computed and stored, never pushed), ``pins`` and ``drained``
(fixed weights in every plan); remeasure requests send a DIP back to Algorithm 1.

Time: probe rounds carry wall-clock timestamps, so the service steps its controllers on
``clock.wall()`` when the clock has one (``SystemClock``, ``FakeClock``). Failure: a store
error in one VIP's step is logged and the VIP is retried next round; the others go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from adapters.base import Adapter
from knapsack_lb.clock import Clock, SystemClock
from knapsack_lb.config import KlbConfig
from knapsack_lb.controller.core import SolverFn, VipController
from knapsack_lb.controller.settings import ControllerSettings
from knapsack_lb.errors import KnapsackLBError
from knapsack_lb.model import VipConfig, WeightPlan
from knapsack_lb.names import validate_name
from knapsack_lb.service.adapters import AdapterFactory, AdapterPool, adapter_factory
from knapsack_lb.store import CONTROLLER_LEASES, CONTROLLER_STATUS, LatencyStore

log = logging.getLogger(__name__)

LEASE_GROUP = CONTROLLER_LEASES
MISMATCH_TOLERANCE = 0.01  # total variation distance between planned and read-back weights
APPLY_FAILURES_KEY = "apply_failures"  # failed pushes, kept in the stored controller state


def _wall(clock: Clock) -> float:
    wall = getattr(clock, "wall", None)
    return float(wall()) if callable(wall) else clock.now()


def _distance(a: Mapping[str, float], b: Mapping[str, float]) -> float:
    names = set(a) | set(b)
    return 0.5 * sum(abs(a.get(n, 0.0) - b.get(n, 0.0)) for n in names)


@dataclass
class VipOutcome:
    """What one VIP's step did (for logs, status and tests)."""

    vip: str
    plan: WeightPlan | None = None
    pushed: bool = False
    reapplied: bool = False
    skipped: str = ""
    error: str = ""


def no_load_balancers(vip: VipConfig) -> Adapter:
    """The adapter factory of a controller started without a configuration file: it has no
    operator-defined load balancers, so every VIP that selects one is refused by name."""
    return adapter_factory({})(vip)


@dataclass
class ControllerService:
    """Runs the VIP controllers of one controller process; see the module docstring."""

    store: LatencyStore
    settings: ControllerSettings = field(default_factory=ControllerSettings)
    clock: Clock = field(default_factory=SystemClock)
    controller_id: str = "controller-1"
    adapter_factory: AdapterFactory = no_load_balancers
    solver: SolverFn | None = None
    seed: int = 0
    controllers: dict[str, VipController] = field(default_factory=dict)
    rounds: int = 0

    def __post_init__(self) -> None:
        validate_name("controller_id", self.controller_id)
        self.adapters = AdapterPool(self.adapter_factory)

    # --- one pass ---------------------------------------------------------------------------
    async def tick(self) -> list[VipOutcome]:
        """One pass over the VIPs this process can lease."""
        self.rounds += 1
        ttl = self.settings.lease_ttl
        await self.store.heartbeat(LEASE_GROUP, self.controller_id, ttl)
        owned = []
        for vip in sorted(await self.store.list_vips()):
            if await self.store.acquire_lease(LEASE_GROUP, vip, self.controller_id, ttl):
                owned.append(vip)
            elif vip in self.controllers:
                log.info("VIP leased by another controller; dropping it", extra={"vip": vip})
                del self.controllers[vip]
        for gone in set(self.controllers) - set(owned):
            del self.controllers[gone]
        self.adapters.retain(set(owned))
        owned.sort(key=lambda v: (not (v in self.controllers and self.controllers[v].curves_changed), v))
        outcomes = []
        for vip in owned:
            try:
                outcomes.append(await self.step_vip(vip))
            except (KnapsackLBError, OSError, ConnectionError, ValueError) as exc:
                log.warning("controller step failed", extra={"vip": vip, "error": str(exc)})
                outcomes.append(VipOutcome(vip, error=f"{type(exc).__name__}: {exc}"))
        await self.store.put_status(CONTROLLER_STATUS, self.controller_id, {
            "vips": owned, "rounds": self.rounds, "time": _wall(self.clock),
            "errors": {o.vip: o.error for o in outcomes if o.error},
        }, ttl)
        return outcomes

    def _controller(self, config: VipConfig, state: Mapping[str, Any] | None) -> VipController:
        ctl = self.controllers.get(config.name)
        if ctl is not None:
            return ctl
        rng = random.Random(f"{self.seed}:{config.name}")
        if state:
            try:
                ctl = VipController.from_dict(state, self.settings, rng=rng, solver=self.solver)
                log.info("resumed controller state from the store", extra={"vip": config.name})
            except (KnapsackLBError, KeyError, TypeError, ValueError) as exc:
                log.warning("stored controller state unusable; starting fresh",
                            extra={"vip": config.name, "error": str(exc)})
                ctl = None
        if ctl is None:
            ctl = VipController(config.name, [d.name for d in config.dips], self.settings, rng=rng, solver=self.solver)
        self.controllers[config.name] = ctl
        return ctl

    async def step_vip(self, vip: str) -> VipOutcome:
        snap = await self.store.snapshot(vip)
        config = snap.config
        if config is None:
            return VipOutcome(vip, skipped="no configuration")
        ctl = self._controller(config, snap.controller_state)
        if config.paused:
            return VipOutcome(vip, skipped="paused")
        remeasure = await self.store.take_remeasure_requests(vip)
        now = _wall(self.clock)
        plan = ctl.step(now, snap.latest, config=config, remeasure=remeasure)
        outcome = VipOutcome(vip, plan=plan)
        if plan is not None:
            await self.store.put_plan(plan)
            await self.store.put_curves(vip, ctl.curve_records())
        state = ctl.to_dict()
        state[APPLY_FAILURES_KEY] = int((snap.controller_state or {}).get(APPLY_FAILURES_KEY, 0))
        await self.store.put_controller_state(vip, state)
        if config.dry_run:
            outcome.skipped = "dry run"
            return outcome
        if config.adapter.lb is None:
            outcome.skipped = "no load balancer selected"
            return outcome
        current = plan or ctl.plan
        if current is None:
            return outcome
        adapter = self.adapters.get(config)
        if plan is not None:
            result = await asyncio.to_thread(adapter.apply, plan)
            outcome.pushed = result.ok
            if not result.ok:
                outcome.error = f"adapter {result.adapter} refused the plan: {result.reason}"
                await self._count_apply_failure(vip, state)
            return outcome
        live = await asyncio.to_thread(adapter.read)
        if _distance(live, current.weights) > MISMATCH_TOLERANCE:
            log.warning("LB weights differ from the plan; re-applying", extra={"vip": vip})
            result = await asyncio.to_thread(adapter.apply, current)
            outcome.reapplied = result.ok
            if not result.ok:
                outcome.error = f"re-apply failed: {result.reason}"
                await self._count_apply_failure(vip, state)
        return outcome

    async def _count_apply_failure(self, vip: str, state: dict[str, Any]) -> None:
        """Keep the VIP's count of failed pushes in its stored state (the API's apply-failure metric)."""
        state[APPLY_FAILURES_KEY] += 1
        await self.store.put_controller_state(vip, state)

    # --- the loop ------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event | None = None, *, max_rounds: int | None = None) -> None:
        """Tick every ``interval`` until ``stop`` is set or ``max_rounds`` passes are done."""
        stop = stop or asyncio.Event()
        done = 0
        while not stop.is_set() and (max_rounds is None or done < max_rounds):
            started = self.clock.now()
            await self.tick()
            done += 1
            wait = max(0.0, self.settings.interval - (self.clock.now() - started))
            if max_rounds is not None and done >= max_rounds:
                break
            if isinstance(self.clock, SystemClock):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=wait)
            else:
                await self.clock.sleep(wait)
        for vip in list(self.controllers):
            with contextlib.suppress(KnapsackLBError, OSError, ConnectionError):
                await self.store.release_lease(LEASE_GROUP, vip, self.controller_id)
        self.adapters.close()


async def run_controller_service(
    store: LatencyStore,
    settings: ControllerSettings,
    clock: Clock | None = None,
    *,
    controller_id: str = "controller-1",
    stop: asyncio.Event | None = None,
    max_rounds: int | None = None,
    adapter_factory: AdapterFactory = no_load_balancers,
) -> ControllerService:
    """Build the service and run it until ``stop`` (reusable by ``klb controller`` and ``klb run``)."""
    service = ControllerService(store, settings, clock or SystemClock(), controller_id,
                                adapter_factory=adapter_factory)
    await service.run(stop, max_rounds=max_rounds)
    return service


async def run_controller(store: LatencyStore, config: KlbConfig, stop: asyncio.Event) -> None:
    """The ``klb run`` component entry point: the controller with the file's load balancers."""
    await run_controller_service(store, config.controller, stop=stop,
                                 adapter_factory=adapter_factory(config.load_balancers))
