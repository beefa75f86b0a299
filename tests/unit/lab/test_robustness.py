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
    PoolGenerator,
    capacity_plan,
    generate_pool,
    measured_busy,
    oracle_plan,
    plan_latency,
    policy_run,
    run_one,
    run_one_fluid,
    save_specs,
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
