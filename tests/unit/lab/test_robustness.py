"""The robustness gauge: its pool generator, its truth (queueing formulas, the oracle) and one
small pool end to end in the simulator and the fluid model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from knapsack_lb.cli.main import app
from knapsack_lb.lab.bench.robustness import (
    MAX_LOAD_AFTER_EVENT,
    SATURATED,
    VCPUS,
    Outcome,
    PoolGenerator,
    PoolReport,
    capacity_plan,
    gauge_policies,
    generate_pool,
    geometric_mean,
    measured_busy,
    oracle_plan,
    path_seed,
    plan_latency,
    policy_run,
    run_one,
    run_one_fluid,
    save_specs,
    summarise,
    true_latency,
)
from knapsack_lb.lab.fluid import FluidDip, FluidModel
from knapsack_lb.sim.spec import load_scenario

POOLS = [generate_pool(i, seed=7) for i in range(40)]


def test_every_pool_is_valid_feasible_and_within_the_documented_ranges() -> None:
    gen = PoolGenerator()
    for pool in POOLS:
        sc = pool.scenario
        assert gen.dips[0] <= len(pool.dips) <= gen.dips[1]
        assert {d.vcpus for d in pool.dips} <= set(VCPUS)
        assert all(1 - gen.neighbour_slowdown <= d.speed <= 1 for d in pool.dips)
        assert gen.load[0] <= pool.load <= gen.load[1]
        assert pool.offered_rate <= gen.max_rate * (1 + 1e-9)
        assert pool.offered_rate / pool.capacity == pytest.approx(pool.load)
        assert pool.rate_after / pool.capacity_after() <= MAX_LOAD_AFTER_EVENT + 1e-9
        assert sc.total_capacity() == pytest.approx(pool.capacity)
        assert (sc.lb.layer == 4) == (sc.clients.kind == "sessions") == (sc.knapsack.data_plane == "smooth_wrr")
        assert 3 <= pool.probe_requests <= 20
        assert len(sc.events) == (pool.event != "none")
        assert sum(oracle_plan(pool).values()) == pytest.approx(1.0)
    kinds = {p.event.split()[0] for p in POOLS}
    assert kinds == {"none", "fail", "capacity", "traffic"}, kinds
    assert {p.layer for p in POOLS} == {4, 7} and {p.discipline for p in POOLS} == {"fcfs", "ps"}


def test_the_capacity_reference_weights_each_dip_by_its_true_capacity_and_follows_the_event() -> None:
    failed = next(p for p in POOLS if p.event.startswith("fail"))
    for pool in (POOLS[0], failed):
        scenario, spec = policy_run(pool, "capacity")
        truth = {d.name: d.vcpus * d.speed for d in pool.dips}
        weights = {g.name: g.weight for g in scenario.dips}
        assert weights == pytest.approx({n: c / sum(truth.values()) for n, c in truth.items()})
        assert spec.name == ("weighted_round_robin" if pool.layer == 4 else "weighted_least_connections")
    after = capacity_plan(failed, after_event=True)
    dead = [d.name for d in failed.dips if d.speed_after == 0]
    assert dead and all(after[n] == 0 for n in dead) and sum(after.values()) == pytest.approx(1.0)
    assert [list(e.weights or ()) for e in policy_run(failed, "capacity")[0].events if e.kind == "weights"] == [
        [after[d.name] for d in failed.dips]]


def test_a_seed_reproduces_its_pools_and_another_seed_does_not() -> None:
    assert [generate_pool(i, seed=7) for i in range(5)] == POOLS[:5]
    assert [generate_pool(i, seed=8).scenario for i in range(5)] != [p.scenario for p in POOLS[:5]]


def test_true_latency_is_the_queueing_formula() -> None:
    # M/M/1: 1 / (mu - lambda); M/D/1 (Pollaczek-Khinchine): s + rho s / (2 (1 - rho))
    assert true_latency(1, 1.0, 0.01, 1.0, "fcfs", 50.0) == pytest.approx(1 / (100 - 50))
    assert true_latency(1, 1.0, 0.01, 0.0, "fcfs", 50.0) == pytest.approx(0.01 + 0.5 * 0.01 / (2 * 0.5))
    # processor sharing is insensitive: the same as M/M/c for any service distribution
    assert true_latency(4, 1.0, 0.01, 0.0, "ps", 300.0) == pytest.approx(true_latency(4, 1.0, 0.01, 1.0, "fcfs", 300.0))
    # M/M/2 at rho 0.5: T = 1/mu + C / (2 mu - lambda) with C = 1/3
    assert true_latency(2, 1.0, 0.01, 1.0, "fcfs", 100.0) == pytest.approx(0.01 + (1 / 3) / 100)
    assert math.isinf(true_latency(2, 0.5, 0.01, 1.0, "ps", 100.0))


def test_the_oracle_is_the_fluid_models_optimum_where_both_are_exact() -> None:
    pool = next(p for p in POOLS if p.service == "exponential" and p.discipline == "fcfs")
    model = FluidModel([FluidDip(d.name, d.vcpus, d.speed / pool.mean_service) for d in pool.dips],
                       total_rate=pool.offered_rate)
    ours = plan_latency(pool, oracle_plan(pool))
    assert ours == pytest.approx(model.oracle().quality.mean_latency, rel=0.01)
    assert ours <= plan_latency(pool, {d.name: d.vcpus * d.speed for d in pool.dips}) * (1 + 1e-6)


def test_on_a_static_pool_no_static_weighting_beats_the_oracle_beyond_noise() -> None:
    pool = next(p for p in POOLS if p.event == "none" and len(p.dips) <= 6 and p.layer == 7)
    pool = generate_pool(pool.index, seed=7, gen=PoolGenerator(duration=150.0))
    oracle = run_one(pool, "oracle")
    for label in ("round_robin", "wrr_vcpu"):
        other = run_one(pool, label)
        assert oracle.steady_mean_ms <= other.steady_mean_ms * 1.05, (label, oracle, other)
    assert oracle.error_share == 0.0


def test_knapsacklb_runs_with_its_defaults_and_reports_what_it_did() -> None:
    pool = generate_pool(POOLS.index(min(POOLS, key=lambda p: len(p.dips))), seed=7,
                         gen=PoolGenerator(duration=120.0))
    assert pool.scenario.knapsack.settings == {}  # the defaults: nothing tuned
    outcome = run_one(pool, "knapsack")
    assert outcome.plans and sum(outcome.methods.values()) == outcome.plans
    assert 0 < outcome.probe_share < 0.2
    assert math.isfinite(outcome.mean_ms)
    assert outcome.max_busy is not None and 0 < outcome.max_busy <= 1
    assert outcome.saturated_windows is not None and outcome.saturated_windows >= 0
    fluid = run_one_fluid(pool, "knapsack")
    assert fluid.plans and math.isfinite(fluid.mean_ms)
    with pytest.raises(ValueError, match="least_connections"):
        run_one_fluid(pool, "least_connections")


def test_a_dip_busy_through_a_window_counts_as_at_capacity() -> None:
    """What the DIPs were measured to carry, from the simulator's windows (busy share of each DIP's
    cores): the windows that end after ``since`` only; one DIP at ``SATURATED`` saturates its window."""
    series = {"window_times": [5.0, 10.0, 15.0, 20.0],
              "utilization": [[1.0, 0.2], [0.5, SATURATED], [0.7, 0.98], [0.3, 0.4]]}
    assert measured_busy(series, 5.0) == (SATURATED, 1)
    assert measured_busy(series, 0.0) == (1.0, 2)
    assert measured_busy(series, 20.0) == (None, 0)


def test_saved_specs_load_as_scenarios_with_the_gauges_policies(tmp_path: Path) -> None:
    paths = save_specs(POOLS[:3], tmp_path)
    for pool, path in zip(POOLS[:3], paths, strict=True):
        sc = load_scenario(path)
        assert sc.dips == pool.scenario.dips and sc.events == pool.scenario.events
        assert {p.display for p in sc.policies} >= {"round_robin", "least_connections", "wrr_vcpu", "knapsack"}


def test_the_command_prints_strict_json_and_draws_the_plot(tmp_path: Path) -> None:
    plot = tmp_path / "r.png"
    result = CliRunner().invoke(app, ["bench", "robustness", "--pools", "2", "--engine", "fluid", "--duration", "120",
                                      "--workers", "1", "--plot", str(plot), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["summary"]["pools"] == 2 and len(data["pools"]) == 2
    assert set(data["pools"][0]["outcomes"]) == {"round_robin", "wrr_vcpu", "oracle", "knapsack"}
    assert plot.stat().st_size > 10_000


def test_light_requests_reach_the_pools_scenarios_and_the_fluid_engine_refuses_them() -> None:
    pool = generate_pool(3, 1, PoolGenerator(light_requests=50))
    assert pool.scenario.knapsack.light_requests == 50
    assert generate_pool(3, 1).scenario.knapsack.light_requests == 0
    assert pool.scenario.dips == generate_pool(3, 1).scenario.dips  # the same pool, with a light URL
    result = CliRunner().invoke(app, ["bench", "robustness", "--pools", "1", "--engine", "fluid", "--light-requests",
                                      "50"])
    assert result.exit_code != 0 and "light" in result.output


def test_path_zero_is_the_scenarios_seed_and_every_path_has_its_own() -> None:
    pool = POOLS[5]
    seeds = [path_seed(pool, k) for k in range(20)]
    assert seeds[0] == pool.scenario.seed and len(set(seeds)) == 20
    assert not set(seeds[1:]) & {p.scenario.seed for p in POOLS}  # no path is another pool's own
    with pytest.raises(ValueError, match="path must be 0-19"):
        path_seed(pool, 20)


def test_two_paths_of_one_pool_differ_and_one_path_reruns_to_the_digit() -> None:
    pool = next(p for p in POOLS if p.layer == 7 and len(p.dips) <= 6)
    pool = generate_pool(pool.index, seed=7, gen=PoolGenerator(duration=90.0))
    first, again, other = run_one(pool, "round_robin"), run_one(pool, "round_robin", 0), run_one(pool, "round_robin", 1)
    assert first.mean_ms == again.mean_ms and first.path == 0
    assert other.mean_ms != first.mean_ms and other.path == 1


def test_geometric_mean_of_ratios() -> None:
    assert geometric_mean([1.1, 1 / 1.1]) == pytest.approx(1.0)
    assert geometric_mean([2.0, 8.0]) == pytest.approx(4.0)
    assert geometric_mean([1.0, math.nan]) == 1.0
    assert geometric_mean([0.9, math.inf]) == math.inf
    assert math.isnan(geometric_mean([]))


def _report(index: int, path: int, means: dict[str, float]) -> PoolReport:
    """A pool's report along one path with the given whole-run (and steady) means; nothing run."""
    pool = next(p for p in POOLS if p.index == index)
    return PoolReport(pool, {label: Outcome(index, label, ms, ms, ms, ms, 0.0, 0.0, first_solved_s=5.0, path=path,
                                            max_utilisation_after=0.9 if label == "knapsack" else None)
                             for label, ms in means.items()})


def test_the_summary_takes_each_pools_geometric_mean_over_its_paths_and_counts_each_path() -> None:
    """Two layer-4 pools on two paths: on one KnapsackLB is 10 % better on one path and 12 % worse on the
    other (0.4 % worse over both: not better), on the other it is 20 % then 5 % better; a layer-7 pool is
    judged against least connections and WLC by vCPU only, not round robin."""
    l4 = [p.index for p in POOLS if p.layer == 4][:2]
    l7 = next(p.index for p in POOLS if p.layer == 7)
    reports = [
        _report(l4[0], 0, {"round_robin": 100.0, "least_connections": 120.0, "wrr_vcpu": 110.0, "oracle": 80.0,
                           "knapsack": 90.0}),
        _report(l4[0], 1, {"round_robin": 100.0, "least_connections": 120.0, "wrr_vcpu": 110.0, "oracle": 80.0,
                           "knapsack": 112.0}),
        _report(l4[1], 0, {"round_robin": 50.0, "least_connections": 60.0, "wrr_vcpu": 70.0, "oracle": 40.0,
                           "knapsack": 40.0}),
        _report(l4[1], 1, {"round_robin": 50.0, "least_connections": 60.0, "wrr_vcpu": 70.0, "oracle": 40.0,
                           "knapsack": 47.5}),
        _report(l7, 0, {"round_robin": 10.0, "least_connections": 30.0, "wlc_vcpu": 20.0, "oracle": 20.0,
                        "knapsack": 19.0}),
        _report(l7, 1, {"round_robin": 10.0, "least_connections": 30.0, "wlc_vcpu": 20.0, "oracle": 20.0,
                        "knapsack": 19.0}),
    ]
    summary = summarise(reports)
    assert summary["pools"] == 3 and summary["paths"] == 2
    layer4, layer7 = summary["by_layer"]["4"], summary["by_layer"]["7"]
    assert layer4["operator_baselines"] == ["round_robin", "least_connections", "wrr_vcpu"]
    assert layer4["better_whole_run"] == 1  # the first pool is not better over its two paths
    assert layer4["better_whole_run_per_path"] == [2, 1]
    assert layer4["whole_run_vs_operator"]["worst"] == pytest.approx(math.sqrt(0.9 * 1.12))
    assert layer4["whole_run_vs_operator"]["median"] == pytest.approx(math.sqrt(0.8 * 0.95))
    assert layer4["worse_whole_run_by_5pct"] == 0 and layer4["above_capacity_after_solved"] == 0
    assert layer7["operator_baselines"] == ["least_connections", "wlc_vcpu"]
    assert layer7["better_whole_run"] == 1 and layer7["whole_run_vs_operator"]["worst"] == pytest.approx(0.95)
    assert summary["steady_vs_best_baseline"]["worst"] == pytest.approx(1.9)  # against round robin's 10 ms


def test_the_policies_run_always_include_knapsacklb_and_the_oracle() -> None:
    assert gauge_policies("sim", ["round_robin"]) == ("round_robin", "oracle", "knapsack")
    assert gauge_policies("fluid") == ("round_robin", "wrr_vcpu", "oracle", "knapsack")
    with pytest.raises(ValueError, match="'least_connections'"):
        gauge_policies("fluid", ["least_connections"])


def test_the_command_runs_several_paths_of_one_layers_pools_with_chosen_policies(tmp_path: Path) -> None:
    args = ["bench", "robustness", "--pools", "3", "--engine", "fluid", "--duration", "120", "--workers", "1",
            "--plot", str(tmp_path / "r.png"), "--json"]
    result = CliRunner().invoke(app, [*args, "--paths", "2", "--layer", "4", "--policies", "wrr_vcpu"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    layer4 = [p.index for p in (generate_pool(i, 1) for i in range(3)) if p.layer == 4]
    assert [(p["index"], p["path"]) for p in data["pools"]] == [(i, k) for i in layer4 for k in (0, 1)]
    assert {p["layer"] for p in data["pools"]} == {4}
    assert set(data["pools"][0]["outcomes"]) == {"wrr_vcpu", "oracle", "knapsack"}
    assert data["summary"]["paths"] == 2 and list(data["summary"]["by_layer"]) == ["4"]
    for bad, field in ((["--layer", "5"], "layer"), (["--policies", "nginx"], "policies")):
        result = CliRunner().invoke(app, [*args, *bad])
        assert result.exit_code != 0 and field in result.output and bad[1] in result.output


def test_knapsacklb_in_the_fluid_model_starts_from_the_lbs_vcpu_weights_as_in_the_simulator() -> None:
    """Pool 0 of seed 1 (DIPs of 4, 2, 2 and 2 vCPUs at 80 % load): an equal split runs the 2-vCPU DIPs
    past their capacity, and a fluid run that started there was 40x weights by vCPU over two minutes."""
    pool = generate_pool(0, 1, PoolGenerator(duration=120.0))
    assert [d.vcpus for d in pool.dips] == [4, 2, 2, 2] and pool.load == pytest.approx(0.8, abs=0.01)
    knapsack, vcpu = run_one_fluid(pool, "knapsack"), run_one_fluid(pool, "wrr_vcpu")
    assert knapsack.mean_ms < 1.1 * vcpu.mean_ms, (knapsack, vcpu)
