import math

import pytest

from knapsack_lb.errors import InvalidInputError
from knapsack_lb.model import Measurement, ProbeSpec, VipConfig, WeightPlan
from knapsack_lb.names import parse_address, validate_name


def test_plan_round_trips_and_checks_sum() -> None:
    plan = WeightPlan(vip="web", weights={"a": 0.25, "b": 0.75}, reasons=("initial",))
    again = WeightPlan.from_dict(plan.to_dict())
    assert again == WeightPlan(vip="web", weights={"a": 0.25, "b": 0.75}, reasons=("initial",),
                               objective=math.nan) or again.weights == plan.weights
    with pytest.raises(InvalidInputError, match="sum to 1"):
        WeightPlan(vip="web", weights={"a": 0.5, "b": 0.4})
    with pytest.raises(InvalidInputError, match="'b'"):
        WeightPlan(vip="web", weights={"a": 1.5, "b": -0.5})


@pytest.mark.parametrize("bad", ["a;b", "a b", "a\nb", "a'b", 'a"b', "a/b", "", "-x", "x" * 70])
def test_names_refuse_injection(bad: str) -> None:
    with pytest.raises(InvalidInputError):
        validate_name("server", bad)


def test_addresses() -> None:
    assert parse_address("address", "127.0.0.1:80") == ("127.0.0.1", 80)
    assert parse_address("address", "[::1]:8080") == ("::1", 8080)
    assert parse_address("address", "dip-1.local:443") == ("dip-1.local", 443)
    for bad in ["127.0.0.1", "::1:80", "host:0", "host:99999", "a;b:80", "h st:80"]:
        with pytest.raises(InvalidInputError, match="address"):
            parse_address("address", bad)


def test_measurement_counts_must_add_up() -> None:
    with pytest.raises(InvalidInputError, match="sent"):
        Measurement("web", "a", 0.0, 0.1, 10, 5, 1, 1, 0.01, 0.01, 0.01, 0.01, None, "w1")


def test_a_rounds_light_latencies_round_trip_and_bad_ones_are_refused_by_name() -> None:
    m = Measurement("web", "a", 0.0, 0.1, 2, 2, 0, 0, 0.01, 0.01, 0.01, 0.01, None, "w1",
                    light_latencies=(0.001, 0.0012, 0.004), light_failures=1)
    assert Measurement.from_dict(m.to_dict()) == m
    old = {k: v for k, v in m.to_dict().items() if not k.startswith("light")}  # a round stored before them
    assert Measurement.from_dict(old).light_latencies == ()
    for field, value in (("light_latencies", (0.001, math.nan)), ("light_latencies", (-0.001,)),
                         ("light_failures", -1)):
        with pytest.raises(InvalidInputError, match=field):
            Measurement("web", "a", 0.0, 0.1, 2, 2, 0, 0, 0.01, 0.01, 0.01, 0.01, None, "w1",
                        **{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["light", "/light?work=1 2", "/l\nx", "/l'x", '/l"x', "/l;x y"])
def test_a_light_path_is_validated_like_the_probe_path(bad: str) -> None:
    assert ProbeSpec(light_path="/light?work=0.001").light_path == "/light?work=0.001"
    with pytest.raises(ValueError, match="light_path"):
        ProbeSpec(light_path=bad)


def test_vip_config_validates_pins() -> None:
    dips = [{"name": "a", "address": "127.0.0.1:1"}, {"name": "b", "address": "127.0.0.1:2"}]
    with pytest.raises(ValueError, match="pins"):
        VipConfig(name="web", dips=dips, pins={"zz": 0.5})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="duplicate"):
        VipConfig(name="web", dips=dips + dips)  # type: ignore[arg-type]
