"""Algorithm 1 (KnapsackLB section 4.3) in virtual time against M/M/1 DIPs of known capacity."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from knapsack_lb.controller.measurement import (
    PRIORITY_NORMAL,
    PRIORITY_OVERUTILISED,
    DipMeasurement,
    algorithm1,
    is_drop,
)
from knapsack_lb.controller.settings import ControllerSettings, MeasurementSettings, RefreshSettings
from knapsack_lb.controller.state import ControllerState, DipState
from knapsack_lb.lab.fluid import FluidDip, FluidModel
from knapsack_lb.model import Measurement


def _m(latency: float | None, successes: int = 100, errors: int = 0, timeouts: int = 0) -> Measurement:
    return Measurement("v", "d", 1.0, 0.1, successes + errors + timeouts, successes, errors, timeouts, latency,
                       latency, latency, latency, None, "t")


def test_run_step_doubles_near_l0_and_slows_near_capacity() -> None:
    fast = algorithm1(0.1, 0.0, l0=0.01, l_cur=0.01, dropped=False)
    slow = algorithm1(0.1, 0.0, l0=0.01, l_cur=0.04, dropped=False)
    assert fast.next_weight == pytest.approx(0.2)
    assert slow.next_weight == pytest.approx(0.125)
    assert fast.w_max == slow.w_max == 0.1
    assert not fast.done and not fast.backtracked


def test_backtrack_goes_to_the_mean_of_current_and_largest_drop_free_weight() -> None:
    step = algorithm1(0.3, 0.2, l0=0.01, l_cur=0.2, dropped=True)
    assert step.next_weight == pytest.approx(0.25)
    assert step.w_max == 0.2 and step.backtracked


def test_done_when_the_change_is_within_five_percent_of_w_max() -> None:
    assert algorithm1(0.205, 0.2, l0=0.01, l_cur=1.0, dropped=True).done  # change 0.0025 <= 0.01
    assert not algorithm1(0.25, 0.2, l0=0.01, l_cur=1.0, dropped=True).done  # change 0.025 > 0.01


def test_run_is_capped_by_the_smallest_drop_weight_only_when_given() -> None:
    capped = algorithm1(0.1, 0.05, l0=0.01, l_cur=0.01, dropped=False, w_drop=0.14)
    paper = algorithm1(0.1, 0.05, l0=0.01, l_cur=0.01, dropped=False)
    assert capped.next_weight == pytest.approx(0.12)
    assert paper.next_weight == pytest.approx(0.2)


def test_drop_is_failed_probes_or_five_times_the_weight_zero_latency() -> None:
    s = ControllerSettings()
    assert not is_drop(_m(0.04), 0.01, s)
    assert is_drop(_m(0.05), 0.01, s)
    assert is_drop(_m(0.011, successes=90, timeouts=10), 0.01, s)
    assert is_drop(_m(None, successes=0, errors=100), 0.01, s)


def _walked_to(weight: float, l0: float) -> DipMeasurement:
    """A DIP past l_0 and its equal-share round (0.1 at l_0), whose next step is ``weight``."""
    s = ControllerSettings()
    m = DipMeasurement("d", enqueued_at=0.0)
    m.record(0.0, _m(l0), s, 0.1, 0.0, scheduled=True)
    m.record(0.1, _m(l0), s, 0.1, 1.0, scheduled=True)
    assert m.target is not None
    m.target = weight
    return m


def _thin(mean: float, std: float, n: int = 5, timeouts: int = 0) -> Measurement:
    return Measurement("v", "d", 1.0, 0.3, n + timeouts, n, 0, timeouts, mean, mean, mean, mean, None, "t",
                       latency_std=std)


def test_a_drop_a_few_probes_do_not_prove_is_measured_again_and_the_pooled_rounds_decide() -> None:
    """l_0 = 10 ms, drop at 50 ms. Five probes at 55 ms (exponential spread) prove nothing: the same
    weight is measured again; with the next round at 30 ms the ten probes average 42.5 ms, no drop."""
    s, l0 = ControllerSettings(), 0.010
    m = _walked_to(0.3, l0)
    m.record(0.3, _thin(0.055, 0.055), s, 0.1, 2.0, scheduled=True)
    assert m.target == 0.3 and m.w_max == pytest.approx(0.1) and m.unconfirmed is not None
    m.record(0.3, _thin(0.030, 0.030), s, 0.1, 3.0, scheduled=True)
    assert m.unconfirmed is None and m.w_max == pytest.approx(0.3) and not m.last_dropped
    assert (0.3, pytest.approx(0.0425), False) in m.points


def test_the_round_after_an_unproven_drop_is_pooled_under_the_weight_the_lb_carried() -> None:
    """At layer 4 the share the LB counted moves round to round (0.24, then 0.36, under weight 0.3):
    the second round is the same weight measured again, not another weight deciding alone."""
    s, l0 = ControllerSettings(), 0.010
    m = _walked_to(0.3, l0)
    m.record(0.3, replace(_thin(0.055, 0.055), share=0.24), s, 0.1, 2.0, scheduled=True)
    m.record(0.3, replace(_thin(0.030, 0.030), share=0.36), s, 0.1, 3.0, scheduled=True)
    assert m.unconfirmed is None and not m.last_dropped
    assert (0.3, pytest.approx(0.0425), False) in m.points


def test_a_drop_the_second_round_confirms_backtracks_and_failures_or_proof_act_at_once() -> None:
    s, l0 = ControllerSettings(), 0.010
    m = _walked_to(0.3, l0)
    m.record(0.3, _thin(0.080, 0.080), s, 0.1, 2.0, scheduled=True)
    m.record(0.3, _thin(0.070, 0.070), s, 0.1, 3.0, scheduled=True)
    assert m.last_dropped and m.w_max == pytest.approx(0.1) and m.target == pytest.approx(0.2)
    failing = _walked_to(0.3, l0)
    failing.record(0.3, _thin(0.020, 0.020, n=3, timeouts=2), s, 0.1, 2.0, scheduled=True)
    assert failing.last_dropped and failing.unconfirmed is None
    proven = _walked_to(0.3, l0)
    proven.record(0.3, _thin(0.080, 0.080, n=100), s, 0.1, 2.0, scheduled=True)  # lower bound 64 ms
    assert proven.last_dropped and proven.unconfirmed is None


def _measure(capacity_share: float, settings: ControllerSettings, n_dips: int = 10) -> DipMeasurement:
    """Drive one DIP's Algorithm 1 with exact (noise-free) M/M/1 latencies, every weight scheduled."""
    rate = 1000.0
    dip = FluidDip("d", servers=1, service_rate=capacity_share * rate)
    m = DipMeasurement("d", enqueued_at=0.0)
    equal = 1 / n_dips
    for step in range(50):
        wanted = m.wanted(equal, zero_first=True)
        if wanted is None:
            break
        latency = dip.mean_latency(wanted * rate)
        obs = _m(latency if math.isfinite(latency) else 0.9, successes=100 if math.isfinite(latency) else 50,
                 timeouts=0 if math.isfinite(latency) else 50)
        m.record(wanted, obs, settings, equal, float(step), scheduled=True)
    return m


@pytest.mark.parametrize("capacity", [0.02, 0.05, 0.1, 0.3])
def test_w_max_brackets_the_five_x_point_of_an_mm1_dip(capacity: float) -> None:
    """M/M/1: latency reaches 5x l0 at 80 % utilisation, so w_max lands just below 0.8 * capacity."""
    m = _measure(capacity, ControllerSettings())
    assert m.done
    assert 0.7 * capacity <= m.w_max < 0.8 * capacity
    assert m.iterations <= 10
    assert m.l0 == pytest.approx(1 / (capacity * 1000))


def test_paper_settings_converge_too_with_more_iterations() -> None:
    ours = _measure(0.05, ControllerSettings())
    paper = _measure(0.05, ControllerSettings.paper())
    assert paper.done and 0.7 * 0.05 <= paper.w_max < 0.8 * 0.05
    assert ours.iterations <= paper.iterations


def test_a_dip_that_drops_everywhere_stops_with_no_usable_weight() -> None:
    s = ControllerSettings(measurement=MeasurementSettings(max_iterations=6))
    m = DipMeasurement("d", enqueued_at=0.0)
    for step in range(20):
        wanted = m.wanted(0.1, zero_first=True)
        if wanted is None:
            break
        obs = _m(0.001) if wanted == 0 else _m(None, successes=0, errors=100)
        m.record(wanted, obs, s, 0.1, float(step), scheduled=True)
    assert m.done and m.w_max == 0.0 and m.iterations == 6


def test_priority_is_over_utilised_after_a_drop_and_state_round_trips() -> None:
    m = _measure(0.02, ControllerSettings(measurement=MeasurementSettings(max_iterations=3)))
    assert m.priority in (PRIORITY_NORMAL, PRIORITY_OVERUTILISED)
    state = ControllerState(vip="web", dips={"d": DipState("d", measuring=m)}, drain_time=0.0)
    assert ControllerState.from_dict(state.to_dict()).dips["d"].measuring == m


def test_a_live_pool_dip_is_measured_at_zero_first_and_a_cold_pool_at_the_equal_share() -> None:
    m = DipMeasurement("d", enqueued_at=0.0)
    assert m.wanted(0.1, zero_first=True) == 0.0
    assert m.wanted(0.1, zero_first=False) == 0.1


def test_fluid_probe_rounds_feed_algorithm1_to_the_same_bracket() -> None:
    """With real probe noise (100-request means) w_max still lands near the 5x point."""
    model = FluidModel([FluidDip("d", 1, 50.0), FluidDip("e", 8, 200.0)], total_rate=500.0, seed=3)
    s = ControllerSettings()
    m = DipMeasurement("d", enqueued_at=0.0)
    for step in range(40):
        wanted = m.wanted(0.5, zero_first=True)
        if wanted is None:
            break
        model.set_weights({"d": wanted, "e": 1 - wanted}, float(step))
        m.record(wanted, model.measure(float(step) + 1)["d"], s, 0.5, float(step), scheduled=True)
    capacity = model.capacity_share("d")
    assert m.done and 0.55 * capacity <= m.w_max < 0.9 * capacity


def test_a_refresh_runs_up_to_its_old_w_max_then_by_cautious_steps() -> None:
    def step(w: float) -> float:
        return algorithm1(w, 0.0, l0=0.01, l_cur=0.01, dropped=False, threshold=0.3, cautious_step=0.1).next_weight

    assert step(0.1) == pytest.approx(0.2)  # Algorithm 1's doubling, below the old w_max
    assert step(0.2) == pytest.approx(0.3)  # capped at the old w_max
    assert step(0.29) == pytest.approx(0.319)  # near it: the cautious step, so the cap never ends the run
    assert step(0.3) == pytest.approx(0.33)
    assert not algorithm1(0.3, 0.3, l0=0.01, l_cur=0.01, dropped=False, threshold=0.3, cautious_step=0.1).done
    assert algorithm1(0.3, 0.0, l0=0.01, l_cur=0.01, dropped=False).next_weight == pytest.approx(0.6)  # paper


@pytest.mark.parametrize(("elasticity", "stops"), [(1.0, False), (5.0, True)])
def test_a_refresh_stops_at_the_knee_of_its_curve(elasticity: float, stops: bool) -> None:
    settings = ControllerSettings()  # knee at arc elasticity 4
    m = DipMeasurement("d", 0.0, refresh=True, l0=0.01, pending_zero=False, pending_equal=False, w_cur=0.1,
                       target=0.1, threshold=0.1)
    m.record(0.1, _m(0.015), settings, 0.1, 5.0, scheduled=True, expected=0.03)  # room: half the curve's latency
    assert not m.done and m.room_seen and m.target == pytest.approx(0.11)
    m.record(0.11, _m(0.015 * 1.1 ** elasticity), settings, 0.1, 10.0, scheduled=True)
    assert m.done is stops
    if stops:
        assert m.w_max == pytest.approx(0.11) and m.target is None
    state = ControllerState(vip="web", dips={"d": DipState("d", measuring=m)}, drain_time=0.0)
    assert ControllerState.from_dict(state.to_dict()).dips["d"].measuring == m


def _refresh_at_threshold(latency: float, expected: float | None, settings: ControllerSettings) -> DipMeasurement:
    m = DipMeasurement("d", 0.0, refresh=True, l0=0.01, pending_zero=False, pending_equal=False, w_cur=0.1,
                       target=0.1, threshold=0.1)
    m.record(0.1, _m(latency), settings, 0.1, 5.0, scheduled=True, expected=expected)
    return m


@pytest.mark.parametrize(("latency", "expected", "goes_on"), [
    (0.015, 0.030, True),  # 50 % below the curve: room
    (0.015, 0.018, False),  # 17 % below: within the 20 % capacity threshold, no evidence
    (0.020, 0.018, False),  # above the curve
    (0.015, None, False),  # no curve to compare with
])
def test_a_refresh_goes_past_its_threshold_only_with_evidence_of_room(
        latency: float, expected: float | None, goes_on: bool) -> None:
    m = _refresh_at_threshold(latency, expected, ControllerSettings())
    assert m.done is not goes_on and m.room_seen is goes_on
    if not goes_on:
        assert m.w_max == pytest.approx(0.1) and m.target is None  # it ends where it stood


def test_without_refresh_needs_room_a_refresh_goes_on_regardless() -> None:
    m = _refresh_at_threshold(0.020, 0.018, ControllerSettings(refresh=RefreshSettings(needs_room=False)))
    assert not m.done and m.target == pytest.approx(0.11)


@pytest.mark.parametrize(("arc", "step"), [(1.0, 0.10), (3.0, 1.25 ** (1 / 3) - 1), (3.9, 1.25 ** (1 / 3.9) - 1)])
def test_steps_past_the_threshold_shrink_with_the_measured_elasticity(arc: float, step: float) -> None:
    m = _refresh_at_threshold(0.015, 0.030, ControllerSettings())
    m.record(0.11, _m(0.015 * 1.1 ** arc), ControllerSettings(), 0.1, 10.0, scheduled=True)
    assert not m.done and m.target == pytest.approx(0.11 * (1 + step))
