"""Helpers for tests that run `klb` commands as real processes against a real Redis and real
emulated backends: the configuration file, starting and stopping a command, reading the store."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from knapsack_lb.lab.procs import RedisServer
from knapsack_lb.lab.testbed.emulator import EmulatorFleet
from knapsack_lb.store.redis import RedisLatencyStore

NAMESPACE = "svc"
T = TypeVar("T")


def write_config(tmp_path: Path, redis_url: str, fleet: EmulatorFleet, **loop: Any) -> Path:
    """One VIP over the fleet's DIPs behind a recording 'load balancer', probed every 0.5 s."""
    config = {
        "redis": {"url": redis_url, "namespace": NAMESPACE},
        "vip_source": "config",
        "load_balancers": {"rec": {"adapter": "recording"}},
        "vips": [{
            "name": "web",
            "probe": {"path": "/", "requests_per_round": 5, "interval": 0.5, "timeout": 1.0},
            "adapter": {"lb": "rec"},
            "dips": [{"name": name, "address": address} for name, address in fleet.addresses.items()],
        }],
        "controller": {"loop": {"interval": 0.5, **loop}},
        "api": {"enabled": False},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def klb(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "knapsack_lb.cli.main", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def terminate(process: subprocess.Popen[bytes]) -> tuple[int, str]:
    """SIGTERM, then the exit code and everything the process printed."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        out, _ = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
    return process.returncode, out.decode(errors="replace")


def read_store(redis: RedisServer, read: Callable[[RedisLatencyStore], Any]) -> Any:
    """``await read(store)`` on a fresh connection to ``redis``."""
    async def run() -> Any:
        store = RedisLatencyStore.from_url(redis.url, namespace=NAMESPACE)
        try:
            return await read(store)
        finally:
            await store.close()
    return asyncio.run(run())


async def counts(store: RedisLatencyStore) -> tuple[int, int]:
    """(stored probe rounds of VIP web, stored plans of VIP web)."""
    return len(await store.measurements("web")), len(await store.plan_history("web"))


def wait_until(probe: Callable[[], T], done: Callable[[T], bool], timeout: float = 60.0) -> T:
    """Poll ``probe`` every 0.5 s until ``done`` holds or ``timeout`` passes; the last value."""
    deadline = time.monotonic() + timeout
    value = probe()
    while not done(value) and time.monotonic() < deadline:
        time.sleep(0.5)
        value = probe()
    return value

