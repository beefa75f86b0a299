"""When the demo and the day-2 tour call learning settled: the window and the watch, on known plans."""

from __future__ import annotations

import pytest

from knapsack_lb.lab.demo.ops import OpsSettings
from knapsack_lb.lab.demo.settings import DemoSettings
from knapsack_lb.lab.demo.settle import SettleWatch, plan_cycle, settle_window
from knapsack_lb.model import PlanFlag, PlanMethod, WeightPlan


def _plan(a: float, *, measuring: bool = False) -> WeightPlan:
    return WeightPlan("web", {"a": a, "b": 1.0 - a}, method=PlanMethod.EXACT_GREEDY,
                      flags=(PlanFlag.MEASURING,) if measuring else ())


def test_the_window_spans_two_plan_cycles() -> None:
    assert plan_cycle(drain_time=5.0, probe_interval=2.0, controller_interval=2.0) == pytest.approx(9.0)
    assert settle_window(6.0, 9.0) == pytest.approx(18.0)  # plans come 9 s apart: 6 s passes between two
    assert settle_window(40.0, 9.0) == pytest.approx(40.0)
    assert DemoSettings.quick_preset().settle_window == pytest.approx(18.0)
    assert OpsSettings.quick_preset().demo_settings().settle_window == pytest.approx(10.0)  # drain 1 + 2 + 2


def test_settled_only_after_the_window_without_a_move() -> None:
    watch = SettleWatch(window=10.0)
    assert not watch.observe(_plan(0.5, measuring=True), 0.0)
    assert not watch.settled(100.0)  # no solved plan yet
    assert watch.observe(_plan(0.6), 1.0)  # the first solved plan
    assert not watch.observe(_plan(0.61), 5.0)  # moved by less than 2 %: not a move
    assert not watch.settled(10.9) and watch.settled(11.0)
    watch.observe(_plan(0.7), 12.0)  # moved: the window starts again
    assert not watch.settled(21.0) and watch.settled(22.0)
    assert watch.solved_at == 1.0


def test_a_plan_stored_after_the_deciding_poll_is_confirmed_or_starts_the_window_again() -> None:
    watch = SettleWatch(window=10.0)
    watch.observe(_plan(0.6), 0.0)
    assert watch.settled(10.5)  # decided on a poll that saw the plan of 0 s
    assert watch.confirm(_plan(0.6), 11.0)  # the plan in force when learning ends is that one
    assert not watch.confirm(_plan(0.75), 11.5)  # a plan came between the poll and the decision
    assert not watch.settled(21.0) and watch.settled(21.5)


def test_a_plan_that_is_not_solved_is_a_move() -> None:
    watch = SettleWatch(window=10.0)
    watch.observe(_plan(0.6), 0.0)
    watch.observe(_plan(0.6, measuring=True), 5.0)  # back to measuring
    assert not watch.settled(50.0)
    watch.observe(_plan(0.6), 20.0)  # solved again, at the same weights: the window starts here
    assert not watch.settled(29.0) and watch.settled(30.0)


@pytest.mark.parametrize("method", [PlanMethod.KEPT, PlanMethod.EQUAL_SPLIT])
def test_the_start_before_any_curve_is_no_solved_plan(method: PlanMethod) -> None:
    """The learner's first plan restates the LB's weights (or splits equally) until a curve is usable:
    learning has not begun, so it is neither the first solved plan nor one to settle on."""
    watch = SettleWatch(window=10.0)
    start = WeightPlan("web", {"a": 0.5, "b": 0.5}, method=method)
    assert not watch.observe(start, 0.0)
    assert not watch.settled(50.0) and watch.solved_at is None
    assert watch.observe(_plan(0.6), 60.0)  # the solver's first plan
    assert watch.solved_at == 60.0
    watch.observe(WeightPlan("web", {"a": 0.6, "b": 0.4}, method=PlanMethod.KEPT,
                             flags=(PlanFlag.SOLVER_FAILED,)), 65.0)  # the last good plan kept: no move
    assert watch.settled(70.0)
