"""Service dynamics: KnapsackLB section 4.5 (traffic, capacity, failures, refresh) and 4.7 (drain).

**Shift and rescale** (section 4.5, our reconstruction of the lost formulas): a DIP had
latency ``l`` at weight ``w`` on its curve; now it shows ``l'`` at the same ``w``. The
curve reaches ``l'`` at ``w'`` (inverse of the curve); the factor ``k = w / w'`` multiplies
every weight of the curve: ``l_new(x) = l_old(x / k)`` and ``w_max_new = k * w_max``. The
paper's example: 5 ms at 0.5, now 7 ms at 0.5, the old curve reached 7 ms at 0.625, so
``k = 0.5 / 0.625 = 0.8``. Under M/M/1 this is exact for a traffic change (a DIP's load is
``w * Lambda``, so ``k = Lambda_old / Lambda_new``).

* Traffic change: most DIPs' latency moved the same way at unchanged weights. We call it when
  the median relative change over the judged DIPs exceeds ``dynamics.traffic_change_threshold`` and
  at least ``dynamics.traffic_change_quorum`` of them moved the same way, for
  ``dynamics.change_confirmations`` rounds; every curve is then shifted by the *median* ``k`` (traffic
  moves every DIP alike; the median is robust to the noise of one DIP). Ours: the median must also
  exceed ``NOISE_SIGMAS`` of its standard error (from each round's noise and each curve's error,
  see "Noise" below), and a ``k`` that points the other way than the median deviation (the
  confirming rounds' means disagree with this round) is not taken.
* Traffic shift estimate (ours): the per-DIP factors are combined by a median weighted by each
  DIP's squared elasticity ``(d ln l / d ln w)^2`` at its weight, over the mean of the
  confirming rounds: a DIP in the flat part of its curve says little about its load.
* Traffic drift (ours, ``dynamics.traffic_drift_threshold``): what a shift leaves (or a change below the
  traffic threshold) is estimated by slope-weighted least squares over the DIPs' recent mean
  deviations, with a robust standard error, and corrected when significant.
* Capacity change: one DIP's latency is off its curve's estimate by more than
  ``dynamics.capacity_change_threshold`` (paper: 20 %) for ``dynamics.change_confirmations`` rounds, or at once
  when its round is a drop (it is overloaded now); only that DIP's curve is rescaled. Ours: a drop by a
  round's mean that the round's own lower confidence bound does not reach (``RoundView.lower``: five
  probes near saturation cross the drop level by chance) waits for the next round, and the two
  rounds' mean decides; timeouts act at once. Ours:
  below the curve's knee (elasticity under ``refresh.knee_elasticity`` at the DIP's weight)
  one noisy inverse is a guess - a wild one where the curve is flat - so a gain sends the DIP
  back to Algorithm 1 instead (``dynamics.remeasure_on_gain``; an upward guess can plan past the true
  capacity) and a loss is cut at once and then re-measured (``dynamics.remeasure_after_loss``; cuts
  taken on a slow-start ramp compound). At the knee the inverse is well-conditioned and a
  refresh's first 10 % step could overload the DIP, so the rescale stands there
  (docs/decisions/controller.md).
* Noise (ours): a capacity change must also exceed ``NOISE_SIGMAS`` standard errors of the
  recent mean deviation, each round's error estimated from its own spread
  (:func:`round_noise`); the paper's 20 % is about 2 standard errors of a 100-request round at
  high utilisation, where the sojourn time is most variable. The curve's own error at the
  operating point (its leave-one-out error, ``RoundView.curve_error``) adds to that error and,
  unlike the rounds' noise, does not average down: Algorithm 1's curve from a few 5-request
  rounds can mispredict by a factor of 2 or 3, and a rescale then chases the curve's error, not
  the DIP's capacity.
* Failures are handled by the controller (no successful probe: removed, re-solved).
* Refresh: finished curves older than ``refresh.period`` are re-measured, at most
  ``refresh.budget`` of the pool's estimated capacity (sum of ``w_max``) at once.
* Drain time (section 4.7): :func:`estimate_drain_time` is the paper's measurement - after a
  DIP's weight is cut to 0 at ``t1``, the time until its latency settles (``t2 - t1``).

How it fails: with noisy probes (a 100-request mean has roughly 10 % noise) small changes are
missed on purpose (thresholds, confirmations); a DIP whose latency is flat in its weight (a
lightly loaded many-core DIP) gives an ill-conditioned inverse, so ``k`` is clamped to
``[1/3, 3]``; one rescale is bounded to ``[0.5, 1.25]`` and a capacity *gain* is applied at
half strength (``sqrt(k)``), so a noisy or biased estimate cannot push ``w_max`` far above
the truth; a wrong correction is corrected again by the next deviation.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from knapsack_lb.controller.settings import ControllerSettings
from knapsack_lb.curves import LatencyCurve

K_MIN, K_MAX = 1 / 3, 3.0  # bounds of one inverse-curve estimate
K_EVENT_MIN, K_EVENT_MAX = 0.5, 1.25  # bounds of one rescale: a wrong estimate is corrected by the next event
RECENT_ROUNDS = 3
NOISE_SIGMAS = 4.0  # 30 DIPs judged every round: a 3-sigma test would fire on noise every few minutes
# A round this many times above its curve and at a drop-level latency is overload, acted on at once. A
# +10 % traffic step moves a 1-vCPU DIP at 70 % utilisation from 3.3 to about 4.5 x l_0 (1.4 x its
# curve, and past the paper's 5 x l_0 drop on noise); a DIP pushed past its capacity grows without bound.
OVERLOAD_RATIO = 3.0
# A pool-wide estimate weighs DIPs by their curve's elasticity, capped at the knee: there the inverse is
# already well-conditioned, and further up the curve's shape, not the traffic, decides a DIP's latency
# (one DIP at elasticity 19 once outweighed the other 29 and shifted every curve the wrong way).
SLOPE_CAP = 4.0


def weight_for_latency(curve: LatencyCurve, latency: float, hi: float) -> float | None:
    """The smallest weight in ``[0, hi]`` where the (non-decreasing) curve reaches ``latency``."""
    if curve.latency(0.0) >= latency:
        return 0.0
    top = curve.latency(hi)
    if not math.isfinite(top):
        top = math.inf
    if top < latency:
        return None
    lo, up = 0.0, hi
    for _ in range(60):
        mid = (lo + up) / 2
        if curve.latency(mid) >= latency:
            up = mid
        else:
            lo = mid
    return up


def shift_factor(curve: LatencyCurve, weight: float, observed: float, w_max: float) -> float | None:
    """Section 4.5's ``k = w / w'`` where the curve reaches ``observed`` at ``w'``; clamped."""
    if weight <= 0 or not math.isfinite(observed):
        return None
    w_prime = weight_for_latency(curve, observed, hi=max(4 * w_max, 4 * weight))
    if w_prime is None:
        return K_MIN
    if w_prime <= 0:
        return K_MAX
    return min(K_MAX, max(K_MIN, weight / w_prime))


def round_noise(mean: float | None, p50: float | None, p90: float | None, successes: int) -> float:
    """Standard error of ``ln(mean latency)`` of one probe round, from its own spread.

    The coefficient of variation is estimated as ``(p90 - p50) / (1.61 * mean)`` (exact for an
    exponential sojourn time, whose p90 - p50 is 1.61 means); the error of a mean of ``n``
    requests is ``cv / sqrt(n)``. 0 when the round does not say.
    """
    if mean is None or p50 is None or p90 is None or not mean > 0 or successes < 2 or p90 < p50:
        return 0.0
    return (p90 - p50) / (1.61 * mean) / math.sqrt(successes)


def elasticity(curve: LatencyCurve, weight: float) -> float:
    """``d ln l / d ln w`` of the curve at ``weight`` (central difference, 1 %): how much a DIP's
    latency says about a change of its weight axis. Near 0 in a curve's flat part (the latency
    barely moves with the load there), large near capacity."""
    if weight <= 0:
        return 0.0
    up, down = curve.latency(weight * 1.01), curve.latency(weight * 0.99)
    if not (math.isfinite(up) and math.isfinite(down)) or up <= 0 or down <= 0:
        return 0.0
    return max(0.0, math.log(up / down) / (math.log(1.01) - math.log(0.99)))


def knee_weight(curve: LatencyCurve, knee: float, hi: float) -> float | None:
    """The smallest weight in ``(0, hi]`` where the curve's :func:`elasticity` reaches ``knee``
    (about 80 % utilisation for ``knee = 4`` under M/M/c), None if it stays below up to ``hi``.

    Scanned on a grid of 64 points, then bisected between the last two; the elasticity of a
    convex, non-decreasing curve grows with the weight, so the first crossing is the knee.
    """
    if knee <= 0 or hi <= 0:
        return None
    grid = [hi * (i + 1) / 64 for i in range(64)]
    below = 0.0
    for w in grid:
        if elasticity(curve, w) >= knee:
            lo, up = below, w
            for _ in range(30):
                mid = (lo + up) / 2
                if elasticity(curve, mid) >= knee:
                    up = mid
                else:
                    lo = mid
            return up
        below = w
    return None


def weighted_median(values: Sequence[float], weights: Sequence[float]) -> float:
    """The value at which the cumulative weight reaches half the total (values sorted)."""
    pairs = sorted(zip(values, weights, strict=True))
    total = sum(w for _, w in pairs)
    if total <= 0:
        return statistics.median(values)
    running = 0.0
    for value, w in pairs:
        running += w
        if running >= total / 2:
            return value
    return pairs[-1][0]


def pooled_shift(deviations: Mapping[str, float], slopes: Mapping[str, float]) -> tuple[float, float] | None:
    """Least-squares estimate of ``s = -ln k`` from ``deviation_d ~ slope_d * s`` and its standard
    error (heteroscedasticity-robust); None when no DIP carries information.

    A shift of the weight axis by ``k`` moves each DIP's log-latency by about ``slope_d *
    (-ln k)`` (``slope_d`` its elasticity), so DIPs near capacity weigh most and DIPs in a flat
    curve part, whose latency does not depend on the load, nearly nothing.
    """
    names = [d for d in deviations if slopes.get(d, 0.0) > 0]
    sxx = sum(slopes[d] ** 2 for d in names)
    if len(names) < 3 or sxx <= 0:
        return None
    s = sum(slopes[d] * deviations[d] for d in names) / sxx
    spread = sum((slopes[d] * (deviations[d] - slopes[d] * s)) ** 2 for d in names)
    return s, math.sqrt(spread * len(names) / (len(names) - 1)) / sxx


@dataclass
class DipTrack:
    """What the detector remembers about one DIP since its curve last changed: the
    log-deviations ``log(observed / curve estimate)`` of its last rounds (at whatever weight:
    each is relative to the curve at that round's weight) with each round's standard error, and
    how many rounds in a row their mean was beyond the capacity threshold."""

    deviations: list[float] = field(default_factory=list)
    pending: int = 0
    suspect: float | None = None  # the latency of an overload its round did not prove, awaiting the next
    noises: list[float] = field(default_factory=list)  # each deviation's standard error (its round's own noise)

    def record(self, deviation: float, noise: float) -> None:
        """Keep one round's deviation and its standard error (the last ``RECENT_ROUNDS``)."""
        # a state stored before rounds carried their noise has deviations only: theirs is unknown (0)
        noises = self.noises if len(self.noises) == len(self.deviations) else [0.0] * len(self.deviations)
        self.deviations = [*self.deviations, deviation][-RECENT_ROUNDS:]
        self.noises = [*noises, noise][-RECENT_ROUNDS:]

    def mean_error(self, curve_error: float) -> float:
        """Standard error of the mean deviation: the rounds' own noise averages down over the rounds,
        the curve's error at the operating point does not (every round is compared with the same curve)."""
        n = len(self.noises)
        rounds = math.sqrt(sum(x * x for x in self.noises)) / n if n else 0.0
        return math.hypot(rounds, curve_error)

    def reset(self) -> None:
        self.deviations, self.noises, self.pending, self.suspect = [], [], 0, None


@dataclass
class DetectorState:
    """What the detector remembers between rounds (persisted with the controller's state)."""

    tracks: dict[str, DipTrack] = field(default_factory=dict)
    traffic_pending: int = 0
    drift_pending: int = 0


@dataclass(frozen=True)
class RoundView:
    """One trusted probe round of a ready DIP, as the detector needs it."""

    weight: float
    latency: float
    timeout_share: float
    noise: float = 0.0  # standard error of ln(latency) from this round's own spread (0 = unknown)
    drop_latency: float = math.inf  # section 4.3's drop: at or above this latency the DIP is overloaded
    lower: float | None = None  # the lower confidence bound of its mean latency (None: the round does not say)
    curve_error: float = 0.0  # standard error of ln(the curve's estimate) here, from its fit (0 = unknown)


@dataclass(frozen=True)
class Verdict:
    """Changes found in one round: a traffic shift factor and per-DIP capacity factors."""

    traffic_factor: float | None = None
    capacity: Mapping[str, float] = field(default_factory=dict)
    observed: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    remeasure: frozenset[str] = frozenset()


@dataclass
class ChangeDetector:
    """Detects traffic and capacity changes from trusted probe rounds (see the module docstring).

    Both compare a DIP's observed latency with its curve's estimate at its current weight
    (section 4.5: "observed latency differs from the estimated latency"). A traffic change
    moves most DIPs the same way at once, so it is judged on the median over the pool in
    each round; a capacity change is one DIP's own deviation, averaged over its last
    ``RECENT_ROUNDS`` rounds so that probe noise does not trigger it. A round with timed-out
    probes (overload) is acted on at once: the DIP's ``w_max`` is cut to what its share of
    answered probes says it still serves. Fast errors are the circuit breaker's business.
    """

    settings: ControllerSettings
    state: DetectorState = field(default_factory=DetectorState)

    def forget(self, dip: str) -> None:
        self.state.tracks.pop(dip, None)

    def reset(self, dip: str) -> None:
        self.state.tracks.pop(dip, None)

    def observe(
        self, rounds: Mapping[str, RoundView], curves: Mapping[str, tuple[LatencyCurve, float]], *,
        pool: bool = True, overload_only: frozenset[str] = frozenset(),
    ) -> Verdict:
        """``rounds``: this round's trusted rounds of ready DIPs; ``curves``: dip -> (curve, w_max).
        ``pool=False`` judges only per-DIP capacity changes (no traffic shift or drift); DIPs in
        ``overload_only`` are judged only for overload (timeouts, or a drop-level latency far
        above the curve: :meth:`_overloaded`) at a weight within their ``w_max``, which is
        unambiguous even while other DIPs' weights move."""
        s = self.settings
        judged_rounds = rounds if pool else {d: v for d, v in rounds.items() if d not in overload_only}
        deviation: dict[str, float] = {}
        for dip, view in judged_rounds.items():
            self.state.tracks.setdefault(dip, DipTrack())
            curve, _ = curves[dip]
            predicted = curve.latency(view.weight)
            if view.weight > 0 and math.isfinite(view.latency) and view.latency > 0 and math.isfinite(predicted) \
                    and predicted > 0 and view.timeout_share <= s.measurement.drop_failure_share:
                deviation[dip] = math.log(view.latency / predicted)
        notes: list[str] = []
        # --- traffic: most DIPs off their curves the same way --------------------------------------
        judged = len(deviation)
        pooled = pool and judged >= 3 and judged >= 0.5 * len(judged_rounds)
        if pooled:
            med = statistics.median(deviation.values())
            same = sum(1 for x in deviation.values() if x * med > 0) / judged
            # ours: the median of n deviations has a standard error of about sqrt(pi / 2) times their RMS
            # error over sqrt(n); each deviation's error is its round's noise and its curve's error there
            spread = statistics.fmean(rounds[d].noise ** 2 + rounds[d].curve_error ** 2 for d in deviation)
            median_error = math.sqrt(math.pi / 2 * spread / judged)
            if abs(med) > max(math.log1p(s.dynamics.traffic_change_threshold), NOISE_SIGMAS * median_error) \
                    and same >= s.dynamics.traffic_change_quorum:
                self.state.traffic_pending += 1
            else:
                self.state.traffic_pending = 0
            for dip, x in deviation.items():
                self.state.tracks[dip].record(x, rounds[dip].noise)
            if self.state.traffic_pending >= s.dynamics.change_confirmations:
                self.state.traffic_pending = 0
                factors, slopes = [], []
                for dip in deviation:
                    curve, w_max = curves[dip]
                    weight = rounds[dip].weight
                    # the mean over the confirming rounds: they all saw the new traffic
                    recent = self.state.tracks[dip].deviations[-s.dynamics.change_confirmations:]
                    observed = curve.latency(weight) * math.exp(statistics.fmean(recent))
                    k = shift_factor(curve, weight, observed, w_max)
                    if k is not None and K_MIN < k < K_MAX:  # a clamped inverse says nothing about the size
                        factors.append(math.log(k))
                        slopes.append(min(SLOPE_CAP, elasticity(curve, weight)) ** 2)
                # slope-weighted median: a DIP in its curve's flat part gives a noisy inverse
                shift = weighted_median(factors, slopes) if factors else 0.0
                if shift * med < 0:  # latencies up, weights scaled down (or both the other way)
                    k = min(K_EVENT_MAX, max(K_EVENT_MIN, math.exp(shift)))
                    notes.append(f"traffic change: median latency x{math.exp(med):.3f} against the curves on "
                                 f"{judged} DIPs, {same:.0%} the same way; every curve shifted by k={k:.3f}")
                    for dip in rounds:
                        self.state.tracks[dip].reset()
                    self.state.drift_pending = 0
                    return Verdict(traffic_factor=k, notes=tuple(notes))
                if factors:
                    # the confirming rounds' mean puts the DIPs the other way than this round's median
                    notes.append(f"traffic change not taken: median latency x{math.exp(med):.3f} against the curves, "
                                 f"but the DIPs' shift factors do not agree (k={math.exp(shift):.3f})")
            drift = self._drift(rounds, curves)
            if drift is not None:
                k, note = drift
                for dip in rounds:
                    self.state.tracks[dip].reset()
                return Verdict(traffic_factor=k, notes=(note,))
        # --- capacity: one DIP off its curve ------------------------------------------------------
        capacity: dict[str, float] = {}
        observed_points: dict[str, tuple[float, float]] = {}
        remeasure: set[str] = set()
        for dip, view in rounds.items():
            if view.weight <= 0:
                continue
            curve, w_max = curves[dip]
            track = self.state.tracks.setdefault(dip, DipTrack())
            if dip in overload_only and view.weight > w_max * (1 + 1e-6):
                continue  # a measurement round's remainder put it past its curve's limit: overload is no news
            timed_out = view.timeout_share > s.measurement.drop_failure_share
            overloaded = self._overloaded(view, curve)
            if overloaded and not timed_out and view.lower is not None and view.lower < view.drop_latency:
                # the mean of a few probes reaches the drop level by chance: the next round decides, pooled
                if track.suspect is None:
                    track.suspect = view.latency
                    continue
                view = replace(view, latency=(track.suspect + view.latency) / 2)
                overloaded = self._overloaded(view, curve)
            track.suspect = None
            if timed_out or overloaded:
                served = view.weight * (1 - view.timeout_share)
                k = min(1.0, max(K_EVENT_MIN, 0.9 * served / w_max)) if w_max > 0 else K_EVENT_MIN
                if k < 1.0:
                    capacity[dip] = k
                    what = (f"{view.timeout_share:.0%} of probes timed out" if timed_out else
                            f"latency {view.latency * 1000:.1f} ms is a drop (>= {view.drop_latency * 1000:.1f} ms) "
                            f"and {view.latency / curve.latency(view.weight):.1f}x its curve")
                    notes.append(f"capacity change on {dip}: {what} at weight {view.weight:.4f}; w_max cut, curve "
                                 f"rescaled by k={k:.3f}")
                track.reset()
                continue
            if self._beyond_its_curve(view, curve, w_max) and dip not in overload_only:
                # ours: carrying more than the curve says it can, without a drop, is a capacity gain the
                # deviation cannot measure (the curve is infinite there); seen after a capacity inversion
                track.pending += 1
                if track.pending >= s.dynamics.change_confirmations:
                    capacity[dip] = min(K_EVENT_MAX, view.weight / w_max)
                    if s.dynamics.remeasure_on_gain:
                        remeasure.add(dip)
                    notes.append(f"capacity change on {dip}: serves weight {view.weight:.4f} without a drop, beyond "
                                 f"its curve's limit (w_max {w_max:.4f}); curve rescaled by "
                                 f"k={capacity[dip]:.3f}"
                                 + (", then back to measurement" if s.dynamics.remeasure_on_gain else ""))
                    track.reset()
                continue
            if dip not in deviation or dip in overload_only:
                continue
            if not pooled:  # else already recorded by the traffic judgement above
                track.record(deviation[dip], view.noise)
            mean_dev = statistics.fmean(track.deviations)
            # ours: beyond the paper's 20 %, also beyond NOISE_SIGMAS standard errors of the recent mean
            # (at high utilisation one round's mean latency is noisier than the 20 % allows for, and a
            # curve fitted to a few noisy rounds is itself off by its leave-one-out error)
            noise = NOISE_SIGMAS * track.mean_error(view.curve_error)
            if abs(mean_dev) > max(math.log1p(s.dynamics.capacity_change_threshold), noise):
                track.pending += 1
            else:
                track.pending = 0
            if track.pending >= s.dynamics.change_confirmations:
                observed = curve.latency(view.weight) * math.exp(mean_dev)
                k = shift_factor(curve, view.weight, observed, w_max)
                if k is not None:
                    if k > 1:  # a gain is taken at half strength (geometric), a loss in full: safety first
                        k = math.sqrt(k)
                    k = min(K_EVENT_MAX, max(K_EVENT_MIN, k))
                    capacity[dip] = k
                    observed_points[dip] = (view.weight, observed)
                    # below its knee one noisy inverse is a guess: re-measure (a loss is cut first); at the
                    # knee the inverse is well-conditioned and a refresh's first step could overload the DIP
                    below_knee = elasticity(curve, view.weight) < s.refresh.knee_elasticity
                    if k > 1:
                        again = s.dynamics.remeasure_on_gain and (below_knee or s.refresh.needs_room)
                    else:
                        again = below_knee and s.dynamics.remeasure_after_loss
                    if again:
                        remeasure.add(dip)
                        action = ("back to measurement (Algorithm 1 from its current weight)" if k > 1 else
                                  f"curve cut by k={k:.3f}, then back to measurement")
                    else:
                        action = f"curve rescaled by k={k:.3f}"
                    notes.append(f"capacity change on {dip}: latency {math.expm1(mean_dev):+.0%} against its curve "
                                 f"at weight {view.weight:.4f} over {len(track.deviations)} rounds; {action}")
                track.reset()
        return Verdict(capacity=capacity, observed=observed_points, notes=tuple(notes),
                       remeasure=frozenset(remeasure))

    def _beyond_its_curve(self, view: RoundView, curve: LatencyCurve, w_max: float) -> bool:
        """A round at a weight past both ``w_max`` and the curve's asymptote, answered without a drop."""
        return (w_max > 0 and view.weight > w_max * (1 + 1e-6) and not math.isfinite(curve.latency(view.weight))
                and view.timeout_share <= self.settings.measurement.drop_failure_share and math.isfinite(view.latency)
                and view.latency < view.drop_latency)

    def _overloaded(self, view: RoundView, curve: LatencyCurve) -> bool:
        """Ours: a round at a drop-level latency (section 4.3) that is also ``OVERLOAD_RATIO`` times
        and ``NOISE_SIGMAS`` of its own noise above the curve: the DIP is overloaded now, like one
        whose probes time out."""
        if not math.isfinite(view.drop_latency) or view.latency < view.drop_latency:
            return False
        predicted = curve.latency(view.weight)
        if not (math.isfinite(predicted) and predicted > 0):
            return False
        return math.log(view.latency / predicted) > max(math.log(OVERLOAD_RATIO), NOISE_SIGMAS * view.noise)

    def _drift(
        self, rounds: Mapping[str, RoundView], curves: Mapping[str, tuple[LatencyCurve, float]]
    ) -> tuple[float, str] | None:
        """Ours: a pool-wide drift below the traffic threshold (e.g. the error left by a traffic
        shift estimated from noisy rounds), judged on each DIP's mean deviation over its recent
        rounds; corrected when significant (|s| > 3 standard errors and above
        ``dynamics.traffic_drift_threshold``) for ``dynamics.change_confirmations`` rounds, by at most
        ``dynamics.traffic_change_threshold`` per correction (a larger pool-wide deviation that the
        traffic test's noise gate held back is approached step by step, re-judged after each)."""
        s = self.settings
        if s.dynamics.traffic_drift_threshold <= 0:
            return None
        means = {d: statistics.fmean(self.state.tracks[d].deviations) for d in rounds
                 if len(self.state.tracks[d].deviations) >= RECENT_ROUNDS}
        slopes = {d: min(SLOPE_CAP, elasticity(curves[d][0], rounds[d].weight)) for d in means}
        found = pooled_shift(means, slopes)
        if found is None:
            self.state.drift_pending = 0
            return None
        shift, error = found
        if abs(shift) > max(3 * error, math.log1p(s.dynamics.traffic_drift_threshold)):
            self.state.drift_pending += 1
        else:
            self.state.drift_pending = 0
        if self.state.drift_pending < s.dynamics.change_confirmations:
            return None
        self.state.drift_pending = 0
        # a drift is what lies below a traffic change: one correction moves the curves by at most the traffic
        # threshold, as the estimate is linear in the slopes and overshoots near a curve's knee
        bound = 1 + s.dynamics.traffic_change_threshold
        k = min(K_EVENT_MAX, bound, max(K_EVENT_MIN, 1 / bound, math.exp(-shift)))
        return k, (f"traffic drift: the pool's latencies sit {math.expm1(shift):+.1%} (capacity-equivalent, "
                   f"+-{error:.1%}) off the curves on {len(means)} DIPs; every curve shifted by k={k:.3f}")


def refresh_candidates(
    fitted_at: Mapping[str, float],
    w_max: Mapping[str, float],
    under_refresh: Sequence[str],
    *,
    now: float,
    period: float,
    budget: float,
) -> list[str]:
    """Curves due for refresh, oldest first, keeping refreshed capacity within ``budget`` (section 4.5).

    Capacity is estimated by ``w_max``; at least one DIP may always refresh when none is, so
    that a pool of a few large DIPs still gets refreshed.
    """
    if period <= 0:
        return []
    total = sum(w_max.values())
    if total <= 0:
        return []
    used = sum(w_max.get(d, 0.0) for d in under_refresh)
    chosen: list[str] = []
    for dip in sorted((d for d in fitted_at if d not in under_refresh), key=lambda d: fitted_at[d]):
        if now - fitted_at[dip] < period:
            break
        share = w_max.get(dip, 0.0)
        if (used + share) / total <= budget or (not under_refresh and not chosen):
            chosen.append(dip)
            used += share
    return chosen


def estimate_drain_time(
    switch_time: float, series: Sequence[tuple[float, float]], tolerance: float = 0.1
) -> float | None:
    """Section 4.7: after a DIP's weight went to 0 at ``switch_time`` (its latency high), the time
    until the latency reaches its settled weight-0 value (``t2 - t1``).

    ``series`` are ``(time, latency)`` probe rounds after the switch. The settled value is the
    mean of the last two rounds; ``t2`` is the first round within ``tolerance`` of it. None
    when fewer than three rounds or the latency has not settled (the last two differ).
    """
    points = sorted((t, latency) for t, latency in series if t >= switch_time and math.isfinite(latency))
    if len(points) < 3:
        return None
    last, before = points[-1][1], points[-2][1]
    settled = (last + before) / 2
    if abs(last - before) > 2 * tolerance * settled:
        return None
    for t, latency in points:
        if abs(latency - settled) <= tolerance * settled:
            return t - switch_time
    return None
