"""The fluid M/M/c test bed against queueing formulas."""

from __future__ import annotations

import math

import pytest

from knapsack_lb.lab.fluid import FluidDip, FluidModel, erlang_c


def test_erlang_c_of_mm1_is_the_utilisation_and_of_mm2_is_known() -> None:
    assert erlang_c(1, 0.7) == pytest.approx(0.7)
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)  # M/M/2 at rho = 0.5: 2 rho^2 / (1 + rho)


def test_mm1_latency_and_overload() -> None:
    d = FluidDip("d", 1, 100.0)
    assert d.mean_latency(60.0) == pytest.approx(1 / 40)
    assert math.isinf(d.mean_latency(100.0))
    assert d.exceed(60.0, 0.05) == pytest.approx(math.exp(-40 * 0.05))


def test_oracle_splits_identical_dips_equally_and_favours_the_larger_dip() -> None:
    same = FluidModel([FluidDip("a", 1, 100.0), FluidDip("b", 1, 100.0)], total_rate=100.0)
    assert same.oracle().weights == pytest.approx({"a": 0.5, "b": 0.5}, abs=1e-6)
    skew = FluidModel([FluidDip("a", 1, 100.0), FluidDip("b", 4, 100.0)], total_rate=300.0)
    oracle = skew.oracle()
    assert oracle.weights["b"] > 0.8
    assert oracle.quality.mean_latency <= skew.quality({"a": 0.2, "b": 0.8}).mean_latency


def test_probe_rounds_reflect_weights_failures_and_drain_lag() -> None:
    model = FluidModel([FluidDip("a", 1, 100.0), FluidDip("b", 2, 100.0)], total_rate=150.0, drain_time=10.0,
                       seed=2)
    model.set_weights({"a": 0.0, "b": 1.0}, 0.0)
    model.set_weights({"a": 1.0, "b": 0.0}, 100.0)
    assert model.effective_weights(105.0) == pytest.approx({"a": 0.5, "b": 0.5})
    overloaded = model.measure(120.0)["a"]
    assert overloaded.timeouts > 0
    model.fail("b")
    failed = model.measure(130.0)["b"]
    assert failed.successes == 0 and failed.errors == failed.sent and failed.failure_latency_mean is not None
    model.restore("b")
    model.set_capacity_factor("b", 0.5)
    assert model.capacity_share("b") == pytest.approx(100.0 / 150.0)
