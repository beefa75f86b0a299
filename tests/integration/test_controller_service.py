"""The controller service against a real Redis and a real Redis Cluster (every test on both):
store round trips, leases, take-over, overrides.

Probe rounds come from the fluid model (written into Redis the way probe workers write them);
the LB is a RecordingAdapter whose weights feed back into the fluid model. Time is a
FakeClock; only the lease expiry waits in real time (Redis TTLs are real).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from adapters.recording import RecordingAdapter
from knapsack_lb.clock import FakeClock
from knapsack_lb.controller.settings import ControllerSettings, LoopSettings, SolverSettings
from knapsack_lb.curves import curve_models
from knapsack_lb.errors import StalePlanError
from knapsack_lb.lab.fluid import FluidDip, FluidModel
from knapsack_lb.model import AdapterSpec, DipConfig, VipConfig, WeightPlan
from knapsack_lb.service.controller import LEASE_GROUP, ControllerService
from knapsack_lb.store.redis import RedisLatencyStore
from tests.conftest import RedisTarget

SETTINGS = ControllerSettings(solver=SolverSettings(units=20_000), loop=LoopSettings(lease_ttl=1.0))


@pytest.fixture
async def store(redis_target: RedisTarget) -> AsyncIterator[RedisLatencyStore]:
    redis_store = redis_target.store(namespace="c" + uuid.uuid4().hex[:10])
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
        self.clock.advance(SETTINGS.loop.interval)
        if self.adapter.read():
            self.model.set_weights(self.adapter.read(), self.clock.now() - SETTINGS.loop.interval)
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
    assert all(c.model in curve_models() for c in curves.values())
    state = await store.controller_state("web")
    assert state is not None and state["vip"] == "web"
    assert len(await store.plan_history("web")) == len(world.adapter.applied)
    assert await store.lease_owner(LEASE_GROUP, "web") == "ctl-a"


async def test_the_service_starts_from_the_weights_the_lb_carries(store: RedisLatencyStore) -> None:
    """An operator's weights (by VM size, say) stand until the first curve: the service reads the
    LB before its first step and does not move it to an equal split."""
    world = await _world(store)
    operator = {"a": 0.1, "b": 0.3, "c": 0.6}
    assert world.adapter.apply(WeightPlan(vip="web", weights=operator)).ok
    service = world.service("ctl-a")
    await service.tick()  # no probe round yet: nothing is known but what the LB carries
    assert world.adapter.read() == pytest.approx(operator)
    plan = await store.current_plan("web")
    assert plan is None or (plan.method == "kept" and plan.weights == pytest.approx(operator))
    await world.probe_round()  # the first round is taken at the operator's weights, and a plan is solved
    await service.tick()
    plan = await store.current_plan("web")
    assert plan is not None and plan.method not in ("kept", "equal-split")


async def test_a_killed_controller_is_taken_over_and_resumed_from_the_store(store: RedisLatencyStore) -> None:
    world = await _world(store)
    first = world.service("ctl-a")
    for _ in range(4):
        await world.probe_round()
        await first.tick()
    before = first.controllers["web"]
    rounds_before, version_before = before.rounds, before.version
    learned = {n: len(d.evidence) for n, d in before.dips.items()}
    assert rounds_before == 4 and all(learned.values())
    # ctl-a dies here without releasing its lease.
    second = world.service("ctl-b")
    await world.probe_round()
    outcomes = await second.tick()
    assert outcomes == [] and "web" not in second.controllers  # the lease is still ctl-a's
    await asyncio.sleep(SETTINGS.loop.lease_ttl + 0.3)
    await world.probe_round()
    await second.tick()
    resumed = second.controllers["web"]
    assert resumed.rounds > rounds_before  # continued, not restarted: its rounds and evidence came along
    assert all(len(resumed.dips[n].evidence) >= count for n, count in learned.items())
    assert await store.lease_owner(LEASE_GROUP, "web") == "ctl-b"
    for _ in range(6):
        await world.probe_round()
        await second.tick()
    plan = await store.current_plan("web")
    assert plan is not None and plan.version >= version_before and plan.method != "equal-split"


async def test_a_stale_owner_cannot_store_or_push_an_older_plan(store: RedisLatencyStore) -> None:
    world = await _world(store)
    stale = world.service("ctl-a")
    for _ in range(3):
        await world.probe_round()
        await stale.tick()
    # ctl-a freezes; ctl-b takes the VIP over once the lease expires and goes on planning
    await asyncio.sleep(SETTINGS.loop.lease_ttl + 0.3)
    fresh = world.service("ctl-b")
    for _ in range(3):
        await world.probe_round()
        await fresh.tick()
    assert await store.lease_owner(LEASE_GROUP, "web") == "ctl-b"
    pushes = len(world.adapter.applied)
    # ctl-a thaws mid-pass, after its lease check: its loop steps and tries to store an older version
    await world.probe_round()
    with pytest.raises(StalePlanError):
        for _ in range(5):
            await stale.loops["web"].tick(world.clock.wall())
            await world.probe_round()
    assert len(world.adapter.applied) == pushes  # the stale plan never reached the LB
    versions = [p.version for p in await store.plan_history("web", limit=100)]
    assert versions == sorted(set(versions))
    await stale.tick()  # its next pass drops the VIP: the lease is ctl-b's
    assert "web" not in stale.loops


async def test_two_services_with_one_controller_id_never_both_run(store: RedisLatencyStore) -> None:
    world = await _world(store)
    first, second = world.service("ctl-a"), world.service("ctl-a")
    await world.probe_round()
    assert [o.vip for o in await first.tick()] == ["web"]
    assert await second.tick() == [] and not second.loops


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
    for _ in range(20):  # learned, and settled
        await world.probe_round()
        await service.tick()
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
        failed += bool(outcome.error)
    assert failed >= 1
    state = await store.controller_state("web")
    assert state is not None and apply_failures(state) == failed


async def test_a_step_that_fails_after_its_plan_is_stored_is_counted_in_status_and_metrics(
        store: RedisLatencyStore, monkeypatch: pytest.MonkeyPatch) -> None:
    from knapsack_lb.api.metrics import gather, render

    world = await _world(store)
    service = world.service("ctl-a")

    async def refuse(vip: str, state: Any) -> None:
        raise ValueError("state refused by the store")

    monkeypatch.setattr(store, "put_controller_state", refuse)
    for _ in range(3):
        await world.probe_round()
        outcome = (await service.tick())[0]
        assert outcome.error is not None and "state refused" in outcome.error
    assert await store.current_plan("web") is not None  # stored, then the step failed
    status = (await store.statuses("controller"))["ctl-a"]
    assert status["step_failures"] == 3 and status["errors"]["web"].startswith("ValueError")
    text = render(await gather(store, world.clock.now())).decode()
    assert 'klb_controller_step_failures_total{controller="ctl-a"} 3.0' in text

LIVE_DIPS = ("a", "b", "c")


async def _behind_lb(store: RedisLatencyStore, backends: dict[str, str], testbed: Any,
                     controller_id: str) -> tuple[FluidModel, FakeClock, ControllerService]:
    """The VIP of LIVE_DIPS at the emulated ``backends`` behind a real LB (a testbed of
    ``knapsack_lb.lab.testbed``); its probe rounds come from a fluid model of the same DIPs (a test
    writes them into the store)."""
    from knapsack_lb.config import LoadBalancerConfig
    from knapsack_lb.service.adapters import adapter_factory

    lbs = {"hx": LoadBalancerConfig(adapter=testbed.adapter_name, settings=testbed.adapter_settings)}
    dips = [FluidDip("a", 1, 100.0), FluidDip("b", 2, 100.0), FluidDip("c", 4, 90.0)]
    model = FluidModel(dips, total_rate=0.7 * sum(d.capacity for d in dips), vip="web", seed=3)
    await store.put_vip(VipConfig(name="web", dips=tuple(DipConfig(name=n, address=backends[n]) for n in LIVE_DIPS),
                                  adapter=AdapterSpec(lb="hx")))
    clock = FakeClock(1000.0)
    return model, clock, ControllerService(store, SETTINGS, clock, controller_id, adapter_factory=adapter_factory(lbs))


async def test_a_refused_apply_keeps_the_confirmed_weights_in_a_real_haproxy(
        store: RedisLatencyStore, tmp_path: Path) -> None:
    """The live environment of the one loop: Redis as source and state, a real HAProxy as sink.
    While HAProxy's admin socket is unreachable every push fails; HAProxy keeps the weights it
    confirmed last, the controller keeps learning only from those, the store's in-force record
    does not move; once the socket is back the pending plan goes through."""
    from adapters.haproxy import HAProxyAdapter
    from knapsack_lb.lab.testbed import lb_harness
    from knapsack_lb.lab.testbed.lb_haproxy import HAProxyTestbed

    with lb_harness.emulated_backends(LIVE_DIPS, tmp_path / "backends") as backends, \
            HAProxyTestbed(backends, tmp_path / "haproxy") as haproxy:
        model, clock, service = await _behind_lb(store, backends, haproxy, "ctl-live")
        reader = HAProxyAdapter.from_config(haproxy.adapter_settings)

        async def round_and_tick() -> Any:
            clock.advance(SETTINGS.loop.interval)
            in_force = await store.in_force("web")
            if in_force is not None:
                model.set_weights(in_force.weights, clock.now() - SETTINGS.loop.interval)
            await store.put_measurements(list(model.measure(clock.now()).values()))
            return (await service.tick())[0]

        for _ in range(6):
            await round_and_tick()
        confirmed = await store.in_force("web")
        assert confirmed is not None
        lb_before = reader.read_integers()
        socket_path = Path(haproxy.socket_path)
        socket_path.rename(socket_path.with_suffix(".away"))  # the admin socket is unreachable
        try:
            refused = 0
            for _ in range(4):
                outcome = await round_and_tick()
                refused += bool(outcome.applied is not None and not outcome.applied.ok)
                ctl = service.controllers["web"]
                assert ctl.confirmed_version == confirmed.version
                assert ctl.in_force == pytest.approx(dict(confirmed.weights))
            assert refused >= 1
        finally:
            socket_path.with_suffix(".away").rename(socket_path)
        assert reader.read_integers() == lb_before
        assert await store.in_force("web") == confirmed
        state = await store.controller_state("web")
        assert state is not None and state["apply_failures"] == refused
        outcome = await round_and_tick()
        assert outcome.pushed and service.controllers["web"].confirmed_version > confirmed.version


@pytest.mark.parametrize("lb", ["haproxy", "nginx", "envoy"])
async def test_the_live_loop_pools_the_requests_the_lb_timed_into_the_rounds(
        lb: str, store: RedisLatencyStore, tmp_path: Path) -> None:
    """A layer-7 LB sending what it timed to the adapter's log_listen (HAProxy's and Nginx's logs over
    syslog, Envoy's gRPC access log): every client request it timed between two ticks reaches the
    controller inside its DIP's round (``lb_timed``; what the budget then does with them:
    tests/unit/test_loop.py)."""
    from knapsack_lb.lab.procs import free_port
    from knapsack_lb.lab.testbed import lb_harness
    from tests.unit.controller.loop import record_steps

    testbed_class = lb_harness.load_testbed_class(lb)
    log_to = f"127.0.0.1:{free_port(kind=testbed_class.log_socket)}"
    with lb_harness.emulated_backends(LIVE_DIPS, tmp_path / "backends", service_time=0.002) as backends, \
            testbed_class(backends, tmp_path / lb, log_to=log_to) as testbed:
        model, clock, service = await _behind_lb(store, backends, testbed, "ctl-logs")

        async def round_and_tick() -> None:
            clock.advance(SETTINGS.loop.interval)
            await store.put_measurements(list(model.measure(clock.now()).values()))
            await service.tick()

        try:
            await round_and_tick()  # the first tick starts the adapter's receiver
            steps = record_steps(service.controllers["web"])
            sent: dict[str, int] = {n: 0 for n in LIVE_DIPS}
            for _ in range(3):
                for backend, count in lb_harness.measure_split(testbed, 150).items():
                    sent[backend] += count
                await asyncio.sleep(1.0)  # the last lines or entries are on their way
                await round_and_tick()
            assert sum(sent.values()) == 450
            timed = {n: sum(rounds[n].lb_timed for rounds in steps if n in rounds) for n in LIVE_DIPS}
            assert timed == sent, (timed, sent)
        finally:
            service.adapters.close()
