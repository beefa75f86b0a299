"""A controller's leases: one interval long by default, renewed every third of it while the process
lives (between passes and within a long pass), so a live controller never loses a VIP and a dead
one's VIPs are free within an interval."""

from __future__ import annotations

import asyncio

from knapsack_lb.clock import FakeClock
from knapsack_lb.controller.settings import ControllerSettings, LoopSettings, SolverSettings
from knapsack_lb.model import DipConfig, VipConfig
from knapsack_lb.service.controller import LEASE_GROUP, ControllerService
from knapsack_lb.store.memory import MemoryLatencyStore

SETTINGS = ControllerSettings(solver=SolverSettings(units=2_000))
VIP = VipConfig(name="web", dips=(DipConfig(name="a", address="127.0.0.1:8001"),
                                  DipConfig(name="b", address="127.0.0.1:8002")))


async def _two_controllers() -> tuple[FakeClock, MemoryLatencyStore, ControllerService, ControllerService]:
    clock = FakeClock(1000.0)
    store = MemoryLatencyStore(clock=clock)
    await store.put_vip(VIP)
    first = ControllerService(store, SETTINGS, clock, "ctl-a")
    second = ControllerService(store, SETTINGS, clock, "ctl-b")
    assert [o.vip for o in await first.tick()] == ["web"]
    return clock, store, first, second


def test_the_lease_lasts_one_interval_unless_set() -> None:
    assert LoopSettings().lease_seconds() == LoopSettings().interval == 5.0
    assert LoopSettings(interval=2.0).lease_seconds() == 2.0
    assert LoopSettings(lease_ttl=30.0).lease_seconds() == 30.0


async def test_a_live_controller_keeps_its_vip_while_it_waits_for_the_next_pass() -> None:
    clock, store, first, second = await _two_controllers()
    stop = asyncio.Event()
    await first._wait_renewing(stop, clock.now() + 3 * SETTINGS.loop.interval)  # three leases long
    assert await second.tick() == []  # the lease was renewed all along: nothing to take
    assert await store.lease_owner(LEASE_GROUP, "web") == "ctl-a"


async def test_a_dead_controllers_vip_is_taken_within_two_intervals() -> None:
    clock, store, _first, second = await _two_controllers()
    clock.advance(SETTINGS.loop.interval)  # the first controller died right after its pass
    assert [o.vip for o in await second.tick()] == ["web"]
    assert await store.lease_owner(LEASE_GROUP, "web") == "ctl-b"


async def test_a_renewal_drops_a_vip_another_controller_holds_now() -> None:
    clock, _store, first, second = await _two_controllers()
    clock.advance(SETTINGS.loop.interval)  # the first controller froze for a whole lease
    await second.tick()
    assert await first.renew_leases()
    assert first.leased == set() and "web" not in first.loops
