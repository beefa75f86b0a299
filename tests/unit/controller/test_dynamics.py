"""Section 4.5 shift/rescale and change detection, section 4.7 drain time, refresh budget."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from knapsack_lb.controller.dynamics import (
    ChangeDetector,
    DipTrack,
    RoundView,
    elasticity,
    estimate_drain_time,
    knee_weight,
    refresh_candidates,
    round_noise,
    shift_factor,
    weight_for_latency,
    weighted_median,
)
from knapsack_lb.controller.settings import ControllerSettings, DynamicsSettings, RefreshSettings
from knapsack_lb.curves import PiecewiseLinearCurve, QuadraticCurve, QueueingCurve


@pytest.mark.parametrize("curve", [
    QuadraticCurve(0.01, 0.02, 0.3), QueueingCurve(0.001, 0.002, 0.4),
    PiecewiseLinearCurve((0.0, 0.1, 0.3), (0.01, 0.012, 0.03)),
])
def test_scaling_multiplies_the_weight_axis(curve: object) -> None:
    scaled = curve.scaled(0.8)
    ws = np.array([0.0, 0.05, 0.1, 0.2])
    assert scaled.latencies(ws * 0.8) == pytest.approx(curve.latencies(ws))  # type: ignore[attr-defined]


def test_the_papers_example_gives_k_0_8() -> None:
    """5 ms at 0.5; now 7 ms at 0.5; the curve reached 7 ms at 0.625, so k = 0.5 / 0.625 = 0.8."""
    curve = PiecewiseLinearCurve((0.0, 0.5, 0.625, 1.0), (0.003, 0.005, 0.007, 0.02))
    assert weight_for_latency(curve, 0.007, hi=1.0) == pytest.approx(0.625)
    assert shift_factor(curve, 0.5, 0.007, w_max=0.9) == pytest.approx(0.8)


def test_a_traffic_change_on_mm1_dips_shifts_by_the_ratio_of_rates() -> None:
    """M/M/1: T(w) = 1/(mu - w*L). Traffic L -> 1.2 L is exactly k = 1/1.2 on every curve."""
    s = ControllerSettings(dynamics=DynamicsSettings(change_confirmations=1))
    det = ChangeDetector(s)
    rate, mus = 1000.0, {"a": 300.0, "b": 400.0, "c": 500.0, "d": 350.0}
    weights = {"a": 0.2, "b": 0.25, "c": 0.35, "d": 0.2}
    curves = {d: (QueueingCurve(0.0, 1 / rate, mu / rate), mu / rate * 0.8) for d, mu in mus.items()}
    rounds = {d: RoundView(w, 1 / (mus[d] - w * rate * 1.2), 0.0) for d, w in weights.items()}
    verdict = det.observe(rounds, curves)
    assert verdict.traffic_factor == pytest.approx(1 / 1.2, rel=1e-3)
    assert not verdict.capacity and "traffic change" in verdict.notes[0]


def test_one_dip_off_its_curve_is_a_capacity_change_after_the_confirmations() -> None:
    s = ControllerSettings(dynamics=DynamicsSettings(change_confirmations=2))
    det = ChangeDetector(s)
    rate = 1000.0
    curves = {d: (QueueingCurve(0.0, 1 / rate, 0.4), 0.3) for d in "abcd"}
    true = {"a": 0.4, "b": 0.4, "c": 0.4, "d": 0.3}  # d lost 25 % capacity (slower service: l0 rises too)
    rounds = {d: RoundView(0.2, 1 / ((true[d] - 0.2) * rate), 0.0) for d in "abcd"}
    assert not det.observe(rounds, curves).capacity  # first round: not yet confirmed
    verdict = det.observe(rounds, curves)
    assert set(verdict.capacity) == {"d"}
    # The paper's rule: the old curve reaches the observed 10 ms at w' = 0.3, so k = 0.2 / 0.3.
    assert verdict.capacity["d"] == pytest.approx(0.2 / 0.3, rel=1e-3)
    assert verdict.observed["d"] == pytest.approx((0.2, 0.01))
    assert verdict.traffic_factor is None


def test_timeouts_cut_w_max_at_once() -> None:
    det = ChangeDetector(ControllerSettings(dynamics=DynamicsSettings(change_confirmations=3)))
    curves = {d: (QueueingCurve(0.0, 0.001, 0.4), 0.3) for d in "abc"}
    rounds = {"a": RoundView(0.3, 0.5, 0.4), "b": RoundView(0.2, 0.005, 0.0), "c": RoundView(0.2, 0.005, 0.0)}
    verdict = det.observe(rounds, curves)
    assert verdict.capacity["a"] == pytest.approx(0.9 * 0.3 * 0.6 / 0.3)


def test_noise_within_the_thresholds_changes_nothing() -> None:
    det = ChangeDetector(ControllerSettings(dynamics=DynamicsSettings(change_confirmations=1)))
    curves = {d: (QueueingCurve(0.0, 0.001, 0.4), 0.3) for d in "abcdef"}
    rng = np.random.default_rng(1)
    for _ in range(20):
        rounds = {d: RoundView(0.2, 0.005 * float(np.exp(rng.normal(0, 0.03))), 0.0) for d in "abcdef"}
        verdict = det.observe(rounds, curves)
        assert verdict.traffic_factor is None and not verdict.capacity


def test_drain_time_is_the_time_until_latency_settles_after_the_switch() -> None:
    series = [(105.0, 0.050), (110.0, 0.030), (115.0, 0.0105), (120.0, 0.0101), (125.0, 0.0099)]
    assert estimate_drain_time(100.0, series) == pytest.approx(15.0)
    assert estimate_drain_time(100.0, series[:2]) is None
    assert estimate_drain_time(100.0, [(105.0, 0.05), (110.0, 0.03), (115.0, 0.01)]) is None  # still moving


def test_refresh_keeps_within_the_capacity_budget_oldest_first() -> None:
    fitted = {"a": 0.0, "b": 10.0, "c": 20.0, "d": 5000.0}
    w_max = {"a": 0.02, "b": 0.03, "c": 0.5, "d": 0.5}
    assert refresh_candidates(fitted, w_max, [], now=4000.0, period=1800.0, budget=0.05) == ["a", "b"]
    assert refresh_candidates(fitted, w_max, ["a"], now=4000.0, period=1800.0, budget=0.05) == ["b"]
    assert refresh_candidates(fitted, w_max, [], now=100.0, period=1800.0, budget=0.05) == []
    assert refresh_candidates(fitted, w_max, [], now=4000.0, period=0.0, budget=0.05) == []


def test_elasticity_of_an_mm1_curve_is_w_over_c_minus_w() -> None:
    curve = QueueingCurve(0.0, 0.001, 0.4)
    assert elasticity(curve, 0.2) == pytest.approx(1.0, rel=1e-3)
    assert elasticity(curve, 0.36) == pytest.approx(9.0, rel=1e-2)
    assert elasticity(curve, 0.0) == 0.0


def test_weighted_median_follows_the_weights() -> None:
    assert weighted_median([1.0, 2.0, 3.0], [1.0, 1.0, 1.0]) == 2.0
    assert weighted_median([1.0, 2.0, 3.0], [0.1, 0.1, 5.0]) == 3.0


def test_the_traffic_shift_trusts_dips_near_capacity_over_flat_ones() -> None:
    """+10 % traffic; four M/M/1 DIPs near capacity tell k = 1/1.1 exactly, six nearly flat DIPs
    show probe noise of +30 % that their flat curves turn into absurd factors."""
    det = ChangeDetector(ControllerSettings(dynamics=DynamicsSettings(change_confirmations=1)))
    rate = 1000.0
    curves = {f"busy{i}": (QueueingCurve(0.0, 1 / rate, 0.1), 0.09) for i in range(4)}
    curves |= {f"flat{i}": (QueueingCurve(0.005, 1e-6, 10.0), 1.0) for i in range(6)}
    rounds = {f"busy{i}": RoundView(0.07, 1 / ((0.1 - 0.07 * 1.1) * rate), 0.0) for i in range(4)}
    rounds |= {f"flat{i}": RoundView(0.1, 1.3 * curves[f"flat{i}"][0].latency(0.1), 0.0) for i in range(6)}
    verdict = det.observe(rounds, curves)
    assert verdict.traffic_factor == pytest.approx(1 / 1.1, rel=1e-3)


def test_a_drift_below_the_traffic_threshold_is_corrected_once_significant() -> None:
    """+4 % traffic on M/M/1 DIPs: below the 10 % traffic threshold, found as a drift after
    three rounds (each DIP's recent mean) with k = 1/1.04 to first order."""
    rate, mus = 1000.0, {"a": 300.0, "b": 400.0, "c": 500.0, "d": 350.0}
    weights = {"a": 0.2, "b": 0.25, "c": 0.35, "d": 0.2}
    curves = {d: (QueueingCurve(0.0, 1 / rate, mu / rate), mu / rate * 0.8) for d, mu in mus.items()}
    rounds = {d: RoundView(w, 1 / (mus[d] - w * rate * 1.04), 0.0) for d, w in weights.items()}
    det = ChangeDetector(ControllerSettings(dynamics=DynamicsSettings(change_confirmations=1)))
    off = ChangeDetector(ControllerSettings(dynamics=DynamicsSettings(change_confirmations=1,
                                                                       traffic_drift_threshold=0.0)))
    verdicts = [det.observe(rounds, curves) for _ in range(3)]
    assert [v.traffic_factor is None for v in verdicts] == [True, True, False]
    assert verdicts[2].traffic_factor == pytest.approx(1 / 1.04, rel=0.02)
    assert "traffic drift" in verdicts[2].notes[0]
    assert all(off.observe(rounds, curves).traffic_factor is None for _ in range(5))


def test_a_drift_correction_moves_the_curves_by_at_most_the_traffic_threshold() -> None:
    """+20 % traffic on M/M/1 DIPs whose curves are too uncertain for the traffic test (leave-one-out
    error 1): the drift finds it, and corrects by 1/1.1 (the 10 % traffic threshold), not 1/1.2."""
    rate, mus = 1000.0, {"a": 300.0, "b": 400.0, "c": 500.0, "d": 350.0}
    weights = {"a": 0.2, "b": 0.25, "c": 0.35, "d": 0.2}
    curves = {d: (QueueingCurve(0.0, 1 / rate, mu / rate), mu / rate * 0.8) for d, mu in mus.items()}
    rounds = {d: RoundView(w, 1 / (mus[d] - w * rate * 1.2), 0.0, curve_error=math.log1p(1.0))
              for d, w in weights.items()}
    det = ChangeDetector(ControllerSettings(dynamics=DynamicsSettings(change_confirmations=1)))
    verdicts = [det.observe(rounds, curves) for _ in range(3)]
    assert [v.traffic_factor is None for v in verdicts] == [True, True, False]
    assert "traffic drift" in verdicts[2].notes[0]
    assert verdicts[2].traffic_factor == pytest.approx(1 / 1.1)


def test_a_capacity_change_below_the_knee_is_re_measured_a_loss_after_its_cut() -> None:
    """M/M/1-shaped curves (elasticity w / (c - w)): at w = 0.2 (1) one point's inverse is a guess,
    so the DIP is re-measured; at w = 0.36 (9, past the knee of 4) a loss's inverse stands, and a
    gain is re-measured only by a refresh that needs room (``refresh_needs_room``), else rescaled."""
    curves = {d: (QueueingCurve(0.0, 0.001, 0.4), 0.38) for d in "abcd"}
    for weight, factor, gain, remeasured, action, room in (
        (0.2, 0.7, True, True, "back to measurement", True), (0.2, 1.4, False, True, "cut by", True),
        (0.36, 1.4, False, False, "rescaled", True), (0.36, 0.7, True, True, "back to measurement", True),
        (0.36, 0.7, True, False, "rescaled", False),
    ):
        latency = curves["a"][0].latency(weight)
        rounds = {d: RoundView(weight, latency, 0.0) for d in "abc"} | {"d": RoundView(weight, latency * factor, 0.0)}
        settings = ControllerSettings(dynamics=DynamicsSettings(change_confirmations=1),
                                      refresh=RefreshSettings(needs_room=room))
        verdict = ChangeDetector(settings).observe(rounds, curves)
        assert (verdict.capacity["d"] > 1) is gain
        assert (verdict.remeasure == {"d"}) is remeasured and action in verdict.notes[0]
    paper = ChangeDetector(ControllerSettings(dynamics=DynamicsSettings(change_confirmations=1,
                                                                        remeasure_on_gain=False)))
    latency = curves["a"][0].latency(0.2)
    rounds = {d: RoundView(0.2, latency, 0.0) for d in "abc"} | {"d": RoundView(0.2, latency * 0.7, 0.0)}
    verdict = paper.observe(rounds, curves)
    assert not verdict.remeasure and "rescaled" in verdict.notes[0]


def test_round_noise_of_an_exponential_sample_is_one_over_root_n() -> None:
    mean = 0.01
    assert round_noise(mean, mean * math.log(2), mean * math.log(10), 100) == pytest.approx(0.1, rel=1e-2)
    assert round_noise(None, 0.01, 0.02, 100) == 0.0


def test_a_deviation_within_the_rounds_own_noise_is_not_a_capacity_change() -> None:
    """+30 % against the curve is beyond the paper's 20 %, but not beyond 4 standard errors of a
    round whose own spread says its mean is +-10 % (1 round, CV 1 from 100 requests)."""
    curves = {d: (QueueingCurve(0.0, 0.001, 0.4), 0.3) for d in "abcd"}
    calm = {d: RoundView(0.2, 0.005, 0.0) for d in "abc"}
    for noise, changed in ((0.0, True), (0.1, False)):
        det = ChangeDetector(ControllerSettings(dynamics=DynamicsSettings(change_confirmations=1)))
        verdict = det.observe(calm | {"d": RoundView(0.2, 0.0065, 0.0, noise)}, curves)
        assert ("d" in verdict.capacity) is changed


def test_the_mean_deviations_error_pools_each_rounds_own_noise_and_keeps_the_curves() -> None:
    """Three rounds with standard errors 0.3, 0.4 and 0 (unknown): the mean's error is
    sqrt(0.09 + 0.16) / 3 = 1/6; a curve error of 0.25 does not average down: hypot(1/6, 0.25)."""
    track = DipTrack()
    for deviation, noise in ((0.1, 0.3), (-0.2, 0.4), (0.4, 0.0)):
        track.record(deviation, noise)
    assert track.mean_error(0.0) == pytest.approx(1 / 6)
    assert track.mean_error(0.25) == pytest.approx(math.hypot(1 / 6, 0.25))
    track.record(0.0, 0.3)  # the window keeps the last three rounds
    assert track.noises == [0.4, 0.0, 0.3] and track.deviations == [-0.2, 0.4, 0.0]


def test_a_deviation_within_the_curves_own_fit_error_is_not_a_capacity_change() -> None:
    """-50 % against a curve for three rounds of small noise is a capacity change, unless the curve
    itself mispredicts held-out rounds by that much (a leave-one-out error of 2 is ln 3 = 1.1 in log)."""
    curves = {d: (QueueingCurve(0.0, 0.001, 0.4), 0.3) for d in "abcd"}
    calm = {d: RoundView(0.2, 0.002, 0.0) for d in "abc"}
    for curve_error, changed in ((0.0, True), (math.log1p(2.0), False)):
        det = ChangeDetector(ControllerSettings(dynamics=DynamicsSettings(change_confirmations=3)))
        verdicts = [det.observe(calm | {"d": RoundView(0.2, 0.001, 0.0, 0.05, curve_error=curve_error)}, curves,
                                pool=False) for _ in range(3)]
        assert ("d" in verdicts[-1].capacity) is changed, verdicts


def test_a_traffic_change_must_exceed_the_error_of_the_median_deviation() -> None:
    """Three DIPs +60 % against their curves: a traffic change when the curves are exact, not when
    each curve mispredicts by its leave-one-out error of 1 (the median's error is then about
    sqrt(pi / 2) * ln 2 / sqrt(3) = 0.5, and 4 of them are far beyond ln 1.6 = 0.47)."""
    curves = {d: (QueueingCurve(0.0, 0.001, 0.4), 0.3) for d in "abc"}
    observed = 1.6 * curves["a"][0].latency(0.2)
    for curve_error, changed in ((0.0, True), (math.log1p(1.0), False)):
        det = ChangeDetector(ControllerSettings(dynamics=DynamicsSettings(change_confirmations=2)))
        rounds = {d: RoundView(0.2, observed, 0.0, 0.05, curve_error=curve_error) for d in "abc"}
        verdicts = [det.observe(rounds, curves) for _ in range(2)]
        assert (verdicts[-1].traffic_factor is not None) is changed, verdicts


def test_a_traffic_shift_against_the_median_deviation_is_not_taken() -> None:
    """This round all three DIPs are slower than their curves, but over the confirming rounds the
    DIP that dominates the slope-weighted estimate (near its knee) was faster: its k > 1 would
    *raise* every curve's capacity on a traffic rise. The detector does not take it."""
    curve = QueueingCurve(0.0, 0.001, 0.4)
    curves = {d: (curve, 0.38) for d in "abc"}
    weights = {"a": 0.05, "b": 0.05, "c": 0.35}
    first = {"a": 0.4, "b": 0.4, "c": -0.9}  # median +0.4, two of three the same way
    det = ChangeDetector(ControllerSettings(dynamics=DynamicsSettings(change_confirmations=2)))
    for deviations in (first, dict.fromkeys("abc", 0.4)):
        rounds = {d: RoundView(w, curve.latency(w) * math.exp(deviations[d]), 0.0) for d, w in weights.items()}
        verdict = det.observe(rounds, curves)
    assert verdict.traffic_factor is None
    assert any("traffic change not taken" in note for note in verdict.notes), verdict.notes


def test_the_knee_of_an_mm1_curve_is_at_four_fifths_of_capacity() -> None:
    """Elasticity of b / (c - w) is w / (c - w): 4 at w = 0.8 c; never reached below hi -> None."""
    curve = QueueingCurve(0.0, 0.001, 0.5)
    assert knee_weight(curve, 4.0, hi=0.49) == pytest.approx(0.4, rel=1e-4)
    assert knee_weight(curve, 4.0, hi=0.3) is None
    assert knee_weight(curve, 0.0, hi=0.49) is None  # knee switched off


def _overload_round(factor: float, weight: float = 0.3, l0: float = 0.0025) -> tuple[dict[str, RoundView], dict]:
    curves = {d: (QueueingCurve(0.0, 0.001, 0.4), 0.3) for d in "abcd"}
    calm = {d: RoundView(0.2, curves[d][0].latency(0.2), 0.0, 0.0, 5 * l0) for d in "abc"}
    return calm | {"d": RoundView(weight, factor * curves["d"][0].latency(weight), 0.0, 0.0, 5 * l0)}, curves


@pytest.mark.parametrize("overload_only", [frozenset(), frozenset("abcd")])
def test_a_drop_level_latency_far_above_the_curve_is_overload_cut_at_once(overload_only: frozenset[str]) -> None:
    """No timeouts, no confirmation: 4x its curve at a drop-level latency cuts w_max to 90 % of the weight
    it was overloaded at, in the steady state and while other DIPs measure alike."""
    rounds, curves = _overload_round(4.0)
    verdict = ChangeDetector(ControllerSettings(dynamics=DynamicsSettings(change_confirmations=3))).observe(
        rounds, curves, pool=not overload_only, overload_only=overload_only)
    assert set(verdict.capacity) == {"d"} and verdict.capacity["d"] == pytest.approx(0.9)
    assert "is a drop" in verdict.notes[0] and "4.0x its curve" in verdict.notes[0]


def test_an_overload_its_round_does_not_prove_waits_for_the_next_round_pooled() -> None:
    """Five probes at 4x the curve whose lower confidence bound is below the drop level: no cut yet.
    A second such round cuts; a calm second round (pooled: 2.5x, no drop) does not."""
    det = ChangeDetector(ControllerSettings(dynamics=DynamicsSettings(change_confirmations=3)))
    rounds, curves = _overload_round(4.0)
    thin = replace(rounds["d"], lower=0.5 * rounds["d"].drop_latency)
    assert not det.observe(rounds | {"d": thin}, curves, pool=False, overload_only=frozenset("abcd")).capacity
    verdict = det.observe(rounds | {"d": thin}, curves, pool=False, overload_only=frozenset("abcd"))
    assert verdict.capacity["d"] == pytest.approx(0.9)
    det = ChangeDetector(ControllerSettings(dynamics=DynamicsSettings(change_confirmations=3)))
    calm = replace(thin, latency=curves["d"][0].latency(0.3), lower=0.5 * curves["d"][0].latency(0.3))
    assert not det.observe(rounds | {"d": thin}, curves, pool=False, overload_only=frozenset("abcd")).capacity
    assert not det.observe(rounds | {"d": calm}, curves, pool=False, overload_only=frozenset("abcd")).capacity
    proven = replace(rounds["d"], lower=2 * rounds["d"].drop_latency)
    det = ChangeDetector(ControllerSettings(dynamics=DynamicsSettings(change_confirmations=3)))
    assert det.observe(rounds | {"d": proven}, curves, pool=False, overload_only=frozenset("abcd")).capacity


def test_a_latency_below_three_times_the_curve_or_the_drop_level_is_not_overload() -> None:
    rounds, curves = _overload_round(2.5)  # a traffic step moves a DIP by ~1.4x; 2.5x still is not overload
    det = ChangeDetector(ControllerSettings(dynamics=DynamicsSettings(change_confirmations=3)))
    assert not det.observe(rounds, curves, pool=False, overload_only=frozenset("abcd")).capacity
    rounds, curves = _overload_round(4.0, l0=1.0)  # far above the curve but below 5 x l_0: no drop
    assert not det.observe(rounds, curves, pool=False, overload_only=frozenset("abcd")).capacity


def test_overload_past_w_max_while_others_measure_is_no_news() -> None:
    """A measurement round's remainder may put a DIP past its curve's limit; its overload says nothing."""
    rounds, curves = _overload_round(4.0, weight=0.33)
    verdict = ChangeDetector(ControllerSettings()).observe(rounds, curves, pool=False, overload_only=frozenset("d"))
    assert not verdict.capacity


def test_overload_only_dips_are_not_judged_for_gains_or_small_losses() -> None:
    rounds, curves = _overload_round(1.0)
    rounds["d"] = RoundView(0.2, 0.5 * curves["d"][0].latency(0.2), 0.0)
    det = ChangeDetector(ControllerSettings(dynamics=DynamicsSettings(change_confirmations=1)))
    assert not det.observe(rounds, curves, pool=False, overload_only=frozenset("d")).capacity
    assert det.observe(rounds, curves, pool=False).capacity["d"] > 1  # judged in full otherwise


def test_a_dip_at_its_curves_cliff_does_not_steer_the_traffic_shift() -> None:
    """+10 % traffic on eight M/M/1 DIPs; a ninth sits at its curve's cliff (elasticity ~ 50) with a
    latency below its curve: uncapped, its squared elasticity outweighed the rest and shifted every
    curve the wrong way (k > 1)."""
    det = ChangeDetector(ControllerSettings(dynamics=DynamicsSettings(change_confirmations=1)))
    rate = 1000.0
    curves = {f"m{i}": (QueueingCurve(0.0, 1 / rate, 0.1), 0.09) for i in range(8)}
    rounds = {f"m{i}": RoundView(0.07, 1 / ((0.1 - 0.07 * 1.1) * rate), 0.0) for i in range(8)}
    curves["cliff"] = (QueueingCurve(0.0, 1 / rate, 0.1), 0.099)
    rounds["cliff"] = RoundView(0.098, 0.5 * curves["cliff"][0].latency(0.098), 0.0)
    verdict = det.observe(rounds, curves)
    assert verdict.traffic_factor is not None and verdict.traffic_factor < 1
