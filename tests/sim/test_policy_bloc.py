"""BLOC (ACSOS'22, BLOC paper, sections III-IV): chips, AQM, capacity, Active/Inactive lists."""

from __future__ import annotations

import random

import pytest

from knapsack_lb.errors import InvalidInputError
from knapsack_lb.sim.policies.base import Outcome, Request
from knapsack_lb.sim.policies.bloc import BlocPolicy, DynamicCapacity, aqm_admits, issue_chip, no_chip_probability
from tests.sim.fakes import FakeView


def answer(dip: int, sent: float, done: float, status: str = "ok", chip: bool = False) -> Outcome:
    return Outcome(request_id=0, dip=dip, sent_at=sent, finished_at=done, status=status, chip=chip)  # type: ignore[arg-type]


def test_no_chip_probability_section_iv_a() -> None:
    assert no_chip_probability(4, 10) == pytest.approx(0.5)  # q = 0.4 cap
    assert no_chip_probability(0, 10) == 0.0
    assert no_chip_probability(8, 10) == 1.0  # 20% of capacity stays reserved
    assert no_chip_probability(12, 10) == 1.0


def test_issue_chip_frequency_matches_the_formula() -> None:
    rng = random.Random(7)
    draws = 20_000
    chips = sum(issue_chip(4, 10, rng) for _ in range(draws))
    assert chips / draws == pytest.approx(0.5, abs=0.015)
    chips = sum(issue_chip(2, 10, rng) for _ in range(draws))
    assert chips / draws == pytest.approx(0.75, abs=0.015)
    assert not any(issue_chip(8, 10, rng) for _ in range(1000))
    assert all(issue_chip(0, 10, rng) for _ in range(1000))


def test_aqm_rejects_above_capacity() -> None:
    assert aqm_admits(9, 10)
    assert not aqm_admits(10, 10)
    assert aqm_admits(10_000, None)  # dynamic capacity not known yet: admit all


def test_dynamic_capacity_is_the_30s_average_recomputed_every_window() -> None:
    cap = DynamicCapacity(window=30.0)
    for t, q in ((1.0, 4), (10.0, 6), (20.0, 8)):
        cap.sample(t, q)
    assert cap.capacity(29.9) is None  # the first 30 s admit all
    assert cap.capacity(30.0) == 6.0
    cap.sample(31.0, 1)
    cap.sample(40.0, 2)
    assert cap.capacity(59.0) == 6.0
    assert cap.capacity(60.0) == 2.0  # ceil(1.5)
    assert cap.capacity(95.0) == 2.0  # an empty window keeps the last value
    with pytest.raises(InvalidInputError, match="window"):
        DynamicCapacity(window=0)


def test_without_chips_requests_probe_inactive_dips_then_drop() -> None:
    policy = BlocPolicy(reset_interval=1.0)
    view = FakeView(n=3)
    rng = random.Random(1)
    probed = [policy.pick(Request(i, "c", 0.0), view, rng) for i in range(3)]
    assert sorted(d for d in probed if d is not None) == [0, 1, 2]  # each inactive DIP probed once
    assert policy.pick(Request(3, "c", 0.0), view, rng) is None  # no timer expired: dropped
    view.now = 1.0
    assert policy.pick(Request(4, "c", 1.0), view, rng) is not None


def test_a_chip_makes_a_dip_active_and_a_request_spends_it() -> None:
    policy = BlocPolicy()
    view = FakeView(n=3)
    rng = random.Random(2)
    dip = policy.pick(Request(0, "c", 0.0), view, rng)
    assert dip is not None
    policy.observe(answer(dip, 0.0, 0.25, chip=False), view)
    assert policy.active(view) == []  # a successful probe without a chip stays Inactive
    view.now = 1.0
    policy.observe(answer(dip, 0.5, 1.0, chip=True), view)
    assert policy.active(view) == [dip]
    assert policy.pick(Request(1, "c", 1.0), view, rng) == dip
    assert policy.chips[dip] == 0 and policy.active(view) == []


def test_p2c_least_connections_over_the_active_list() -> None:
    policy = BlocPolicy(start_active=True, initial_chips=1000)
    view = FakeView(n=2, counts={0: 5, 1: 1})
    rng = random.Random(3)
    assert {policy.pick(Request(i, "c", 0.0), view, rng) for i in range(50)} == {1}


def test_rejection_drops_chips_backs_off_and_the_retry_goes_elsewhere() -> None:
    policy = BlocPolicy(reset_interval=2.0, start_active=True, initial_chips=5)
    view = FakeView(n=3)
    rng = random.Random(4)
    policy.observe(answer(0, 0.0, 0.01, status="rejected"), view)
    assert policy.chips[0] == 0 and 0 not in policy.active(view)
    retry = Request(1, "c", 0.01, attempt=1, excluded=frozenset({0}))
    assert policy.pick(retry, view, rng) in {1, 2}
    # a chip granted to a request sent before the rejection is stale: dropped with the others
    policy.observe(answer(0, -0.1, 0.05, chip=True), view)
    assert 0 not in policy.active(view)
    # once the Active list is empty, the backed-off DIP is probed only after its reset interval
    policy.chips[1] = policy.chips[2] = 0
    view.now = 1.0
    assert policy.pick(Request(2, "c", 1.0), view, rng) in {1, 2}  # those two were never backed off
    view.now = 2.5
    policy.chips[1] = policy.chips[2] = 0
    policy._timer_until[1] = policy._timer_until[2] = 10.0
    assert policy.pick(Request(3, "c", 2.5), view, rng) == 0  # its reset interval has passed: probe it
    assert policy.pick(Request(4, "c", 2.5), view, rng) is None  # its timer restarted
    policy.observe(answer(0, 2.5, 2.8, chip=True), view)  # the probe succeeds with a chip
    view.now = 2.8
    assert policy.active(view) == [0]


def test_validation_names_the_field() -> None:
    with pytest.raises(InvalidInputError, match="reset_interval"):
        BlocPolicy(reset_interval=0)
