"""The plan guard: a new plan that measurably made the VIP slower is rolled back.

Every model is wrong somewhere, and a learned plan can be worse than the one it replaced (a curve
extrapolated past the data, a noisy round taken for a trend). The guard does not trust the model
for this: it measures. While a plan is in force, each round's probes give the VIP's latency as
the plan weighs it, ``L = sum_i w_i * mean_i`` over the DIPs (weights renormalised over the DIPs
that answered), with the variance ``sum_i w_i^2 * stderr_i^2``; rounds under the same plan are
averaged, and the variance of that average is the larger of the one the rounds' own spreads give
and the one the spread of the rounds' ``L`` gives (a load that moves makes rounds differ more than
their probes say). When a plan has been measured for ``MIN_ROUNDS`` rounds and its ``L`` exceeds
the previous plan's by more than ``z`` combined standard errors and more than ``threshold``
relative, :meth:`PlanGuard.verdict` names the previous plan and the controller restores it. The
previous plan's ``L`` is taken as it would measure now: each DIP the plan in force gives no more
weight and that measured slower under it adds its slowdown (:func:`slowed_without_weight`; a DIP's
latency rises with its own load only, so the previous plan, which gives it as much, would be as slow
there). Two plans are compared only when they serve the same DIPs: a drain, a failure, a return or
a new DIP changes the VIP's latency by itself, and restoring the plan from before it would undo the
change (a returning DIP back at once to its old share, past its slow start). Nor across a DIP's own
slowdown (:meth:`PlanGuard.slowed`): a DIP found slower than its curve, or overloaded, at a weight
the previous plan gives it too makes the plan in force look worse, and the previous plan would put
the weight back where it slowed. A rollback that came first, between the slowdown and the rounds
that confirm it, is not undone, but the DIPs it held are released (:meth:`PlanGuard.across_change`).

The challenger. The previous plan is one yardstick; the plan the controller could always have sent
instead is another: weights in proportion to the DIPs' learned capacities (their caps ``w_max``,
the controller's fallback). A solved plan that has been in force and measured for ``MIN_ROUNDS``
rounds, with nothing changing, and that differs from that capacity-proportional plan by at least
``CHALLENGE_MOVE`` of the traffic is challenged: the controller sends the capacity-proportional
plan for ``MIN_ROUNDS`` measured rounds (a :class:`Challenge`), and :meth:`PlanGuard.decide` keeps
it when the solved plan measured worse beyond ``z`` combined standard errors and ``threshold``
(ties go to the solver); otherwise the solved plan comes back. The challenger is only tried when
the caps carry the VIP (each DIP then below its safe cap) and it takes no DIP past every weight that
DIP was seen at: it measures a split within the rounds' range, it does not explore (a cap fitted to
a weak rise can lie several times past the weights seen, and the challenger then sent a 2-vCPU DIP
2.75x its capacity), for the ``mean`` objective (the one the guard measures), and when either plan
has moved by ``CHALLENGE_MOVE`` since the last challenge and ``CHALLENGE_SPACING`` of the learning
window has passed, so its cost is bounded: a few rounds under the plan that measures worse, at most
twice a window.

How it fails: the two plans are measured at different times, so a traffic change between them
looks like a worse plan (the rollback then restores a plan that is no better, and the learner,
which sees the change in its rounds, moves on); a plan that is worse by less than the threshold,
or within noise, stays.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from knapsack_lb.controller.estimation import RoundEvidence

MIN_ROUNDS = 2  # rounds a plan is measured before it is judged
MIN_COVERAGE = 0.9  # share of the plan's weight whose DIPs must have answered in a round
CHALLENGE_MOVE = 0.05  # the least share of the traffic two plans must differ by for the challenger to be tried
CHALLENGE_SPACING = 0.5  # the least time between two challenges, as a share of the learning window


def moved(a: Mapping[str, float], b: Mapping[str, float]) -> float:
    """The share of the traffic that moves from split ``a`` to split ``b`` (total variation distance)."""
    return 0.5 * math.fsum(abs(a.get(n, 0.0) - b.get(n, 0.0)) for n in set(a) | set(b))


@dataclass
class PlanRecord:
    """The VIP latency measured under one plan: ``rounds`` rounds' ``L`` values and their variances."""

    version: int
    weights: dict[str, float]
    values: list[float] = field(default_factory=list)
    variances: list[float] = field(default_factory=list)
    # per DIP: [rounds, sum of the rounds' means, sum of their means' variances]
    dips: dict[str, list[float]] = field(default_factory=dict)

    @property
    def mean(self) -> float:
        return math.fsum(self.values) / len(self.values) if self.values else math.nan

    def dip_mean(self, name: str) -> tuple[float, float] | None:
        """DIP ``name``'s mean latency over the plan's rounds and that mean's variance; None unmeasured."""
        rounds, total, variances = self.dips.get(name, (0.0, 0.0, 0.0))
        return (total / rounds, variances / rounds ** 2) if rounds else None

    def record(self, rounds: Mapping[str, RoundEvidence], value: float, variance: float) -> None:
        """One round's ``L`` (:func:`vip_latency`) and its DIPs' own means."""
        self.values.append(value)
        self.variances.append(variance)
        for name, r in rounds.items():
            if self.weights.get(name, 0.0) > 0 and r.n > 0 and math.isfinite(r.mean):
                kept = self.dips.setdefault(name, [0.0, 0.0, 0.0])
                kept[0] += 1
                kept[1] += r.mean
                kept[2] += r.std ** 2 / r.n

    @property
    def serving(self) -> frozenset[str]:
        """The DIPs the plan gives traffic to."""
        return frozenset(n for n, w in self.weights.items() if w > 0)

    @property
    def variance(self) -> float:
        """The variance of :attr:`mean`: from the probes' spreads, or the rounds' spread if larger."""
        n = len(self.values)
        if n == 0:
            return math.inf
        own = math.fsum(self.variances) / n ** 2
        if n < 3:
            return own
        m = self.mean
        spread = math.fsum((v - m) ** 2 for v in self.values) / (n - 1) / n
        return max(own, spread)


@dataclass
class Rollback:
    """The guard's last rollback: when, the weights it restored and the DIPs it held below the plan
    it undid."""

    time: float
    weights: dict[str, float]
    held: list[str]


@dataclass
class Challenge:
    """The capacity-proportional plan (``weights``, sent as plan ``version`` at ``started``) tried
    against the solved plan in force before it (``solved``, plan ``solved_version``). ``won`` is
    None while on trial, then whether it measured better (decided at ``decided``)."""

    solved: dict[str, float]
    solved_version: int
    weights: dict[str, float]
    version: int
    started: float
    won: bool | None = None
    decided: float = -math.inf

    def stale(self, solved: Mapping[str, float], challenger: Mapping[str, float], now: float, window: float) -> bool:
        """Whether a new challenge of ``solved`` by ``challenger`` may follow this one: it was decided
        ``CHALLENGE_SPACING`` of a ``window`` ago, and either plan has moved since."""
        return now - self.decided >= CHALLENGE_SPACING * window and (
            moved(solved, self.solved) >= CHALLENGE_MOVE or moved(challenger, self.weights) >= CHALLENGE_MOVE)


@dataclass
class GuardState:
    """What the guard remembers: the plan in force, the one before it, its last rollback and its
    last challenge."""

    current: PlanRecord | None = None
    previous: PlanRecord | None = None
    rollback: Rollback | None = None
    challenge: Challenge | None = None


def _gives(weights: Mapping[str, float], name: str, weight: float, tolerance: float) -> bool:
    """Whether a plan's ``weights`` give DIP ``name`` at least ``weight`` (within ``tolerance``): the
    weight it was found slow at, so that the plan puts it back there."""
    return weights.get(name, 0.0) >= weight * (1 - tolerance)


def vip_latency(weights: Mapping[str, float], rounds: Mapping[str, RoundEvidence]) -> tuple[float, float] | None:
    """``(L, variance)`` of one round under ``weights``; None when too little of the plan answered."""
    answered = {n: w for n, w in weights.items() if w > 0 and n in rounds and rounds[n].n > 0}
    total = sum(w for w in weights.values() if w > 0)
    mass = sum(answered.values())
    if total <= 0 or mass < MIN_COVERAGE * total:
        return None
    value = math.fsum(w / mass * rounds[n].mean for n, w in answered.items())
    variance = math.fsum((w / mass) ** 2 * rounds[n].std ** 2 / rounds[n].n for n, w in answered.items())
    return value, variance


def slowed_without_weight(prev: PlanRecord, cur: PlanRecord, z: float, tolerance: float) -> tuple[float, float]:
    """The previous plan's latency as it would measure now, and its variance: its own ``L``, plus the
    slowdown of each DIP the plan in force gives no more weight than it did (within ``tolerance``,
    relative) and that measured slower under it, beyond ``z`` standard errors of both means (weighted
    by the previous plan's share).

    A DIP's latency rises with its own load only, so a DIP slower at a weight no higher than before
    slowed by itself (a lost core, a noisy neighbour) or with the traffic, and the previous plan,
    which gives it as much or more, would be at least that slow now. Judged on ``L`` alone, a plan
    in force when a DIP lost capacity, or when the load on every DIP drifted, looks worse than the one
    measured before it, and the rollback then restores a plan that is no better (on the gauge, plans
    a third of a percent of the traffic apart, rolled back for a 6 % rise that every DIP showed). How
    it fails: a DIP the plan raised at all (beyond ``tolerance``) is charged to the plan for its whole
    slowdown, so a DIP that lost capacity just after a small raise still reads as the plan's doing
    (traced on the gauge: +8 % weight, then 4x slower after a 42 % loss, rolled back to a weight
    1.4x its new capacity); a DIP that slowed by less than its rounds' noise is not counted; a DIP
    that got faster is not credited."""
    total = sum(w for w in prev.weights.values() if w > 0)
    then, variance = prev.mean, prev.variance
    if total <= 0:
        return then, variance
    for name, weight in prev.weights.items():
        before, now = prev.dip_mean(name), cur.dip_mean(name)
        if weight <= 0 or before is None or now is None or cur.weights.get(name, 0.0) > weight * (1 + tolerance):
            continue
        slower = now[0] - before[0]
        if slower > z * math.sqrt(now[1] + before[1]):
            share = weight / total
            then += share * slower
            variance += share ** 2 * (now[1] + before[1])
    return then, variance


class PlanGuard:
    """Measures each plan in force and says when the newest one is significantly worse."""

    def __init__(self, state: GuardState | None = None) -> None:
        self.state = state or GuardState()

    def observe(self, version: int, weights: Mapping[str, float], rounds: Mapping[str, RoundEvidence]) -> None:
        """One round taken while plan ``version`` (``weights``) was in force and settled."""
        measured = vip_latency(weights, rounds)
        if measured is None:
            return
        st = self.state
        if st.current is None or st.current.version != version:
            if st.current is not None and len(st.current.values) >= MIN_ROUNDS:
                st.previous = st.current
            st.current = PlanRecord(version, dict(weights))
        st.current.record(rounds, *measured)

    def verdict(self, z: float, threshold: float, tolerance: float = 0.0) -> PlanRecord | None:
        """The previous plan, when the current one is worse beyond noise and ``threshold`` than it would
        measure now (:func:`slowed_without_weight`, weights within ``tolerance`` counted as one); else None."""
        cur, prev = self.state.current, self.state.previous
        if cur is None or prev is None or len(cur.values) < MIN_ROUNDS or cur.serving != prev.serving:
            return None
        then, variance = slowed_without_weight(prev, cur, z, tolerance)
        gap = cur.mean - then
        if gap > z * math.sqrt(cur.variance + variance) and cur.mean > (1 + threshold) * then:
            return prev
        return None

    def decide(self, z: float, threshold: float, now: float) -> bool | None:
        """The challenge on trial, once its plan has ``MIN_ROUNDS`` rounds: True when the solved plan
        measured worse beyond ``z`` combined standard errors and ``threshold`` (the challenger stays),
        False otherwise (the solved plan comes back, judged afresh); None while it is measured. A
        solved plan whose measurement was forgotten (a traffic change) cannot be beaten."""
        st = self.state
        challenge, cur, prev = st.challenge, st.current, st.previous
        if challenge is None or challenge.won is not None:
            return None
        if cur is None or cur.version != challenge.version or len(cur.values) < MIN_ROUNDS:
            return None
        won = (prev is not None and prev.version == challenge.solved_version
               and prev.mean - cur.mean > z * math.sqrt(cur.variance + prev.variance)
               and prev.mean > (1 + threshold) * cur.mean)
        challenge.won, challenge.decided = won, now
        st.previous = None
        if not won:
            st.current = None
        return won

    def slowed(self, name: str, weight: float, tolerance: float) -> bool:
        """DIP ``name`` was just found slower than its curve, or overloaded, at ``weight``. When the
        previous plan gives it at least that weight (within ``tolerance``), restoring that plan would
        put the DIP back where it was found slow: the DIP changed (a noisy neighbour, a lost core), and
        the previous plan, measured before, looks better for that alone. Forget both plans, as after a
        traffic change, and say whether there was one to forget. A previous plan that gives the DIP
        less stays: moving weight off it is what a rollback is for."""
        prev = self.state.previous
        if prev is None or not _gives(prev.weights, name, weight, tolerance):
            return False
        self.reset()
        return True

    def across_change(self, name: str, weight: float, since: float, tolerance: float) -> list[str]:
        """DIP ``name`` was just found slower than its curve at ``weight``, and its newest round that
        still agreed with the curve is from ``since``. When the last rollback came after that and
        restored a plan that gives the DIP at least that weight (within ``tolerance``), it compared a
        plan measured after the DIP changed with one measured before, as across a traffic change:
        the plan it undid looked worse for the change alone, so its holds say nothing about the DIPs
        it held. Those DIPs (the rollback is forgotten), else none."""
        rollback = self.state.rollback
        if rollback is None or rollback.time <= since or not _gives(rollback.weights, name, weight, tolerance):
            return []
        self.state.rollback = None
        return rollback.held

    def forget(self, rollback: Rollback | None = None) -> None:
        """After a rollback (``rollback``, when it restored a plan): judge afresh from the next plan on."""
        self.state = GuardState(current=self.state.current, rollback=rollback)

    def reset(self) -> None:
        """After a traffic change: no plan measured before it is compared with one after it."""
        self.state = GuardState()
