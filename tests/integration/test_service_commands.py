"""`klb probe --config`, `klb controller --config` and `klb run --config` as real processes on a real
Redis and real emulated backends: they do their work, and SIGTERM stops them cleanly (exit 0)
with everything they stored still in Redis."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from knapsack_lb.lab.procs import RedisServer
from knapsack_lb.lab.testbed.emulator import EmulatorConfig, EmulatorFleet
from tests.integration.processes import counts, klb, read_store, terminate, wait_until, write_config


@pytest.fixture
def backends() -> Iterator[EmulatorFleet]:
    configs = [EmulatorConfig(name=f"dip{i}", mode="ps", service_time=0.002, distribution="fixed") for i in (1, 2)]
    with EmulatorFleet(configs) as fleet:
        yield fleet


def test_probe_and_controller_processes_from_one_config_stop_cleanly_on_sigterm(
    fresh_redis: RedisServer, backends: EmulatorFleet, tmp_path: Path
) -> None:
    config = write_config(tmp_path, fresh_redis.url, backends)
    probe = klb("probe", "--config", str(config))
    try:
        measured = wait_until(lambda: read_store(fresh_redis, counts), lambda c: c[0] >= 4)
        assert measured[0] >= 4, "the probe worker wrote no rounds"
    finally:
        code, out = terminate(probe)
    assert code == 0, out
    after_stop = read_store(fresh_redis, counts)
    assert after_stop[0] >= measured[0]  # nothing stored was lost by stopping

    controller = klb("controller", "--config", str(config))
    probe = klb("probe", "--config", str(config))
    try:
        stored = wait_until(lambda: read_store(fresh_redis, counts), lambda c: c[1] >= 1, timeout=90)
        assert stored[1] >= 1, "the controller stored no plan"
    finally:
        codes = [terminate(controller), terminate(probe)]
    assert [c for c, _ in codes] == [0, 0], codes
    assert read_store(fresh_redis, counts)[1] >= stored[1]


def test_run_starts_every_component_and_stops_on_sigterm(
    fresh_redis: RedisServer, backends: EmulatorFleet, tmp_path: Path
) -> None:
    config = write_config(tmp_path, fresh_redis.url, backends)
    run = klb("run", "--config", str(config))
    try:
        stored = wait_until(lambda: read_store(fresh_redis, counts), lambda c: c[0] >= 4 and c[1] >= 1, timeout=90)
        assert stored[0] >= 4 and stored[1] >= 1, stored
    finally:
        code, out = terminate(run)
    assert code == 0, out


def test_controller_without_config_or_redis_is_refused() -> None:
    done = subprocess.run([sys.executable, "-m", "knapsack_lb.cli.main", "controller"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0 and "--config" in done.stderr + done.stdout
