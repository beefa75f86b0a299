"""The measurement phase of one DIP: KnapsackLB section 4.3, Algorithm 1.

The extracted paper text lost the formulas; this is our reconstruction from the prose
(docs/controller.md keeps it with the reasoning):

* Inputs per iteration ``i``: the current and previous measurement weights ``w_i`` and
  ``w_{i-1}``, ``w_max`` (the largest weight measured so far without a drop), the weight-0
  latency ``l_0`` and the latency ``l_i`` measured at ``w_i``.
* A **drop** is a probe round with failed requests (errors or timeouts above
  ``measurement.drop_failure_share``) or a latency of at least ``measurement.drop_latency_factor * l_0`` (paper: 5x;
  "latencies are 5x or higher when the CPU is 100 % utilised").
* **Run** (no drop): ``w_max = max(w_max, w_i)`` (line 5) and
  ``w_{i+1} = w_i + alpha * w_i * l_0 / l_i`` (line 6): near ``l_0`` the weight roughly
  doubles (alpha = 1), near capacity (``l_i >> l_0``) it grows slowly.
* **Backtrack** (drop): ``w_{i+1} = (w_i + w_max) / 2`` (line 8).
* **A drop needs proof** (ours): a round whose mean reaches the drop level but whose lower
  confidence bound does not (Student's t on its own probes; no failed probes) is measured again at
  the same weight, and the two rounds pooled decide - their mean, on twice the probes, against the
  drop level. A live round of five probes at 70 % load has a coefficient of variation near 1: its
  mean crosses 5x ``l_0`` by chance often enough to halve a DIP's ``w_max`` on noise.
* **Done** (lines 1-2): the change between consecutive weights is within
  ``D = convergence_fraction * w_max`` (paper: 5 %). We test the change ``|w_{i+1} - w_i|``
  as soon as ``w_{i+1}`` is computed: the paper tests it at the start of the next iteration,
  where it compares the same two numbers, so this only saves the one measurement whose
  result the test does not use.

The first two measurement weights are 0 (for ``l_0``) and the equal share ``1/N`` (section
6.1); their order is free (a DIP added to a live pool starts at 0, a cold start of a whole
pool starts at the equal share, which already sums to 1 on the LB).

How it fails: a DIP that drops even at tiny weights halves its weight each iteration and
stops after ``measurement.max_iterations`` with ``w_max = 0`` (unusable; the controller
then gives it only the minimum weight). Noise can still turn a drop-free round into a drop or the
reverse (two pooled rounds of a few probes are noisy too); Algorithm 1 then simply bisects a little
longer. A real drop costs one more round at the weight that overloads the DIP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from knapsack_lb.controller.estimation import RoundEvidence, is_overload, pooled, round_evidence, same_weight
from knapsack_lb.controller.settings import ControllerSettings
from knapsack_lb.model import Measurement

PRIORITY_OVERUTILISED = 0
PRIORITY_NORMAL = 1
PRIORITY_REFRESH = 2
# Ours: beyond its threshold a refresh step is sized from the last step's arc elasticity e so that the
# latency rises by at most this factor ((1 + step)^e): 10 % steps while e <= 2.3, 5.7 % at e = 4.
STEP_LATENCY_RISE = 1.25


@dataclass(frozen=True)
class AlgorithmStep:
    """Output of one iteration of Algorithm 1."""

    next_weight: float
    done: bool
    w_max: float
    backtracked: bool


def is_drop(measurement: Measurement, l0: float | None, settings: ControllerSettings) -> bool:
    """A "drop" (section 4.3): failed probes, or latency at least ``measurement.drop_latency_factor * l0``."""
    if measurement.sent == 0 or measurement.successes == 0 or measurement.latency_mean is None:
        return True
    if measurement.failures / measurement.sent > settings.measurement.drop_failure_share:
        return True
    return l0 is not None and measurement.latency_mean >= settings.measurement.drop_latency_factor * l0


def algorithm1(
    w_cur: float,
    w_max: float,
    l0: float,
    l_cur: float,
    dropped: bool,
    *,
    pace: float = 1.0,
    convergence_fraction: float = 0.05,
    upper: float = 1.0,
    w_drop: float | None = None,
    threshold: float | None = None,
    cautious_step: float = 0.0,
) -> AlgorithmStep:
    """One iteration of Algorithm 1 (run or backtrack, then the convergence test).

    ``w_drop`` (ours, optional): the smallest weight that dropped so far. When given, a run
    step never goes past the midpoint between ``w_cur`` and it - like TCP's ``ssthresh``, the
    search does not re-run into a weight already known to drop. ``None`` is the paper.

    ``threshold`` and ``cautious_step`` (ours, for a refresh): ``threshold`` plays TCP's
    ``ssthresh`` - a run step goes at most up to it (or ``cautious_step`` when it is nearer),
    and beyond it grows the weight by at most ``cautious_step`` (a fraction) per iteration; the
    step stays larger than the convergence test, so the cap never ends the run. A doubling step
    from a many-core DIP's flat latency (``l_i`` near ``l_0`` up to high utilisation) would
    otherwise jump far past its capacity on a live pool. The controller sets it to the DIP's
    previous ``w_max``, or the knee of its current curve when that is lower
    (``refresh.needs_room``), and near the
    knee passes a ``cautious_step`` sized from the measured elasticity, which may fall below the
    convergence test and so end the run there, as intended.
    """
    if not dropped:
        w_max = max(w_max, w_cur)
        # l_cur below l_0 is noise; cap the growth at the paper's fastest pace (l_cur == l_0).
        ratio = min(1.0, l0 / l_cur) if l_cur > 0 else 1.0
        nxt = w_cur + pace * w_cur * ratio
        if w_drop is not None and w_drop > w_cur:
            nxt = min(nxt, (w_cur + w_drop) / 2)
        if threshold is not None and cautious_step > 0:
            nxt = min(nxt, max(threshold, w_cur * (1 + cautious_step)))
    else:
        nxt = (w_cur + w_max) / 2
    nxt = min(nxt, upper)
    done = w_max > 0 and abs(nxt - w_cur) <= convergence_fraction * w_max
    if not dropped and w_cur >= upper:
        done = True  # the DIP takes the whole VIP's traffic without a drop
    return AlgorithmStep(next_weight=nxt, done=done, w_max=w_max, backtracked=dropped)


@dataclass
class DipMeasurement:
    """The measurement state of one DIP (new, or refreshing its curve).

    ``points`` are every trusted probe round seen while measuring: ``(weight, latency,
    dropped)``; the drop-free ones are what the curve is fitted on (section 6.1). ``target``
    is the weight Algorithm 1 wants measured next; ``priority`` and ``enqueued_at`` order it
    in the scheduler (section 4.6: over-utilised first, FIFO within a class).
    """

    dip: str
    enqueued_at: float
    refresh: bool = False
    l0: float | None = None
    equal_latency: float | None = None
    equal_dropped: bool = False
    pending_zero: bool = True
    pending_equal: bool = True
    w_cur: float = 0.0
    w_prev: float = 0.0
    w_max: float = 0.0
    target: float | None = None
    last_dropped: bool = False
    w_drop: float | None = None
    threshold: float | None = None
    room_seen: bool = False
    l_prev: float | None = None
    iterations: int = 0
    done: bool = False
    points: list[tuple[float, float, bool]] = field(default_factory=list)
    unconfirmed: RoundEvidence | None = None  # a drop its round did not prove: measured again before it counts

    @property
    def priority(self) -> int:
        if self.refresh:
            return PRIORITY_REFRESH
        return PRIORITY_OVERUTILISED if self.last_dropped else PRIORITY_NORMAL

    def wanted(self, equal_share: float, zero_first: bool) -> float | None:
        """The weight to measure next, or None when done."""
        if self.done:
            return None
        if self.target is not None:
            return self.target
        if self.pending_zero and (zero_first or not self.pending_equal):
            return 0.0
        if self.pending_equal:
            return equal_share
        return 0.0

    def record(
        self, weight: float, measurement: Measurement, settings: ControllerSettings, equal_share: float,
        now: float, *, scheduled: bool, expected: float | None = None,
    ) -> None:
        """Take one trusted probe round at ``weight``; advance Algorithm 1 if it was the scheduled one.

        ``expected``: for a refresh, the latency the DIP's current curve predicts at ``weight``
        (see :meth:`_no_room_beyond`); None when there is no curve.
        """
        latency = measurement.latency_mean
        if weight <= 1e-12:
            if measurement.successes > 0 and latency is not None:
                self.l0 = latency
                if self.pending_zero:
                    self.iterations += 1
                self.pending_zero = False
                self.points = [p for p in self.points if p[0] > 0]
                self.points.append((0.0, latency, False))
                if self.target == 0.0:
                    self.target = None
            self._maybe_start(settings, equal_share, now)
            return
        dropped = is_drop(measurement, self.l0, settings)
        if scheduled and not self.pending_equal and settings.measurement.drop_needs_proof:
            evidence = round_evidence(measurement, weight)
            if self.unconfirmed is None and dropped and self._unproven(evidence, settings):
                self.unconfirmed, self.target, self.enqueued_at = evidence, weight, now
                self.iterations += 1
                return
            if self.unconfirmed is not None:
                latency, dropped = self._confirm(evidence, latency, dropped, settings)
        if latency is not None and math.isfinite(latency):
            self.points.append((weight, latency, dropped))
        if not scheduled:
            return
        self.iterations += 1
        if self.pending_equal and self.target is None:
            self.pending_equal = False
            self.equal_latency = latency if latency is not None else math.inf
            self.equal_dropped = dropped
            self.w_cur = weight
            self._maybe_start(settings, equal_share, now)
            return
        self._advance(weight, latency, dropped, settings, now, expected)

    def _unproven(self, evidence: RoundEvidence | None, settings: ControllerSettings) -> bool:
        """A drop by the round's mean that its lower confidence bound does not prove (Student's t on its
        own probes, :func:`~knapsack_lb.controller.estimation.is_overload`): on a round of a few probes
        near saturation the mean crosses ``drop_latency_factor * l_0`` by chance. Failed probes prove it."""
        m, z = settings.measurement, settings.learning.confidence
        return evidence is not None and evidence.n > 0 and evidence.failed <= m.drop_failure_share and \
            not is_overload(evidence, self.l0, m.drop_latency_factor, m.drop_failure_share, z)

    def _confirm(self, evidence: RoundEvidence | None, latency: float | None, dropped: bool,
                 settings: ControllerSettings) -> tuple[float | None, bool]:
        """The round after an unproven drop, at its weight: the two rounds pooled decide (their mean
        against the drop level, on twice the probes); failed probes, or a round under another weight
        (:attr:`~knapsack_lb.controller.estimation.RoundEvidence.setting`), decide alone."""
        earlier, self.unconfirmed = self.unconfirmed, None
        m = settings.measurement
        if earlier is None or evidence is None or evidence.n == 0 or evidence.failed > m.drop_failure_share \
                or not same_weight(evidence.setting, earlier.setting, m.trust_tolerance) or self.l0 is None:
            return latency, dropped
        both = pooled([earlier, evidence])
        return both.mean, both.mean >= m.drop_latency_factor * self.l0

    def _maybe_start(self, settings: ControllerSettings, equal_share: float, now: float) -> None:
        """Once both l_0 and the equal-share latency are known, run the first Algorithm 1 iteration."""
        if self.pending_zero or self.pending_equal or self.target is not None or self.done:
            return
        assert self.l0 is not None
        latency = self.equal_latency if self.equal_latency is not None else math.inf
        dropped = self.equal_dropped or latency >= settings.measurement.drop_latency_factor * self.l0
        self.w_cur = equal_share if self.w_cur <= 0 else self.w_cur
        self._advance(self.w_cur, latency, dropped, settings, now)

    def _advance(
        self, weight: float, latency: float | None, dropped: bool, settings: ControllerSettings, now: float,
        expected: float | None = None,
    ) -> None:
        if self.l0 is None:  # cannot judge yet: keep the point, measure l_0 first
            self.target = None
            self.pending_zero = True
            return
        if dropped and weight > self.w_max:
            self.w_drop = weight if self.w_drop is None else min(self.w_drop, weight)
        if self._no_room_beyond(weight, latency, dropped, expected, settings) or self._at_knee(
                weight, latency, dropped, settings):
            self.w_prev, self.w_cur, self.w_max = weight, weight, max(self.w_max, weight)
            self.last_dropped, self.enqueued_at, self.done, self.target = False, now, True, None
            return
        cautious = settings.refresh.cautious_step
        arc = self._arc_elasticity(weight, latency, dropped)
        if settings.refresh.needs_room and arc is not None and arc > 0 and self._past_threshold(weight):
            # ours: a step beyond the threshold may raise the latency by at most STEP_LATENCY_RISE
            cautious = min(cautious, STEP_LATENCY_RISE ** (1 / arc) - 1)
        self.l_prev = None if dropped or latency is None else latency
        step = algorithm1(
            weight, self.w_max, self.l0, latency if latency is not None else math.inf, dropped,
            pace=settings.measurement.pace, convergence_fraction=settings.measurement.convergence_fraction,
            w_drop=self.w_drop if settings.measurement.run_capped_by_drop else None,
            threshold=self.threshold, cautious_step=cautious,
        )
        self.w_prev, self.w_cur, self.w_max = weight, step.next_weight, step.w_max
        self.last_dropped = dropped
        self.enqueued_at = now
        if step.done or self.iterations >= settings.measurement.max_iterations:
            self.done = True
            self.target = None
        else:
            self.target = step.next_weight

    def _no_room_beyond(self, weight: float, latency: float | None, dropped: bool, expected: float | None,
                        settings: ControllerSettings) -> bool:
        """Ours, for a refresh (``refresh.needs_room``): the first drop-free round at or past the
        threshold (the knee of the DIP's current curve, or its old ``w_max``) ends the refresh unless
        its latency is at least ``dynamics.capacity_change_threshold`` below what the curve ``expected``
        there - evidence that the DIP has more room than the curve says. With that evidence the run
        goes on by cautious steps, each sized from the last step's arc elasticity so that the
        latency rises by at most ``STEP_LATENCY_RISE``, until :meth:`_at_knee`.

        How it fails: a real gain smaller than the margin is not explored (the curve stays a
        little pessimistic until the detector sees it); a noisy round 20 % below the curve lets
        the run go on, where the step size and the knee still stop it. Why the gate exists:
        docs/decisions/controller.md.
        """
        if (not settings.refresh.needs_room or not self.refresh or self.room_seen or dropped or latency is None
                or not self._past_threshold(weight)):
            return False
        if expected is not None and math.isfinite(expected) and latency <= expected * (
                1 - settings.dynamics.capacity_change_threshold):
            self.room_seen = True
            return False
        return True

    def _at_knee(self, weight: float, latency: float | None, dropped: bool, settings: ControllerSettings) -> bool:
        """Ours, for a refresh beyond its threshold: stop when the last cautious step's arc
        elasticity ``ln(l_i / l_{i-1}) / ln(w_i / w_{i-1})`` reaches ``refresh.knee_elasticity``.

        Under M/M/c a +10 % step has an arc elasticity of 3-5 at 80 % utilisation whatever
        the number of servers, while the paper's drop (5x ``l_0``) comes at about 97 % on an
        8-core DIP: the knee stops a re-measurement before the DIP is driven past capacity.
        Probe noise (~10 % per round) gives the estimate a spread of about 1.5, so a false
        stop at low load is rare, and it only keeps ``w_max`` conservative.
        """
        knee = settings.refresh.knee_elasticity
        if knee <= 0 or not self._past_threshold(weight):
            return False
        arc = self._arc_elasticity(weight, latency, dropped)
        return arc is not None and arc >= knee

    def _past_threshold(self, weight: float) -> bool:
        """At or beyond the refresh's threshold (its ssthresh), up to rounding of the plan's weights."""
        return self.threshold is not None and weight >= self.threshold * (1 - 1e-9)

    def _arc_elasticity(self, weight: float, latency: float | None, dropped: bool) -> float | None:
        """``ln(l_i / l_{i-1}) / ln(w_i / w_{i-1})`` of a refresh's last step up, None when unknown."""
        if (not self.refresh or dropped or latency is None or self.l_prev is None or not self.w_prev > 0
                or weight <= self.w_prev or not latency > 0):
            return None
        return math.log(latency / self.l_prev) / math.log(weight / self.w_prev)
