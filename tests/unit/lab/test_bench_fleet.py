"""The fleet benchmark's pure arithmetic: lag per interval, planning, take-over and join times, gaps,
memory at a retention and cores needed, on steps with known answers."""

from __future__ import annotations

import pytest

from knapsack_lb.errors import InvalidInputError
from knapsack_lb.lab.bench.fleet import (
    KeySizes,
    Step,
    all_planned_at,
    cores_needed,
    joined_seconds,
    lag_by_interval,
    memory_at_retention,
    percentile,
    takeover_seconds,
    vips_without_step,
)


def test_lag_per_interval_has_the_steps_their_vips_and_percentiles() -> None:
    steps = [Step("a", "c0", 101.0, 100.0, 1), Step("b", "c0", 103.0, 100.0, 1),  # lags 1 and 3, interval 0
             Step("a", "c0", 106.0, 105.5, 1)]  # lag 0.5, interval 1
    rows = lag_by_interval(steps, start=100.0, interval=5.0)
    assert [(r["t"], r["steps"], r["vips"]) for r in rows] == [(0.0, 2, 2), (5.0, 1, 1)]
    assert rows[0]["lag_p50"] == 2.0 and rows[0]["lag_p99"] == pytest.approx(2.98)
    assert rows[1]["lag_p50"] == 0.5
    assert percentile([], 50) is None


def test_every_vip_is_planned_at_the_last_first_plan() -> None:
    steps = [Step("a", "c0", 1.0, None, 0), Step("a", "c0", 2.0, 1.5, 1), Step("b", "c1", 4.0, 3.0, 2),
             Step("b", "c1", 9.0, 8.0, 3)]
    assert all_planned_at(steps, ["a", "b"]) == 4.0
    assert all_planned_at(steps, ["a", "b", "c"]) is None


def test_takeover_waits_for_the_last_orphan_and_ignores_the_victims_own_steps() -> None:
    steps = [Step("a", "k", 10.0, 9.0, 1), Step("b", "k", 10.0, 9.0, 1), Step("c", "s", 10.0, 9.0, 1),
             Step("a", "k", 20.5, 20.0, 1),  # a step the victim finished after the kill does not count
             Step("a", "s", 24.0, 23.0, 1), Step("b", "s", 31.0, 30.0, 1)]
    assert takeover_seconds(steps, "k", 20.0) == (11.0, 2)
    assert takeover_seconds(steps[:5], "k", 20.0) == (None, 2)  # b never taken over
    assert takeover_seconds(steps, "nobody", 20.0) == (0.0, 0)


def test_a_joiner_is_done_when_it_stepped_the_last_vip_it_took() -> None:
    steps = [Step("a", "j", 12.0, 11.0, 1), Step("b", "j", 17.0, 16.0, 1), Step("a", "j", 17.0, 16.0, 1),
             Step("c", "j", 40.0, 39.0, 1)]
    assert joined_seconds(steps, "j", 10.0, until=30.0) == (7.0, 2)
    assert joined_seconds(steps, "x", 10.0, until=30.0) == (None, 0)


def test_vips_without_a_step_across_an_event() -> None:
    steps = [Step("a", "c", 9.0, 8.0, 1), Step("a", "c", 14.0, 13.0, 1),  # gap 5
             Step("b", "c", 9.0, 8.0, 1), Step("b", "c", 21.0, 20.0, 1),  # gap 12
             Step("c", "c", 9.0, 8.0, 1)]  # never again: gap to the end (30)
    assert vips_without_step(steps, ["a", "b", "c"], at=10.0, limit=10.0, end=30.0) == ["b", "c"]


def test_memory_at_retention_is_rounds_plus_plans_plus_fixed_per_dip() -> None:
    # 2 VIPs, 10 DIPs, 50 rounds stored in 30,000 B (600 B each); a plan entry of 1,200 B per VIP summed: 2,400 B
    # over 10 DIPs = 240 B per DIP per plan; fixed keys 20,000 B = 2,000 B per DIP.
    sizes = KeySizes(vips=2, dips=10, rounds=50, round_bytes=30_000, plan_bytes=2_400.0, fixed_bytes=20_000)
    estimate = memory_at_retention(sizes, retention_count=120, plan_history=100, dips=60_000)
    assert estimate.bytes_per_round == 600.0
    assert estimate.bytes_per_plan_per_dip == 240.0
    assert estimate.fixed_bytes_per_dip == 2_000.0
    assert estimate.bytes_per_dip == 600 * 120 + 240 * 100 + 2_000  # 98,000 B
    assert estimate.total_bytes == 98_000 * 60_000
    assert estimate.to_dict()["total_gib"] == round(98_000 * 60_000 / 2**30, 3)
    with pytest.raises(InvalidInputError):
        memory_at_retention(KeySizes(0, 0, 0, 0, 0.0, 0), retention_count=1, plan_history=1, dips=1)


def test_cores_needed_to_step_every_vip_every_interval() -> None:
    assert cores_needed(100.0, vips=3410, interval=5.0) == pytest.approx(6.82)
    with pytest.raises(InvalidInputError):
        cores_needed(0.0, vips=1, interval=5.0)


def test_the_learners_evidence_still_to_come_is_added_per_dip() -> None:
    # 10 DIPs hold 20 evidence entries of 100 B each (2 per DIP); at steady state each DIP holds 121
    sizes = KeySizes(vips=2, dips=10, rounds=50, round_bytes=30_000, plan_bytes=0.0, fixed_bytes=0,
                     evidence_entries=20, evidence_bytes=2_000)
    estimate = memory_at_retention(sizes, retention_count=1, plan_history=1, dips=1, evidence_per_dip=121)
    assert estimate.evidence_bytes_per_dip == (121 - 2) * 100
    assert estimate.bytes_per_dip == 600 + (121 - 2) * 100
