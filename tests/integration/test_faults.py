"""Faults with real processes: Redis killed under `klb run` and under separate `klb probe` /
`klb controller`, Redis down at start, two controllers from one configuration, and a controller
frozen (SIGSTOP) while a standby takes its VIP over. Redis runs with an fsync'ed append-only file,
as a production Redis that must not lose acknowledged writes does."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from knapsack_lb.lab.procs import RedisServer, free_listening_port
from knapsack_lb.lab.testbed.emulator import EmulatorConfig, EmulatorFleet
from knapsack_lb.service.controller import LEASE_GROUP
from knapsack_lb.store import CONTROLLER_STATUS
from knapsack_lb.store.redis import RedisLatencyStore
from tests.integration.processes import counts, klb, read_store, terminate, wait_until, write_config

OUTAGE = 20.0  # seconds Redis stays down
INTERVAL = 0.5  # the controller's and the probes' interval in these tests


@pytest.fixture
def backends() -> Iterator[EmulatorFleet]:
    configs = [EmulatorConfig(name=f"dip{i}", mode="ps", service_time=0.002, distribution="fixed") for i in (1, 2)]
    with EmulatorFleet(configs) as fleet:
        yield fleet


@pytest.fixture
def durable_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis", persistent=True).start()
    try:
        yield server
    finally:
        server.stop()


async def _plan_versions(store: RedisLatencyStore) -> list[int]:
    return [p.version for p in await store.plan_history("web", limit=1000)]


async def _controller_status(store: RedisLatencyStore) -> dict[str, dict[str, object]]:
    return await store.statuses(CONTROLLER_STATUS)


async def _web_lease_owner(store: RedisLatencyStore) -> str | None:
    return await store.lease_owner(LEASE_GROUP, "web")


async def _round_times(store: RedisLatencyStore) -> list[float]:
    return [m.time for m in await store.measurements("web")]


def _alive(*processes: subprocess.Popen[bytes]) -> bool:
    return all(p.poll() is None for p in processes)


def _outage(redis: RedisServer, *processes: subprocess.Popen[bytes]) -> tuple[float, float]:
    """Kill Redis, keep it down for ``OUTAGE`` seconds while checking nothing exits, restart it."""
    redis.kill()
    down = time.time()
    deadline = time.monotonic() + OUTAGE
    while time.monotonic() < deadline:
        assert _alive(*processes), "a component exited while Redis was down"
        time.sleep(0.5)
    redis.start()
    return down, time.time()


def _resumed_after(redis: RedisServer, since: float) -> bool:
    """The controller reported after ``since`` (its status is written at the end of every pass)."""
    statuses = read_store(redis, _controller_status)
    return any(float(s.get("time", 0.0)) > since for s in statuses.values())  # type: ignore[arg-type]


def _check_recovery(redis: RedisServer, before: tuple[int, int], down: float, up: float) -> None:
    resumed = wait_until(lambda: _resumed_after(redis, up), bool, timeout=4 * INTERVAL + 2.0)
    assert resumed, "the controller did not resume within a few intervals of Redis coming back"
    after = wait_until(lambda: read_store(redis, counts), lambda c: c[0] > before[0], timeout=10)
    assert after[0] >= before[0]  # nothing stored before the outage was lost
    # the probe worker retries the store with backoff (at most 5 s): its buffer may land after the controller resumed
    times = wait_until(lambda: read_store(redis, _round_times), lambda ts: any(down < t < up for t in ts), timeout=15)
    assert any(down < t < up for t in times), "rounds probed during the outage were not written when Redis returned"
    versions = read_store(redis, _plan_versions)
    assert versions == sorted(set(versions))


def test_klb_run_keeps_running_through_a_redis_outage(
    durable_redis: RedisServer, backends: EmulatorFleet, tmp_path: Path
) -> None:
    run = klb("run", "--config", str(write_config(tmp_path, durable_redis.url, backends)))
    try:
        before = wait_until(lambda: read_store(durable_redis, counts), lambda c: c[0] >= 4 and c[1] >= 1, 90)
        assert before[1] >= 1, before
        down, up = _outage(durable_redis, run)
        _check_recovery(durable_redis, before, down, up)
    finally:
        code, out = terminate(run)
    assert code == 0, out


def test_separate_probe_and_controller_keep_running_through_a_redis_outage(
    durable_redis: RedisServer, backends: EmulatorFleet, tmp_path: Path
) -> None:
    config = str(write_config(tmp_path, durable_redis.url, backends))
    probe, controller = klb("probe", "--config", config), klb("controller", "--config", config)
    try:
        before = wait_until(lambda: read_store(durable_redis, counts), lambda c: c[0] >= 4 and c[1] >= 1, 90)
        assert before[1] >= 1, before
        down, up = _outage(durable_redis, probe, controller)
        _check_recovery(durable_redis, before, down, up)
    finally:
        codes = [terminate(probe), terminate(controller)]
    assert [c for c, _ in codes] == [0, 0], codes


def test_every_component_waits_for_redis_at_start(backends: EmulatorFleet, tmp_path: Path) -> None:
    redis = RedisServer(tmp_path / "redis", port=free_listening_port(), persistent=True)
    run = klb("run", "--config", str(write_config(tmp_path, redis.url, backends)))
    try:
        time.sleep(3.0)
        assert _alive(run), "klb run exited while Redis was not there yet"
        redis.start()
        stored = wait_until(lambda: read_store(redis, counts), lambda c: c[0] >= 2 and c[1] >= 1, 60)
        assert stored[0] >= 2 and stored[1] >= 1, stored
    finally:
        code, out = terminate(run)
        redis.stop()
    assert code == 0, out


def test_two_controllers_from_one_config_have_exactly_one_owner(
    fresh_redis: RedisServer, backends: EmulatorFleet, tmp_path: Path
) -> None:
    config = str(write_config(tmp_path, fresh_redis.url, backends))
    probe = klb("probe", "--config", config)
    first, second = klb("controller", "--config", config), klb("controller", "--config", config)
    try:
        statuses = wait_until(lambda: read_store(fresh_redis, _controller_status), lambda s: len(s) == 2, 60)
        assert len(statuses) == 2, "both controllers run, under distinct ids"
        wait_until(lambda: read_store(fresh_redis, counts), lambda c: c[1] >= 3, 60)
        owners = [cid for cid, s in read_store(fresh_redis, _controller_status).items() if s.get("vips")]
        assert len(owners) == 1, owners
        versions = read_store(fresh_redis, _plan_versions)
        assert versions == sorted(set(versions)) and len(versions) >= 3
    finally:
        codes = [terminate(p) for p in (probe, first, second)]
    assert [c for c, _ in codes] == [0, 0, 0], codes


def test_the_same_controller_id_twice_runs_once(
    fresh_redis: RedisServer, backends: EmulatorFleet, tmp_path: Path
) -> None:
    config = str(write_config(tmp_path, fresh_redis.url, backends))
    probe = klb("probe", "--config", config)
    first = klb("controller", "--config", config, "--controller-id", "ctl")
    second = klb("controller", "--config", config, "--controller-id", "ctl")
    try:
        wait_until(lambda: read_store(fresh_redis, counts), lambda c: c[1] >= 4, 60)
        versions = read_store(fresh_redis, _plan_versions)
        assert versions == sorted(set(versions)) and len(versions) >= 4
    finally:
        codes = [terminate(p) for p in (probe, first, second)]
    assert [c for c, _ in codes] == [0, 0, 0], codes
    assert "held by another live process" in codes[1][1] + codes[2][1]


def test_a_frozen_owner_is_taken_over_and_never_writes_an_older_plan(
    fresh_redis: RedisServer, backends: EmulatorFleet, tmp_path: Path
) -> None:
    ttl = 2.0
    config = str(write_config(tmp_path, fresh_redis.url, backends, lease_ttl=ttl))
    probe = klb("probe", "--config", config)
    owner = klb("controller", "--config", config)
    try:
        wait_until(lambda: read_store(fresh_redis, counts), lambda c: c[1] >= 2, 60)
        owner_id = next(iter(read_store(fresh_redis, _controller_status)))
        standby = klb("controller", "--config", config)
        try:
            time.sleep(2.0)
            owner.send_signal(signal.SIGSTOP)
            holder = wait_until(lambda: read_store(fresh_redis, _web_lease_owner),
                                lambda h: h not in (None, owner_id), timeout=3 * ttl + 10)
            assert holder not in (None, owner_id), "the standby did not take the VIP over"
            time.sleep(3 * ttl)
            owner.send_signal(signal.SIGCONT)
            time.sleep(3 * ttl)
            assert read_store(fresh_redis, _web_lease_owner) == holder  # the thawed owner did not take it back
            versions = read_store(fresh_redis, _plan_versions)
            assert versions == sorted(set(versions)), versions  # never backwards, never a duplicate
        finally:
            owner.send_signal(signal.SIGCONT)
            standby_code = terminate(standby)
    finally:
        codes = [terminate(probe), terminate(owner)]
    assert [c for c, _ in codes] == [0, 0] and standby_code[0] == 0, (codes, standby_code)
