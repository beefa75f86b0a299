"""`klb solve` and `klb bench solver` through the real typer app."""

from __future__ import annotations

import json
import math
from pathlib import Path

from typer.testing import CliRunner

from knapsack_lb.cli.main import app

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "curves.json"


def test_solve_example_prints_json_with_weights_summing_to_one() -> None:
    result = CliRunner().invoke(app, ["solve", str(EXAMPLE), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["method"] == "exact-greedy" and data["objective_kind"] == "mean"
    assert abs(math.fsum(data["weights"].values()) - 1.0) < 1e-12
    assert data["weights"]["canary"] == 0.05  # pinned in the example
    assert set(data["predicted_latency"]) == set(data["weights"])


def test_solve_table_and_objective_override() -> None:
    args = ["solve", str(EXAMPLE), "--objective", "max", "--method", "ilp", "--units", "1000"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "max objective" in result.stdout and "ds1-a" in result.stdout


def test_solve_prints_its_summary_on_one_line_whatever_the_table_width() -> None:
    result = CliRunner().invoke(app, ["solve", str(EXAMPLE)])
    assert result.exit_code == 0, result.output
    summary = next(line for line in result.stdout.splitlines() if "mean objective" in line)
    assert summary.rstrip().endswith(" ms") and "by exact-greedy" in summary, summary


def test_solve_reports_bad_input_and_infeasibility_with_exit_codes(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"dips": [{"name": "a", "curve": {"kind": "quadratic", "a": 0.001, "b": -1, "c": 0},
                                          "w_max": 1.0}]}))
    result = CliRunner().invoke(app, ["solve", str(bad)])
    assert result.exit_code == 2
    assert "DIP 'a', field 'curve'" in result.stderr
    small = tmp_path / "small.json"
    small.write_text(json.dumps({"dips": [{"name": "a", "curve": {"kind": "quadratic", "a": 0.001, "b": 0, "c": 1},
                                            "w_max": 0.4}]}))
    result = CliRunner().invoke(app, ["solve", str(small)])
    assert result.exit_code == 3
    assert "over capacity" in result.stderr


def test_bench_solver_prints_one_row_per_method() -> None:
    result = CliRunner().invoke(
        app, ["bench", "solver", "--dips", "12", "--methods", "exact,ilp", "--repeat", "1", "--seed", "3", "--json"]
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["method"] for r in rows] == ["exact", "ilp"]
    for row in rows:
        assert {"method", "dips", "levels", "seconds", "objective", "optimal_objective", "gap"} <= set(row)
        assert row["dips"] == 12 and row["levels"] == 10 and row["seconds"] > 0
    exact, ilp = rows
    assert exact["gap"] == 0.0 and exact["optimal_objective"] == exact["objective"]
    assert ilp["objective"] >= exact["objective"]


def test_bench_solver_fleet_reports_times_beside_the_papers_and_identical_plans() -> None:
    result = CliRunner().invoke(app, ["bench", "solver", "--fleet", "--fleet-scale", "0.01", "--seed", "2"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["fleet"]["vips"] == 35 and data["fleet"]["dips"] == 1900 and data["fleet"]["kind"] == "quadratic"
    for mode in ("batched", "per_vip"):
        assert {"wall_seconds", "cpu_seconds", "vips_per_second"} <= set(data[mode])
    assert {"median_ms", "p99_ms"} <= set(data["per_vip"])
    assert data["batched"]["batched_vips"] == 35 and data["plans_differing_from_batched"] == 0
    assert data["paper"]["seconds_on_8_core_vm"] == 851.0 and "8-core VM" in data["paper"]["what"]


def test_bench_solver_without_dips_or_fleet_is_refused() -> None:
    result = CliRunner().invoke(app, ["bench", "solver"])
    assert result.exit_code == 2 and "--dips is required" in result.stderr
