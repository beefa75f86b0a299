"""A traffic change for the learner: most DIPs slower (or faster) at the weights they carried before.

KnapsackLB section 4.5 detects a traffic change "when we see latency increase for most/all DIPs even
when the weights are unchanged" and shifts every curve by one factor. The learner's curves move
every round while it learns, and a curve that has just moved is pessimistic at the new weights, so
a test of the rounds against the curves reads the learner's own transient as falling traffic. This
test compares rounds with rounds instead: a DIP is judged only when its newest ``confirmations``
rounds were taken under the weight of earlier rounds (within ``tolerance``; the weight the LB
carried, not the share it counted, which at layer 4 moves every round with the connections), which a
learner moving its weights rarely gives and a traffic change always does (the split holds, the
latency moves; the curve explains what the rounds' shares differ by).

Each of a judged DIP's newest rounds gives a latency ratio against its pooled earlier rounds at that
weight, with a standard error from both. A traffic change is called when at least ``MIN_JUDGED``
DIPs and half of the DIPs with rounds are judged and, in each of the newest rounds on its own, the
median ratio is beyond ``threshold``, ``quorum`` of the judged DIPs moved that way, and the pool's
shift is beyond noise (the inverse-variance mean of the log ratios, ``NOISE_SIGMAS`` = 4 standard
errors from 0, on the same side): with a few probes per round one DIP's ratio is mostly noise, and
only many DIPs together tell. Four, not the learner's two: the test runs every round for as long as
the controller runs, its rounds share one baseline, and a false traffic change moves every DIP's
rounds (at two standard errors it fired on a 4-DIP pool of the gauge with no event).

Its size is section 4.5's shift: per moved DIP, ``k = w / w'`` where its curve reaches ``w``'s
latency times the observed ratio at ``w'`` (the ratio, not the round's latency, so a curve's bias
at ``w`` cancels), combined by a median weighted by the curve's squared elasticity (capped at the
knee: a DIP in its curve's flat part says little about its load), and clamped to one event's
bounds.

The learner then keeps every DIP's rounds, the earlier ones moved to the weight that carries their
load under the new traffic (``w * k``), instead of relearning each DIP from its last few rounds
(which leaves caps that cannot carry the VIP, and a stretch past some DIP's capacity). A judged DIP
whose latency moved the other way changed on its own (its capacity, at the same time): it is
relearned from its newest rounds, as its own change test would.

Where the LB counts requests (HAProxy in HTTP mode), the VIP's request rate between two reads of its
counters says the same directly (:func:`rate_change`), and the controller reads it instead: behind
least connections the share a DIP carries moves every round with its latency, so few DIPs hold
their weight long enough to be judged, and at high utilisation the pool's queues swing together.
On the gauge's layer-7 pool 12 (37 DIPs, traffic x1.14 at 300 s to 0.92 utilisation) the test
above never fired. At layer 4 the LB counts bytes, and its clients wait on the pool (keep-alive
connections): a capacity loss serves fewer requests, a recovered DIP or a better plan more, so the
counted rate moves with the pool as well as with the clients. There a rate change is taken only
when the VIP's probe latency moved the same way (``clients_only``: more clients bring more bytes
and a slower VIP, a slower pool fewer bytes and a slower VIP); otherwise the latency test above
decides, and where the LB counts, its call stands only when the counted rate bears it out
(:func:`corroborated`). On the gauge's layer-4 pool 9 of seed 6 (12 DIPs, traffic x1.15 at 300 s to 0.92
utilisation) the latency test never fired, the curves kept the old traffic, and a stretch put a
16-vCPU DIP past its capacity for the rest of the run; the byte rate called it at 310 s.

How it fails: where nothing is counted, a capacity change of most DIPs at once (a host-wide noisy
neighbour) is read as traffic, which moves the plan the same way; while the learner still moves
every DIP's weight, no DIP is judged and each DIP's own change test stands; a change smaller than
``threshold`` is left to those tests. The DIPs' rounds are taken as independent, and near
saturation they are not: the whole pool's queues rise and fall together, and where nothing is
counted a swing of the pool's load reads as a traffic change (pool 35 of the gauge, seed 1, at
92 % utilisation behind least connections: twice in the steady window, 1.108x -> 1.126x the
oracle).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from knapsack_lb.controller.dynamics import (
    K_EVENT_MAX,
    K_EVENT_MIN,
    K_MAX,
    K_MIN,
    NOISE_SIGMAS,
    SLOPE_CAP,
    elasticity,
    shift_factor,
    weighted_median,
)
from knapsack_lb.controller.estimation import Pooled, RoundEvidence, pooled, same_weight
from knapsack_lb.curves import LatencyCurve

MIN_JUDGED = 3  # DIPs that must have held their weight for a pool-wide verdict
MIN_RATE_READS = 3  # reads of the VIP's counted rate before the newest ones are compared with them
MAD_TO_SD = 1.4826  # a normal sample's standard deviation over its median absolute deviation


@dataclass(frozen=True)
class RateReading:
    """What the VIP's counters counted per second (``rate``) over the ``seconds`` before ``time``, from
    two reads of the LB's counters of one ``kind`` (``requests``, or ``bytes`` at layer 4), and the
    VIP's probe latency as the plan in force weighs it in the round of that step (``latency``; None
    where no round was judged)."""

    time: float
    rate: float
    seconds: float
    kind: str = "requests"
    latency: float | None = None

    @property
    def counts_requests(self) -> bool:
        """Whether the counters counted requests: a rate the clients set, which the rate alone tells."""
        return self.kind == "requests"


@dataclass(frozen=True)
class TrafficChange:
    """A traffic change: every curve's weight axis scales by ``k`` (below 1: more traffic); ``ratio``
    is the median latency ratio over the ``judged`` DIPs, ``moved`` of which moved that way."""

    k: float
    ratio: float
    judged: int
    moved: int
    apart: tuple[str, ...] = ()  # judged DIPs that moved the other way: they changed on their own
    counted: bool = False  # ``ratio`` is the VIP's counted rate's, from the LB's counters (:func:`rate_change`)
    kind: str = "requests"  # what the counters counted

    def describe(self) -> str:
        if self.counted:
            what = "request rate" if self.kind == "requests" else f"{self.kind} rate, its latency the same way,"
            return (f"traffic change: the VIP's {what} x{self.ratio:.3f} (the LB's counters); every DIP's "
                    f"earlier rounds shifted by k={self.k:.3f}")
        apart = f"; {', '.join(self.apart)} moved the other way: relearned from their last rounds" if self.apart else ""
        return (f"traffic change: latency x{self.ratio:.3f} at unchanged weights (median of {self.judged} DIPs, "
                f"{self.moved} moved that way); the others' earlier rounds shifted by k={self.k:.3f}{apart}")


def _usable(r: RoundEvidence) -> bool:
    return r.n >= 2 and math.isfinite(r.mean) and r.mean > 0


@dataclass(frozen=True)
class _Verdict:
    """One DIP whose newest rounds held an earlier weight: the log latency ratio of each newest
    round, and of them pooled, against the earlier rounds pooled, with standard errors."""

    rounds: tuple[tuple[float, float], ...]
    pooled: float


def _log_ratio(after: Pooled, before: Pooled, spread: float) -> tuple[float, float]:
    """The log ratio of two pooled groups of rounds and its standard error: each group's own (its probes)
    and the pool's between-round ``spread`` over its number of rounds."""
    error = math.sqrt((before.stderr / before.mean) ** 2 + (after.stderr / after.mean) ** 2
                      + spread ** 2 * (1 / before.rounds + 1 / after.rounds))
    return math.log(after.mean / before.mean), max(error, 1e-9)


def _judge(rounds: Sequence[RoundEvidence], curve: LatencyCurve, confirmations: int, tolerance: float,
           since: float, spread: float) -> _Verdict | None:
    """One DIP's newest ``confirmations`` rounds against its earlier rounds (taken since ``since``)
    under their weight (:attr:`RoundEvidence.setting`), less what the curve says the difference of the
    shares they carried explains; None when the newest did not hold an earlier weight. The pool's
    between-round ``spread`` (:func:`~knapsack_lb.controller.estimation.between_round_spread`) counts
    in every ratio's error."""
    rounds = [r for r in rounds if r.time >= since]
    recent, earlier = rounds[-confirmations:], rounds[:-confirmations]
    if len(recent) < confirmations or not all(_usable(r) for r in recent):
        return None
    setting = recent[-1].setting
    if setting <= 0 or not all(same_weight(r.setting, setting, tolerance) for r in recent):
        return None
    same = [r for r in earlier if _usable(r) and same_weight(r.setting, setting, tolerance)]
    if not same:
        return None
    before = pooled(same)

    def explained(at: float) -> float | None:
        ratio = curve.latency(at) / curve.latency(before.weight)
        return math.log(ratio) if math.isfinite(ratio) and ratio > 0 else None

    ratios = []
    for part in [*([r] for r in recent), recent]:
        after = pooled(part)
        shift = explained(after.weight)
        if shift is None:
            return None
        x, se = _log_ratio(after, before, spread)
        ratios.append((x - shift, se))
    return _Verdict(tuple(ratios[:-1]), ratios[-1][0])


def _pool_moved(ratios: Sequence[tuple[float, float]], threshold: float, quorum: float) -> int:
    """+1 or -1 when the DIPs' ``(log ratio, standard error)`` of one round show the pool moved that
    way (median beyond ``threshold``, ``quorum`` of them that way, the inverse-variance mean
    ``NOISE_SIGMAS`` standard errors from 0 on the same side); else 0."""
    median = statistics.median(x for x, _ in ratios)
    precision = sum(1 / se ** 2 for _, se in ratios)
    mean = sum(x / se ** 2 for x, se in ratios) / precision
    same = sum(1 for x, _ in ratios if x * median > 0)
    if abs(median) <= math.log1p(threshold) or same < quorum * len(ratios) or mean * median <= 0 \
            or abs(mean) * math.sqrt(precision) <= NOISE_SIGMAS:
        return 0
    return 1 if median > 0 else -1


def traffic_change(evidence: Mapping[str, Sequence[RoundEvidence]], curves: Mapping[str, tuple[LatencyCurve, float]],
                   *, confirmations: int, tolerance: float, threshold: float, quorum: float,
                   since: float = -math.inf, spread: float = 0.0) -> TrafficChange | None:
    """The traffic change the DIPs' rounds show (see the module docstring), or None.

    ``evidence``: each live DIP's rounds, oldest first; ``curves``: dip -> (its curve, its cap);
    rounds before ``since`` (the last traffic change) are not compared with the ones after it;
    ``spread``: the pool's between-round spread (0 where rounds vary only as their probes say)."""
    verdicts = {}
    for name, rounds in evidence.items():
        verdict = _judge(rounds, curves[name][0], confirmations, tolerance, since, spread) if name in curves else None
        if verdict is not None:
            verdicts[name] = verdict
    judged = len(verdicts)
    if judged < MIN_JUDGED or judged < 0.5 * sum(1 for rounds in evidence.values() if rounds):
        return None
    # each of the newest rounds on its own: a change shows in every one of them
    moves = {_pool_moved([v.rounds[i] for v in verdicts.values()], threshold, quorum) for i in range(confirmations)}
    if len(moves) != 1 or 0 in moves:
        return None
    direction = moves.pop()
    moved = [name for name, v in verdicts.items() if v.pooled * direction > 0]
    factors, slopes = [], []
    for name in moved:
        curve, cap = curves[name]
        weight = evidence[name][-1].weight
        k = shift_factor(curve, weight, curve.latency(weight) * math.exp(verdicts[name].pooled), cap)
        if k is not None and K_MIN < k < K_MAX:  # a clamped inverse says nothing about the size
            factors.append(math.log(k))
            slopes.append(min(SLOPE_CAP, elasticity(curve, weight)) ** 2)
    if not factors:
        return None
    k = min(K_EVENT_MAX, max(K_EVENT_MIN, math.exp(weighted_median(factors, slopes))))
    ratio = math.exp(statistics.median(v.pooled for v in verdicts.values()))
    apart = tuple(sorted(name for name, v in verdicts.items() if v.pooled * direction < 0))
    return TrafficChange(k, ratio, judged, len(moved), apart)


def rate_change(reads: Sequence[RateReading], *, confirmations: int, threshold: float, z: float,
                clients_only: bool = False) -> TrafficChange | None:
    """A traffic change the VIP's counted rate shows, or None: each of the newest ``confirmations``
    reads differs from the mean of the reads before them (at least ``MIN_RATE_READS``) by more than
    ``threshold`` relative and ``z`` standard errors, the same way. A read's variance is the larger
    of its count's (Poisson: ``rate / seconds``) and the spread of the earlier reads (traffic burstier
    than Poisson); the earlier mean's is that over their number. ``k`` is the inverse of the newest
    reads' mean over the earlier one, clamped to one event's bounds. ``clients_only`` (counters of
    bytes, at layer 4, whose Poisson term is no bound: the earlier reads' spread carries the noise):
    a change only where the VIP's probe latency moved the same way in each of the newest reads.

    How it fails: a change in what the counters count (a second LB in front of the same DIPs, a
    client that retries harder) reads as traffic; a change smaller than ``threshold`` is left to the
    DIPs' own change tests."""
    if confirmations < 1 or len(reads) < confirmations + MIN_RATE_READS:
        return None
    before, after = reads[:-confirmations], reads[-confirmations:]
    base = statistics.fmean(r.rate for r in before)
    if base <= 0:
        return None
    spread = statistics.variance([r.rate for r in before])
    base_variance = max(spread, base / statistics.fmean(r.seconds for r in before)) / len(before)
    signs = set()
    for r in after:
        gap = r.rate - base
        noise = z * math.sqrt(max(spread, r.rate / r.seconds) + base_variance)
        if abs(gap) <= noise or abs(gap) <= threshold * base:
            return None
        signs.add(gap > 0)
    if len(signs) != 1:
        return None
    ratio = statistics.fmean(r.rate for r in after) / base
    if clients_only and not _clients_moved(before, after, ratio):
        return None
    return TrafficChange(min(K_EVENT_MAX, max(K_EVENT_MIN, 1 / ratio)), ratio, 0, 0, counted=True,
                         kind=reads[-1].kind)


def corroborated(change: TrafficChange, reads: Sequence[RateReading], *, confirmations: int, z: float) -> bool:
    """Whether the VIP's counted rate bears out a traffic change the DIPs' rounds show: each of the
    newest ``confirmations`` reads lies beyond ``z`` standard errors of the reads before them, the way
    the latency moved (no size threshold). Fewer clients bring fewer bytes and a faster pool, more
    bring more and a slower one, whether the counters count requests or bytes; a capacity change
    moves the two apart (a slower pool serves fewer requests). The reads before are summarised by
    their median and median absolute deviation, not their mean and variance: the rounds show a change
    only once their weights have held for a while, and the reads taken meanwhile, after the change,
    are among them (on the paper's pool +8 % traffic was called six steps after it came, and four of
    the eleven reads before were already at the new rate).

    Why: the rounds of one step are not independent across DIPs. A probe round samples each DIP's queue
    in a few seconds, and at layer 4 those queues follow the sessions each DIP holds, which change over a
    session's lifetime, not a round's: on the gauge's layer-4 pool 17 of seed 2 (17 DIPs, 82 % load, no
    event) two rounds read 14 of 16 DIPs faster, x0.759, while the clients' latency and the served rate
    held (105-118 ms, 4,820-4,910 requests a 5 s window); the shift by k = 1.167 put plans at 1.1-1.3x
    a DIP's capacity for the rest of the run. How it fails: a change within the rate's own noise is left
    to the DIPs' change tests; with fewer than ``MIN_RATE_READS`` reads before the newest nothing is
    borne out."""
    if confirmations < 1 or len(reads) < confirmations + MIN_RATE_READS:
        return False
    before, after = reads[:-confirmations], reads[-confirmations:]
    rates = [r.rate for r in before]
    base = statistics.median(rates)
    if base <= 0:
        return False
    spread = (MAD_TO_SD * statistics.median(abs(x - base) for x in rates)) ** 2
    seconds = statistics.fmean(r.seconds for r in before)
    base_variance = max(spread, base / seconds) * math.pi / (2 * len(before))  # a median's, over the reads
    way = 1 if change.ratio > 1 else -1
    return all((r.rate - base) * way > z * math.sqrt(max(spread, r.rate / r.seconds) + base_variance) for r in after)


def _clients_moved(before: Sequence[RateReading], after: Sequence[RateReading], ratio: float) -> bool:
    """Whether the VIP's latency moved the way its counted rate did, in each of the newest reads: the
    clients' doing. Where clients wait on the pool (connections at layer 4) a slower pool serves
    fewer requests, so a capacity loss reads as less traffic with the latency up, a recovered DIP
    or a better plan as more traffic with the latency down; more clients bring both up."""
    earlier = [r.latency for r in before if r.latency is not None and r.latency > 0]
    if not earlier or any(r.latency is None for r in after):
        return False
    base = statistics.fmean(earlier)
    return all((r.latency - base) * (ratio - 1) > 0 for r in after if r.latency is not None)


def shifted(rounds: Sequence[RoundEvidence], k: float, keep: int) -> list[RoundEvidence]:
    """``rounds`` after a traffic change by ``k``: all but the newest ``keep`` (taken under the new
    traffic) moved to the weight that carries their load now."""
    cut = max(0, len(rounds) - keep)
    return [replace(r, weight=r.weight * k, configured=r.configured * k) for r in rounds[:cut]] + list(rounds[cut:])
