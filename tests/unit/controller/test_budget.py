"""The probe budget allocator (knapsack_lb.controller.budget): known answers."""

from __future__ import annotations

import pytest

from knapsack_lb.controller.budget import DipUncertainty, allocate
from knapsack_lb.errors import InvalidInputError


def _settled(name: str, r: float | None, capacity: float | None = 10_000.0, **kw: object) -> DipUncertainty:
    return DipUncertainty(name, "settled", relative_stderr=r, capacity=capacity, **kw)  # type: ignore[arg-type]


def test_equal_uncertainty_is_the_uniform_split() -> None:
    dips = [_settled(n, 0.05) for n in "abcd"]
    assert allocate(dips, uniform=100, interval=5.0) == dict.fromkeys("abcd", 100)


def test_nothing_known_is_the_uniform_split() -> None:
    dips = [DipUncertainty(n) for n in "abc"]
    assert allocate(dips, uniform=20, interval=5.0) == dict.fromkeys("abc", 20)


def test_a_dip_with_four_times_the_standard_error_gets_more() -> None:
    dips = [_settled("a", 0.04), _settled("b", 0.01), _settled("c", 0.01), _settled("d", 0.01)]
    budget = allocate(dips, uniform=100, interval=5.0)
    assert sum(budget.values()) == 400
    assert budget["a"] > 100 > budget["b"] == budget["c"] == budget["d"]
    # water-filling: the known ones keep their floor, the uncertain one takes the rest
    assert budget == {"a": 391, "b": 3, "c": 3, "d": 3}


def test_a_new_dip_takes_what_the_well_known_ones_do_not_need() -> None:
    dips = [DipUncertainty("new", capacity=10_000.0), _settled("a", 0.2), _settled("b", 0.2)]
    budget = allocate(dips, uniform=50, interval=5.0)
    assert sum(budget.values()) == 150
    assert budget["new"] > max(budget["a"], budget["b"]) and min(budget["a"], budget["b"]) > 3
    assert abs(budget["a"] - budget["b"]) <= 1


def test_the_cap_binds_at_three_percent_of_capacity_and_the_surplus_goes_to_the_others() -> None:
    # "a" serves 200 requests/s: 3 % of it over a 5 s interval is 30 requests
    dips = [_settled("a", 0.2, capacity=200.0), _settled("b", 0.2), _settled("c", 0.2)]
    budget = allocate(dips, uniform=100, interval=5.0)
    assert budget["a"] == 30
    assert budget["b"] + budget["c"] == 270 and abs(budget["b"] - budget["c"]) <= 1


def test_unknown_capacity_caps_at_the_uniform_share() -> None:
    dips = [_settled("a", 0.5, capacity=None), _settled("b", 0.01, capacity=None), _settled("c", 0.01, None)]
    budget = allocate(dips, uniform=40, interval=5.0)
    assert budget == dict.fromkeys("abc", 40)


def test_the_floor_holds() -> None:
    dips = [DipUncertainty("new", capacity=10_000.0), _settled("known", 1e-4)]
    budget = allocate(dips, uniform=10, interval=5.0, floor=4)
    assert budget == {"new": 16, "known": 4}
    # a DIP of unknown capacity is never probed harder than the uniform share: the known one keeps the rest
    assert allocate([DipUncertainty("new"), _settled("known", 1e-4)], uniform=10, interval=5.0, floor=4) == {
        "new": 10, "known": 10}
    # a floor above the uniform share is the uniform share; a cap below the floor wins, but never 0
    assert allocate([DipUncertainty("x"), _settled("y", 1e-4)], uniform=2, interval=5.0, floor=5) == {"x": 2, "y": 2}
    tiny = [_settled("tiny", 0.3, capacity=1.0), _settled("big", 0.3)]
    assert allocate(tiny, uniform=10, interval=5.0)["tiny"] == 1


def test_a_drained_dip_gets_its_floor_only() -> None:
    dips = [DipUncertainty("gone", "drained"), _settled("a", 0.1), _settled("b", 0.1)]
    budget = allocate(dips, uniform=30, interval=5.0)
    assert budget["gone"] == 3 and budget["a"] + budget["b"] == 87


@pytest.mark.parametrize("uniform", [1, 3, 7, 100])
def test_the_total_never_exceeds_the_vips_total(uniform: int) -> None:
    dips = [DipUncertainty("n"), _settled("a", 0.3, capacity=50.0), _settled("b", 0.01),
            DipUncertainty("d", "drained"), _settled("c", 0.07, spread=2.0)]
    budget = allocate(dips, uniform=uniform, interval=1.0)
    assert sum(budget.values()) <= uniform * len(dips)
    assert all(n >= 1 for n in budget.values())


def test_the_cap_rises_on_the_lower_bound_and_falls_on_the_best_estimate() -> None:
    # 3 % x 5 s = 0.15 requests per request/s of capacity; the uniform share is 20
    unseen = _settled("unseen", 0.5, capacity=1e6, capacity_low=20.0)  # low bound 3 requests: not seen small
    small = _settled("small", 0.5, capacity=40.0, capacity_low=20.0)  # seen to saturate at 40/s: 6 requests
    big = _settled("big", 0.5, capacity=1e6, capacity_low=1000.0)  # known to take 150
    budget = allocate([unseen, small, big], uniform=20, interval=5.0)
    assert budget["unseen"] == 20 and budget["small"] == 6
    assert budget["big"] == 60 - 20 - 6


def test_when_every_cap_binds_the_load_shrinks() -> None:
    dips = [_settled(n, 0.1, capacity=100.0) for n in "ab"]  # 3 % of 100/s x 5 s = 15
    assert allocate(dips, uniform=100, interval=5.0) == {"a": 15, "b": 15}


def test_uniform_method_and_determinism() -> None:
    dips = [DipUncertainty("a"), _settled("b", 0.01)]
    assert allocate(dips, uniform=9, interval=5.0, method="uniform") == {"a": 9, "b": 9}
    ties = [_settled(n, 0.1) for n in "cab"]
    first = allocate(ties, uniform=7, interval=5.0)
    assert first == allocate(list(reversed(ties)), uniform=7, interval=5.0) == dict.fromkeys("abc", 7)


def test_nonsense_counts_as_unknown_and_bad_arguments_are_named() -> None:
    dips = [_settled("a", float("nan"), capacity=float("inf")), _settled("b", -1.0, capacity=0.0)]
    assert allocate(dips, uniform=5, interval=5.0) == {"a": 5, "b": 5}
    with pytest.raises(InvalidInputError, match="load_cap"):
        allocate(dips, uniform=5, interval=5.0, load_cap=0.0)
    with pytest.raises(InvalidInputError, match="uniform"):
        allocate(dips, uniform=0, interval=5.0)
    with pytest.raises(InvalidInputError, match="dips"):
        allocate([DipUncertainty("a"), DipUncertainty("a")], uniform=5, interval=5.0)


def test_requests_the_lb_timed_count_as_probes_already_sent() -> None:
    # equal uncertainty: the water level is over a round's samples, so the DIP the LB timed 50 requests of
    # gets 50 probes fewer, and the VIP's probes shrink by as many
    dips = [_settled("timed", 0.2, lb_timed=50), _settled("untimed", 0.2)]
    assert allocate(dips, uniform=100, interval=5.0) == {"timed": 50, "untimed": 100}
    # the LB timed more than the VIP's whole budget: every DIP its floor, the one it sends nothing too
    dips = [_settled("a", 0.2, lb_timed=900), _settled("b", 0.2, lb_timed=400), _settled("c", 0.2)]
    assert allocate(dips, uniform=100, interval=5.0) == dict.fromkeys("abc", 3)
    # a few timed requests lower every DIP's probes by as many
    dips = [_settled(n, 0.2, lb_timed=10) for n in "abc"]
    assert allocate(dips, uniform=20, interval=5.0) == dict.fromkeys("abc", 10)


def test_the_breakers_floor_counts_the_lb_timed_requests() -> None:
    dips = [_settled("timed", 0.2, lb_timed=8), _settled("probed", 0.2)]
    budget = allocate(dips, uniform=3, interval=5.0, floor=3, judged=10)
    # the breaker judges a round of 10 requests: "probed" needs them all from probes, "timed" only 3 more
    # (the floor), and neither gets more than the uniform share's cap allows
    assert budget == {"timed": 3, "probed": 3}
    budget = allocate(dips, uniform=20, interval=5.0, floor=3, judged=10)
    assert budget["timed"] >= 3 and budget["probed"] >= 10
    with pytest.raises(InvalidInputError, match="judged"):
        allocate(dips, uniform=5, interval=5.0, judged=0)


def test_light_requests_work_comes_off_the_cap_and_the_total() -> None:
    # "a" serves 200 requests/s: 3 % over 5 s is 30 requests, 50 light requests at a tenth of a probe's work cost 5
    dips = [_settled("a", 0.2, capacity=200.0, light=5.0), _settled("b", 0.2, light=5.0), _settled("c", 0.2)]
    budget = allocate(dips, uniform=100, interval=5.0)
    assert budget["a"] == 25
    assert sum(budget.values()) == 300 - 10 and abs(budget["b"] - budget["c"]) <= 1
    # half a probe's worth still takes a whole probe off the cap; the cap never falls below one probe
    assert allocate([_settled("a", 0.2, capacity=200.0, light=0.5)], uniform=100, interval=5.0)["a"] == 29
    assert allocate([_settled("a", 0.2, capacity=20.0, light=9.0)], uniform=100, interval=5.0)["a"] == 1
    # unknown or nonsense light work counts as none
    assert allocate([_settled("a", 0.2, capacity=200.0, light=float("nan"))], uniform=100, interval=5.0)["a"] == 30
