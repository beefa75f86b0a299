import json
import math
import random

import pytest

from knapsack_lb.controller.breaker import Ejection
from knapsack_lb.controller.core import VipController
from knapsack_lb.controller.dynamics import DipTrack
from knapsack_lb.controller.guard import Challenge
from knapsack_lb.controller.settings import ControllerSettings
from knapsack_lb.controller.state import ControllerState, DrainProbe
from knapsack_lb.errors import InvalidInputError
from knapsack_lb.model import WeightPlan


def _busy_controller() -> VipController:
    ctl = VipController("web", ["a", "b", "c"], ControllerSettings(), rng=random.Random(3))
    ctl.plan = WeightPlan("web", {"a": 0.5, "b": 0.5, "c": 0.0},
                          predicted_latency={"a": 0.01, "b": math.inf, "c": 0.0}, version=7)
    ctl.dips["a"].points = [(0.2, 0.01), (0.4, 0.02)]
    ctl.dips["b"].l0 = 0.004
    ctl.detector.state.tracks["a"] = DipTrack([0.1, -0.05], 1)
    ctl.detector.state.traffic_pending = 2
    ctl.breaker.state.ejections["c"] = Ejection(until=130.0, count=2)
    ctl.breaker.state.history["c"] = 2
    ctl._drain = DrainProbe("b", 40.0, [(45.0, 0.02), (50.0, 0.011)])
    ctl.guard.state.challenge = Challenge({"a": 0.7, "b": 0.3}, 6, {"a": 0.5, "b": 0.5}, 7, started=60.0)
    return ctl


def test_a_state_with_infinite_latencies_is_strict_json_and_round_trips() -> None:
    ctl = _busy_controller()
    text = json.dumps(ctl.to_dict(), allow_nan=False)  # what the store writes: never fails on inf
    twin = VipController.from_dict(json.loads(text), ControllerSettings())
    assert twin.to_dict() == ctl.to_dict()
    assert twin.plan is not None and twin.plan.predicted_latency["b"] == math.inf
    assert twin.dips["a"].last_round == -math.inf
    assert twin.breaker.ejections["c"] == Ejection(130.0, 2)
    assert twin.detector.state.tracks["a"].deviations == [0.1, -0.05]
    assert twin.guard.state.challenge == Challenge({"a": 0.7, "b": 0.3}, 6, {"a": 0.5, "b": 0.5}, 7, 60.0)


def test_a_state_of_another_version_is_refused_by_field() -> None:
    data = _busy_controller().to_dict() | {"state_version": 1}
    with pytest.raises(InvalidInputError) as err:
        ControllerState.from_dict(data)
    assert err.value.field == "state_version"


def test_a_damaged_state_names_the_field_and_a_short_value() -> None:
    data = _busy_controller().to_dict()
    data["dips"]["a"]["w_max"] = "x" * 10_000
    with pytest.raises(InvalidInputError) as err:
        ControllerState.from_dict(data)
    assert err.value.field == "controller_state.dips.a.w_max"
    assert len(str(err.value)) < 400
