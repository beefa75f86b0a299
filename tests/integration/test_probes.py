"""Probe workers against real emulated DIPs and a real Redis (KnapsackLB section 5, KLM)."""

from __future__ import annotations

import asyncio
import random
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from knapsack_lb.clock import FakeClock
from knapsack_lb.errors import InvalidInputError
from knapsack_lb.lab.procs import ManagedProcess, RedisServer, free_port
from knapsack_lb.lab.testbed.emulator import EmulatorConfig, EmulatorFleet
from knapsack_lb.model import DipConfig, Measurement, ProbeSpec, VipConfig, WeightPlan
from knapsack_lb.store import InForce
from knapsack_lb.store.redis import RedisLatencyStore
from probes.assignment import rendezvous_owner
from probes.targets import build_targets, parse_probe_url
from probes.worker import ProbeWorker, ProbeWorkerOptions
from tests.conftest import RedisTarget


def _vip(name: str, addresses: dict[str, str], **probe: object) -> VipConfig:
    """A VIP whose rounds send their requests back to back unless ``spread`` is given: these tests are
    about what a round holds, not when its requests go out."""
    probe.setdefault("spread", 0.0)
    return VipConfig(
        name=name,
        dips=tuple(DipConfig(name=dip, address=address) for dip, address in addresses.items()),
        probe=ProbeSpec(**probe),
    )


@pytest.fixture
async def store(redis_server: RedisServer) -> AsyncIterator[RedisLatencyStore]:
    redis_store = RedisLatencyStore.from_url(redis_server.url, namespace="p" + uuid.uuid4().hex[:10])
    yield redis_store
    await redis_store.close()


async def test_a_round_matches_the_emulators_own_latency(store: RedisLatencyStore) -> None:
    configs = [EmulatorConfig("fast", service_time=0.005, distribution="fixed"),
               EmulatorConfig("slow", service_time=0.02, distribution="fixed")]
    with EmulatorFleet(configs) as fleet:
        config = _vip("web", fleet.addresses, path="/probe", requests_per_round=20, interval=5.0)
        await store.put_vip(config)
        await store.put_plan(WeightPlan(vip="web", weights={"fast": 0.5, "slow": 0.5}, version=2))
        await store.put_in_force("web", InForce({"fast": 0.7, "slow": 0.3}, version=1, at=0.0))  # what the LB carries
        worker = ProbeWorker(store, ProbeWorkerOptions(worker_id="w1"))
        await worker.refresh()
        assert worker.owned == {"web:fast", "web:slow"}
        round_ = {m.dip: m for m in await worker.probe_round("web")}
        assert await worker.flush()
        stored = {m.dip: m for m in await store.measurements("web")}
        assert stored == round_
        for dip in ("fast", "slow"):
            m, stats = round_[dip], fleet.stats(dip)
            assert (m.sent, m.successes, m.errors, m.timeouts) == (20, 20, 0, 0)
            assert stats.successes == 20
            server_mean = stats.mean_server_latency
            assert server_mean is not None and m.latency_mean is not None
            # The probe sees the server's time plus loopback, parsing and (on a busy machine) scheduling.
            assert server_mean <= m.latency_mean <= server_mean * 1.05 + 0.003
            assert m.latency_p50 is not None and m.latency_p99 is not None and m.latency_p50 <= m.latency_p99
            assert m.failure_latency_mean is None and m.worker == "w1"
        assert round_["fast"].weight == 0.7 and round_["slow"].weight == 0.3
        assert fleet.stats("fast").connections == 1  # keep-alive for the whole round


async def test_a_dips_requests_are_spread_over_the_round_or_sent_back_to_back(store: RedisLatencyStore) -> None:
    """With ``spread`` 0.8 the last of five requests goes out in the last fifth of 0.8 s of a 1 s
    interval; with 0 the five go out one after another at once."""
    with EmulatorFleet([EmulatorConfig("d1", service_time=0.001, distribution="fixed")]) as fleet:
        for workers, (spread, shortest, longest) in enumerate(((0.8, 0.64, 1.0), (0.0, 0.0, 0.3)), start=1):
            await store.put_vip(_vip("web", fleet.addresses, requests_per_round=5, interval=1.0, spread=spread))
            worker = ProbeWorker(store, ProbeWorkerOptions(worker_id="w1"), rng=random.Random(3))
            await worker.refresh()
            started = time.perf_counter()
            (m,) = await worker.probe_round("web")
            took = time.perf_counter() - started
            assert m.successes == 5 and shortest <= took < longest, (spread, took)
            assert fleet.stats("d1").connections == workers  # one kept-alive connection per worker


async def test_light_requests_go_to_their_own_path_and_are_stored_with_the_round(store: RedisLatencyStore) -> None:
    """With ``light_path`` set each DIP also gets ``light_requests_per_round`` requests to it, on a
    connection of their own; the round carries their latencies (sorted) and survives the store."""
    configs = [EmulatorConfig("d1", service_time=0.02, distribution="fixed")]
    with EmulatorFleet(configs) as fleet:
        config = _vip("web", fleet.addresses, path="/probe", requests_per_round=4, interval=2.0,
                      light_path="/light?work=0.002", light_requests_per_round=12)
        await store.put_vip(config)
        worker = ProbeWorker(store, ProbeWorkerOptions(worker_id="w1"))
        await worker.refresh()
        (m,) = await worker.probe_round("web")
        assert await worker.flush()
        (stored,) = await store.measurements("web")
        assert stored == m
        stats = fleet.stats("d1")
        assert (m.sent, m.successes, stats.successes) == (4, 4, 4)  # the probes' count is the probes' only
        assert (len(m.light_latencies), m.light_failures, stats.light_probes) == (12, 0, 12)
        assert list(m.light_latencies) == sorted(m.light_latencies)
        # 2 ms of work each; the probes' 20 ms never delay them beyond one probe's service
        assert m.light_latencies[0] >= 0.002 and m.light_latencies[-1] < 0.2
        assert m.latency_mean is not None and m.light_latencies[0] < m.latency_mean
        assert stats.connections == 2  # one kept-alive connection each

        await store.put_vip(_vip("web", fleet.addresses, path="/probe", requests_per_round=4, interval=2.0))
        await worker.refresh()
        (plain,) = await worker.probe_round("web")
        assert (plain.light_latencies, plain.light_failures) == ((), 0)
        assert fleet.stats("d1").light_probes == 12


async def test_failures_are_counted_and_timed_apart(store: RedisLatencyStore) -> None:
    configs = [
        EmulatorConfig("fastfail", failure_probability=1.0, failure_mode="fast", service_time=0.01),
        EmulatorConfig("slowfail", failure_probability=1.0, failure_mode="slow", failure_delay=0.05),
        EmulatorConfig("hang", failure_probability=1.0, failure_mode="slow", failure_delay=5.0),
        EmulatorConfig("half", failure_probability=0.5, failure_mode="fast", service_time=0.002, seed=3),
    ]
    with EmulatorFleet(configs) as fleet:
        addresses = dict(fleet.addresses, refused=f"127.0.0.1:{free_port()}")
        await store.put_vip(_vip("web", addresses, requests_per_round=6, timeout=0.1, interval=5.0))
        worker = ProbeWorker(store, ProbeWorkerOptions(worker_id="w1"))
        await worker.refresh()
        round_ = {m.dip: m for m in await worker.probe_round("web")}
    fast, slow, hang, half, refused = (round_[d] for d in ("fastfail", "slowfail", "hang", "half", "refused"))
    assert (fast.errors, fast.successes, fast.latency_mean) == (6, 0, None)
    assert (slow.errors, slow.timeouts) == (6, 0)
    assert fast.failure_latency_mean is not None and slow.failure_latency_mean is not None
    assert fast.failure_latency_mean < 0.02 <= 0.05 <= slow.failure_latency_mean
    assert (hang.timeouts, hang.errors) == (6, 0)
    assert hang.failure_latency_mean == pytest.approx(0.1, abs=0.05)
    assert refused.errors == 6 and refused.failure_latency_mean is not None and refused.failure_latency_mean < 0.05
    assert half.sent == 6 and 0 < half.errors < 6 and half.successes == 6 - half.errors


async def test_unexpected_status_is_an_error(store: RedisLatencyStore) -> None:
    with EmulatorFleet([EmulatorConfig("d1", service_time=0.001)]) as fleet:
        await store.put_vip(_vip("web", fleet.addresses, requests_per_round=3, expected_status=204))
        worker = ProbeWorker(store, ProbeWorkerOptions(worker_id="w1"))
        await worker.refresh()
        (m,) = await worker.probe_round("web")
    assert (m.errors, m.successes) == (3, 0)


async def test_round_stops_at_the_interval_when_every_request_times_out(store: RedisLatencyStore) -> None:
    with EmulatorFleet([EmulatorConfig("hang", failure_probability=1.0, failure_mode="slow",
                                       failure_delay=5.0)]) as fleet:
        await store.put_vip(_vip("web", fleet.addresses, requests_per_round=100, timeout=0.2, interval=0.5))
        worker = ProbeWorker(store, ProbeWorkerOptions(worker_id="w1"))
        await worker.refresh()
        started = time.perf_counter()
        (m,) = await worker.probe_round("web")
    assert time.perf_counter() - started < 1.0
    assert m.sent == m.timeouts and 2 <= m.sent <= 4


async def test_a_stored_probe_budget_sets_how_many_requests_each_dip_receives(
    store: RedisLatencyStore, caplog: pytest.LogCaptureFixture
) -> None:
    """The controller's budget reaches the emulated DIPs: each gets its entry, a DIP without a valid
    entry gets requests_per_round (a bad value is named in a warning), the budget is read at most
    once per interval, and without one (expired, unreadable, or stale) every DIP gets the uniform share."""
    clock = FakeClock(1000.0)
    with EmulatorFleet([EmulatorConfig(name, service_time=0.001, distribution="fixed") for name in "abc"]) as fleet:
        await store.put_vip(_vip("web", fleet.addresses, requests_per_round=10, interval=5.0))
        worker = ProbeWorker(store, ProbeWorkerOptions(worker_id="w1"), clock=clock)
        served = dict.fromkeys("abc", 0)

        async def round_() -> dict[str, int]:
            sent = {m.dip: m.sent for m in await worker.probe_round("web")}
            for dip in served:
                total = fleet.stats(dip).successes
                assert total - served[dip] == sent[dip], dip  # what the DIP itself received
                served[dip] = total
            return sent

        await store.client.set(store._vk("web", "budget"), '{"a": 4, "b": 20, "c": "x", "gone": 7}')
        with caplog.at_level("WARNING", logger="probes.worker"):
            await worker.refresh()
        assert await round_() == {"a": 4, "b": 20, "c": 10}
        assert any("budget.c" in r.getMessage() and "'x'" in r.getMessage() for r in caplog.records)
        await store.put_probe_budget("web", {"a": 12, "b": 3, "c": 15}, ttl=30.0)
        await worker.refresh()  # within the interval: the budget read last is kept, not read again
        assert await round_() == {"a": 4, "b": 20, "c": 10}
        clock.advance(5.0)
        await worker.refresh()
        assert await round_() == {"a": 12, "b": 3, "c": 15}
        clock.advance(16.0)  # no refresh for more than three intervals (the store was down): uniform
        assert await round_() == dict.fromkeys("abc", 10)
        await store.client.set(store._vk("web", "budget"), "not json")
        with caplog.at_level("WARNING", logger="probes.worker"):
            await worker.refresh()
        assert await round_() == dict.fromkeys("abc", 10)
        assert any("unreadable" in r.getMessage() for r in caplog.records)
        await store.put_probe_budget("web", {"a": 2, "b": 2, "c": 2}, ttl=0.2)  # then its controller dies
        clock.advance(5.0)
        await worker.refresh()
        assert await round_() == dict.fromkeys("abc", 2)
        await asyncio.sleep(0.3)
        clock.advance(5.0)
        await worker.refresh()
        assert await round_() == dict.fromkeys("abc", 10)


def test_bad_addresses_and_urls_are_refused_at_configuration_time() -> None:
    config = _vip("web", {"d1": "no-such-host.invalid:80"})
    with pytest.raises(InvalidInputError, match=r"DIP 'd1'.*does not resolve"):
        build_targets(config)
    with pytest.raises(ValueError, match="address"):
        _vip("web", {"d1": "127.0.0.1:99999"})
    with pytest.raises(InvalidInputError, match="only http://"):
        parse_probe_url("https://127.0.0.1/x", vip="web", dip="d1")
    with pytest.raises(InvalidInputError, match="bad path"):
        parse_probe_url("http://127.0.0.1:81/a b", vip="web", dip="d1")
    assert parse_probe_url("http://127.0.0.1:8081/health?x=1", vip="web", dip="d1") == (
        "127.0.0.1", 8081, "/health?x=1")


async def test_a_vip_with_an_unresolvable_dip_is_skipped_and_others_probed(store: RedisLatencyStore) -> None:
    with EmulatorFleet([EmulatorConfig("d1", service_time=0.001)]) as fleet:
        await store.put_vip(_vip("good", fleet.addresses, requests_per_round=2))
        await store.put_vip(_vip("bad", {"x": "no-such-host.invalid:80"}, requests_per_round=2))
        worker = ProbeWorker(store, ProbeWorkerOptions(worker_id="w1"))
        await worker.refresh()
        assert worker.owned == {"good:d1"}


def _probe_process(target: RedisTarget, namespace: str, worker_id: str, log_dir: Path) -> ManagedProcess:
    # `klb-probe` is `klb probe` without loading the rest of the klb app (faster start).
    argv = [sys.executable, "-m", "knapsack_lb.cli.probe_main", "--redis", target.url, "--namespace", namespace,
            "--worker-id", worker_id, "--duration", "60", "--log-format", "json",
            *(["--redis-cluster"] if target.cluster else [])]
    return ManagedProcess(argv, log_path=log_dir / f"{worker_id}.log").start()


async def _owners(store: RedisLatencyStore, resources: list[str]) -> dict[str, str | None]:
    return {r: await store.lease_owner("probes", r) for r in resources}


async def _wait_for(predicate_coro: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate_coro():  # type: ignore[operator]
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"condition not met within {timeout} s")


@pytest.mark.slow
async def test_three_worker_processes_share_dips_and_take_over_from_a_killed_one(
    redis_target: RedisTarget, tmp_path: Path
) -> None:
    interval = 1.0
    namespace = "p" + uuid.uuid4().hex[:10]
    store = redis_target.store(namespace=namespace)
    dips = [f"d{i}" for i in range(9)]
    resources = [f"web:{d}" for d in dips]
    workers = ["wa", "wb", "wc"]
    with EmulatorFleet([EmulatorConfig(d, service_time=0.001, distribution="fixed") for d in dips]) as fleet:
        await store.put_vip(_vip("web", fleet.addresses, requests_per_round=5, interval=interval))
        procs = {w: _probe_process(redis_target, namespace, w, tmp_path) for w in workers}
        try:
            async def settled() -> bool:
                owners = await _owners(store, resources)
                return all(owners[r] == rendezvous_owner(r, workers) for r in resources)

            await _wait_for(settled, timeout=30)
            owners = await _owners(store, resources)
            victim = max(workers, key=lambda w: sum(o == w for o in owners.values()))
            victim_dips = [r.split(":")[1] for r, o in owners.items() if o == victim]
            assert victim_dips
            procs[victim].signal(signal.SIGKILL)
            killed_at = time.time()
            await asyncio.sleep(2 * interval + 0.5)  # and let the rounds reach Redis
            for dip in victim_dips:
                taken = [m for m in await store.measurements("web", dip, since=killed_at) if m.worker != victim]
                assert taken, f"{dip} was not probed by a survivor after the kill"
                assert min(m.time for m in taken) - killed_at <= 2 * interval, dip
            survivors = [w for w in workers if w != victim]
            assert all(o in survivors for o in (await _owners(store, resources)).values())

            procs["wd"] = _probe_process(redis_target, namespace, "wd", tmp_path)
            members = [*survivors, "wd"]

            async def rebalanced() -> bool:
                owners = await _owners(store, resources)
                return all(owners[r] == rendezvous_owner(r, members) for r in resources)

            await _wait_for(rebalanced, timeout=30)
            assert any(rendezvous_owner(r, members) == "wd" for r in resources)
        finally:
            for proc in procs.values():
                proc.stop()
    await store.close()


@pytest.mark.slow
async def test_redis_outage_buffers_rounds_and_loses_none(fresh_redis: RedisServer) -> None:
    interval = 0.3
    store = RedisLatencyStore.from_url(fresh_redis.url, socket_timeout=0.5)
    with EmulatorFleet([EmulatorConfig(d, service_time=0.001) for d in ("d1", "d2")]) as fleet:
        config = _vip("web", fleet.addresses, requests_per_round=5, interval=interval)
        await store.put_vip(config)
        worker = ProbeWorker(store, ProbeWorkerOptions(worker_id="w1", backoff_initial=0.05, backoff_max=0.2))
        produced: list[Measurement] = []
        original = worker.probe_round

        async def recording_round(vip: str) -> list[Measurement]:
            measurements = await original(vip)
            produced.extend(measurements)
            return measurements

        worker.probe_round = recording_round  # type: ignore[method-assign]
        stop = asyncio.Event()
        running = asyncio.ensure_future(worker.run(stop))
        await _wait_for(lambda: _has_rounds(store, 2), timeout=10)
        fresh_redis.kill()
        killed_at = time.time()
        await asyncio.sleep(6 * interval)
        assert not running.done() and worker.stats.store_errors > 0
        buffered = len(worker.buffer)
        assert buffered >= 3
        restarted = RedisServer(fresh_redis.workdir, port=fresh_redis.port).start()
        try:
            await store.put_vip(config)  # the new Redis is empty (no persistence in this fixture)
            await _wait_for(lambda: _buffer_empty(worker), timeout=10)
            stop.set()
            stats = await running
            assert stats.dropped_rounds == 0
            stored = {(m.dip, m.time) for m in await store.measurements("web")}
            # Rounds written before the kill died with that Redis; every round started after it was buffered.
            during = [m for m in produced if m.time > killed_at]
            assert len(during) >= 2 * (buffered - 1)
            missing = [(m.dip, m.time) for m in during if (m.dip, m.time) not in stored]
            assert not missing
        finally:
            await store.close()
            restarted.stop()


async def _has_rounds(store: RedisLatencyStore, count: int) -> bool:
    return len(await store.measurements("web", "d1")) >= count


async def _buffer_empty(worker: ProbeWorker) -> bool:
    return len(worker.buffer) == 0


def test_klb_probe_refuses_a_bad_redis_url_and_worker_id() -> None:
    from typer.testing import CliRunner

    from knapsack_lb.cli.main import app

    result = CliRunner().invoke(app, ["probe", "--redis", "http://x", "--worker-id", "w1", "--duration", "1"])
    assert result.exit_code == 2 and "redis.url" in result.output
    result = CliRunner().invoke(app, ["probe", "--redis", "redis://127.0.0.1:1/0", "--worker-id", "bad;id"])
    assert result.exit_code == 2 and "worker_id" in result.output


async def test_a_worker_limited_to_one_vip_is_never_given_dips_of_another(store: RedisLatencyStore) -> None:
    addresses = {f"d{i}": f"127.0.0.1:{9000 + i}" for i in range(8)}
    await store.put_vip(_vip("a", addresses))
    await store.put_vip(_vip("b", addresses))
    only_a = ProbeWorker(store, ProbeWorkerOptions(worker_id="only-a", vips=("a",)))
    both = ProbeWorker(store, ProbeWorkerOptions(worker_id="both"))
    for _ in range(3):  # heartbeats first, then everyone sees everyone, then leases settle
        await only_a.refresh()
        await both.refresh()
    assert all(r.startswith("a:") for r in only_a.owned)
    assert {r for r in both.owned if r.startswith("b:")} == {f"b:{d}" for d in addresses}
    assert only_a.owned | both.owned == {f"{v}:{d}" for v in "ab" for d in addresses}
    assert not only_a.owned & both.owned
    assert only_a.owned  # the shared VIP really is shared


async def test_a_corrupt_stored_config_skips_only_that_vip(store: RedisLatencyStore) -> None:
    await store.put_vip(_vip("good", {"d1": "127.0.0.1:9001"}))
    await store.put_vip(_vip("broken", {"d1": "127.0.0.1:9002"}))
    await store.client.set(store._vk("broken", "config"), '{"name": "broken", "dips": "not a list"}')
    worker = ProbeWorker(store, ProbeWorkerOptions(worker_id="w1"))
    await worker.refresh()
    assert worker.owned == {"good:d1"}


@pytest.mark.slow
async def test_beyond_the_buffer_bound_the_oldest_rounds_are_dropped_counted_and_logged(
    fresh_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    interval = 0.2
    store = RedisLatencyStore.from_url(fresh_redis.url, socket_timeout=0.5)
    with EmulatorFleet([EmulatorConfig("d1", service_time=0.001)]) as fleet:
        config = _vip("web", fleet.addresses, requests_per_round=3, interval=interval)
        await store.put_vip(config)
        worker = ProbeWorker(store, ProbeWorkerOptions(worker_id="w1", max_buffered_rounds=2,
                                                       backoff_initial=0.05, backoff_max=0.1))
        stop = asyncio.Event()
        running = asyncio.ensure_future(worker.run(stop))
        await _wait_for(lambda: _has_rounds(store, 1), timeout=10)
        fresh_redis.kill()
        await asyncio.sleep(8 * interval)
        assert len(worker.buffer) == 2 and worker.stats.dropped_rounds >= 2
        assert any("oldest round dropped" in r.getMessage() for r in caplog.records)
        newest = {m.time for m in worker.buffer.peek_all()}
        restarted = RedisServer(fresh_redis.workdir, port=fresh_redis.port).start()
        try:
            await _wait_for(lambda: _buffer_empty(worker), timeout=10)
            stop.set()
            await running
            stored = {m.time for m in await store.measurements("web", "d1")}
            assert newest <= stored
        finally:
            await store.close()
            restarted.stop()
