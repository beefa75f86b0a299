"""`klb bench fleet` on a tiny fleet: two real `klb controller` processes on a real Redis share six VIPs,
every VIP gets a plan, the lag is measured, and after one controller is SIGKILLed the other steps its
VIPs within two intervals (the controllers' default lease: one interval, renewed every third)."""

from __future__ import annotations

import json
from pathlib import Path

from knapsack_lb.lab.bench.fleet import FleetBenchOptions, run_fleet_bench
from knapsack_lb.lab.procs import RedisServer

INTERVAL = 1.0


def test_a_tiny_fleet_is_planned_shared_and_taken_over(fresh_redis: RedisServer, tmp_path: Path) -> None:
    options = FleetBenchOptions(vips=6, dips=40, controllers=2, seconds=14.0, interval=INTERVAL,
                                redis=fresh_redis.url, join=False, kill=True, kill_at=0.5, probe_requests=20)
    result = run_fleet_bench(options, tmp_path / "out")

    assert result["fleet"]["vips"] == 6 and result["fleet"]["dips"] == 40
    assert result["time_to_all_planned_seconds"] is not None, "some VIP never got a plan"
    lag = result["lag"]
    assert lag["steps"] > 6 and lag["p50_seconds"] is not None and 0 <= lag["p50_seconds"] <= lag["p99_seconds"]
    assert lag["per_interval"] and {"t", "steps", "vips", "lag_p50", "lag_p99"} <= set(lag["per_interval"][0])
    both = [c for c in result["controllers"] if c["steps"]]
    assert len(both) == 2, "the two controllers share the VIPs"
    assert all(c["steps_per_cpu_second"] for c in both)
    kill = result["rebalance"]["sigkill"]
    assert kill["vips_of_killed_controller"] >= 1
    assert kill["seconds"] is not None and kill["seconds"] <= 2 * INTERVAL + 0.5, kill
    assert result["store_ops"]["ops_per_second"] > 0
    memory = result["memory"]
    assert memory["bytes_per_dip_measured"] > 0 and memory["at_retention"]["bytes_per_round"] > 0
    for key in ("settings", "coverage", "writers", "events", "files"):
        assert key in result
    assert json.loads(Path(result["files"]["json"]).read_text())["benchmark"] == "fleet"
    assert Path(result["files"]["png"]).stat().st_size > 0
