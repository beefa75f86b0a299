"""`klb probe --config`, `klb controller --config` and `klb run --config` as real processes on a real
Redis and real emulated backends: they do their work, and SIGTERM stops them cleanly (exit 0)
with everything they stored still in Redis."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from knapsack_lb.lab.procs import RedisServer
from knapsack_lb.lab.testbed.emulator import EmulatorConfig, EmulatorFleet
from knapsack_lb.store.redis import RedisLatencyStore

NAMESPACE = "svc"


@pytest.fixture
def backends() -> Iterator[EmulatorFleet]:
    configs = [EmulatorConfig(name=f"dip{i}", mode="ps", service_time=0.002, distribution="fixed") for i in (1, 2)]
    with EmulatorFleet(configs) as fleet:
        yield fleet


def _config(tmp_path: Path, redis: RedisServer, fleet: EmulatorFleet) -> Path:
    addresses = fleet.addresses
    config = {
        "redis": {"url": redis.url, "namespace": NAMESPACE},
        "vip_source": "config",
        "load_balancers": {"rec": {"adapter": "recording"}},
        "vips": [{
            "name": "web",
            "probe": {"path": "/", "requests_per_round": 5, "interval": 0.5, "timeout": 1.0},
            "adapter": {"lb": "rec"},
            "dips": [{"name": name, "address": address} for name, address in addresses.items()],
        }],
        "controller": {"interval": 0.5},
        "api": {"enabled": False},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _klb(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "knapsack_lb.cli.main", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


async def _stored(redis: RedisServer) -> tuple[int, int]:
    store = RedisLatencyStore.from_url(redis.url, namespace=NAMESPACE)
    try:
        measurements = await store.measurements("web")
        plans = await store.plan_history("web")
        return len(measurements), len(plans)
    finally:
        await store.close()


def _wait_for(redis: RedisServer, done: object, timeout: float = 60.0) -> tuple[int, int]:
    deadline = time.monotonic() + timeout
    counts = (0, 0)
    while time.monotonic() < deadline:
        counts = asyncio.run(_stored(redis))
        if done(counts):  # type: ignore[operator]
            return counts
        time.sleep(0.5)
    return counts


def _terminate(process: subprocess.Popen[bytes]) -> tuple[int, str]:
    process.send_signal(signal.SIGTERM)
    try:
        out, _ = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
    return process.returncode, out.decode(errors="replace")


def test_probe_and_controller_processes_from_one_config_stop_cleanly_on_sigterm(
    fresh_redis: RedisServer, backends: EmulatorFleet, tmp_path: Path
) -> None:
    config = _config(tmp_path, fresh_redis, backends)
    probe = _klb("probe", "--config", str(config))
    try:
        measured = _wait_for(fresh_redis, lambda c: c[0] >= 4)
        assert measured[0] >= 4, "the probe worker wrote no rounds"
    finally:
        code, out = _terminate(probe)
    assert code == 0, out
    after_stop = asyncio.run(_stored(fresh_redis))
    assert after_stop[0] >= measured[0]  # nothing stored was lost by stopping

    controller = _klb("controller", "--config", str(config))
    probe = _klb("probe", "--config", str(config))
    try:
        counts = _wait_for(fresh_redis, lambda c: c[1] >= 1, timeout=90)
        assert counts[1] >= 1, "the controller stored no plan"
    finally:
        codes = [_terminate(controller), _terminate(probe)]
    assert [c for c, _ in codes] == [0, 0], codes
    assert asyncio.run(_stored(fresh_redis))[1] >= counts[1]


def test_run_starts_every_component_and_stops_on_sigterm(
    fresh_redis: RedisServer, backends: EmulatorFleet, tmp_path: Path
) -> None:
    config = _config(tmp_path, fresh_redis, backends)
    run = _klb("run", "--config", str(config))
    try:
        counts = _wait_for(fresh_redis, lambda c: c[0] >= 4 and c[1] >= 1, timeout=90)
        assert counts[0] >= 4 and counts[1] >= 1, counts
    finally:
        code, out = _terminate(run)
    assert code == 0, out


def test_controller_without_config_or_redis_is_refused() -> None:
    done = subprocess.run([sys.executable, "-m", "knapsack_lb.cli.main", "controller"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0 and "--config" in done.stderr + done.stdout
