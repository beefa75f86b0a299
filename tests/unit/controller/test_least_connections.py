"""Weights for a least-connections LB: the operator's split unless the rounds' bounds move a DIP."""

from __future__ import annotations

import json
import math
import random

import pytest

from knapsack_lb.controller.core import VipController
from knapsack_lb.controller.least_connections import (
    MIN_PEERS,
    CapacityInterval,
    PeerLatency,
    best_scale,
    capacity_split,
    slow_hosts,
)
from knapsack_lb.errors import InvalidInputError
from knapsack_lb.lab.fluid import FluidDip, FluidModel
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


def _alike(*means: float, prior: float = 0.25, stderr: float = 0.001) -> dict[str, PeerLatency]:
    return {f"d{i}": PeerLatency(prior, mean, stderr) for i, mean in enumerate(means)}


def test_a_dip_slower_than_its_alike_peers_gets_their_median_over_its_latency() -> None:
    """Four DIPs the operator weighted alike; one answers in 150 ms where the others answer in
    100 ms: its speed relative to them is 2/3. The faster one (90 ms) is not scaled up."""
    slower = slow_hosts(_alike(0.100, 0.090, 0.100, 0.150, 0.100), z=2.0)
    assert slower == pytest.approx({"d3": 2 / 3})


def test_a_difference_within_the_errors_is_no_slower_host() -> None:
    """103 ms against a median of 100 ms, each known to 2 ms: 3 ms < 2 x hypot(2, 2) = 5.7 ms."""
    assert slow_hosts(_alike(0.100, 0.100, 0.100, 0.103, stderr=0.002), z=2.0) == {}
    assert slow_hosts(_alike(0.100, 0.100, 0.100, 0.106, stderr=0.002), z=2.0) == pytest.approx({"d3": 0.100 / 0.106})


def test_only_dips_of_one_share_are_compared_and_only_among_enough_of_them() -> None:
    """A 1-vCPU DIP queues more than the 8-vCPU ones at the same utilisation: a different share is
    a different size, never a slower host; two alike DIPs cannot tell which of them is slow."""
    pool = {**_alike(0.100, 0.100, 0.100, prior=0.3), "small": PeerLatency(0.1, 0.300, 0.001)}
    assert slow_hosts(pool, z=2.0) == {}
    assert MIN_PEERS == 3
    assert slow_hosts(_alike(0.100, 0.200), z=2.0) == {}


def test_unknown_latencies_are_left_out_and_a_bad_z_names_itself() -> None:
    pool = {**_alike(0.100, 0.100, 0.100, 0.150), "x": PeerLatency(0.25, math.nan, 0.001),
            "y": PeerLatency(0.25, 0.5, math.inf)}
    assert slow_hosts(pool, z=2.0) == pytest.approx({"d3": 2 / 3})
    for z in (0.0, -1.0, math.nan):
        with pytest.raises(InvalidInputError) as err:
            slow_hosts(pool, z=z)
        assert err.value.field == "z"


def test_behind_least_connections_a_dip_on_a_slower_host_gets_less_than_its_alike_peers() -> None:
    """Four 2-core DIPs the operator weighted alike, at 60 % load; ``slow`` runs at 70 % of the
    others' speed (a noisy neighbour) and no knee is seen on any of them. The controller sends
    relative capacities with ``slow`` below the others, says why, and leaves the three alike."""
    dips = [FluidDip("a", 2, 100.0), FluidDip("b", 2, 100.0), FluidDip("c", 2, 100.0), FluidDip("slow", 2, 70.0)]
    model = FluidModel(dips, total_rate=0.6 * sum(d.capacity for d in dips), seed=5)
    operator = dict.fromkeys(model.names, 0.25)
    model.set_weights(operator, 0.0)
    loop = Loop(model, VipController("vip", model.names, FAST, rng=random.Random(1)))
    loop.ctl.observe_lb(operator, 0.0)
    config = vip_config(model.names, balancing="least_connections")
    for _ in range(20):
        loop.tick(config)
    plan = loop.ctl.plan
    assert plan is not None and plan.method is PlanMethod.RELATIVE_CAPACITY
    w = plan.weights
    assert w["slow"] < 0.9 * w["a"]
    assert w["a"] == pytest.approx(w["b"]) and w["b"] == pytest.approx(w["c"])
    assert "slower than the DIPs weighted alike: slow x0." in plan.reasons[-1]
