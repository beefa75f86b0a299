"""The controller service: the control loop of every VIP this process leases (KnapsackLB section 5).

Every ``interval`` seconds the service

1. announces itself (heartbeat in group ``controllers``) and takes or renews the leases of its
   share of the VIPs (``acquire_lease``): ``ceil(VIPs / live controllers)``, preferring the VIPs
   rendezvous hashing gives it (:meth:`ControllerService._lease_share`). A VIP leased by another
   live controller is left alone; a controller above its share (another one joined) releases the
   surplus; a dead controller's leases expire after ``lease_ttl`` and its VIPs are taken over by
   the others, resuming from the controller state it stored;
2. ticks each leased VIP's :class:`~knapsack_lb.loop.ControlLoop`, those whose curves changed
   first (the paper prioritises VIPs "with a change in the weight-latency curve"): the source is
   the latency store (one snapshot per tick), the sink the adapter of the operator's load balancer
   the VIP selects (:mod:`knapsack_lb.service.adapters`), pushed from a worker thread.

Everything else - pause, dry run, pins, drains, re-measure requests, confirmation by the LB,
re-applying on drift, persisting plans, curves and state - is the loop's (:mod:`knapsack_lb.loop`).

Identity: every process has its own ``controller_id`` (by default '<hostname>-<pid>-<random>')
and holds it as a lease in group ``controller-ids`` under a random per-process token, so two
processes configured with the same id never both run: the second waits, logging why, until the
first's identity lease expires.

Fencing: a VIP's plan versions only go up. A loop that takes a VIP over starts its versions above
the stored plan's, and the store refuses a plan that is not newer than the stored one
(:class:`~knapsack_lb.errors.StalePlanError`): a controller that was paused (SIGSTOP, a long GC,
a partition) while another took its VIP over drops the VIP instead of pushing its stale plan.

Stopping: when the stop event is set (SIGTERM, SIGINT), every VIP this process runs is left on the
plan ``loop.on_stop`` names before its lease is released (:meth:`ControlLoop.stop`): by default the
last solved plan the LB confirmed, so a controller stopped while learning never leaves the LB on a
measurement plan. A stop ends within the service's stop grace even when every store call hangs (a
hung Redis holds each call for its socket timeout, once per attempt): a pass in flight gets
``STOP_TICK_SECONDS`` and is then cancelled as a crash would end it, the stop plans and the lease
releases their own bounds; what is cut short is logged, and unreleased leases expire by their TTL.

Faults: the store being unreachable never ends the service. A pass that cannot reach it is
abandoned, logged once per outage, and retried with exponential backoff (``RETRY_INITIAL``
doubling up to the interval); meanwhile no lease is renewed, nothing is pushed and the load
balancers keep the last weights they were given. A store or adapter error in one VIP's tick is
logged and counted (``step_failures`` in the controller's status) and the VIP is retried on the
next pass; the others go on.

Time: probe rounds carry wall-clock timestamps, so the service steps its controllers on
``clock.wall()`` when the clock has one (``SystemClock``, ``FakeClock``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from adapters.base import Adapter
from knapsack_lb.clock import Clock, SystemClock, unless_stopped, wait_unless_stopped, within
from knapsack_lb.config import KlbConfig, process_id
from knapsack_lb.controller.core import SolverFn, VipController
from knapsack_lb.controller.settings import ControllerSettings
from knapsack_lb.errors import KnapsackLBError, StalePlanError, StoreUnavailableError, short_repr
from knapsack_lb.loop import APPLY_ERROR, APPLY_FAILURES, APPLY_WARNINGS, ControlLoop, Sink, StoreSource, TickOutcome
from knapsack_lb.model import ApplyResult, TimedRequests, Traffic, VipConfig, WeightPlan
from knapsack_lb.names import validate_name
from knapsack_lb.service.adapters import AdapterFactory, AdapterPool, adapter_factory
from knapsack_lb.store import CONTROLLER_LEASES, CONTROLLER_STATUS, LatencyStore
from probes.assignment import assigned_to

log = logging.getLogger(__name__)
RENEWALS_PER_TTL = 3  # leases are renewed this many times per lease_ttl, also within a long pass
CLOCK_SLACK = 1e-6  # seconds: a wait that ends this close to its target has reached it (float sums)

LEASE_GROUP = CONTROLLER_LEASES
IDENTITY_GROUP = "controller-ids"
RETRY_INITIAL = 0.5  # seconds before the first retry of a pass the store did not answer
# A stop is over within the service's stop grace (10 s) even when every store call hangs: a pass in flight
# may finish within STOP_TICK_SECONDS (then it is cancelled, as a crash would end it), leaving the stop plans
# within STOP_PLANS_SECONDS, handing the leases back within STOP_RELEASE_SECONDS (else they expire).
STOP_TICK_SECONDS = 2.0
STOP_PLANS_SECONDS = 4.0
STOP_RELEASE_SECONDS = 2.0



def _wall(clock: Clock) -> float:
    wall = getattr(clock, "wall", None)
    return float(wall()) if callable(wall) else clock.now()


@dataclass
class AdapterSink:
    """A real load balancer behind its adapter; the adapter's blocking calls run in a thread."""

    adapter: Adapter

    async def apply(self, plan: WeightPlan) -> ApplyResult:
        return await asyncio.to_thread(self.adapter.apply, plan)

    async def read(self) -> Mapping[str, float] | None:
        carried = await asyncio.to_thread(self.adapter.read)
        return carried or None

    async def traffic(self) -> Traffic | None:
        """What the LB counted per DIP, when its adapter can say (``traffic()`` is optional)."""
        counters = getattr(self.adapter, "traffic", None)
        return await asyncio.to_thread(counters) if callable(counters) else None

    async def timings(self) -> Mapping[str, TimedRequests] | None:
        """The client requests the LB timed per DIP since it was last asked, when its adapter can say
        (``timings()`` is optional)."""
        timed = getattr(self.adapter, "timings", None)
        return await asyncio.to_thread(timed) if callable(timed) else None


def no_load_balancers(vip: VipConfig) -> Adapter:
    """The adapter factory of a controller started without a configuration file: it has no
    operator-defined load balancers, so every VIP that selects one is refused by name."""
    return adapter_factory({})(vip)


@dataclass
class ControllerService:
    """Runs the control loops of one controller process; see the module docstring."""

    store: LatencyStore
    settings: ControllerSettings = field(default_factory=ControllerSettings)
    clock: Clock = field(default_factory=SystemClock)
    controller_id: str = field(default_factory=lambda: process_id("controller_id", unique=True))
    adapter_factory: AdapterFactory = no_load_balancers
    solver: SolverFn | None = None
    seed: int = 0
    loops: dict[str, ControlLoop] = field(default_factory=dict)
    rounds: int = 0
    step_failures: int = 0
    store_ready: bool = True
    cpu_seconds: float = 0.0  # process CPU time spent in passes (stepping, store round trips, pushes)
    renewed_at: float = -math.inf  # when the leases were last renewed (clock time)
    leased: set[str] = field(default_factory=set)  # the VIPs whose leases this process holds

    def __post_init__(self) -> None:
        validate_name("controller_id", self.controller_id)
        self.adapters = AdapterPool(self.adapter_factory)
        self.token = secrets.token_hex(8)  # this process's claim on its controller_id

    @property
    def controllers(self) -> dict[str, VipController]:
        """The controller of every VIP this process runs."""
        return {vip: loop.controller for vip, loop in self.loops.items()}

    # --- one pass ---------------------------------------------------------------------------
    async def tick(self) -> list[TickOutcome]:
        """One pass over the VIPs this process can lease."""
        self.rounds += 1
        ttl = self.settings.loop.lease_seconds()
        if not await self._claim_identity(ttl):
            return []
        owned = await self._lease_share(sorted(await self.store.list_vips()), ttl)
        self.leased = set(owned)
        for gone in set(self.loops) - set(owned):
            del self.loops[gone]
        self.adapters.retain(set(owned))
        owned.sort(key=lambda v: (not (v in self.loops and self.loops[v].controller.curves_changed), v))
        outcomes = []
        stepped: dict[str, list[float | int | None]] = {}
        started = time.process_time()
        now = _wall(self.clock)
        for vip in owned:
            if self.clock.now() >= self.renewed_at + ttl / RENEWALS_PER_TTL - CLOCK_SLACK \
                    and not await self.renew_leases():
                break
            if vip not in self.leased:  # lost to another controller at a renewal within this pass
                continue
            try:
                outcome = await (await self._loop(vip)).tick(now)
            except StalePlanError as exc:
                log.warning("a newer plan is in the store: another controller took the VIP over; dropping it",
                            extra={"vip": vip, "error": str(exc)})
                self.loops.pop(vip, None)
                outcome = TickOutcome(vip, error=str(exc))
            except (KnapsackLBError, OSError, ConnectionError, ValueError) as exc:
                self.step_failures += 1
                log.warning("controller step failed", extra={"vip": vip, "error": short_repr(str(exc))})
                outcome = TickOutcome(vip, error=f"{type(exc).__name__}: {short_repr(str(exc))}")
            if outcome.skipped == "no configuration":
                self.loops.pop(vip, None)
            elif not outcome.error and vip in self.loops:
                plan = self.loops[vip].controller.plan
                stepped[vip] = [round(_wall(self.clock), 3), outcome.round_time, 0 if plan is None else plan.version]
            outcomes.append(outcome)
        self.cpu_seconds += time.process_time() - started
        await self.store.put_status(CONTROLLER_STATUS, self.controller_id, {
            "vips": owned, "rounds": self.rounds, "time": _wall(self.clock), "step_failures": self.step_failures,
            "errors": {o.vip: o.error for o in outcomes if o.error}, "stepped": stepped,
            "step_cpu_seconds": round(self.cpu_seconds, 3),
        }, ttl)
        return outcomes

    async def _claim_identity(self, ttl: float) -> bool:
        """Hold this process's ``controller_id`` and announce it (heartbeat); False, with every loop
        dropped, when another live process holds the id."""
        if not await self.store.acquire_lease(IDENTITY_GROUP, self.controller_id, self.token, ttl):
            log.error("controller id is held by another live process; waiting for its lease to expire",
                      extra={"controller_id": self.controller_id})
            self.loops.clear()
            self.leased.clear()
            return False
        await self.store.heartbeat(LEASE_GROUP, self.controller_id, ttl)
        self.renewed_at = self.clock.now()
        return True

    async def renew_leases(self) -> bool:
        """Renew the identity, the heartbeat and the lease of every VIP this process runs, between
        passes and within a long one (every ``lease_ttl / RENEWALS_PER_TTL``), so that a lease as short
        as one interval never lapses while its holder is alive. A VIP whose lease another controller
        holds now is dropped. False when the identity itself was lost."""
        ttl = self.settings.loop.lease_seconds()
        if not await self._claim_identity(ttl):
            return False
        self.leased = set(await self._renew_held(sorted(self.leased), ttl))
        return True

    async def _renew_held(self, vips: list[str], ttl: float) -> list[str]:
        """Renew the leases of ``vips`` (held by this process); those another controller holds now are
        dropped with their loops. The VIPs still held (the callers set :attr:`leased` from it)."""
        held = []
        for vip in vips:
            if await self.store.acquire_lease(LEASE_GROUP, vip, self.controller_id, ttl):
                held.append(vip)
            else:
                log.info("VIP leased by another controller; dropping it", extra={"vip": vip})
                self.loops.pop(vip, None)
        return held

    async def _lease_share(self, vips: list[str], ttl: float) -> list[str]:
        """Take or renew the leases of this process's share of ``vips``; the VIPs it holds now.

        The share is ``ceil(len(vips) / live controllers)``. Held VIPs are renewed (a lease another
        controller holds now is dropped); beyond the share, the held VIPs that rendezvous hashing
        (:func:`probes.assignment.assigned_to`) gives to another live controller are released, so
        that a controller that joins finds them free. Below the share, free VIPs are taken, the
        ones hashing gives this process first: a dead controller's VIPs are taken over once its
        leases and heartbeat expire (``loop.lease_ttl``), and a controller that was only frozen
        finds its VIPs held and does not take them back while the others carry no more than their share.
        """
        live = await self.store.live_members(LEASE_GROUP)
        share = math.ceil(len(vips) / max(1, len(set(live) | {self.controller_id})))
        preferred = assigned_to(self.controller_id, vips, live)
        held = [v for v in vips if v in self.loops]
        excess = len(held) - share
        for vip in sorted(held, key=lambda v: (v in preferred, v)):
            if excess <= 0:
                break
            log.info("VIP handed to another controller (rebalancing)", extra={"vip": vip})
            await self.store.release_lease(LEASE_GROUP, vip, self.controller_id)
            del self.loops[vip]
            held.remove(vip)
            excess -= 1
        owned = await self._renew_held(held, ttl)
        for vip in sorted(set(vips) - set(held), key=lambda v: (v not in preferred, v)):
            if len(owned) >= share:
                break
            if await self.store.acquire_lease(LEASE_GROUP, vip, self.controller_id, ttl):
                owned.append(vip)
        return owned

    async def _loop(self, vip: str) -> ControlLoop:
        loop = self.loops.get(vip)
        if loop is not None:
            return loop
        snap = await self.store.snapshot(vip)
        controller = self._controller(vip, snap.config, snap.controller_state)
        if snap.current_plan is not None:  # fencing: versions continue above whatever is stored
            controller.version = max(controller.version, snap.current_plan.version)
        loop = ControlLoop(controller, StoreSource(self.store, vip), self._sink, lambda: _wall(self.clock),
                           state=self.store, read_at_start=True)
        stored = snap.controller_state or {}
        loop.counters = {key: int(stored[key]) for key in (APPLY_FAILURES, APPLY_WARNINGS)
                         if isinstance(stored.get(key), int)}
        loop.apply_error = str(stored.get(APPLY_ERROR) or "")
        self.loops[vip] = loop
        return loop

    def _sink(self, config: VipConfig) -> Sink | None:
        if config.adapter.lb is None:
            return None
        return AdapterSink(self.adapters.get(config))

    def _controller(self, vip: str, config: VipConfig | None, state: Mapping[str, Any] | None) -> VipController:
        names = [d.name for d in config.dips] if config is not None else []
        rng = random.Random(f"{self.seed}:{vip}")
        if state:
            try:
                ctl = VipController.from_dict(state, self.settings, rng=rng, solver=self.solver)
                log.info("resumed controller state from the store", extra={"vip": vip})
                return ctl
            except (KnapsackLBError, KeyError, TypeError, ValueError) as exc:
                log.warning("stored controller state unusable; starting fresh", extra={"vip": vip, "error": str(exc)})
        return VipController(vip, names, self.settings, rng=rng, solver=self.solver)

    # --- the loop ------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event | None = None, *, max_rounds: int | None = None) -> None:
        """Tick every ``interval`` until ``stop`` is set or ``max_rounds`` passes are done."""
        stop = stop or asyncio.Event()
        done = 0
        retry = RETRY_INITIAL
        while not stop.is_set() and (max_rounds is None or done < max_rounds):
            started = self.clock.now()
            try:
                await unless_stopped(stop, self.tick(), grace=STOP_TICK_SECONDS)
            except StoreUnavailableError as exc:
                if self.store_ready:
                    log.error("the store does not answer; the load balancers keep their weights, retrying",
                              extra={"error": short_repr(str(exc))})
                self.store_ready = False
                await self._sleep(stop, retry)
                retry = min(2 * retry, self.settings.loop.interval)
                continue
            if not self.store_ready:
                log.info("the store answers again; control resumed", extra={"controller_id": self.controller_id})
            self.store_ready, retry = True, RETRY_INITIAL
            done += 1
            if max_rounds is not None and done >= max_rounds:
                break
            await self._wait_renewing(stop, started + self.settings.loop.interval)
        try:
            if stop.is_set():
                await within(STOP_PLANS_SECONDS, self.leave_safe_plans(), log=log, step="leaving the stop plans")
            await within(STOP_RELEASE_SECONDS, self._release_leases(), log=log, step="handing the leases back")
        finally:
            self.adapters.close()

    async def _release_leases(self) -> None:
        for vip in sorted(self.leased | set(self.loops)):
            with contextlib.suppress(KnapsackLBError, OSError, ConnectionError):
                await self.store.release_lease(LEASE_GROUP, vip, self.controller_id)
        with contextlib.suppress(KnapsackLBError, OSError, ConnectionError):
            await self.store.release_lease(IDENTITY_GROUP, self.controller_id, self.token)

    async def leave_safe_plans(self) -> None:
        """On stop, every VIP this process runs is left on the plan ``loop.on_stop`` names (one
        attempt each, in the stop grace; a failure is logged and the LB keeps what it carries)."""
        now = _wall(self.clock)
        for vip, loop in list(self.loops.items()):
            try:
                outcome = await loop.stop(now)
            except (KnapsackLBError, OSError, ConnectionError, ValueError) as exc:
                log.warning("could not leave a safe plan on stop", extra={"vip": vip, "error": short_repr(str(exc))})
                continue
            if outcome.plan is not None and outcome.pushed:
                log.info("left the load balancer on the stop plan", extra={
                    "vip": vip, "version": outcome.plan.version, "method": str(outcome.plan.method),
                    "reason": outcome.plan.reasons[-1] if outcome.plan.reasons else ""})
            elif outcome.error:
                log.warning("could not leave a safe plan on stop", extra={"vip": vip, "error": outcome.error})

    async def _wait_renewing(self, stop: asyncio.Event, until: float) -> None:
        """Sleep until ``until`` (the next pass), renewing the leases every ``lease_ttl / RENEWALS_PER_TTL``."""
        step = self.settings.loop.lease_seconds() / RENEWALS_PER_TTL
        due = self.renewed_at + step
        while not stop.is_set() and self.clock.now() < until - CLOCK_SLACK:
            await self._sleep(stop, max(0.0, min(until, due) - self.clock.now()))
            if stop.is_set() or self.clock.now() >= until - CLOCK_SLACK:
                return
            if self.clock.now() >= due - CLOCK_SLACK:
                with contextlib.suppress(StoreUnavailableError):  # the next pass waits the outage out
                    await self.renew_leases()
                due = self.clock.now() + step

    async def _sleep(self, stop: asyncio.Event, seconds: float) -> None:
        if isinstance(self.clock, SystemClock):
            await wait_unless_stopped(stop, seconds)
        else:
            await self.clock.sleep(seconds)


async def run_controller_service(
    store: LatencyStore,
    settings: ControllerSettings,
    clock: Clock | None = None,
    *,
    controller_id: str | None = None,
    stop: asyncio.Event | None = None,
    max_rounds: int | None = None,
    adapter_factory: AdapterFactory = no_load_balancers,
) -> ControllerService:
    """Build the service and run it until ``stop`` (reusable by ``klb controller`` and ``klb run``)."""
    service = ControllerService(store, settings, clock or SystemClock(),
                                controller_id or process_id("controller_id", unique=True),
                                adapter_factory=adapter_factory)
    await service.run(stop, max_rounds=max_rounds)
    return service


async def run_controller(store: LatencyStore, config: KlbConfig, stop: asyncio.Event) -> None:
    """The ``klb run`` component entry point: the controller with the file's load balancers."""
    await run_controller_service(store, config.controller, stop=stop, controller_id=config.resolved_controller_id(),
                                 adapter_factory=adapter_factory(config.load_balancers))
