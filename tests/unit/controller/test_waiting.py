"""Capacity from the share of light probes that waited: Erlang's formula on known answers."""

from __future__ import annotations

import math

import pytest

from knapsack_lb.controller.waiting import capacity_from_waited_share, erlang_c, servers_from_waited_share
from knapsack_lb.errors import InvalidInputError
from knapsack_lb.solver.oracle import erlang_c as erlang_c_integer


def test_erlang_c_of_one_server_is_its_utilisation_and_of_two_the_textbook_value() -> None:
    assert erlang_c(1, 0.7) == pytest.approx(0.7)
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)  # M/M/2 at rho = 0.5: 2 rho^2 / (1 + rho)


@pytest.mark.parametrize("servers", [1, 2, 4, 8, 16, 64])
@pytest.mark.parametrize("utilisation", [0.1, 0.5, 0.7, 0.95])
def test_erlang_c_at_whole_servers_is_the_recursion_of_the_integer_formula(servers: int, utilisation: float) -> None:
    offered = servers * utilisation
    assert erlang_c(servers, offered) == pytest.approx(erlang_c_integer(servers, offered), rel=1e-9)


def test_erlang_c_between_whole_servers_lies_between_their_values_and_saturates_at_the_offered_load() -> None:
    offered = 5.6
    assert erlang_c(8, offered) < erlang_c(7.5, offered) < erlang_c(7, offered)
    assert erlang_c(offered, offered) == 1.0
    assert erlang_c(offered * 0.9, offered) == 1.0
    assert erlang_c(4, 0.0) == 0.0


@pytest.mark.parametrize("servers", [1.0, 3.0, 7.5, 16.0, 48.0])
@pytest.mark.parametrize("utilisation", [0.3, 0.7, 0.9])
def test_servers_from_the_waited_share_inverts_erlang_c(servers: float, utilisation: float) -> None:
    offered = servers * utilisation
    assert servers_from_waited_share(erlang_c(servers, offered), offered) == pytest.approx(servers, rel=1e-6)


def test_capacity_of_a_16_worker_dip_at_70_percent_from_its_exact_waited_share() -> None:
    # 16 workers of 10 ms: 1,600 requests/s; carried 1,120/s; Erlang C 0.1297 of requests wait
    share = erlang_c(16, 11.2)
    probes = 10_000
    estimate = capacity_from_waited_share(round(share * probes), probes, rate=1120.0, unloaded=0.010)
    assert estimate.capacity == pytest.approx(1600.0, rel=0.01)
    assert estimate.servers == pytest.approx(16.0, rel=0.01)
    assert estimate.low is not None and estimate.high is not None
    assert estimate.low < 1600.0 < estimate.high
    assert estimate.high / estimate.low < 1.1  # ten thousand probes know it to a few percent


def test_fewer_probes_give_wider_bounds_around_the_same_estimate() -> None:
    few = capacity_from_waited_share(13, 100, rate=1120.0, unloaded=0.010)
    many = capacity_from_waited_share(130, 1000, rate=1120.0, unloaded=0.010)
    assert few.capacity == pytest.approx(many.capacity)
    assert few.low is not None and few.high is not None and many.low is not None and many.high is not None
    assert few.low < many.low < many.high < few.high


def test_no_probe_waited_bounds_the_capacity_from_below_only() -> None:
    estimate = capacity_from_waited_share(0, 50, rate=500.0, unloaded=0.010)
    assert estimate.capacity is None and estimate.high is None
    assert estimate.low is not None and estimate.low > 500.0


def test_every_probe_waited_leaves_no_lower_bound_the_dip_may_be_past_its_capacity() -> None:
    estimate = capacity_from_waited_share(50, 50, rate=500.0, unloaded=0.010)
    assert estimate.low is None
    assert estimate.capacity == pytest.approx(500.0)
    assert estimate.high is not None and estimate.high > 500.0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"waited": -1, "probes": 10, "rate": 1.0, "unloaded": 0.01}, "waited"),
        ({"waited": 11, "probes": 10, "rate": 1.0, "unloaded": 0.01}, "waited"),
        ({"waited": 0, "probes": 0, "rate": 1.0, "unloaded": 0.01}, "probes"),
        ({"waited": 1, "probes": 10, "rate": math.nan, "unloaded": 0.01}, "rate"),
        ({"waited": 1, "probes": 10, "rate": 0.0, "unloaded": 0.01}, "rate"),
        ({"waited": 1, "probes": 10, "rate": 1.0, "unloaded": -0.01}, "unloaded"),
        ({"waited": 1, "probes": 10, "rate": 1.0, "unloaded": 0.01, "z": 0.0}, "z"),
    ],
)
def test_bad_input_names_the_field_and_the_value(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        capacity_from_waited_share(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field
