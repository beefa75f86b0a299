"""The lb-timings bench's summary on known numbers, and its command's refusals (the live runs:
tests/integration/test_bench_lb_timings.py)."""

from __future__ import annotations

from typer.testing import CliRunner

from knapsack_lb.cli.main import app
from knapsack_lb.lab.bench.lb_timings import TimingsRun, summarise


def _run(seed: int, logs: bool, mean: float | None) -> TimingsRun:
    return TimingsRun(lb="haproxy", seed=seed, logs=logs, mean_ms=mean, p99_ms=mean, requests=100, failed=0,
                      probe_requests=10)


def test_pairs_are_compared_by_seed_and_a_run_without_answers_has_no_ratio() -> None:
    runs = [_run(1, True, 30.0), _run(1, False, 40.0), _run(2, True, 50.0), _run(2, False, 40.0),
            _run(3, True, None), _run(3, False, 40.0)]
    summary = summarise(runs)
    assert summary["mean_ratio_logs_over_probes"] == {1: 0.75, 2: 1.25}
    assert (summary["pairs_lower_with_logs"], summary["pairs"]) == (1, 2)
    assert summary["variants"]["logs"] == {"runs": 3, "mean_ms": 40.0, "failed": 0, "probe_requests": 30}
    assert summary["variants"]["probes only"]["mean_ms"] == 40.0


def test_the_command_names_a_bad_option() -> None:
    runner = CliRunner()
    bad = runner.invoke(app, ["bench", "lb-timings", "--seeds", "1,x"])
    assert bad.exit_code == 2 and "--seeds" in bad.output and "'1,x'" in bad.output
    late = runner.invoke(app, ["bench", "lb-timings", "--seconds", "30", "--count-after", "30"])
    assert late.exit_code == 2 and "--count-after" in late.output
    other = runner.invoke(app, ["bench", "lb-timings", "--lb", "traefik"])
    assert other.exit_code == 2 and "--lb" in other.output and "'traefik'" in other.output
