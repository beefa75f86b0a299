"""Learning a DIP's weight-latency curve from every probe round: the controller's default learner.

KnapsackLB (section 4.3, Algorithm 1) learns a curve by walking one DIP's weight up until its
latency reaches 5x the weight-0 latency, one drain-time-long round per step, and only then solves.
On a live pool that is slow (minutes before the first solved plan) and unsafe: the walk drives
DIPs to the edge of capacity on purpose, and a single noisy round of a few probes (coefficient of
variation near 1) decides each step. This learner keeps the paper's model - a convex weight-latency
curve per DIP, solved for the weights that minimise latency (section 4.4) - and changes how the
curve is learned:

* **Every round is evidence, with its own error.** A round at the weight the LB confirmed carries
  its mean and its standard error from its own spread (:func:`round_evidence`); rounds taken under
  the same weight are pooled exactly (:func:`pooled`: the mean and the standard error of all their
  requests together), at their mean share where the LB counted one (:func:`by_weight`: grouped by
  the noisy share itself, the rounds' scatter along the weight axis dilutes the fitted slope and
  the saturation comes out high). A round judged on its own (the change test) counts at least the
  DIP's spread of one probe pooled over its rounds (:func:`probe_spread`): a few probes' own
  spread is low exactly when they missed the slow tail. Where rounds at one weight vary more than their
  probes say (probes sent back to back see one state of the queue; at layer 4 the load moves with
  the connections), that spread between rounds is estimated for the pool
  (:func:`between_round_spread`) and counted by every decision.
* **A queueing model, fitted with its uncertainty.** ``1 / latency = (1/s) * (1 - (w / c) ** k)``
  (:mod:`knapsack_lb.curves.utilisation`) is a weighted least-squares line for each knee shape
  ``k``; weights come from the standard errors. Two rounds at different loads give the unloaded
  latency ``s`` and the saturation weight ``c`` (for ``k = 1`` exactly the relation
  ``latency = s / (1 - utilisation)``). The pool gives each DIP a weak prior on ``s`` (the lower
  quartile of the DIPs' lowest latencies, +-``PRIOR_SPREAD``), so one round at the current split
  already gives a curve: the first plan is solved after one round. The prior stays until the DIP's
  own rounds reject it (:func:`_points_and_fits`): rounds a few percent of weight apart cannot tell
  the unloaded latency from the knee. Where a DIP's own rounds at distinct loads told its unloaded
  latency, the lower of that and the pool's is its prior, through relearning too (:func:`own_prior`).
* **Decisions on confidence bounds.** The weight a plan may give a DIP (its ``cap``, the solver's
  ``w_max``) is the lower confidence bound of ``c`` over every knee shape the data do not reject
  (``z`` standard errors, profile over ``k``), less the rails' headroom. A DIP whose latency has
  not risen yet therefore grows by a bounded factor per round (how much depends on how precisely its
  flat latency is known: about 10 % for a 16-server knee at a 10 % standard error), and a DIP that
  is seen rising gets a curve that says where its knee is.
* **Overload is a hard bound.** A round with failed probes (more than ``drop_failure_share``) or
  whose mean's lower confidence bound is ``drop_latency_factor`` times the DIP's unloaded latency
  or more (the paper's "drop", :func:`is_overload`; the unloaded latency is the lower of the DIP's
  lightest rounds pooled, :func:`light_latency`, and the lower quartile of those of the pool, not
  of its lowest rounds: the lowest round of a few probes is biased low, and a drop level at a
  fraction of the service time calls ordinary rounds overloads) proves the DIP cannot carry that
  weight: its cap falls to half of it, or to the largest weight it carried cleanly below it
  (multiplicative decrease).
* **Changes forget the past.** A clean round that disagrees with the fitted curve by more than
  ``z`` standard errors of its log-latency and ``capacity_change_threshold`` (the paper's 20 %) drops the
  DIP's older rounds (:func:`change_direction`), so a capacity change is learned afresh from the rounds
  after it (a traffic change moves every DIP's rounds instead: :mod:`knapsack_lb.controller.traffic`);
  rounds older than ``window`` seconds are forgotten anyway. Where the curve predicts a drop-level
  latency it is at the asymptote a drop puts there, and a faster round is no gain (:func:`disagreement`).

How it fails: the model assumes the latency a probe sees is a function of the DIP's weight only;
a DIP whose latency moves for other reasons (a noisy neighbour that comes and goes each minute)
keeps being re-learned from its recent rounds. With very few probes per round the standard errors
are large and caps grow slowly: the learner is cautious, not fast, on such DIPs.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.stats import f as f_dist
from scipy.stats import norm as normal
from scipy.stats import t as student_t

from knapsack_lb.curves.base import LatencyCurve
from knapsack_lb.curves.utilisation import UNBOUNDED, ShapeFit, UtilisationCurve, curve_from_fit, shape_fits
from knapsack_lb.model import Measurement

PRIOR_SPREAD = 0.25  # relative standard deviation of the pool prior on a DIP's unloaded latency
LIGHT_PRECISION = PRIOR_SPREAD / 2  # a light-load latency is pooled until known this well (light_latency)
BACKOFF = 0.5  # a weight that overloaded a DIP: its cap falls to this share of it (or its last clean weight)
MODEL_ERROR = 0.01  # no round is trusted closer than 1 % (the model is an approximation; service may be fixed)
PLAUSIBLE_CHI2 = 4.0  # a knee shape is rejected when its chi-square exceeds the best one's by this (2 sigma)
MIN_SPREAD_PAIRS = 5  # pairs of same-weight rounds before the between-round spread is estimated
SAME_WEIGHT_ABSOLUTE = 1e-4  # weights this close count as one, however small (:func:`same_weight`)
# Looser confidence levels for the caps, as shares of ``z``: when the caps at ``z`` cannot carry the VIP the
# plan takes the most confident level whose caps can (:attr:`Estimate.relaxed`)
RELAXED_LEVELS = (0.75, 0.5, 0.25)


@dataclass(frozen=True)
class RoundEvidence:
    """One trusted round as evidence: ``n`` successful probes with this mean and standard deviation at
    ``weight``; ``failed`` is the share of probes that failed. ``configured`` is the weight the LB
    carried for the DIP during the round, when ``weight`` is the share it was measured to carry
    (NaN when they are one)."""

    time: float
    weight: float
    mean: float
    std: float
    n: int
    failed: float
    configured: float = math.nan

    @property
    def setting(self) -> float:
        """The weight the round was taken under: ``configured``, else ``weight``."""
        return self.configured if math.isfinite(self.configured) else self.weight


def round_evidence(m: Measurement, weight: float) -> RoundEvidence | None:
    """A round as evidence, or None when no probe was sent (nothing to learn).

    The round stands at the DIP's share of the VIP's requests over the round when the LB's counters
    told it (``m.share``): at layer 4 the weights move new connections only, and the share the DIP
    really carried lags them by the connections' lifetimes; else at ``weight``, what the LB confirmed.

    Without its own spread (fewer than two successes, or a prober that does not report it) the
    round's standard deviation is taken equal to its mean - the spread of exponential service, the
    pessimistic common case - so a thin round weighs little."""
    if m.sent == 0:
        return None
    configured = weight if m.share is not None else math.nan
    weight = m.share if m.share is not None else weight
    failed = m.failures / m.sent
    if m.successes == 0 or m.latency_mean is None or not math.isfinite(m.latency_mean) or m.latency_mean <= 0:
        return RoundEvidence(m.time, weight, math.inf, math.inf, 0, failed, configured)
    std = m.latency_std if m.latency_std is not None and m.successes >= 2 and math.isfinite(m.latency_std) \
        else m.latency_mean
    return RoundEvidence(m.time, weight, m.latency_mean, max(std, 0.0), m.successes, failed, configured)


@dataclass(frozen=True)
class Pooled:
    """Rounds pooled as if they were one: ``mean`` and ``stderr`` over all ``n`` successful probes."""

    weight: float
    mean: float
    stderr: float
    n: int
    rounds: int


def pooled(rounds: Sequence[RoundEvidence]) -> Pooled:
    """Pool rounds exactly: the grand mean, and the standard error from the total sum of squares
    (each round's own spread plus the spread of the round means). Raises ``ValueError`` on no
    successful probe."""
    good = [r for r in rounds if r.n > 0 and math.isfinite(r.mean)]
    total = sum(r.n for r in good)
    if total == 0:
        raise ValueError("pooled: no successful probe in these rounds")
    mean = sum(r.n * r.mean for r in good) / total
    weight = sum(r.n * r.weight for r in good) / total
    squares = sum((r.n - 1) * r.std ** 2 + r.n * (r.mean - mean) ** 2 for r in good)
    variance = squares / (total - 1) if total > 1 else mean ** 2
    return Pooled(weight, mean, math.sqrt(max(variance, 0.0) / total), total, len(good))


def same_weight(weight: float, to: float, tolerance: float) -> bool:
    """``weight`` counts as taken at ``to``: within ``tolerance`` of it relative, or
    ``SAME_WEIGHT_ABSOLUTE`` absolute (:func:`same_weights` on arrays)."""
    return abs(weight - to) <= max(SAME_WEIGHT_ABSOLUTE, tolerance * to)


def same_weights(weights: npt.NDArray[np.float64], to: npt.NDArray[np.float64],
                 tolerance: float) -> npt.NDArray[np.bool_]:
    """:func:`same_weight` element by element."""
    return np.abs(weights - to) <= np.maximum(SAME_WEIGHT_ABSOLUTE, tolerance * to)


def probe_spread(rounds: Iterable[RoundEvidence]) -> float | None:
    """One probe's relative spread on a DIP (its latency's coefficient of variation), pooled over the
    rounds with two or more successful probes: ``sqrt(sum((n - 1) * (std / mean)**2) / sum(n - 1))``;
    None without such a round.

    A round's own spread is a poor measure of its own error when it has a few probes: a latency's
    spread grows with its mean, so a round that missed the slow tail by chance has both a low mean
    and a low spread, and judged by its own spread it reads as a capacity gain (on the live demo,
    five-probe rounds' own coefficients of variation ranged from 0.02 to 1.05 on one DIP whose
    pooled spread was 0.5-0.65). The pooled spread has as many degrees of freedom as the DIP has
    probes, and does not move with any one round's mean."""
    freedom = squares = 0.0
    for r in rounds:
        if r.n >= 2 and 0 < r.mean < math.inf and math.isfinite(r.std):
            freedom += r.n - 1
            squares += (r.n - 1) * (r.std / r.mean) ** 2
    return math.sqrt(squares / freedom) if freedom > 0 else None


def light_latency(rounds: Sequence[RoundEvidence], z: float) -> float:
    """A DIP's latency at the lightest load it was seen at: its rounds pooled (as :func:`pooled` does) from
    the lightest weight up until the pooled mean's relative standard error is at most
    ``LIGHT_PRECISION``, stopping before the first round that is slower than the rounds so far by
    more than ``z`` standard errors of both (load shows there); ``inf`` with no successful probe.
    The standard errors count at least the DIP's spread of one probe (:func:`probe_spread`): a few
    probes' own spread is low exactly when they missed the slow tail.

    Not the lowest round, nor the lowest group of rounds at one weight: the minimum of many rounds
    of a few probes is biased low, the more so the more rounds and the noisier the service (at
    layer 7 the share a DIP carries moves a little every round, so most groups are one round). On a
    37-DIP pool of exponential service (150 ms) with 3-5 probes a round, the lower quartile of the
    DIPs' lowest rounds sat at 6-13 ms, and the drop test (5x the unloaded latency) fired on ordinary
    rounds. How it fails: a DIP seen only under load gives its loaded latency (the drop test takes
    the lower of it and the pool's prior); a rise too gradual to stop the pooling biases it up by
    part of the rise."""
    good = sorted((r for r in rounds if r.n > 0 and math.isfinite(r.mean)), key=lambda r: r.weight)
    spread = probe_spread(good) or 0.0
    count = 0
    total = squares = mean = stderr = 0.0
    for r in good:
        if count and r.mean - mean > z * math.hypot(stderr, max(r.std, spread * r.mean) / math.sqrt(r.n)):
            break
        count += r.n
        total += r.n * r.mean
        squares += (r.n - 1) * r.std ** 2 + r.n * r.mean ** 2
        mean = total / count
        variance = (squares - count * mean ** 2) / (count - 1) if count > 1 else mean ** 2
        stderr = max(math.sqrt(max(variance, 0.0)), spread * mean) / math.sqrt(count)
        if stderr <= LIGHT_PRECISION * mean:
            return mean
    return mean if count else math.inf


def unloaded_latency(pool: float | None, light: float) -> float | None:
    """The unloaded latency a DIP's drop test reads: the lower of the pool's (None: not known) and the
    DIP's own ``light`` latency (:func:`light_latency`; ``inf``: no successful probe); None without either."""
    return min(pool, light) if pool is not None else (light if math.isfinite(light) else None)


def seen_under_load(light: float, pool: float | None, z: float) -> bool:
    """Whether a DIP's light latency (:func:`light_latency`, pooled to ``LIGHT_PRECISION``) lies above
    the pool's unloaded latency (:func:`pool_prior` of the light latencies, known to ``PRIOR_SPREAD``)
    by more than ``z`` of both errors: then even its lightest rounds were taken under load, and a
    flat fit of them is no sign of room (:func:`estimate` gives it no floor). False without a pool
    or a light latency.

    A DIP can be flat because every round saw it loaded: a small DIP started at its share of the
    pool's vCPUs near its knee (at layer 4 the shares it carries scatter round to round, its rounds
    stand at several weights, and their flat latency at 3-4x the pool's reads as a slow host with no
    knee). The floor, a fixed share of the pool, was then above its capacity, and plans ran such
    DIPs at 1.1-1.6x it (docs/decisions/controller.md). How it fails: a DIP on a host that much
    slower than the rest of the pool is taken for a loaded one and grows by the bounded step only."""
    if pool is None or not math.isfinite(light):
        return False
    return light * (1 - z * LIGHT_PRECISION) > pool * (1 + z * PRIOR_SPREAD)


def by_weight(rounds: Sequence[RoundEvidence], tolerance: float) -> list[Pooled]:
    """Rounds grouped by the weight they were taken under (:attr:`RoundEvidence.setting`,
    :func:`same_weight` as the group's first) and pooled, each group at its rounds' mean share."""
    groups: list[list[RoundEvidence]] = []
    for r in sorted((r for r in rounds if r.n > 0 and math.isfinite(r.mean)), key=lambda r: r.setting):
        if groups and same_weight(r.setting, groups[-1][0].setting, tolerance):
            groups[-1].append(r)
        else:
            groups.append([r])
    return [pooled(g) for g in groups]


@functools.lru_cache(maxsize=256)
def _f_median(freedom: float) -> float:
    """The median of ``F(1, freedom)``."""
    return float(f_dist.median(1, freedom))


def between_round_spread(dips: Iterable[Sequence[RoundEvidence]], tolerance: float, z: float) -> float:
    """How much a round's mean varies beyond what its own probes say, as a relative standard
    deviation (``tau``), from pairs of consecutive rounds one DIP took under the same weight
    (:attr:`RoundEvidence.setting`: at layer 4 the share the LB counted differs every round, and that
    difference is part of the spread), pooled over the DIPs (one probing method, one kind of load).

    A round whose probes are sent back to back sees one state of the DIP's queue (the probe worker
    spreads them over the round, but another prober may not); at layer 4 the load a DIP carries
    moves with the connections it holds, so rounds at one weight can differ by far more than their
    own spread (on the live demo with back-to-back probes, one DIP's 5-probe rounds at weights
    0.16-0.20 read 22 ms to 109 ms, each within +-50 % among its own probes). A round's mean then has
    the variance ``std**2 / n + (tau * mean)**2``, and every decision that reads one round, or pools a
    few, must count ``tau``: without it a single round with a tight spread looks like proof.

    Each pair's log-ratio ``d`` has the variance ``v = v1 + v2 + 2 tau**2`` (``v_i`` the rounds' own,
    ``(std / mean)**2 / n``); ``tau`` is the smallest value that brings the median of ``d**2 / v`` down
    to the median of ``F(1, n1 + n2 - 2)`` (the square of a t statistic: the rounds' own variances are
    estimated from a few probes each; a chi-square's median would read their noise as spread). The
    median, not the mean: a DIP's real change (a capacity loss, a traffic step) is one pair of its
    rounds, not a spread, and must not read as noise (a moment estimate over same-weight groups took
    ``tau`` from 0.03 to 0.47 on a capacity loss of 4 of 30 DIPs). 0 with fewer than
    ``MIN_SPREAD_PAIRS`` pairs, and unless more pairs lie above that median than chance allows at
    ``z`` (a sign test): the estimate's own noise is no spread, and where rounds agree with their
    probes (the fluid model) it must not move a decision."""
    rows = [(dip, r.setting, r.mean, r.std, r.n) for dip, rounds in enumerate(dips) for r in rounds
            if r.n >= 2 and 0 < r.mean < math.inf]
    if len(rows) < 2:
        return 0.0
    dip, weight, mean, std, n = np.array(rows, dtype=float).T
    # a round's own variance of its log-mean, never below the model's error; pairs are consecutive
    # rounds of one DIP under the same weight
    variance = np.maximum((std / mean) ** 2 / n, MODEL_ERROR ** 2)
    pair = (dip[1:] == dip[:-1]) & same_weights(weight[1:], weight[:-1], tolerance)
    if np.count_nonzero(pair) < MIN_SPREAD_PAIRS:
        return 0.0
    d2 = np.log(mean[1:][pair] / mean[:-1][pair]) ** 2
    own = (variance[1:] + variance[:-1])[pair]
    reference = _f_median(float(np.median((n[1:] + n[:-1] - 2)[pair])))
    if np.count_nonzero(d2 / own > reference) <= len(d2) / 2 + z * math.sqrt(len(d2)) / 2:
        return 0.0
    low, high = 0.0, float(d2.max()) / (2 * reference)  # there every ratio is at most the reference
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (mid, high) if np.median(d2 / (own + 2 * mid)) > reference else (low, mid)
    return math.sqrt(high)


@dataclass(frozen=True)
class Estimate:
    """What the rounds say about one DIP: its curve, its saturation weight (best estimate), the
    largest weight a plan may give it (``cap``: the lower confidence bound of the saturation), the
    upper confidence bound of the saturation (``ceiling``: ``inf`` until a rise is significant, never
    above a weight that overloaded it) and whether its last round overloaded it. ``relaxed`` holds
    the caps at the looser confidence levels of ``RELAXED_LEVELS`` (each at least the one before,
    and ``cap``): a DIP whose saturation is known
    precisely (seen at its knee) gains least from them, one seen only far below its knee more, and
    none passes the backoff below a weight that overloaded it; empty without a fit (rounds at one
    weight, or overloaded at every weight seen)."""

    curve: UtilisationCurve
    saturation: float
    cap: float
    overloaded: bool
    points: int
    dispersion: float = 1.0
    relaxed: tuple[float, ...] = ()
    ceiling: float = math.inf
    unloaded: float | None = None  # what the DIP's own rounds tell of its unloaded latency (:func:`own_unloaded`)

    @property
    def s(self) -> float:
        """The unloaded latency."""
        return self.curve.s

    @property
    def k(self) -> float:
        """The knee's shape."""
        return self.curve.k

    def describe(self) -> str:
        sat = "unbounded" if self.saturation > 1e2 else f"{self.saturation:.3f}"
        return (f"s={self.s * 1e3:.1f}ms saturation={sat} k={self.k:g} "
                f"cap={self.cap:.3f}{' overloaded' if self.overloaded else ''}")


@functools.lru_cache(maxsize=1024)
def critical(z: float, n: int) -> float:
    """How many of a round's standard errors a decision at confidence ``z`` needs when the standard
    error comes from the round's own ``n`` probes: Student's t quantile with ``n - 1`` degrees of
    freedom at the normal probability of ``z`` (about 2.9 for ``z = 2`` and 5 probes, ``z`` itself for
    large rounds). A few probes' spread is itself uncertain, and a z test on it fires on noise. A
    round of fewer than two probes has no spread of its own (its spread is the assumed exponential
    one), so ``z`` stands."""
    if n < 2:
        return z
    return float(student_t.ppf(normal.cdf(z), n - 1))


def mean_lower_bound(mean: float, std: float, n: int, z: float) -> float:
    """The lower confidence bound of the mean of ``n`` probes with this spread (Student's t, :func:`critical`)."""
    return mean - critical(z, n) * std / math.sqrt(n)


def is_overload(r: RoundEvidence, unloaded: float | None, drop_factor: float, failure_share: float,
                z: float, spread: float = 0.0) -> bool:
    """The paper's drop (section 4.3): failed probes, or a latency of ``drop_factor`` times unloaded
    or more - on the round's lower confidence bound (``z``, Student's t on its own ``n`` probes, see
    :func:`critical`), not on its mean. A drop halves the DIP's cap, so it needs proof: near
    saturation one request's latency varies more than its mean, and a round of a few probes at a
    safe load crosses the drop level by chance often enough to knock a DIP's cap down over and over
    (measured on the gauge's pools: this test against the mean's, steady-window latency over the
    oracle's median 1.04 against 1.07 and p90 1.24 against 1.43 over 80 pools). A round of one probe
    has no spread of its own and is no latency evidence; a DIP whose probes fail still drops. The
    pool's ``spread`` between rounds (:func:`between_round_spread`) widens the bound: a round that
    caught one long queue is not proof of overload where rounds at one weight vary that much."""
    if r.n == 0 or r.failed > failure_share:
        return True
    if unloaded is None or r.n < 2:
        return False
    own = r.mean - mean_lower_bound(r.mean, r.std, r.n, z)
    return r.mean - math.hypot(own, z * spread * r.mean) >= drop_factor * unloaded


@dataclass(frozen=True)
class _ShapeVerdict:
    """The shape fits of one DIP's points: the curve to solve on, the safe saturation bound, how
    much more the points vary than their errors say, and whether any rise is significant."""

    best: ShapeFit
    plausible: tuple[ShapeFit, ...]
    dispersion: float
    flat: bool

    def _saturations(self, z: float) -> list[float]:
        """Each plausible shape's saturation with its slope ``z`` standard errors (scaled) steeper."""
        return [f.saturation(f.beta + z * math.sqrt(max(f.var_beta * self.dispersion, 0.0))) for f in self.plausible]

    def low(self, z: float) -> float:
        """The lowest plausible saturation at ``z`` standard errors."""
        return min(self._saturations(z))

    def high(self, z: float) -> float:
        """The highest plausible saturation at ``z`` standard errors (``inf`` while no rise is that sure)."""
        return max(self._saturations(-z))


def _dispersion(chi2: float, points: int) -> float:
    """How much more ``points`` vary around their best two-parameter fit than their errors say (its
    reduced chi-square, never below 1): rounds vary more than their own spread when the load itself
    moves (connections come and go), and every variance is scaled by it (quasi-likelihood)."""
    return max(1.0, chi2 / (points - 2)) if points > 2 else 1.0


def _judge_shapes(fits: Sequence[ShapeFit], points: int, z: float) -> _ShapeVerdict:
    """Profile over the knee shapes: those within ``PLAUSIBLE_CHI2`` (scaled) of the best fit are
    plausible; the curve is the gentlest plausible one, the bound (:meth:`_ShapeVerdict.low`) the lowest
    plausible ``c`` at a given number of standard errors; flat unless the rise is ``z`` of them."""
    lowest = min(fits, key=lambda f: (round(f.chi2, 9), f.k))
    dispersion = _dispersion(lowest.chi2, points)
    plausible = tuple(f for f in fits if f.chi2 <= lowest.chi2 + PLAUSIBLE_CHI2 * dispersion)
    gentle = fits[0]  # k = 1: a rise that M/M/1 cannot tell from noise is no rise
    flat = gentle.beta <= z * math.sqrt(max(gentle.var_beta * dispersion, 0.0))
    return _ShapeVerdict(min(plausible, key=lambda f: f.k), plausible, dispersion, flat)


def _points_and_fits(ws: list[float], ls: list[float], vs: list[float], prior: float | None,
                     own: list[ShapeFit]) -> tuple[list[float], list[float], list[float], list[ShapeFit]]:
    """The points to fit and their shape fits: a DIP's own points, joined by the pool's prior on the
    unloaded latency (at weight 0) always when they sit at one weight (they cannot tell ``s`` from
    the knee), else unless they reject it - the best fit's chi-square rises by more than
    ``PLAUSIBLE_CHI2`` (scaled by the fit's dispersion) with the prior added. Rounds a few percent of
    weight apart (a refit after a change, or rounds at a settled split) otherwise fit a line through
    noise: a DIP that carried a third of the VIP at its unloaded latency came out with ``s = 0.8 ms``
    and a cap of a fifth of that. A DIP whose own points at distinct loads say its unloaded latency
    is not the pool's keeps its own. ``own``: the own points' shape fits (empty at one weight)."""
    if prior is None or not ws:
        return ws, ls, vs, own
    jw, jl, jv = [0.0, *ws], [prior, *ls], [(PRIOR_SPREAD * prior) ** 2, *vs]
    joined = shape_fits(np.asarray(jw), np.asarray(jl), np.asarray(jv))
    if own:
        best_own = min(f.chi2 for f in own)
        if min(f.chi2 for f in joined) - best_own > PLAUSIBLE_CHI2 * _dispersion(best_own, len(ws)):
            return ws, ls, vs, own
    return jw, jl, jv, joined


def own_unloaded(fits: Sequence[ShapeFit], points: int, z: float) -> float | None:
    """The unloaded latency a DIP's own rounds at distinct loads tell (``fits``, without the pool's
    prior), when they tell it at least as precisely as a light latency is pooled to
    (``LIGHT_PRECISION`` on the best shape's intercept, scaled by the fit's dispersion); the highest
    of the plausible shapes' (the one least below the pool's prior). None otherwise: rounds a few
    percent of weight apart fit a line through noise, and its intercept can be anything.

    The controller keeps it across the relearning that drops a DIP's older rounds (a capacity or a
    traffic change, :attr:`~knapsack_lb.controller.state.DipState.unloaded`): section 4.5 of
    KnapsackLB models both changes as a scaling of the curve's weight axis, so the unloaded latency
    stays. Without it a DIP relearned from rounds at one weight took the pool's prior, which in a
    settled pool is a loaded latency (the lowest of rounds at the operating points): an 8-vCPU DIP
    with a 7 ms unloaded latency took 17 ms, read its 96 %-busy latency as half busy, and kept that
    share for the rest of the run (the fluid dynamics, 14 % above the oracle)."""
    if not fits:
        return None
    shapes = _judge_shapes(fits, points, z)
    best = shapes.best
    if best.alpha <= 0 or math.sqrt(max(best.var_alpha, 0.0) * shapes.dispersion) > LIGHT_PRECISION * best.alpha:
        return None
    return max(1.0 / f.alpha for f in shapes.plausible if f.alpha > 0)


def estimate(
    rounds: Sequence[RoundEvidence],
    prior: float | None,
    *,
    z: float,
    tolerance: float,
    drop_factor: float,
    failure_share: float,
    floor: float = 0.0,
    spread: float = 0.0,
    unloaded: float | None = None,
    under_load: bool = False,
    remembered: float | None = None,
) -> Estimate | None:
    """Fit one DIP's rounds (see the module docstring); None when there is nothing to fit (no clean
    round and no prior). ``prior`` is the pool's estimate of the unloaded latency; ``floor`` is the
    cap of a DIP whose latency has not risen significantly at any weight seen (a small share of the
    pool: what a DIP seen only nearly idle may take next), never above a weight that overloaded it.
    ``spread`` is the pool's between-round spread (:func:`between_round_spread`): each group of
    rounds at one weight is as uncertain as its probes say plus ``spread`` over its rounds.
    ``unloaded`` is the DIP's unloaded latency for the drop test, :func:`unloaded_latency` of the
    pool's (:func:`pool_prior` of the DIPs' :func:`light_latency`) and its own; when None, that of
    ``prior`` and its own. The drop level is ``drop_factor`` times it. ``under_load``
    (:func:`seen_under_load`): the DIP's lightest rounds were taken under load, so a flat fit of
    rounds at load takes no floor; rounds at (nearly) no load only still do. ``remembered``: what the
    DIP's own rounds told of its unloaded latency before (:attr:`Estimate.unloaded` of an earlier
    estimate); the prior is the lower of ``prior`` and what its rounds tell now, else that
    (:func:`own_prior`), so that the same rounds always give the same estimate."""
    if not rounds:
        return None
    if unloaded is None:
        unloaded = unloaded_latency(prior, light_latency(rounds, z))
    drops = [r for r in rounds if is_overload(r, unloaded, drop_factor, failure_share, z, spread)]
    overloaded = rounds[-1] in drops
    bins = by_weight([r for r in rounds if r.n > 0 and (r.weight <= 0 or r not in drops)], tolerance)
    ws, ls = [b.weight for b in bins], [b.mean for b in bins]
    vs = [max(b.stderr, MODEL_ERROR * b.mean) ** 2 + (spread * b.mean) ** 2 / b.rounds for b in bins]
    own = shape_fits(np.asarray(ws), np.asarray(ls), np.asarray(vs))
    told = own_unloaded(own, len(ws), z)
    ws, ls, vs, fits = _points_and_fits(ws, ls, vs, own_prior(prior, remembered if told is None else told), own)
    drop_weights = [r.weight for r in drops if r.weight > 0]
    w_drop = min(drop_weights, default=math.inf)
    # a weight that overloaded the DIP: back off below it, to half of it or the last clean weight under it
    # (a clean round at the drop's own weight, within ``tolerance``, is no weight below it: the drop is the news)
    below = max((w for w in ws if 0 < w < w_drop * (1 - tolerance)), default=0.0)
    bound = max(BACKOFF * w_drop, below) if drop_weights else math.inf
    if len(ws) < 2:
        if not drop_weights or unloaded is None:
            return None
        # overloaded at every weight seen: nothing but the backoff is known
        return Estimate(UtilisationCurve(unloaded, w_drop, 1.0), w_drop, bound, overloaded, 0, ceiling=w_drop)
    w_arr = np.asarray(ws)
    if not fits:  # seen at (nearly) no load only: its latency is known, its knee not at all
        cap = 0.0 if overloaded else min(floor, bound)
        curve = UtilisationCurve(min(ls), UNBOUNDED * max(cap, 1e-3), 1.0)
        return Estimate(curve, math.inf, cap, overloaded, len(bins), ceiling=w_drop)
    shapes = _judge_shapes(fits, len(ws), z)
    saturation = min(shapes.best.saturation(), w_drop)

    def cap_at(level: float) -> float:
        low = min(shapes.low(level), bound)
        return max(0.0, max(low, min(floor, bound)) if shapes.flat and not overloaded and not under_load else low)

    low = cap_at(z)
    relaxed = tuple(itertools.accumulate((cap_at(share * z) for share in RELAXED_LEVELS), max, initial=low))[1:]
    top = max((w for w in ws if w > 0), default=0.0)
    curve = curve_from_fit(shapes.best, w_arr, None, saturation=max(saturation, low * 1.01, top * 1.01, 1e-6)
                           if math.isfinite(saturation) else None)
    return Estimate(curve, saturation, low, overloaded, len(bins), shapes.dispersion, relaxed,
                    min(shapes.high(z), w_drop), told)


def disagreement(r: RoundEvidence, curve: LatencyCurve, *, z: float, threshold: float, failure_share: float,
                 dispersion: float = 1.0, spread: float = 0.0, cv: float | None = None,
                 drop_latency: float = math.inf) -> int | None:
    """How one round stands against ``curve``: +1 above it, -1 below it, 0 within its noise or
    ``threshold``; None when the curve does not say (no finite estimate at the round's weight).

    Off means by more than ``z`` of its standard error on the log scale (the round's coefficient of
    variation over ``sqrt(n)``; Student's t for a round's few probes, :func:`critical`; scaled by the
    fit's ``dispersion``) and by more than ``threshold`` relative (the paper's 20 % capacity-change
    test, on a confidence bound instead of a single round). A round with failed probes at a weight
    the curve calls safe is above it. The pool's between-round ``spread`` (:func:`between_round_spread`)
    adds to the round's own noise. ``cv``, the DIP's spread of one probe pooled over its rounds
    (:func:`probe_spread`), is the least the round's coefficient of variation counts for: a round
    that is tight by chance gets no credit for it, one noisier than the DIP's usual is judged on
    its own.

    Where the curve predicts ``drop_latency`` or more it is at its asymptote, which a drop puts at the
    weight that overloaded the DIP: a faster round there is no capacity gain (None), only what the drop
    already told (the knee lies between) and evidence for the next fit. At layer 4 a DIP's share
    wanders around its weight, so such rounds are common, and each one read as "faster" forgot the
    drop and sent the DIP back to the weight that overloaded it (on the live demo, four times in two
    minutes). A slower round there is still judged."""
    expected = curve.latency(r.weight)
    if not math.isfinite(expected) or expected <= 0:
        return None
    if r.n == 0 or r.failed > failure_share:
        return 1
    gap = r.mean - expected
    if gap < 0 and expected >= drop_latency:
        return None
    # on the log scale, where a latency halved and one doubled are the same news: the standard error of
    # a mean's logarithm is the coefficient of variation over sqrt(n)
    variation = r.std / r.mean if cv is None else max(cv, r.std / r.mean)
    noise = math.hypot(critical(z, r.n) * variation / math.sqrt(r.n) * math.sqrt(dispersion), z * spread)
    if abs(math.log(r.mean / expected)) <= noise or abs(gap) <= threshold * expected:
        return 0
    return 1 if gap > 0 else -1


def change_direction(rounds: Sequence[RoundEvidence], curve: LatencyCurve, *, z: float, threshold: float,
                     failure_share: float, dispersion: float = 1.0, confirmations: int = 1,
                     spread: float = 0.0, drop_latency: float = math.inf) -> int:
    """+1 (slower) or -1 (faster) when the newest ``confirmations`` rounds all disagree with ``curve``
    that way (each by :func:`disagreement`, counting at least the spread of one probe pooled over
    ``rounds``); else 0."""
    recent = list(rounds[-confirmations:])
    if len(recent) < confirmations:
        return 0

    def signs(cv: float | None) -> set[int | None]:
        return {disagreement(r, curve, z=z, threshold=threshold, failure_share=failure_share,
                             dispersion=dispersion, spread=spread, cv=cv, drop_latency=drop_latency) for r in recent}

    found = signs(None)
    if len(found) == 1 and found <= {1, -1}:
        # the pooled spread only widens a round's noise, so rounds within their own noise are within it
        # too: it is computed only for a disagreement (the test runs on every DIP at every step)
        found = signs(probe_spread(rounds))
    if len(found) != 1 or not found <= {1, -1}:
        return 0
    return found.pop() or 0


def own_prior(pool: float | None, unloaded: float | None) -> float | None:
    """A DIP's prior on its unloaded latency: the lower of the pool's (:func:`pool_prior`) and what its
    own rounds tell (:func:`own_unloaded`, now or remembered); either when the other is not known. The lower one:
    a DIP back on a slower host then reads as busier than it is and grows by the bounded step until
    its own rounds reject the prior, where the higher one would read it as idler."""
    known = [v for v in (pool, unloaded) if v is not None]
    return min(known) if known else None


def pool_prior(lowest: Sequence[float]) -> float | None:
    """The pool's unloaded latency: the lower quartile of the DIPs' unloaded latencies (the pool
    serves one application; the least loaded DIPs show its unloaded latency). The fits' prior takes
    it over the DIPs' lowest round latencies: biased low where rounds are few probes of a noisy
    service, which keeps the fits cautious (the DIPs' light latencies instead were measured and lost
    at layer 7, docs/decisions/controller.md, "A DIP's unloaded latency from its light rounds"). The
    drop test takes it over their light latencies (:func:`light_latency`), where the bias is a
    false overload."""
    values = sorted(v for v in lowest if math.isfinite(v) and v > 0)
    if not values:
        return None
    return float(np.percentile(values, 25))
