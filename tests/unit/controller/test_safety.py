"""Safety rails: projection onto bounds, minimum weight, change bound, slow start, capacity split."""

from __future__ import annotations

import pytest

from knapsack_lb.controller.rails import apply_rails, capacity_proportional, project


def test_projection_sums_to_one_within_bounds() -> None:
    out = project({"a": 0.9, "b": 0.1, "c": 0.0}, {"c": 0.05}, {"a": 0.6})
    assert sum(out.values()) == pytest.approx(1.0)
    assert out["a"] <= 0.6 + 1e-9 and out["c"] >= 0.05 - 1e-9


def test_every_healthy_dip_gets_the_minimum_weight() -> None:
    out = apply_rails({"a": 1.0, "b": 0.0, "c": 0.0}, previous=None, healthy={"a", "b"}, min_weight=0.01,
                      max_change=1.0)
    assert out["b"] == pytest.approx(0.01) and out["c"] == 0.0 and sum(out.values()) == pytest.approx(1.0)


def test_the_change_per_step_is_bounded() -> None:
    out = apply_rails({"a": 0.9, "b": 0.1}, previous={"a": 0.5, "b": 0.5}, healthy={"a", "b"}, min_weight=0.0,
                      max_change=0.1)
    assert out == pytest.approx({"a": 0.6, "b": 0.4})


def test_a_failed_dip_goes_to_zero_at_once_even_beyond_the_change_bound() -> None:
    out = apply_rails({"a": 0.5, "b": 0.5, "x": 0.0}, previous={"a": 0.2, "b": 0.2, "x": 0.6}, healthy={"a", "b"},
                      min_weight=0.0, max_change=0.1, fixed={"x": 0.0})
    assert out["x"] == 0.0 and sum(out.values()) == pytest.approx(1.0)


def test_slow_start_caps_a_returning_dip() -> None:
    out = apply_rails({"a": 0.5, "b": 0.5}, previous=None, healthy={"a", "b"}, min_weight=0.01, max_change=1.0,
                      ramp_caps={"b": 0.1})
    assert out["b"] == pytest.approx(0.1) and out["a"] == pytest.approx(0.9)


def test_capacity_proportional_split() -> None:
    assert capacity_proportional({"a": 0.2, "b": 0.6}) == pytest.approx({"a": 0.25, "b": 0.75})
    assert capacity_proportional({"a": 0.0, "b": 0.0}) == {"a": 0.5, "b": 0.5}
