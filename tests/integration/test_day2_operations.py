"""Day-2 operations against real load balancers: removing, draining (over a pin), undraining and
stopping, with the controller service on a real Redis and a real HAProxy or Nginx as its sink.

Probe rounds come from the fluid model at the split the LB confirmed (written into Redis the way
probe workers write them); time is a FakeClock. What is asserted is what the LB itself carries,
read back through the adapter.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from adapters.base import Adapter, make_adapter
from knapsack_lb.clock import FakeClock
from knapsack_lb.config import LoadBalancerConfig
from knapsack_lb.controller.settings import ControllerSettings, LoopSettings, SolverSettings
from knapsack_lb.lab.fluid import FluidDip, FluidModel
from knapsack_lb.lab.procs import RedisServer
from knapsack_lb.lab.testbed import lb_harness
from knapsack_lb.model import AdapterSpec, DipConfig, VipConfig
from knapsack_lb.service.adapters import adapter_factory
from knapsack_lb.service.controller import ControllerService
from knapsack_lb.store.redis import RedisLatencyStore

SETTINGS = ControllerSettings(solver=SolverSettings(units=20_000), loop=LoopSettings(lease_ttl=5.0))
NAMES = ("a", "b", "c", "d")


@pytest.fixture(scope="module")
def backends(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    with lb_harness.emulated_backends(NAMES, tmp_path_factory.mktemp("day2-backends")) as addresses:
        yield addresses


@pytest.fixture
async def store(redis_server: RedisServer) -> AsyncIterator[RedisLatencyStore]:
    redis_store = RedisLatencyStore.from_url(redis_server.url, namespace="d" + uuid.uuid4().hex[:10])
    try:
        yield redis_store
    finally:
        await redis_store.close()


@dataclass
class Live:
    """A VIP of four DIPs behind a real LB, its controller service and a reader of the LB."""

    store: RedisLatencyStore
    clock: FakeClock
    model: FluidModel
    service: ControllerService
    reader: Adapter
    backends: dict[str, str]

    def config(self, names: tuple[str, ...] = NAMES, **overrides: Any) -> VipConfig:
        return VipConfig(name="web", dips=tuple(DipConfig(name=n, address=self.backends[n]) for n in names),
                         adapter=AdapterSpec(lb="lb"), **overrides)

    async def tick(self, times: int = 1) -> None:
        for _ in range(times):
            self.clock.advance(SETTINGS.loop.interval)
            in_force = await self.store.in_force("web")
            if in_force is not None:
                self.model.set_weights({n: in_force.weights.get(n, 0.0) for n in self.model.names},
                                       self.clock.now() - SETTINGS.loop.interval)
            vip = await self.store.get_vip("web")
            assert vip is not None
            members = {d.name for d in vip.dips}
            rounds = [m for m in self.model.measure(self.clock.now()).values() if m.dip in members]
            await self.store.put_measurements(rounds)
            await self.service.tick()

    def carried(self) -> dict[str, float]:
        """The split the LB carries (a server that is down or gone carries 0)."""
        return {n: self.reader.read().get(n, 0.0) for n in NAMES}


@pytest.fixture(params=["haproxy", "nginx"])
def lb(request: pytest.FixtureRequest, backends: dict[str, str], tmp_path: Path) -> Iterator[Any]:
    testbed_class = lb_harness.load_testbed_class(request.param)
    with testbed_class(backends, tmp_path / request.param) as testbed:
        yield testbed


async def _live(store: RedisLatencyStore, testbed: Any, backends: dict[str, str],
                settings: ControllerSettings = SETTINGS) -> Live:
    lbs = {"lb": LoadBalancerConfig(adapter=testbed.adapter_name, settings=testbed.adapter_settings)}
    dips = [FluidDip("a", 1, 100.0), FluidDip("b", 2, 100.0), FluidDip("c", 2, 90.0), FluidDip("d", 4, 100.0)]
    model = FluidModel(dips, total_rate=0.6 * sum(d.capacity for d in dips), vip="web", seed=5)
    clock = FakeClock(1000.0)
    service = ControllerService(store, settings, clock, "ctl-day2", adapter_factory=adapter_factory(lbs))
    world = Live(store, clock, model, service, make_adapter(testbed.adapter_name, testbed.adapter_settings),
                 dict(backends))
    await store.put_vip(world.config())
    return world


@pytest.fixture
async def live(store: RedisLatencyStore, lb: Any, backends: dict[str, str]) -> Live:
    world = await _live(store, lb, backends)
    await world.tick(12)
    assert world.carried()["d"] > 0.2  # learned: the 4-core DIP carries the most
    return world


async def test_a_removed_dip_goes_to_zero_in_the_lb_within_one_interval(live: Live) -> None:
    await live.store.put_vip(live.config(("a", "b", "d")))
    await live.tick()
    assert live.carried()["c"] == 0.0
    plan = await live.store.current_plan("web")
    assert plan is not None and "c" not in plan.weights and any("removed" in r for r in plan.reasons)


async def test_a_drain_wins_over_a_pin_and_undrain_ramps(live: Live) -> None:
    await live.store.put_vip(live.config(drained=("d",), pins={"d": 0.5}))
    await live.tick()
    assert live.carried()["d"] == 0.0
    await live.tick(4)
    assert live.carried()["d"] == 0.0
    await live.store.put_vip(live.config())
    await live.tick()
    shares = [live.carried()["d"]]
    assert shares[0] <= 0.05  # slow start: not at once back to its share
    for _ in range(int(SETTINGS.rails.slow_start / SETTINGS.loop.interval) + 2):
        await live.tick()
        shares.append(live.carried()["d"])
    assert shares[-1] > 0.2 and max(b - a for a, b in itertools.pairwise(shares)) < 0.2


async def test_stopping_mid_learning_leaves_a_safe_plan(store: RedisLatencyStore, lb: Any,
                                                        backends: dict[str, str]) -> None:
    """Algorithm 1 puts DIPs at measurement weights; a stop with nothing solved yet leaves equal
    weights over the live DIPs (a drained one stays at 0), applied and confirmed by the LB."""
    world = await _live(store, lb, backends, SETTINGS.tuned(learning={"method": "algorithm1"}))
    await store.put_vip(world.config(drained=("c",)))
    await world.tick(2)
    plan = await store.current_plan("web")
    assert plan is not None and "measuring" in plan.flags
    stop = asyncio.Event()
    stop.set()
    await world.service.run(stop)
    carried = world.carried()
    assert carried["c"] == 0.0 and all(abs(carried[n] - 1 / 3) < 0.02 for n in ("a", "b", "d")), carried
    final = await store.current_plan("web")
    assert final is not None and final.method == "equal-split" and any("stopping" in r for r in final.reasons)
    in_force = await store.in_force("web")
    assert in_force is not None and in_force.version == final.version


@pytest.mark.parametrize(("dips", "problem"), [
    (NAMES, ""),
    (("a", "b", "c"), "server(s) ['d'] of the load balancer map to no DIP"),
    (("a", "b", "c", "d", "e"), "DIP(s) ['e'] map to no server"),
    (None, "selects no load balancer"),
])
async def test_klb_check_refuses_a_mapping_that_does_not_match_the_lb(
        redis_server: RedisServer, lb: Any, dips: tuple[str, ...] | None, problem: str) -> None:
    from knapsack_lb.cli.service_commands import run_checks
    from knapsack_lb.config import parse_config

    addresses = {**lb.backends, "e": lb.backends["a"]}
    vip: dict[str, Any] = {"name": "web", "dips": [{"name": n, "address": addresses[n]} for n in dips or NAMES]}
    if dips is not None:
        vip["adapter"] = {"lb": "lb"}
    config = parse_config({"redis": {"url": redis_server.url},
                           "load_balancers": {"lb": {"adapter": lb.adapter_name, "settings": lb.adapter_settings}},
                           "vips": [vip]}, source="test")
    items = await run_checks(config)
    lb_item = next(i for i in items if i.what == "lb web")
    assert lb_item.ok == (not problem) and problem in lb_item.detail, lb_item


async def test_klb_check_refuses_a_vip_whose_balancing_is_not_what_its_lb_does(
        redis_server: RedisServer, lb: Any) -> None:
    """The testbeds balance by round robin (HAProxy ``balance roundrobin``, Nginx's default): a VIP
    that says least connections would have its weights read as relative capacities."""
    from knapsack_lb.cli.service_commands import run_checks
    from knapsack_lb.config import parse_config

    vip = {"name": "web", "dips": [{"name": n, "address": lb.backends[n]} for n in NAMES], "adapter": {"lb": "lb"}}
    items = {}
    for balancing in ("weighted", "least_connections"):
        config = parse_config({"redis": {"url": redis_server.url},
                               "load_balancers": {"lb": {"adapter": lb.adapter_name, "settings": lb.adapter_settings}},
                               "vips": [{**vip, "balancing": balancing}]}, source="test")
        items[balancing] = next(i for i in await run_checks(config) if i.what == "lb web")
    assert items["weighted"].ok, items
    assert not items["least_connections"].ok
    assert "set balancing: weighted" in items["least_connections"].detail
