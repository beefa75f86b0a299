"""`klb bench probes` runs end to end on a tiny size and reports what it promises (no speed asserted)."""

from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner


@pytest.mark.usefixtures("kernel_stamping")
def test_bench_probes_reports_throughput_and_latency_error() -> None:
    from knapsack_lb.cli.main import app

    result = CliRunner().invoke(app, ["bench", "probes", "--dips", "2", "--seconds", "3", "--requests-per-round",
                                      "10", "--noisy-neighbours", "1", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout.strip().splitlines()[-1])
    assert data["probe_requests_per_cpu_second"] > 0
    assert data["noisy_neighbours"] == 1
    assert set(data["latency_error_pct"]) == {"2ms", "20ms"}
    assert data["throughput_phase"]["requests"] > 0 and data["throughput_phase"]["failures"] == 0
    for phase in data["accuracy_phases"]:
        assert phase["successes"] > 0 and phase["probe_mean_latency"] >= phase["service_time"]
        # The error is split into the emulator's and the probe's, and the kernel-timestamp
        # correction is reported (what timing at the read would have given), not hidden.
        assert phase["server_mean_latency"] >= phase["service_time"]
        assert phase["probe_mean_latency"] >= phase["server_mean_latency"]
        assert phase["latency_error_userspace_pct"] >= phase["latency_error_pct"]
        if sys.platform.startswith("linux"):
            assert phase["kernel_timestamped_share"] == 1.0 and phase["probe_read_delay_mean"] > 0
    assert set(data["emulator_error_pct"]) == set(data["latency_error_userspace_pct"]) == {"2ms", "20ms"}
    # Whether the yardstick emulators ran real-time is reported from what they say of themselves.
    schedulers = [phase["emulator_schedulers"] for phase in data["accuracy_phases"]]
    assert data["emulator_realtime"] == all(s == ["fifo"] for s in schedulers)
    assert all(set(s) <= {"fifo", "other"} for s in schedulers)


def test_bench_probes_refuses_bad_sizes() -> None:
    from knapsack_lb.cli.main import app

    result = CliRunner().invoke(app, ["bench", "probes", "--dips", "0"])
    assert result.exit_code == 2 and "--dips" in result.output


def test_bench_probes_sizing_reports_dips_per_worker_at_the_cadence() -> None:
    from knapsack_lb.cli.main import app

    result = CliRunner().invoke(app, ["bench", "probes", "--sizing", "--start-dips", "2", "--max-dips", "3",
                                      "--interval", "1", "--rounds", "2", "--requests-per-round", "10", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout.strip().splitlines()[-1])
    assert data["cadence"] == {"requests_per_round": 10, "interval_seconds": 1.0, "requests_per_second_per_dip": 10.0,
                               "rounds_per_step": 2}
    assert [s["dips"] for s in data["steps"]][:1] == [2]
    for step in data["steps"]:
        assert step["requests"] > 0 and step["worker_cpu_seconds"] > 0
        assert (step["why_not"] is None) == step["kept_cadence"]
        if step["kept_cadence"]:
            assert step["rounds"] >= 2 and step["failures"] == 0 and step["longest_round_seconds"] < 1.0
    kept = [s["dips"] for s in data["steps"] if s["kept_cadence"]]
    assert data["dips_per_worker"] == (max(kept) if kept else None)
    assert data["paper_klm"]["dips_per_klm"] == 225


def test_sizing_doubles_then_bisects_within_its_bounds() -> None:
    from knapsack_lb.lab.bench.probes import next_sizing_step

    assert next_sizing_step(25, 25, None, 800, 2) == 50
    assert next_sizing_step(400, 400, None, 700, 2) == 700
    assert next_sizing_step(700, 700, None, 700, 2) is None  # bounded by max_dips
    assert next_sizing_step(400, 200, 400, 800, 2) == 300
    assert next_sizing_step(300, 300, 400, 800, 0) is None  # no refinement left
    assert next_sizing_step(25, None, 25, 800, 2) is None  # the first step already failed
    assert next_sizing_step(201, 200, 201, 800, 2) is None


def test_bench_probes_sizing_refuses_bad_bounds() -> None:
    from knapsack_lb.cli.main import app

    result = CliRunner().invoke(app, ["bench", "probes", "--sizing", "--start-dips", "10", "--max-dips", "5"])
    assert result.exit_code == 2 and "--start-dips" in result.output
