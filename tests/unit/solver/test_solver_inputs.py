"""Bad input is refused with the DIP and the field named; infeasible input with the numbers."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from knapsack_lb.curves import PiecewiseLinearCurve, QuadraticCurve, QueueingCurve
from knapsack_lb.errors import InfeasibleError, InvalidInputError
from knapsack_lb.solver import DipInput, solve
from knapsack_lb.solver.curves_file import parse_curves

FLAT = QuadraticCurve(0.001, 0.0, 0.01)


class NanCurve:
    """A foreign curve (not one of ours) that returns NaN above a weight."""

    kind = "custom"

    def latency(self, weight: float) -> float:
        return math.nan if weight > 0.2 else 0.001

    def latencies(self, weights: Any) -> Any:
        w = np.asarray(weights, dtype=np.float64)
        return np.where(w > 0.2, np.nan, 0.001)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "custom"}


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"w_max": math.nan}, "w_max"),
        ({"w_max": -0.1}, "w_max"),
        ({"w_max": 0.0}, "w_max"),
        ({"min_weight": -0.01}, "min_weight"),
        ({"min_weight": 0.9}, "min_weight"),
        ({"min_weight": 0.3, "max_weight": 0.2}, "max_weight"),
        ({"pin": 1.5}, "pin"),
        ({"pin": math.inf}, "pin"),
    ],
)
def test_bad_scalar_fields_name_dip_and_field(kwargs: dict[str, Any], field: str) -> None:
    args: dict[str, Any] = {"name": "dip-7", "curve": FLAT, "w_max": 0.5} | kwargs
    with pytest.raises(InvalidInputError) as err:
        DipInput(**args)
    assert err.value.dip == "dip-7"
    assert err.value.field == field
    assert "dip-7" in str(err.value) and field in str(err.value)


def test_unsafe_name_is_refused() -> None:
    with pytest.raises(InvalidInputError) as err:
        DipInput("a;reload", FLAT, 0.5)
    assert err.value.field == "name"


@pytest.mark.parametrize(
    ("curve", "w_max", "field", "words"),
    [
        (QuadraticCurve(-0.001, 0.0, 1.0), 0.6, "curve", "negative"),
        (QuadraticCurve(0.01, -0.1, 0.0), 0.6, "curve", "decreases"),
        (QuadraticCurve(0.01, 0.1, -0.2), 0.6, "curve", "decreases before w_max"),
        (PiecewiseLinearCurve((0.0, 0.3, 0.6), (0.002, 0.001, 0.004)), 0.6, "curve", "not monotone"),
        (NanCurve(), 0.6, "curve", "NaN"),
        (QueueingCurve(0.001, 0.01, 0.5), 0.6, "w_max", "saturation"),
    ],
)
def test_bad_curves_name_dip_and_field(curve: Any, w_max: float, field: str, words: str) -> None:
    dips = [DipInput("good", FLAT, 0.6), DipInput("bad-one", curve, w_max)]
    with pytest.raises(InvalidInputError) as err:
        solve(dips)
    assert err.value.dip == "bad-one"
    assert err.value.field == field
    assert words in str(err.value)


def test_over_capacity_pool_says_so_with_numbers() -> None:
    dips = [DipInput("a", FLAT, 0.3), DipInput("b", FLAT, 0.45)]
    with pytest.raises(InfeasibleError) as err:
        solve(dips)
    message = str(err.value)
    assert "over capacity" in message and "0.75" in message and "below the total 1" in message


def test_pins_above_total_are_infeasible() -> None:
    dips = [DipInput("a", FLAT, 0.9, pin=0.7), DipInput("b", FLAT, 0.9, pin=0.6)]
    with pytest.raises(InfeasibleError, match=r"pinned weights sum to 1\.3"):
        solve(dips)


def test_floors_above_total_are_infeasible() -> None:
    dips = [DipInput("a", FLAT, 0.9, min_weight=0.6), DipInput("b", FLAT, 0.9, min_weight=0.5)]
    with pytest.raises(InfeasibleError, match=r"minimum weights \(1\.1\)"):
        solve(dips)


def test_duplicate_names_are_refused() -> None:
    with pytest.raises(InvalidInputError, match="unique"):
        solve([DipInput("a", FLAT, 0.9), DipInput("a", FLAT, 0.9)])


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"objective": "median"}, "objective"), ({"method": "magic"}, "method"), ({"total": 0.0}, "total"),
     ({"levels": 1}, "levels"), ({"units": 0}, "units"), ({"imbalance": -1.0}, "imbalance"),
     ({"method": "exact", "imbalance": 0.1}, "imbalance")],
)
def test_bad_parameters_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInputError) as err:
        solve([DipInput("a", FLAT, 0.9), DipInput("b", FLAT, 0.9)], **kwargs)
    assert err.value.field == field


def test_curves_file_errors_name_dip_and_field() -> None:
    good = {"name": "a", "curve": {"kind": "quadratic", "a": 0.001, "b": 0.0, "c": 0.1}, "w_max": 0.8}
    with pytest.raises(InvalidInputError) as err:
        parse_curves({"dips": [good, {"name": "b", "curve": good["curve"]}]})
    assert (err.value.dip, err.value.field) == ("b", "w_max")
    with pytest.raises(InvalidInputError) as err:
        parse_curves({"dips": [good | {"maxweight": 0.2}]})
    assert (err.value.dip, err.value.field) == ("a", "maxweight")
    with pytest.raises(InvalidInputError) as err:
        parse_curves({"dips": [good | {"curve": {"kind": "quadratic", "a": 0.001, "b": "x", "c": 0.1}}]})
    assert err.value.dip == "a" and err.value.field == "curve.b"
    parsed = parse_curves({"objective": "sum", "dips": [good, good | {"name": "b", "pin": 0.25}]})
    assert parsed.objective == "sum" and parsed.dips[1].pin == 0.25


def test_non_dip_input_is_refused_with_its_position() -> None:
    with pytest.raises(InvalidInputError) as err:
        solve([DipInput("a", FLAT, 0.9), {"name": "b"}])  # type: ignore[list-item]
    assert err.value.field == "dips[1]"
