"""Capacity from the share of light probes that waited: Erlang's formula on known answers."""

from __future__ import annotations

import math

import pytest

from knapsack_lb.controller.waiting import (
    capacity_from_waited_share,
    erlang_c,
    load_from_light_probes,
    servers_from_spare,
    servers_from_waited_share,
    utilisation_from_waited_share,
)
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


@pytest.mark.parametrize("servers", [1.0, 2.5, 4.0, 16.0, 40.0])
@pytest.mark.parametrize("utilisation", [0.3, 0.7, 0.9])
def test_servers_from_the_spare_workers_inverts_erlang_c(servers: float, utilisation: float) -> None:
    spare = servers * (1 - utilisation)
    assert servers_from_spare(erlang_c(servers, servers - spare), spare) == pytest.approx(servers, rel=1e-6)


def _exact_probes(servers: int, utilisation: float, probes: int) -> tuple[int, float]:
    """M/M/c's expected light-probe statistics: how many wait, and their summed excess (each a wait
    of mean 1 / (c - a) in units of the mean service)."""
    offered = servers * utilisation
    waited = round(erlang_c(servers, offered) * probes)
    return waited, waited / (servers - offered)


def test_a_single_worker_at_70_percent_from_its_waits_alone() -> None:
    # M/M/1: 70 % of probes wait, each for 1 / (1 - 0.7) = 3.33 mean services
    load = load_from_light_probes(700, 1000, 700 / 0.3)
    assert load.utilisation == pytest.approx(0.7, rel=1e-6)
    assert load.servers == pytest.approx(1.0, rel=1e-6)
    assert load.spare == pytest.approx(0.3)


@pytest.mark.parametrize(("servers", "utilisation"), [(4, 0.5), (4, 0.85), (16, 0.7), (16, 0.85)])
def test_the_utilisation_and_the_workers_of_an_mmc_dip_from_its_waits_without_its_rate(
        servers: int, utilisation: float) -> None:
    waited, excess = _exact_probes(servers, utilisation, 100_000)
    load = load_from_light_probes(waited, 100_000, excess)
    assert load.utilisation == pytest.approx(utilisation, abs=0.002)
    assert load.servers == pytest.approx(servers, rel=0.01)
    assert load.high is not None and load.low < utilisation < load.high


def test_fewer_probes_give_wider_bounds_on_the_utilisation() -> None:
    waited, excess = _exact_probes(16, 0.7, 200)
    few = load_from_light_probes(waited, 200, excess)
    waited, excess = _exact_probes(16, 0.7, 5000)
    many = load_from_light_probes(waited, 5000, excess)
    assert few.high is not None and many.high is not None
    assert few.low < many.low < 0.7 < many.high < few.high


def test_no_probe_waited_says_nothing_and_every_probe_waited_leaves_the_dip_possibly_saturated() -> None:
    idle = load_from_light_probes(0, 50, 0.0)
    assert idle.utilisation is None and idle.spare is None and idle.high is None and idle.low == 0.0
    full = load_from_light_probes(50, 50, 5.0)
    assert full.utilisation is None and full.high == 1.0 and 0.0 < full.low < 1.0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"waited": 3, "probes": 2, "excess": 1.0}, "waited"),
        ({"waited": 1, "probes": 0, "excess": 1.0}, "probes"),
        ({"waited": 1, "probes": 10, "excess": 0.0}, "excess"),
        ({"waited": 1, "probes": 10, "excess": math.inf}, "excess"),
        ({"waited": 1, "probes": 10, "excess": -1.0}, "excess"),
        ({"waited": 1, "probes": 10, "excess": 1.0, "z": -2.0}, "z"),
        ({"waited": 1, "probes": 10, "excess": 1.0, "threshold": -0.1}, "threshold"),
        ({"waited": 1, "probes": 10, "excess": 1.0, "threshold": math.nan}, "threshold"),
    ],
)
def test_bad_light_probe_load_input_names_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        load_from_light_probes(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


@pytest.mark.parametrize(("waited", "spare", "field"), [(0.0, 1.0, "waited"), (0.5, 0.0, "spare")])
def test_bad_spare_input_names_the_field(waited: float, spare: float, field: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        servers_from_spare(waited, spare)
    assert info.value.field == field


@pytest.mark.parametrize("threshold", [0.05, 0.1, 0.2])
def test_waits_counted_only_past_a_jitter_threshold_read_the_same_load(threshold: float) -> None:
    # 16 workers at 70 %: waits of mean 1 / 4.8 services; those past the threshold are fewer by
    # exp(-threshold x 4.8) and exceed it by the same mean (a wait is memoryless)
    servers, utilisation, probes = 16, 0.7, 100_000
    spare = servers * (1 - utilisation)
    counted = round(erlang_c(servers, servers - spare) * math.exp(-threshold * spare) * probes)
    load = load_from_light_probes(counted, probes, counted / spare, threshold=threshold)
    assert load.utilisation == pytest.approx(utilisation, abs=0.002)
    assert load.servers == pytest.approx(servers, rel=0.01)
    assert load.high is not None and load.low < utilisation < load.high
    uncorrected = load_from_light_probes(counted, probes, counted / spare)
    assert uncorrected.utilisation is not None and uncorrected.utilisation < utilisation


def test_waits_longer_than_any_number_of_workers_allows_read_as_one_busy_worker() -> None:
    # 30 % waited, for 3.3 services on average: M/M/1 at 70 % would have 70 % waiting; fewer workers
    # than one would be needed, so the read takes one worker and the waits' length (the busier read)
    assert servers_from_spare(0.3, 0.3) == 1.0
    load = load_from_light_probes(300, 1000, 300 / 0.3)
    assert load.servers == 1.0 and load.utilisation == pytest.approx(0.7)


def test_waits_far_shorter_than_the_threshold_are_restored_at_most_e_fold() -> None:
    # three of 300 past a threshold of 0.5, beyond it by a millionth each: not the tail of exponential waits
    # (restored as such, exp(0.5 x 1e6) overflows); restored e-fold, as a threshold of one mean excess would be
    load = load_from_light_probes(3, 300, 3e-6, threshold=0.5)
    assert load.utilisation is not None and math.isfinite(load.utilisation)
    assert load.utilisation == load_from_light_probes(3, 300, 3e-6, threshold=1e-6).utilisation


@pytest.mark.parametrize(("servers", "utilisation"), [(1, 0.3), (4, 0.7), (64, 0.9)])
def test_the_utilisation_from_the_waited_share_inverts_erlang_c_in_the_load(servers: int, utilisation: float) -> None:
    waited = erlang_c(servers, servers * utilisation)
    assert utilisation_from_waited_share(waited, servers) == pytest.approx(utilisation, abs=1e-9)
    if servers == 1:
        assert utilisation_from_waited_share(0.3, 1) == pytest.approx(0.3)  # M/M/1: C is the utilisation
    with pytest.raises(InvalidInputError, match="waited"):
        utilisation_from_waited_share(1.0, servers)
