"""Measurement scheduling (section 4.6)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from knapsack_lb.controller.measurement import PRIORITY_NORMAL, PRIORITY_OVERUTILISED, PRIORITY_REFRESH
from knapsack_lb.controller.scheduling import MeasurementRequest, greedy_fill, schedule_round
from knapsack_lb.errors import InfeasibleError


def test_greedy_fill_orders_by_priority_then_fifo_and_hops_over_what_does_not_fit() -> None:
    requests = [
        MeasurementRequest("refresh", 0.1, PRIORITY_REFRESH, 0.0),
        MeasurementRequest("late", 0.3, PRIORITY_NORMAL, 5.0),
        MeasurementRequest("early", 0.5, PRIORITY_NORMAL, 1.0),
        MeasurementRequest("hot", 0.2, PRIORITY_OVERUTILISED, 9.0),
        MeasurementRequest("big", 0.7, PRIORITY_NORMAL, 2.0),
    ]
    taken, deferred = greedy_fill(requests, max_zero=1)
    assert taken == {"hot": 0.2, "early": 0.5, "late": 0.3}
    assert deferred == ["big", "refresh"]


def test_at_most_max_zero_dips_sit_at_weight_zero() -> None:
    requests = [MeasurementRequest(f"d{i}", 0.0, PRIORITY_NORMAL, float(i)) for i in range(4)]
    taken, deferred = greedy_fill(requests, max_zero=2)
    assert taken == {"d0": 0.0, "d1": 0.0} and deferred == ["d2", "d3"]


def test_the_remainder_goes_to_finished_dips_through_the_solver() -> None:
    calls: list[tuple[tuple[str, ...], float]] = []

    def solver(dips: Sequence[str], total: float) -> Mapping[str, float]:
        calls.append((tuple(dips), total))
        return {"f1": total * 0.75, "f2": total * 0.25}

    sched = schedule_round([MeasurementRequest("m", 0.2, PRIORITY_NORMAL, 0.0)], ["f1", "f2"], [], solver)
    assert calls == [(("f1", "f2"), pytest.approx(0.8))]
    assert sched.weights == pytest.approx({"m": 0.2, "f1": 0.6, "f2": 0.2})
    assert sched.scheduled == {"m": 0.2} and sched.remainder_method == "solver"


def test_an_infeasible_remainder_is_split_equally_over_all_remaining_dips() -> None:
    def solver(dips: Sequence[str], total: float) -> Mapping[str, float]:
        raise InfeasibleError("sum of w_max 0.3 < 0.8")

    requests = [MeasurementRequest("m", 0.2, PRIORITY_NORMAL, 0.0), MeasurementRequest("x", 0.9, PRIORITY_NORMAL, 1.0)]
    sched = schedule_round(requests, ["f1"], ["o1"], solver)
    assert sched.remainder_method == "equal-split" and "solver" in sched.note
    assert sched.weights == pytest.approx({"m": 0.2, "f1": 0.8 / 3, "x": 0.8 / 3, "o1": 0.8 / 3})
    assert sum(sched.weights.values()) == pytest.approx(1.0)


def test_a_failed_solver_falls_back_to_capacity_estimates_when_given() -> None:
    def solver(dips: Sequence[str], total: float) -> Mapping[str, float]:
        raise InfeasibleError("a curve is negative at weight 0")

    requests = [MeasurementRequest("m", 0.2, PRIORITY_NORMAL, 0.0)]
    sched = schedule_round(requests, ["small", "big"], [], solver, fallback_capacity={"small": 0.1, "big": 0.3})
    assert sched.remainder_method == "capacity" and "spread by estimated capacity" in sched.note
    assert sched.weights == pytest.approx({"m": 0.2, "small": 0.2, "big": 0.6})


def test_with_nobody_left_the_scheduled_weights_are_scaled_and_count_only_when_a_little() -> None:
    sched = schedule_round([MeasurementRequest("a", 0.2, PRIORITY_NORMAL, 0.0),
                            MeasurementRequest("b", 0.2, PRIORITY_NORMAL, 0.0)], [], [], None)
    assert sched.weights == pytest.approx({"a": 0.5, "b": 0.5})
    assert sched.scheduled == {} and sched.remainder_method == "scaled"
    near = schedule_round([MeasurementRequest("a", 0.45, PRIORITY_NORMAL, 0.0),
                           MeasurementRequest("b", 0.5, PRIORITY_NORMAL, 0.0)], [], [], None)
    assert near.scheduled == pytest.approx({"a": 0.45 / 0.95, "b": 0.5 / 0.95}) and "measured there" in near.note


def test_a_full_schedule_needs_no_remainder() -> None:
    sched = schedule_round([MeasurementRequest(f"d{i}", 0.25, PRIORITY_NORMAL, 0.0) for i in range(4)], [], [], None)
    assert sched.remainder_method == "none" and sum(sched.weights.values()) == pytest.approx(1.0)


def test_with_capacity_estimates_the_remainder_follows_them_and_skips_the_solver() -> None:
    def solver(dips: Sequence[str], total: float) -> Mapping[str, float]:
        raise AssertionError("the solver is not asked when capacity estimates are given")

    reqs = [MeasurementRequest("a", 0.4, PRIORITY_NORMAL, 0.0)]
    s = schedule_round(reqs, ["b"], ["c"], solver, capacity={"a": 0.1, "b": 0.3, "c": 0.1})
    assert s.remainder_method == "capacity"
    assert s.scheduled == {"a": 0.4}
    # remainder 0.6 split 3:1 between b and c
    assert s.weights["b"] == pytest.approx(0.45)
    assert s.weights["c"] == pytest.approx(0.15)
    assert sum(s.weights.values()) == pytest.approx(1.0)


def test_zero_capacity_estimates_fall_back_to_the_paper_remainder() -> None:
    s = schedule_round([MeasurementRequest("a", 0.5, PRIORITY_NORMAL, 0.0)], [], ["b", "c"], None,
                       capacity={"b": 0.0, "c": 0.0})
    assert s.remainder_method == "equal-split"
    assert s.weights["b"] == pytest.approx(0.25)
