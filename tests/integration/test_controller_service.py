"""The controller service against a real Redis: store round trips, leases, take-over, overrides.

Probe rounds come from the fluid model (written into Redis the way probe workers write them);
the LB is a RecordingAdapter whose weights feed back into the fluid model. Time is a
FakeClock; only the lease expiry waits in real time (Redis TTLs are real).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from adapters.recording import RecordingAdapter
from knapsack_lb.clock import FakeClock
from knapsack_lb.controller.settings import ControllerSettings
from knapsack_lb.lab.fluid import FluidDip, FluidModel
from knapsack_lb.lab.procs import RedisServer
from knapsack_lb.model import AdapterSpec, DipConfig, VipConfig
from knapsack_lb.service.controller import LEASE_GROUP, ControllerService
from knapsack_lb.store.redis import RedisLatencyStore

SETTINGS = ControllerSettings(solver_units=20_000, lease_ttl=1.0)


@pytest.fixture
async def store(redis_server: RedisServer) -> AsyncIterator[RedisLatencyStore]:
    redis_store = RedisLatencyStore.from_url(redis_server.url, namespace="c" + uuid.uuid4().hex[:10])
    try:
        yield redis_store
    finally:
        await redis_store.close()


@dataclass
class World:
    """Fluid DIPs behind a recording 'LB', probed into the store once per interval."""

    store: RedisLatencyStore
    clock: FakeClock
    model: FluidModel
    adapter: RecordingAdapter

    async def probe_round(self) -> None:
        self.clock.advance(SETTINGS.interval)
        if self.adapter.read():
            self.model.set_weights(self.adapter.read(), self.clock.now() - SETTINGS.interval)
        rounds = self.model.measure(self.clock.now())
        await self.store.put_measurements(list(rounds.values()))

    def service(self, controller_id: str) -> ControllerService:
        return ControllerService(self.store, SETTINGS, self.clock, controller_id,
                                 adapter_factory=lambda spec: self.adapter)


async def _world(store: RedisLatencyStore, **overrides: object) -> World:
    dips = [FluidDip("a", 1, 100.0), FluidDip("b", 2, 100.0), FluidDip("c", 4, 90.0)]
    model = FluidModel(dips, total_rate=0.7 * sum(d.capacity for d in dips), vip="web", seed=3)
    config = VipConfig(name="web", dips=tuple(DipConfig(name=d.name, address=f"127.0.0.1:{9100 + i}")
                                              for i, d in enumerate(dips)),
                       adapter=AdapterSpec(lb="rec"), **overrides)
    await store.put_vip(config)
    return World(store, FakeClock(1000.0), model, RecordingAdapter())


async def test_the_service_learns_and_pushes_through_the_store(store: RedisLatencyStore) -> None:
    world = await _world(store)
    service = world.service("ctl-a")
    for _ in range(40):
        await world.probe_round()
        await service.tick()
        plan = await store.current_plan("web")
        if plan is not None and "measuring" not in plan.flags:
            break
    plan = await store.current_plan("web")
    assert plan is not None and "measuring" not in plan.flags
    assert world.adapter.applied and world.adapter.applied[-1].version == plan.version
    curves = await store.curves("web")
    assert set(curves) == {"a", "b", "c"} and all(c.w_max > 0 for c in curves.values())
    assert all(c.model in ("quadratic", "queueing", "piecewise") for c in curves.values())
    state = await store.controller_state("web")
    assert state is not None and state["vip"] == "web"
    assert len(await store.plan_history("web")) == len(world.adapter.applied)
    assert await store.lease_owner(LEASE_GROUP, "web") == "ctl-a"


async def test_a_killed_controller_is_taken_over_and_resumed_from_the_store(store: RedisLatencyStore) -> None:
    world = await _world(store)
    first = world.service("ctl-a")
    for _ in range(4):
        await world.probe_round()
        await first.tick()
    rounds_before = first.controllers["web"].measurement_rounds
    assert rounds_before >= 2 and first.controllers["web"].measuring
    # ctl-a dies here without releasing its lease.
    second = world.service("ctl-b")
    await world.probe_round()
    outcomes = await second.tick()
    assert outcomes == [] and "web" not in second.controllers  # the lease is still ctl-a's
    await asyncio.sleep(SETTINGS.lease_ttl + 0.3)
    await world.probe_round()
    await second.tick()
    resumed = second.controllers["web"]
    assert resumed.measurement_rounds >= rounds_before  # continued, not restarted
    assert await store.lease_owner(LEASE_GROUP, "web") == "ctl-b"
    for _ in range(40):
        await world.probe_round()
        await second.tick()
        if not resumed.measuring and resumed.plan is not None and "measuring" not in resumed.plan.flags:
            break
    assert not resumed.measuring
    assert max(d.iterations for d in resumed.dips.values()) <= 10


async def test_dry_run_stores_plans_but_pushes_nothing(store: RedisLatencyStore) -> None:
    world = await _world(store, dry_run=True)
    service = world.service("ctl-a")
    for _ in range(3):
        await world.probe_round()
        outcomes = await service.tick()
    assert outcomes[0].skipped == "dry run"
    assert await store.current_plan("web") is not None and world.adapter.applied == []


async def test_paused_vip_is_left_alone(store: RedisLatencyStore) -> None:
    world = await _world(store, paused=True)
    service = world.service("ctl-a")
    await world.probe_round()
    outcomes = await service.tick()
    assert outcomes[0].skipped == "paused" and await store.current_plan("web") is None


async def test_weights_changed_behind_our_back_are_reapplied(store: RedisLatencyStore) -> None:
    world = await _world(store)
    service = world.service("ctl-a")
    for _ in range(40):
        await world.probe_round()
        await service.tick()
        ctl = service.controllers["web"]
        if not ctl.measuring and ctl.plan is not None and "measuring" not in ctl.plan.flags:
            break
    tampered = {"a": 1.0, "b": 0.0, "c": 0.0}
    reapplied = []
    for _ in range(6):  # a round may bring a new plan of its own; the check runs on rounds without one
        await world.probe_round()
        world.adapter._current = dict(tampered)  # an operator edited the LB by hand just now
        outcome = (await service.tick())[0]
        if outcome.plan is None:
            reapplied.append(outcome.reapplied)
    assert reapplied and all(reapplied)
    assert world.adapter.read() != tampered


async def test_failed_pushes_are_counted_in_the_stored_state(store: RedisLatencyStore) -> None:
    from knapsack_lb.api.metrics import apply_failures

    world = await _world(store)
    service = world.service("ctl-a")
    failed = 0
    for _ in range(6):
        await world.probe_round()
        world.adapter.fail_next = "LB unreachable"
        outcome = (await service.tick())[0]
        failed += outcome.error is not None
    assert failed >= 1
    state = await store.controller_state("web")
    assert state is not None and apply_failures(state) == failed
