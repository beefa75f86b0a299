"""Weights for a least-connections LB: the operator's split unless the rounds' bounds move a DIP."""

from __future__ import annotations

import json
import math

import pytest

from knapsack_lb.controller.core import VipController
from knapsack_lb.controller.least_connections import CapacityInterval, best_scale, capacity_split
from knapsack_lb.errors import InvalidInputError
from knapsack_lb.model import PlanMethod

from .loop import FAST, Loop, vip_config


def test_the_operators_weights_stand_where_every_interval_allows_them() -> None:
    split = capacity_split({"a": CapacityInterval(0.1, prior=0.25), "b": CapacityInterval(0.05, 0.2, prior=0.25),
                            "c": CapacityInterval(0.2, prior=0.5)})
    assert split.weights == pytest.approx({"a": 0.25, "b": 0.25, "c": 0.5})
    assert split.scale == pytest.approx(0.4) and split.moved == ()


def test_a_dip_proven_smaller_moves_to_its_upper_bound_and_the_rest_keep_their_ratio() -> None:
    """No common scale fits: the one that puts the least prior mass outside (0.9) keeps a and b at
    0.3 and clamps c from 0.3 to its upper bound 0.15."""
    split = capacity_split({"a": CapacityInterval(0.3, prior=1 / 3), "b": CapacityInterval(0.3, prior=1 / 3),
                            "c": CapacityInterval(0.05, 0.15, prior=1 / 3)})
    assert split.scale == pytest.approx(0.9)
    assert split.weights == pytest.approx({"a": 0.4, "b": 0.4, "c": 0.2})
    assert split.moved == ("c",)


def test_the_larger_prior_mass_sets_the_scale_and_the_others_move_to_their_bounds() -> None:
    """a (0.6 of the operator's weights) is proven at most 0.2, b and c at least 0.3: scale 1/3
    costs 2 x 0.2 x log(4.5), scale 1.5 costs 0.6 x log(4.5); a keeps its share of the scale."""
    intervals = {"a": CapacityInterval(0.0, 0.2, prior=0.6), "b": CapacityInterval(0.3, prior=0.2),
                 "c": CapacityInterval(0.3, prior=0.2)}
    assert best_scale(intervals) == pytest.approx(1 / 3)
    split = capacity_split(intervals, total=0.8)
    assert split.weights == pytest.approx({"a": 0.2, "b": 0.3, "c": 0.3})
    assert split.moved == ("b", "c")


def test_a_dip_without_an_operator_weight_gets_its_lower_bound() -> None:
    split = capacity_split({"a": CapacityInterval(0.1, prior=0.5), "b": CapacityInterval(0.1, prior=0.5),
                            "new": CapacityInterval(0.05)})
    assert split.weights == pytest.approx({"a": 0.4, "b": 0.4, "new": 0.2})


def test_no_bound_anywhere_keeps_the_operators_split_exactly() -> None:
    split = capacity_split({"a": CapacityInterval(0.0, prior=3.0), "b": CapacityInterval(0.0, prior=1.0)})
    assert split.weights == pytest.approx({"a": 0.75, "b": 0.25})


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"low": -0.1}, "low"), ({"low": math.nan}, "low"), ({"low": 0.1, "high": 0.0}, "high"),
    ({"low": 0.1, "high": math.nan}, "high"), ({"low": 0.1, "prior": -1.0}, "prior"),
    ({"low": 0.1, "prior": math.inf}, "prior"),
])
def test_a_bad_interval_names_its_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(InvalidInputError) as err:
        CapacityInterval(**kwargs)
    assert err.value.field == field


def test_nothing_to_split_by_is_an_error_not_a_zero_plan() -> None:
    with pytest.raises(InvalidInputError, match="intervals"):
        capacity_split({})
    with pytest.raises(InvalidInputError, match="every capacity is 0"):
        capacity_split({"a": CapacityInterval(0.0), "b": CapacityInterval(0.0)})
    with pytest.raises(InvalidInputError, match="total"):
        capacity_split({"a": CapacityInterval(0.1)}, total=1.5)


def test_behind_least_connections_the_controller_sends_capacities_and_moves_the_overloaded_dip(
        loop: Loop) -> None:
    """The small pool at 70 % load, weighted by vCPU (1, 1, 2, 4) by the operator: b runs at 70 % of
    a's speed, so its vCPU share (1/8 of 567 requests/s) is past its 70 requests/s. The controller
    sends relative capacities: a, c and d keep the operator's ratios (1 : 2 : 4) and b, whose drops
    bound its capacity below the scale the others' lower bounds need, is moved below a; the DIPs'
    upper bounds survive a JSON round trip."""
    operator = {"a": 0.125, "b": 0.125, "c": 0.25, "d": 0.5}
    loop.ctl.observe_lb(operator, 0.0)
    loop.model.set_weights(operator, 0.0)
    config = vip_config(list(operator), balancing="least_connections")
    for _ in range(40):
        loop.tick(config)
    plan = loop.ctl.plan
    assert plan is not None and plan.method is PlanMethod.RELATIVE_CAPACITY
    w = plan.weights
    assert sum(w.values()) == pytest.approx(1.0)
    assert w["b"] / w["a"] < 0.98
    assert "moved by the rounds: b" in plan.reasons[-1]
    assert w["c"] / w["a"] == pytest.approx(2.0, rel=0.03) and w["d"] / w["a"] == pytest.approx(4.0, rel=0.03)
    assert math.isfinite(loop.ctl.dips["b"].ceiling)
    twin = VipController.from_dict(json.loads(json.dumps(loop.ctl.to_dict())), FAST)
    assert twin.dips["b"].ceiling == pytest.approx(loop.ctl.dips["b"].ceiling)
    assert twin.dips["a"].ceiling == loop.ctl.dips["a"].ceiling


@pytest.mark.parametrize("learner", ["loop", "algorithm1_loop"])
def test_a_vip_switched_to_least_connections_gets_capacities_on_its_next_step_without_new_rounds(
        learner: str, request: pytest.FixtureRequest) -> None:
    """The operator moves the LB to least connections (and says so in the VIP's ``balancing``) between
    two rounds: the next step sends relative capacities, not the shares solved for the same curves."""
    loop: Loop = request.getfixturevalue(learner)
    operator = {"a": 0.125, "b": 0.125, "c": 0.25, "d": 0.5}
    loop.ctl.observe_lb(operator, 0.0)
    loop.model.set_weights(operator, 0.0)
    for _ in range(40):
        loop.tick(vip_config(list(operator)))
    assert loop.ctl.plan is not None and loop.ctl.plan.method is not PlanMethod.RELATIVE_CAPACITY
    plan = loop.ctl.step(loop.lab.now + 5.0, {}, config=vip_config(list(operator), balancing="least_connections"))
    assert plan is not None and plan.method is PlanMethod.RELATIVE_CAPACITY
