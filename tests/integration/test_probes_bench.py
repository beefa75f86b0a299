"""`klb bench probes` runs end to end on a tiny size and reports what it promises (no speed asserted)."""

from __future__ import annotations

import json
import sys

from typer.testing import CliRunner


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
