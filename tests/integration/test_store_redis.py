"""The latency store contract against a real redis-server, a real Redis Cluster (3 masters with a
replica each) and the in-memory store: the same tests on each.

Every test gets its own key namespace on the session's Redis or Redis Cluster; tests that kill
Redis use their own server (the cluster's failover: test_store_redis_cluster.py).
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import EqualJitterBackoff, NoBackoff

from knapsack_lb.errors import InvalidInputError, StalePlanError, StoreUnavailableError
from knapsack_lb.lab.procs import ManagedProcess, free_listening_port, free_port, require_binary, wait_for_port
from knapsack_lb.model import DipConfig, Measurement, ProbeSpec, VipConfig, WeightPlan
from knapsack_lb.store import CurveRecord, LatencyStore
from knapsack_lb.store.memory import MemoryLatencyStore
from knapsack_lb.store.redis import (
    STORE_BACKOFF_BASE,
    STORE_BACKOFF_CAP,
    STORE_RETRIES,
    RedisLatencyStore,
    create_redis_client,
    redacted_url,
)
from tests.conftest import RedisTarget, make_redis_target


class CountingConnection(aioredis.Connection):
    """Counts writes to the socket: a pipeline is one write, one round trip."""

    sends = 0

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        type(self).sends += 1
        await super().send_packed_command(command, check_health)


class CountingBackoff(EqualJitterBackoff):
    """The store's backoff, counting the waits it computes: one before each retry. Connections
    that deep-copy their retry share this one, so every wait is counted."""

    def __init__(self) -> None:
        super().__init__(cap=STORE_BACKOFF_CAP, base=STORE_BACKOFF_BASE)
        self.computed = 0

    def __deepcopy__(self, memo: dict[int, Any]) -> CountingBackoff:
        return self

    def compute(self, failures: int) -> float:
        self.computed += 1
        return super().compute(failures)


def _namespace() -> str:
    return "t" + uuid.uuid4().hex[:10]


def measurement(dip: str, time: float, *, vip: str = "web", latency: float = 0.01, weight: float = 0.5,
                errors: int = 0, timeouts: int = 0, worker: str = "w1") -> Measurement:
    sent = 100
    return Measurement(
        vip=vip, dip=dip, time=time, weight=weight, sent=sent, successes=sent - errors - timeouts, errors=errors,
        timeouts=timeouts, latency_mean=latency, latency_p50=latency * 0.9, latency_p90=latency * 1.5,
        latency_p99=latency * 3, failure_latency_mean=0.001 if errors else None, worker=worker,
    )


def vip_config(name: str = "web") -> VipConfig:
    return VipConfig(
        name=name,
        dips=(DipConfig(name="d1", address="127.0.0.1:8001"), DipConfig(name="d2", address="127.0.0.1:8002")),
        probe=ProbeSpec(path="/probe", interval=0.5, requests_per_round=10),
    )


@pytest.fixture(params=["redis", "cluster", "memory"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[LatencyStore]:
    if request.param in ("redis", "cluster"):
        target = make_redis_target(request, request.param)
        redis_store = target.store(namespace=_namespace(), retention_count=5, retention_seconds=100.0,
                                   plan_history_limit=3)
        yield redis_store
        await redis_store.close()
    else:
        yield MemoryLatencyStore(retention_count=5, retention_seconds=100.0, plan_history_limit=3)


async def test_vip_config_round_trip_and_list(store: LatencyStore) -> None:
    assert await store.get_vip("web") is None
    await store.put_vip(vip_config("web"))
    await store.put_vip(vip_config("api"))
    assert await store.get_vip("web") == vip_config("web")
    assert await store.list_vips() == ["api", "web"]
    await store.put_measurements([measurement("d1", 1.0)])
    await store.delete_vip("web")
    assert await store.get_vip("web") is None
    assert await store.list_vips() == ["api"]
    assert await store.measurements("web") == []


async def test_measurements_keep_every_field_oldest_first(store: LatencyStore) -> None:
    round_1 = [measurement("d1", 10.0, errors=3, timeouts=2), measurement("d2", 10.0, latency=0.02)]
    round_2 = [measurement("d1", 15.0, latency=0.011), measurement("d2", 15.0, latency=0.021)]
    other_vip = [measurement("d1", 12.0, vip="api")]
    await store.put_measurements(round_1 + other_vip)
    await store.put_measurements(round_2)
    assert await store.measurements("web", "d1") == [round_1[0], round_2[0]]
    assert await store.measurements("web") == [round_1[0], round_1[1], round_2[0], round_2[1]]
    assert await store.measurements("web", since=12.0) == round_2
    assert await store.measurements("web", "d1", limit=1) == [round_2[0]]
    assert await store.measurements("web", limit=3) == [round_1[1], round_2[0], round_2[1]]
    assert await store.measurements("api") == other_vip
    assert (await store.measurements("web", "d1"))[0].failure_latency_mean == 0.001


async def test_retention_by_count(store: LatencyStore) -> None:
    await store.put_measurements([measurement("d1", float(t)) for t in range(8)])
    kept = await store.measurements("web", "d1")
    assert [m.time for m in kept] == [3.0, 4.0, 5.0, 6.0, 7.0]  # retention_count = 5


async def test_retention_by_age_against_an_injected_now(store: LatencyStore) -> None:
    await store.put_measurements([measurement("d1", 10.0), measurement("d1", 50.0)])
    await store.put_measurements([measurement("d1", 120.0)], now=140.0)  # type: ignore[call-arg]
    assert [m.time for m in await store.measurements("web", "d1")] == [50.0, 120.0]  # 10 is older than 100 s


async def test_plans_current_and_bounded_history(store: LatencyStore) -> None:
    assert await store.current_plan("web") is None
    plans = [
        WeightPlan(vip="web", weights={"d1": 0.25 * i, "d2": 1 - 0.25 * i}, version=i, reasons=(f"step {i}",),
                   predicted_latency={"d1": 0.01, "d2": float("nan")})
        for i in range(5)
    ]
    for plan in plans:
        await store.put_plan(plan)
    current = await store.current_plan("web")
    assert current is not None and current.version == 4 and current.reasons == ("step 4",)
    history = await store.plan_history("web", limit=10)
    assert [p.version for p in history] == [2, 3, 4]  # plan_history_limit = 3, oldest first
    assert [p.version for p in await store.plan_history("web", limit=2)] == [3, 4]


async def test_a_plan_not_newer_than_the_stored_one_is_refused(store: LatencyStore) -> None:
    await store.put_plan(WeightPlan(vip="web", weights={"d1": 1.0}, version=5))
    for stale in (5, 3):
        with pytest.raises(StalePlanError) as refused:
            await store.put_plan(WeightPlan(vip="web", weights={"d2": 1.0}, version=stale))
        assert refused.value.stored == 5
    current = await store.current_plan("web")
    assert current is not None and current.weights == {"d1": 1.0}
    await store.put_plan(WeightPlan(vip="web", weights={"d2": 1.0}, version=6))
    await store.put_plan(WeightPlan(vip="web", weights={"d1": 1.0}))  # version 0: a hand-made plan, not fenced
    assert [p.version for p in await store.plan_history("web", limit=10)] == [5, 6, 0]


async def test_an_unreachable_redis_is_a_store_unavailable_error() -> None:
    store = RedisLatencyStore.from_url(f"redis://127.0.0.1:{free_port()}/0", namespace=_namespace())
    try:
        with pytest.raises(StoreUnavailableError):
            await store.list_vips()
        with pytest.raises(StoreUnavailableError):
            await store.put_plan(WeightPlan(vip="web", weights={"d1": 1.0}, version=1))
        assert await store.ping() is False
    finally:
        await store.close()


def test_the_client_carries_the_store_retry_policy_unless_the_caller_gives_one() -> None:
    plain = create_redis_client("redis://127.0.0.1:1/0")
    cluster = create_redis_client("redis://127.0.0.1:1/0", cluster=True)
    assert isinstance(plain, aioredis.Redis) and isinstance(cluster, RedisCluster)
    for retry in (plain.get_retry(), cluster.retry):
        assert isinstance(retry, Retry) and retry.get_retries() == STORE_RETRIES
    own = Retry(NoBackoff(), 5)
    assert create_redis_client("redis://127.0.0.1:1/0", retry=own).get_retry() is own
    assert create_redis_client("redis://127.0.0.1:1/0", cluster=True, retry=own).retry is own


async def test_a_call_is_tried_store_retries_plus_one_times_then_fails() -> None:
    """Against a server that accepts each connection and closes it at once, and against a port
    nothing listens on (where the waits before the retries are counted instead)."""
    accepted = 0

    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        writer.close()

    server = await asyncio.start_server(drop, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    store = RedisLatencyStore.from_url(f"redis://127.0.0.1:{port}/0", namespace=_namespace())
    try:
        with pytest.raises(StoreUnavailableError):
            await store.list_vips()
        assert accepted == STORE_RETRIES + 1
    finally:
        await store.close()
        server.close()
        await server.wait_closed()

    backoff = CountingBackoff()
    store = RedisLatencyStore.from_url(f"redis://127.0.0.1:{free_port()}/0", namespace=_namespace(),
                                       retry=Retry(backoff, STORE_RETRIES))
    try:
        with pytest.raises(StoreUnavailableError):
            await store.list_vips()
        assert backoff.computed == STORE_RETRIES
    finally:
        await store.close()


async def test_curves_state_remeasure_and_snapshot(store: LatencyStore) -> None:
    await store.put_vip(vip_config())
    curve = CurveRecord(vip="web", dip="d1", curve={"kind": "quadratic", "a": 0.01, "b": 0.0, "c": 0.02},
                        w_max=0.6, points=((0.1, 0.011), (0.2, 0.012)), fit_error=0.03, fitted_at=5.0)
    await store.put_curves("web", [curve])
    assert await store.curves("web") == {"d1": curve}
    await store.put_controller_state("web", {"phase": "measure", "step": 3})
    assert await store.controller_state("web") == {"phase": "measure", "step": 3}
    with pytest.raises(InvalidInputError, match="controller_state"):
        await store.put_controller_state("web", {"bad": object()})
    await store.request_remeasure("web", "d2")
    await store.put_measurements([measurement("d1", 1.0), measurement("d1", 2.0), measurement("d2", 1.5)])
    plan = WeightPlan(vip="web", weights={"d1": 0.4, "d2": 0.6})
    await store.put_plan(plan)
    snap = await store.snapshot("web")
    assert snap.config == vip_config()
    assert {d: m.time for d, m in snap.latest.items()} == {"d1": 2.0, "d2": 1.5}
    assert snap.current_plan == plan and snap.curves == {"d1": curve}
    assert snap.controller_state == {"phase": "measure", "step": 3}
    assert snap.remeasure == frozenset({"d2"})
    assert set((await store.snapshot("web", measurements_since=1.8)).latest) == {"d1"}
    assert await store.take_remeasure_requests("web") == {"d2"}
    assert await store.take_remeasure_requests("web") == set()


async def test_a_probe_budget_round_trips_expires_and_refuses_bad_counts(store: LatencyStore) -> None:
    assert await store.probe_budget("web") is None
    await store.put_probe_budget("web", {"d1": 7, "d2": 13}, ttl=30.0)
    assert await store.probe_budget("web") == {"d1": 7, "d2": 13}
    await store.put_probe_budget("web", {"d1": 4}, ttl=30.0)  # the newest allocation replaces the last
    assert await store.probe_budget("web") == {"d1": 4}
    for bad, field in (({"d1": 0}, "probe_budget"), ({"d1": 2.5}, "probe_budget"), ({"d1": True}, "probe_budget"),
                       ({"d 1": 3}, "dip")):
        with pytest.raises(InvalidInputError, match=field):
            await store.put_probe_budget("web", bad, ttl=1.0)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="ttl"):
        await store.put_probe_budget("web", {"d1": 3}, ttl=0.0)
    assert await store.probe_budget("web") == {"d1": 4}
    await store.put_vip(vip_config())
    await store.delete_vip("web")
    assert await store.probe_budget("web") is None


async def test_a_probe_budget_expires_after_its_ttl(store: LatencyStore) -> None:
    await store.put_probe_budget("web", {"d1": 7}, ttl=0.2)
    await asyncio.sleep(0.3)  # on the Redis server's clock, or the memory store's (the system clock here)
    assert await store.probe_budget("web") is None


async def test_an_older_round_flushed_late_does_not_replace_the_latest(store: LatencyStore) -> None:
    await store.put_measurements([measurement("d1", 20.0)])
    await store.put_measurements([measurement("d1", 10.0)])  # a buffered round arriving late
    snap = await store.snapshot("web")
    assert snap.latest["d1"].time == 20.0
    assert [m.time for m in await store.measurements("web", "d1")] == [10.0, 20.0]


async def test_leases_exclusive_renewable_and_released(store: LatencyStore) -> None:
    assert await store.acquire_lease("probes", "web:d1", "w1", ttl=5.0)
    assert await store.acquire_lease("probes", "web:d1", "w1", ttl=5.0)  # renew
    assert not await store.acquire_lease("probes", "web:d1", "w2", ttl=5.0)
    assert await store.lease_owner("probes", "web:d1") == "w1"
    await store.release_lease("probes", "web:d1", "w2")  # not the owner: no effect
    assert await store.lease_owner("probes", "web:d1") == "w1"
    await store.release_lease("probes", "web:d1", "w1")
    assert await store.lease_owner("probes", "web:d1") is None
    assert await store.acquire_lease("probes", "web:d1", "w2", ttl=5.0)


async def test_bad_names_are_refused(store: LatencyStore) -> None:
    with pytest.raises(InvalidInputError, match="vip"):
        await store.get_vip("web;flushall")
    with pytest.raises(InvalidInputError, match="member"):
        await store.heartbeat("probes", "w 1", ttl=1.0)


async def test_redis_lease_expires_and_is_taken_over(redis_target: RedisTarget) -> None:
    store = redis_target.store(namespace=_namespace())
    try:
        assert await store.acquire_lease("probes", "web:d1", "dead", ttl=0.2)
        assert not await store.acquire_lease("probes", "web:d1", "alive", ttl=1.0)
        await asyncio.sleep(0.3)
        assert await store.lease_owner("probes", "web:d1") is None
        assert await store.acquire_lease("probes", "web:d1", "alive", ttl=1.0)
        await store.heartbeat("probes", "dead", ttl=0.2)
        await store.heartbeat("probes", "alive", ttl=5.0)
        assert await store.live_members("probes") == ["alive", "dead"]
        await store.put_status("probe", "dead", {"rounds": 1}, ttl=0.2)
        await store.put_status("probe", "alive", {"rounds": 2}, ttl=5.0)
        await asyncio.sleep(0.3)
        assert await store.live_members("probes") == ["alive"]
        assert await store.statuses("probe") == {"alive": {"rounds": 2}}
    finally:
        await store.close()


async def test_memory_lease_expiry_follows_the_injected_clock() -> None:
    from knapsack_lb.clock import FakeClock

    clock = FakeClock(100.0)
    store = MemoryLatencyStore(clock=clock)
    assert await store.acquire_lease("probes", "web:d1", "dead", ttl=2.0)
    await store.heartbeat("probes", "dead", ttl=2.0)
    clock.advance(1.0)
    assert not await store.acquire_lease("probes", "web:d1", "alive", ttl=2.0)
    assert await store.live_members("probes") == ["dead"]
    clock.advance(1.5)
    assert await store.live_members("probes") == []
    assert await store.acquire_lease("probes", "web:d1", "alive", ttl=2.0)


async def test_one_round_trip_for_a_round_and_for_a_snapshot(redis_target: RedisTarget) -> None:
    """On a cluster too: one VIP's keys are one slot, so its round and its snapshot go to one node."""
    options = {} if redis_target.cluster else {"connection_class": CountingConnection}
    store = redis_target.store(namespace=_namespace(), **options)
    try:
        await store.ping()
        if isinstance(store.client, RedisCluster):  # its nodes build their connections themselves
            for node in store.client.get_nodes():
                await node.disconnect()
                node.connection_class = CountingConnection
        await store.put_vip(vip_config())
        CountingConnection.sends = 0
        await store.put_measurements([measurement(f"d{i}", 1.0) for i in range(1, 21)])
        assert CountingConnection.sends == 1
        CountingConnection.sends = 0
        snap = await store.snapshot("web")
        assert CountingConnection.sends == 1
        assert len(snap.latest) == 20 and snap.config is not None
    finally:
        await store.close()


async def test_acknowledged_writes_survive_a_redis_crash_with_appendonly(tmp_path: Path) -> None:
    port = free_listening_port()
    argv = [require_binary("redis-server"), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "yes", "--appendfsync", "always", "--dir", str(tmp_path)]
    url = f"redis://127.0.0.1:{port}/0"
    with ManagedProcess(argv, log_path=tmp_path / "redis.log") as proc:
        wait_for_port("127.0.0.1", port)
        store = RedisLatencyStore.from_url(url)
        await store.put_vip(vip_config())
        await store.put_measurements([measurement("d1", 1.0), measurement("d2", 1.0)])
        await store.put_plan(WeightPlan(vip="web", weights={"d1": 0.3, "d2": 0.7}, version=7))
        await store.close()
        proc.signal(signal.SIGKILL)
        assert proc.process is not None
        proc.process.wait(timeout=5)
    with ManagedProcess(argv, log_path=tmp_path / "redis.log"):
        wait_for_port("127.0.0.1", port)
        store = RedisLatencyStore.from_url(url)
        for _ in range(50):  # the AOF is loaded before Redis answers commands other than LOADING errors
            try:
                await store.client.ping()
                break
            except aioredis.BusyLoadingError:
                await asyncio.sleep(0.05)
        try:
            assert await store.get_vip("web") == vip_config()
            assert len(await store.measurements("web")) == 2
            plan = await store.current_plan("web")
            assert plan is not None and plan.version == 7
        finally:
            await store.close()


def test_from_url_refuses_a_non_redis_url() -> None:
    with pytest.raises(InvalidInputError, match="redis_url"):
        RedisLatencyStore.from_url("http://127.0.0.1:6379")


def test_messages_show_the_url_without_its_password() -> None:
    assert redacted_url("redis://:s3cret@10.0.0.1:6379/0") == "redis://:***@10.0.0.1:6379/0"
    assert redacted_url("rediss://klb:s3cret@redis.example:6380") == "rediss://klb:***@redis.example:6380"
    assert redacted_url("redis://10.0.0.1:6379/0") == "redis://10.0.0.1:6379/0"
    assert RedisLatencyStore.from_url("redis://:s3cret@127.0.0.1:1/0").url == "redis://:***@127.0.0.1:1/0"


def test_both_stores_implement_the_protocol() -> None:
    assert isinstance(MemoryLatencyStore(), LatencyStore)
    assert isinstance(RedisLatencyStore.from_url("redis://127.0.0.1:1/0"), LatencyStore)


def test_from_url_accepts_the_config_file_names_of_the_retention_settings() -> None:
    store = RedisLatencyStore.from_url("redis://127.0.0.1:1/0", measurement_retention_count=7,
                                       measurement_retention_age=60.0, plan_history=9)
    assert (store.retention_count, store.retention_seconds, store.plan_history_limit) == (7, 60.0, 9)
