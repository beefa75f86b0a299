"""Light probes on the simulator's own DIP: the waited share is Erlang's, and it reads the capacity."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from knapsack_lb.cli.main import app
from knapsack_lb.controller.waiting import erlang_c
from knapsack_lb.errors import InvalidInputError
from knapsack_lb.lab.bench.light_probes import LightProbeCase, capacity_stderr, run_case


@pytest.mark.parametrize("case", [LightProbeCase(4, 0.7, "ps", "lognormal"),
                                  LightProbeCase(16, 0.7, "fcfs", "exponential")])
def test_the_share_of_light_probes_that_waited_is_erlangs_and_reads_the_capacity(case: LightProbeCase) -> None:
    result = run_case(case, probes=800, seed=3)
    expected = erlang_c(case.workers, case.workers * case.utilisation)
    stderr = math.sqrt(expected * (1 - expected) / result.probes)
    assert result.probes == 800
    assert abs(result.waited_share - expected) < 4 * stderr
    assert result.capacity_over_truth is not None
    assert 0.9 < result.capacity_over_truth < 1.1
    assert result.mean_over_unloaded == pytest.approx(result.mmc_mean_over_unloaded, rel=0.1)


@pytest.mark.parametrize("case", [LightProbeCase(4, 0.85, "ps", "lognormal"),
                                  LightProbeCase(16, 0.7, "fcfs", "exponential")])
def test_the_waits_alone_read_the_capacity_where_the_model_holds(case: LightProbeCase) -> None:
    result = run_case(case, probes=1000, seed=3)
    assert result.rate_free_over_truth is not None
    assert 0.9 < result.rate_free_over_truth < 1.1
    assert result.blocks == 20 and result.blocks_estimated == 20
    with_rate, without_rate = result.block_error["with_rate"], result.block_error["without_rate"]
    assert with_rate is not None and without_rate is not None
    assert with_rate[0] <= with_rate[1] and without_rate[0] <= without_rate[1]


def test_shorter_waits_behind_fcfs_workers_with_fixed_service_read_as_a_busier_dip() -> None:
    result = run_case(LightProbeCase(4, 0.7, "fcfs", "fixed"), probes=1000, seed=3)
    assert result.rate_free_over_truth is not None and result.rate_free_over_truth < 0.95


def test_the_waited_share_knows_a_many_worker_dip_and_the_mean_latency_a_single_worker_one() -> None:
    by_waits, by_mean = capacity_stderr(16, 0.7, 50)
    assert by_waits < 0.05 < 0.4 < by_mean  # 16 workers at 70 %: 2.7 % slower than idle, 13 % wait
    by_waits, by_mean = capacity_stderr(1, 0.85, 50)
    assert by_mean < by_waits  # one worker at 85 %: 6.7x slower than idle


def test_the_same_seed_gives_the_same_run() -> None:
    case = LightProbeCase(4, 0.5, "fcfs", "fixed")
    assert run_case(case, probes=200, seed=5) == run_case(case, probes=200, seed=5)


@pytest.mark.parametrize(("case", "probes", "field"), [
    (LightProbeCase(4, 1.0, "ps", "fixed"), 10, "utilisation"),
    (LightProbeCase(0, 0.5, "ps", "fixed"), 10, "workers"),
    (LightProbeCase(4, 0.5, "ps", "fixed"), 0, "probes"),
])
def test_bad_input_names_the_field(case: LightProbeCase, probes: int, field: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        run_case(case, probes=probes)
    assert info.value.field == field


def test_the_command_prints_every_case_as_json_plots_them_and_refuses_bad_input(tmp_path: Path) -> None:
    runner = CliRunner()
    bad = runner.invoke(app, ["bench", "light-probes", "--probes", "0"])
    assert bad.exit_code == 2 and "'probes'" in bad.output
    picture = tmp_path / "reads.png"
    ok = runner.invoke(app, ["bench", "light-probes", "--probes", "20", "--json", "--plot", str(picture)])
    assert ok.exit_code == 0, ok.output
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads(ok.output.strip().splitlines()[-1])
    assert report["benchmark"] == "light-probes" and len(report["cases"]) == 54
    assert {"waited_share", "erlang_c", "capacity_over_truth", "capacity_stderr", "rate_free_over_truth",
            "block_error"} <= set(report["cases"][0])
