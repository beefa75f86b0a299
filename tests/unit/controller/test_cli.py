"""`klb bench controller` through the real command line."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from knapsack_lb.cli.main import app


def test_bench_two_dip_prints_json_with_the_comparison() -> None:
    result = CliRunner().invoke(app, ["bench", "controller", "--scenario", "two-dip", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout[result.stdout.index("{"):])
    assert data["scenario"] == "two-dip" and data["iterations_max"] <= 10
    for key in ("knapsacklb", "oracle", "round_robin", "by_vcpu"):
        assert {"mean_ms", "p99_ms"} <= set(data[key])
    assert data["vs_oracle"] < 0.05
    assert data["weights"]["large"] > 0.9


def test_an_unknown_scenario_is_refused_by_name() -> None:
    result = CliRunner().invoke(app, ["bench", "controller", "--scenario", "nope"])
    assert result.exit_code == 2
    assert "scenario" in result.output and "nope" in result.output
