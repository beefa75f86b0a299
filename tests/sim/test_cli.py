"""`klb sim ...` and `klb bench sim` end to end on small runs."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from knapsack_lb.cli.main import app

runner = CliRunner()


def write_spec(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(
        "name: tiny\nduration: 10\nwarmup: 1\nservice: {kind: exponential, mean: 0.01}\n"
        "dips: [{name: a, speed: 1.0}, {name: b, speed: 0.5}]\nclients: {kind: open, rate: 60}\n"
        "policies: [round_robin, least_connections]\n"
    )
    return path


def test_sim_run_prints_json_summary(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["sim", "run", str(write_spec(tmp_path)), "--policy", "least_connections", "--seed", "3", "--json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout[result.stdout.index("{") :])
    assert data["policy"] == "least_connections" and data["seed"] == 3 and data["requests"] > 400
    assert set(data["dips"]) == {"a", "b"} and data["p99"] >= data["p50"] > 0


def test_sim_compare_writes_a_plot(tmp_path: Path) -> None:
    plot = tmp_path / "cdf.png"
    result = runner.invoke(app, ["sim", "compare", str(write_spec(tmp_path)), "--plot", str(plot), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout[result.stdout.index("{") :])
    assert [r["policy"] for r in data["results"]] == ["round_robin", "least_connections"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_scenario_names_the_problem(tmp_path: Path) -> None:
    result = runner.invoke(app, ["sim", "run", "no-such-scenario", "--policy", "random"])
    assert result.exit_code != 0
    assert "no-such-scenario" in str(result.exception)


def test_bench_sim_reports_speed() -> None:
    result = runner.invoke(app, ["bench", "sim", "--scenario", "knapsack-3dip", "--duration", "3", "--repeat", "1"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["requests"] > 500 and data["requests_per_cpu_second"] > 0 and data["dips"] == 3
    # the target is judged on one named figure, and the verdict is that figure against the target
    assert data["target_applies_to"] == "requests_per_cpu_second_median"
    assert data["meets_target"] == (data["requests_per_cpu_second_median"] >= data["target_requests_per_second"])
    assert data["requests_per_cpu_second_median"] == data["requests_per_cpu_second"]  # one run: median = fastest
    assert 2.0 < data["events_per_request"] < 10.0
