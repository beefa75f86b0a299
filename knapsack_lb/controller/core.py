"""The per-VIP controller: KnapsackLB sections 4.2-4.7 behind one pure ``step``.

``VipController.step(now, observations)`` takes the latest probe round per DIP and returns
a new ``WeightPlan`` or ``None`` (keep the current one). It reads no clock and no global
state: time comes in as ``now``, randomness from the injected ``random.Random``, the solver
is a constructor argument. The service loop (:mod:`knapsack_lb.service.controller`) and the
simulator drive the very same object; ``to_dict`` / ``from_dict`` persist it in the store so
a restarted controller resumes where the dead one stopped.

One step:

1. Sync the DIP set with the VIP config (new DIPs start measuring; a whole new pool starts
   at the equal share, a DIP added to a live pool at weight 0).
2. Keep only *trusted* rounds: newer than the last one used and taken at least ``drain.time``
   after the plan they measure was applied (section 4.7). The drain time itself is measured
   the paper's way every ``drain.measure_period``: a DIP that carried traffic is cut to 0 (its
   weight-0 measurement) and followed until its latency settles; ``t2 - t1`` is the drain time.
3. Failures (section 4.5): no successful probe for ``dynamics.failure_rounds`` rounds removes the DIP;
   a successful probe brings it back (slow start if its curve is kept). Every fresh round counts
   here, trusted or not: whether a DIP answers does not depend on the split.
4. The relative circuit breaker (ELS blog) ejects DIPs much worse than the pool.
5. Learning. By default (``learning.method: estimate``) every trusted round is evidence: each
   DIP's curve and cap are refitted from its rounds with their standard errors, a traffic change
   (most DIPs slower or faster at the weights they held) moves every DIP's earlier rounds to the
   weights that carry their load now, a round off the curve beyond its confidence bound forgets the
   DIP's older rounds, and the guard measures the plan in force
   (:mod:`~knapsack_lb.controller.estimation`, :mod:`~knapsack_lb.controller.traffic`,
   :mod:`~knapsack_lb.controller.guard`). Where the VIP's DIPs answer light requests
   (``ProbeSpec.light_path``), their waits give each DIP the share it saturates at, which caps
   every plan (:mod:`~knapsack_lb.controller.light_rounds`).
   With ``algorithm1`` (the paper): measuring DIPs advance Algorithm 1 (section 4.3) when their
   round was taken at the scheduled weight, a finished DIP gets its curve fitted (section 4.2),
   ready DIPs feed the change detector (section 4.5: a traffic change shifts every curve, a
   capacity change rescales one), and remeasure requests and periodic refresh (within the 5 %
   budget) send curves back to measurement.
6. The plan: while any DIP measures (Algorithm 1), a measurement round is scheduled (section 4.6)
   and held until its rounds are in; a plan the guard found worse than the one before is rolled
   back; otherwise the solver runs on the curves and the safety rails shape the result. Solver
   failure keeps the last good plan; no live DIP keeps the last plan (never an all-zero plan);
   caps that do not cover the VIP are stretched by one factor and the solver places the excess by
   the curves (said in the plan's reasons); when even the curves' asymptotes cannot carry it,
   traffic is spread by capacity (flagged).

Every plan says why (``reasons``: events, curve models, method) and how (``method``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from knapsack_lb.controller.breaker import RelativeCircuitBreaker
from knapsack_lb.controller.budget import DipUncertainty, LearningState, allocate
from knapsack_lb.controller.dynamics import (
    ChangeDetector,
    RoundView,
    estimate_drain_time,
    knee_weight,
    refresh_candidates,
    round_noise,
)
from knapsack_lb.controller.estimation import (
    MODEL_ERROR,
    RELAXED_LEVELS,
    Estimate,
    RoundEvidence,
    between_round_spread,
    by_weight,
    change_direction,
    estimate,
    light_latency,
    mean_lower_bound,
    pool_prior,
    pooled,
    probe_spread,
    round_evidence,
    same_weight,
    seen_under_load,
    unloaded_latency,
)
from knapsack_lb.controller.guard import (
    CHALLENGE_MOVE,
    CHALLENGE_SPACING,
    MIN_ROUNDS,
    Challenge,
    PlanGuard,
    Rollback,
    moved,
    vip_latency,
)
from knapsack_lb.controller.least_connections import CapacityInterval, PeerLatency, capacity_split, slow_hosts
from knapsack_lb.controller.light_rounds import light_load, light_round
from knapsack_lb.controller.measurement import DipMeasurement
from knapsack_lb.controller.rails import apply_rails, capacity_proportional
from knapsack_lb.controller.scheduling import MeasurementRequest, schedule_round
from knapsack_lb.controller.settings import ControllerSettings
from knapsack_lb.controller.state import ControllerState, DipState, DrainProbe
from knapsack_lb.controller.traffic import (
    RateReading,
    TrafficChange,
    corroborated,
    rate_change,
    shifted,
    traffic_change,
)
from knapsack_lb.curves import LatencyCurve
from knapsack_lb.curves.fitting import fit_curve
from knapsack_lb.errors import InvalidInputError, KnapsackLBError
from knapsack_lb.model import SOLVER_METHODS, Balancing, Measurement, PlanFlag, PlanMethod, VipConfig, WeightPlan
from knapsack_lb.names import validate_name
from knapsack_lb.store import CurveRecord

PLAN_CHANGE_EPSILON = 1e-4
# Ours (overload_watch): during measurement rounds the pool is still judged for a traffic change when at
# least this share of the DIPs is finished and observed, so a refresh of one DIP does not hide a traffic
# change for the minute it takes.
POOL_WHILE_MEASURING = 0.8
# The learner: a DIP whose latency has not risen at any weight seen may take this share of an equal split
# (a new DIP, or one cut to the minimum weight): small enough for the smallest DIP of a mixed pool.
START_SHARE = 0.25
# The learner refits every round: a new plan that moves no weight by this much (about half of HAProxy's
# 1/256 weight step) is not sent; the LB keeps the last one.
LEARNED_CHANGE = 0.002
# When the DIPs' caps (the learner's confidence bounds, or Algorithm 1's measured w_max) cannot carry the VIP
# they are all stretched by one factor, to carry this much more than the VIP needs; the solver then places
# the excess by the curves (a DIP seen at its knee takes little of it, one seen far below its knee much),
# where stretching them just to cover the VIP left it no choice and pushed the DIPs whose caps were tight
# past their knees, and spreading by capacity left no plan solved (docs/decisions/controller.md).
STRETCH_FREEDOM = 1.25
# The guard restores the previous plan when the new one measures this much worse, beyond noise.
GUARD_THRESHOLD = 0.05
# The probe budget: rounds within this relative distance of the weight a DIP carries now count as taken
# there (rounds placed at the share the LB counted wander around the weight)
BUDGET_WEIGHT_TOLERANCE = 0.1
# A DIP's saturation share is read from at most this many of its newest rounds of light requests at one share:
# six rounds of 50 read a utilisation to within a few hundredths (docs/decisions/controller.md)
LIGHT_POOL = 6


@dataclass(frozen=True)
class SolveRequest:
    """What the controller asks the solver: one entry per DIP that may take traffic."""

    dips: tuple[tuple[str, LatencyCurve, float, float, float | None], ...]  # name, curve, w_max, min, pin
    total: float
    objective: str
    method: str
    levels: int
    units: int
    time_limit: float


def _same_weights(a: Mapping[str, float], b: Mapping[str, float], epsilon: float = PLAN_CHANGE_EPSILON) -> bool:
    """The same DIPs, no weight moved by ``epsilon`` or more."""
    return set(a) == set(b) and max((abs(a[n] - b[n]) for n in b), default=0.0) < epsilon


@dataclass(frozen=True)
class SolveResult:
    weights: dict[str, float]
    predicted_latency: dict[str, float]
    objective: float
    method: PlanMethod
    seconds: float
    note: str = ""  # what the plan's reasons add about how it was made


SolverFn = Callable[[SolveRequest], SolveResult]


def default_solver(request: SolveRequest) -> SolveResult:
    """Calls :func:`knapsack_lb.solver.solve` (the solver's API)."""
    from knapsack_lb.solver import DipInput, solve

    inputs = [DipInput(name, curve, w_max, min_weight=low, pin=pin) for name, curve, w_max, low, pin in request.dips]
    solution = solve(
        inputs, objective=request.objective, method=request.method, total=request.total, levels=request.levels,
        units=request.units, time_limit=request.time_limit,
    )
    return SolveResult(dict(solution.weights), dict(solution.predicted_latency), solution.objective,
                       PlanMethod(solution.method), solution.seconds)


def is_solved(plan: WeightPlan) -> bool:
    """A plan meant to stay, one the LB may be left on: not a measurement schedule, not the split for a VIP
    with no live DIP. The learner's start and the fallbacks are such plans too; the ones placed from learned
    curves are those of ``LEARNED_METHODS``."""
    return PlanFlag.MEASURING not in plan.flags and PlanFlag.NO_LIVE_DIP not in plan.flags


class VipController:
    """One VIP's controller; see the module docstring. Not thread-safe: one step at a time."""

    def __init__(
        self,
        vip: str,
        dips: Sequence[str] = (),
        settings: ControllerSettings | None = None,
        *,
        rng: random.Random | None = None,
        solver: SolverFn | None = None,
    ) -> None:
        self.vip = validate_name("vip", vip)
        self.settings = settings or ControllerSettings()
        self.rng = rng or random.Random(0)
        self.solver: SolverFn = solver or default_solver
        self.dips: dict[str, DipState] = {}
        self.plan: WeightPlan | None = None  # the last plan emitted (pending until the LB confirms it)
        self.confirmed_version = 0  # the version of the last plan the LB confirmed
        self.last_solved: WeightPlan | None = None  # the last solved plan the LB confirmed (the plan to stop on)
        self.in_force: dict[str, float] = {}  # the split the LB confirmed it carries ({}: not known yet)
        self.applied_at: float = -math.inf  # when the LB confirmed a change of the split (the drain clock)
        self.paused_at: float = -math.inf  # the last step while the VIP was paused: older rounds teach nothing
        self.scheduled: dict[str, float] = {}
        self.version = 0
        self.drain_time = self.settings.drain.time
        self.drain_measured_at: float | None = None
        self.traffic_changed_at = -math.inf  # rounds before it were taken under other traffic: never compared
        self.vip_rates: list[RateReading] = []  # the VIP's counted rate per step (requests, or bytes at layer 4)
        # per DIP, the client requests the LB timed in its newest round (the probe budget counts them as probes
        # already sent); not kept with the state: after a restart the first round's budget is the uniform one
        self.lb_timed: dict[str, int] = {}
        # per DIP, its newest rounds of light requests (time, share, latencies) at the share it carried last, since
        # its last change; not kept with the state: after a restart its saturation share is read from the next rounds
        self.light_rounds: dict[str, list[tuple[float, float, tuple[float, ...]]]] = {}
        # per DIP, what one light request costs it in probe requests' work (the probe budget counts it)
        self.light_costs: dict[str, float] = {}
        self._drain: DrainProbe | None = None
        self.rounds = 0
        self.measurement_rounds = 0
        self.detector = ChangeDetector(self.settings)
        self.breaker = RelativeCircuitBreaker(self.settings.breaker)
        self.guard = PlanGuard()
        self.round_spread = 0.0  # the pool's between-round spread (estimation.between_round_spread)
        self.events_log: list[tuple[float, str]] = []
        self._pending_reasons: list[str] = []
        self._curves_changed = True
        self._curves_version = 0
        self._solve_cache: tuple[Any, SolveResult] | None = None
        self._balancing: Balancing = "weighted"  # the VIP's, as of the plan being made
        self._cold_start = False
        self._sync(list(dips), now=0.0)

    # --- public ----------------------------------------------------------------------------
    @property
    def _estimating(self) -> bool:
        return self.settings.learning.method == "estimate"

    @property
    def measuring(self) -> list[str]:
        return [d.name for d in self.dips.values() if d.measuring is not None and not d.failed]

    @property
    def curves_changed(self) -> bool:
        """True when a curve changed since the last plan (the service solves such VIPs first)."""
        return self._curves_changed

    def step(
        self,
        now: float,
        observations: Mapping[str, Measurement],
        *,
        config: VipConfig | None = None,
        remeasure: Iterable[str] = (),
        rate: RateReading | None = None,
    ) -> WeightPlan | None:
        """Advance by one control interval; a new plan, or None to keep the current one. ``rate`` is
        what the LB counted per second for the VIP since the previous step (requests, or bytes at layer 4)."""
        self.rounds += 1
        self.lb_timed.update((name, m.lb_timed) for name, m in observations.items())
        if rate is not None and math.isfinite(rate.rate) and rate.rate >= 0 and rate.seconds > 0:
            window = self.settings.learning.window
            kept = [r for r in self.vip_rates if rate.time - r.time <= window and r.kind == rate.kind]
            self.vip_rates = [*kept, rate]
        reasons = self._pending_reasons
        self._pending_reasons = []
        if config is not None:
            if config.name != self.vip:
                raise InvalidInputError("config.name", config.name, f"this controller runs VIP {self.vip!r}")
            reasons += self._sync([d.name for d in config.dips], now)
            if config.paused:
                self.paused_at = now
        reasons += self._drain_probe(now, observations)
        reasons += self._failures(now, observations)
        trusted = self._trusted(now, observations)
        reasons += self._breaker(now, trusted)
        if self._estimating:
            reasons += self._learn(now, trusted, set(remeasure))
        else:
            measured = {n for n in trusted if n in self.dips and self.dips[n].measuring is not None}
            reasons += self._advance_measurements(now, trusted)
            # a round that served a measurement (even its last one) is not also a verdict on the new curve
            reasons += self._dynamics(now, {n: m for n, m in trusted.items() if n not in measured})
            reasons += self._refresh(now, set(remeasure))
        reasons += self._hold_disputed_ramps(now, trusted)
        plan = self._plan(now, config, reasons)
        for reason in reasons:
            self.events_log.append((now, reason))
        self.events_log = self.events_log[-200:]
        return plan

    def curve_records(self) -> list[CurveRecord]:
        return [
            CurveRecord(
                vip=self.vip, dip=d.name, curve=dict(d.curve), w_max=d.w_max, points=list(d.points), model=d.model,
                fit_error=d.fit_error, fitted_at=d.fitted_at,
                extra={"l0": d.l0, "drop_points": [list(p) for p in d.drop_points]},
            )
            for d in self.dips.values()
            if d.curve is not None
        ]

    def status(self) -> dict[str, Any]:
        return {
            "vip": self.vip, "rounds": self.rounds, "measurement_rounds": self.measurement_rounds,
            "measuring": self.measuring, "failed": sorted(d.name for d in self.dips.values() if d.failed),
            "ejected": sorted(self.breaker.ejections), "drain_time": self.drain_time,
            "drain_measured_at": self.drain_measured_at,
            "plan_version": self.version,
        }

    def probe_budget(self, config: VipConfig, rate: float | None = None) -> dict[str, int]:
        """Probe requests per round for each DIP of ``config`` (:mod:`knapsack_lb.controller.budget`):
        more where the estimate at the DIP's current weight is least precise, the VIP's total
        (``requests_per_round`` x DIPs) kept, at most ``probe_budget.load_cap`` of a DIP's capacity.
        ``rate`` is the VIP's requests per second when the LB counts them; a DIP's capacity is then
        ``rate`` x the larger of its ``w_max`` and the weight it carries (it carries that now).

        Without request counters (at layer 4 HAProxy counts bytes; some adapters count nothing) the
        VIP's rate is taken to be the one of which the VIP's probes are ``load_cap``. The cap then no
        longer depends on ``load_cap``: a DIP gets at most the VIP's probe budget times its capacity
        as a share of the VIP's traffic, so no DIP is probed harder, for its capacity, than the VIP
        as a whole is for its traffic. A 1-vCPU DIP beside 16-vCPU ones no longer gets the uniform
        share (with 13 DIPs at 73 % load and probes worth 3 % of the pool, the uniform share is 16 %
        of such a DIP's capacity). How it fails: a DIP's capacity is only as good as its curve;
        before it has one it keeps the uniform share, as with counters.

        The floor is ``probe_budget.floor``, raised to the breaker's ``min_requests`` while the
        breaker is on (a DIP with fewer requests in a round cannot be judged). Where the LB times the
        client requests (layer 7) those of a DIP's newest round count as probes already sent: a DIP
        the LB timed 1000 requests of gets its floor."""
        s = self.settings
        judged = s.breaker.min_requests if s.breaker.enabled else 1
        if rate is None:
            budget = config.probe.requests_per_round * len(config.dips)
            rate = budget / (config.probe.interval * s.probe_budget.load_cap)
        return allocate(self.probe_uncertainty(config, rate), uniform=config.probe.requests_per_round,
                        interval=config.probe.interval, load_cap=s.probe_budget.load_cap,
                        floor=s.probe_budget.floor, judged=judged, method=s.probe_budget.allocation)

    def probe_uncertainty(self, config: VipConfig, rate: float) -> list[DipUncertainty]:
        """What the controller knows of each DIP of ``config`` for the probe budget: its learning state,
        the relative standard error of its rounds at the weight it carries (pooled, scaled by the fit's
        dispersion, at least the model's 1 %; unknown with no round there, and always with
        ``algorithm1``, which keeps no per-round errors), the relative spread of one request in its
        newest round, its capacity (best estimate: the curve's saturation; lower bound: its cap or the
        weight it carries, whichever is larger) in requests per second at the VIP's ``rate``; unknown
        until the DIP is ready."""
        carried = self._carried()
        drained = set(config.drained)
        light = self._light_work(config)
        out = []
        for name in (d.name for d in config.dips):
            dip = self.dips.get(name)
            if dip is None:
                out.append(DipUncertainty(name, "new"))
                continue
            state: LearningState = (
                "drained" if name in drained or dip.failed or self.breaker.is_ejected(name)
                else "new" if not dip.evidence and dip.curve is None
                else "measuring" if dip.measuring is not None or not dip.ready else "settled")
            weight = carried.get(name, 0.0)
            stderr = None
            near = [b for b in by_weight(dip.evidence, self.settings.measurement.trust_tolerance)
                    if abs(b.weight - weight) <= max(1e-3, BUDGET_WEIGHT_TOLERANCE * weight)]
            if near:
                here = min(near, key=lambda b: abs(b.weight - weight))
                # never below the model's own error: the learner trusts no point closer than that
                stderr = max(MODEL_ERROR, here.stderr * math.sqrt(dip.dispersion) / here.mean)
            spread = probe_spread(dip.evidence)
            best = low = None
            if dip.ready:
                # an overloaded DIP carries more than it can: only its cap bounds it from below
                low = (dip.w_max if dip.overloaded else max(dip.w_max, weight)) * rate
                saturation = dip.curve_obj().upper_bound  # Algorithm 1's curves have none: w_max is their estimate
                best = max(saturation * rate, low) if math.isfinite(saturation) else low
            out.append(DipUncertainty(name, state, stderr, spread, best, low, self.lb_timed.get(name, 0),
                                      light.get(name, 0.0)))
        return out

    def _light_work(self, config: VipConfig) -> dict[str, float]:
        """Each DIP's light requests' work per round in probe requests: their count times what one costs
        (its light base over its unloaded latency, both measured, so an overestimate where the network's
        round trip is part of both). A DIP not yet read costs what the dearest one read in the VIP does;
        none read yet, nothing (the first rounds' light work is not counted)."""
        if config.probe.light_path is None:
            return {}
        costs = {d.name: self.light_costs.get(d.name) for d in config.dips}
        dearest = max((c for c in costs.values() if c is not None), default=0.0)
        count = config.probe.light_requests_per_round
        return {name: count * (dearest if cost is None else cost) for name, cost in costs.items()}

    # --- state -------------------------------------------------------------------------------
    def state(self) -> ControllerState:
        """Everything this controller needs to resume (see :mod:`knapsack_lb.controller.state`)."""
        return ControllerState(
            vip=self.vip, dips=self.dips, plan=self.plan, applied_at=self.applied_at,
            confirmed_version=self.confirmed_version, in_force=self.in_force, scheduled=self.scheduled,
            version=self.version, drain_time=self.drain_time, drain_measured_at=self.drain_measured_at,
            drain_probe=self._drain, rounds=self.rounds, measurement_rounds=self.measurement_rounds,
            detector=self.detector.state, breaker=self.breaker.state, guard=self.guard.state,
            last_solved=self.last_solved, traffic_changed_at=self.traffic_changed_at, vip_rates=self.vip_rates,
        )

    def to_dict(self) -> dict[str, Any]:
        return self.state().to_dict()

    @classmethod
    def from_dict(
        cls,
        data: Mapping[str, Any],
        settings: ControllerSettings | None = None,
        *,
        rng: random.Random | None = None,
        solver: SolverFn | None = None,
    ) -> VipController:
        """Resume from a stored state; :class:`InvalidInputError` names the field when it does not fit."""
        state = ControllerState.from_dict(dict(data))
        ctl = cls(state.vip, (), settings, rng=rng, solver=solver)
        ctl.dips, ctl.plan, ctl.applied_at = state.dips, state.plan, state.applied_at
        ctl.confirmed_version, ctl.in_force, ctl.scheduled = state.confirmed_version, state.in_force, state.scheduled
        ctl.last_solved, ctl.traffic_changed_at = state.last_solved, state.traffic_changed_at
        ctl.vip_rates = list(state.vip_rates)
        ctl.version, ctl.drain_time, ctl.drain_measured_at = state.version, state.drain_time, state.drain_measured_at
        ctl._drain, ctl.rounds, ctl.measurement_rounds = state.drain_probe, state.rounds, state.measurement_rounds
        ctl.detector = ChangeDetector(ctl.settings, state.detector)
        ctl.breaker = RelativeCircuitBreaker(ctl.settings.breaker, state.breaker)
        ctl.guard = PlanGuard(state.guard)
        return ctl

    # --- 1. DIP set -------------------------------------------------------------------------
    def _sync(self, names: list[str], now: float) -> list[str]:
        reasons = []
        for name in names:
            validate_name("dip", name)
        cold = not self.dips
        for name in names:
            if name not in self.dips:
                if self._estimating:
                    self.dips[name] = DipState(name, returned_at=None if cold else now)
                    if not cold:
                        reasons.append(f"new DIP {name}: learning from a small share up (slow start)")
                    continue
                m = DipMeasurement(name, enqueued_at=now)
                self.dips[name] = DipState(name, measuring=m)
                if not cold:
                    reasons.append(f"new DIP {name}: measuring (Algorithm 1)")
        for name in [n for n in self.dips if n not in names] if names or not cold else []:
            del self.dips[name]
            self.detector.forget(name)
            self.scheduled.pop(name, None)
            reasons.append(f"DIP {name} removed from the VIP")
        if cold and names:
            self._cold_start = True
        return reasons

    # --- 2. drain time (section 4.7) -------------------------------------------------------------
    def _drain_due(self, now: float) -> bool:
        period = self.settings.drain.measure_period
        return period > 0 and self._drain is None and (
            self.drain_measured_at is None or now - self.drain_measured_at >= period)

    def _drain_probe(self, now: float, observations: Mapping[str, Measurement]) -> list[str]:
        """Follow the DIP whose weight was cut to 0 until its latency settles: ``t2 - t1`` is the
        drain time; the settled latency is that DIP's ``l_0``."""
        probe = self._drain
        if probe is None:
            return []
        name = probe.dip
        dip = self.dips.get(name)
        m = observations.get(name)
        if dip is None or dip.failed or dip.measuring is None:
            self._drain = None
            return []
        if m is not None and m.time > probe.switch and m.successes > 0 and m.latency_mean is not None \
                and (not probe.series or m.time > probe.series[-1][0]):
            probe.series.append((m.time, m.latency_mean))
        series = probe.series
        estimate = estimate_drain_time(probe.switch, series)
        if estimate is None and len(series) < 8:
            return []
        self._drain = None
        self.drain_measured_at = now
        if m is not None and series:
            settled = (series[-1][1] + series[-2][1]) / 2 if len(series) >= 2 else series[-1][1]
            zero = replace(m, weight=0.0, latency_mean=settled)
            dip.measuring.record(0.0, zero, self.settings, self._equal_share(), now, scheduled=True)
        if estimate is None:
            return [f"drain time: {name}'s latency did not settle in {len(series)} rounds; keeping "
                    f"{self.drain_time:.1f}s"]
        self.drain_time = estimate
        return [f"drain time measured on {name}: {estimate:.1f}s from weight cut to settled latency (section 4.7)"]

    # --- 3. trusted rounds ----------------------------------------------------------------------
    def _trusted(self, now: float, observations: Mapping[str, Measurement]) -> dict[str, Measurement]:
        trusted = {}
        for name, m in observations.items():
            dip = self.dips.get(name)
            if dip is None or not self._fresh(m, dip.last_round, now):
                continue
            # before the last change of the split drained: one the controller applied, or the operator's
            # while the VIP was paused (rounds then were not taken at a confirmed split)
            if m.time < max(self.applied_at, self.paused_at) + self.drain_time - 1e-9:
                continue
            if not self._stamp_agrees(name, m):
                continue  # the prober saw another split than the LB confirmed (stale, or changed behind us)
            dip.last_round = m.time
            trusted[name] = m
        return trusted

    def _fresh(self, m: Measurement, newest_seen: float, now: float) -> bool:
        """Newer than the newest round already taken, not from the future, not older than
        ``loop.measurement_max_age``."""
        return newest_seen < m.time <= now + 1e-9 and now - m.time <= self.settings.loop.measurement_max_age

    def _stamp_agrees(self, name: str, m: Measurement) -> bool:
        """The weight the probe stamped on the round matches the split the LB confirmed (within the
        trust tolerance, or 0.001 for tiny weights); with nothing confirmed yet any stamp is taken."""
        if name not in self.in_force:
            return True
        confirmed = self.in_force[name]
        return abs(m.weight - confirmed) <= max(1e-3, self.settings.measurement.trust_tolerance * confirmed)

    def _weight_of(self, name: str, m: Measurement) -> float:
        """The weight a trusted round was taken at: what the LB confirmed it carries."""
        if name in self.in_force:
            return self.in_force[name]
        return m.weight

    # --- what the load balancer confirmed ----------------------------------------------------------
    @property
    def pending(self) -> WeightPlan | None:
        """The last plan, if the LB has not confirmed it yet (refused, dry run, or not applied)."""
        if self.plan is None or self.plan.version == self.confirmed_version:
            return None
        return self.plan

    def confirm(self, plan: WeightPlan, carried: Mapping[str, float], at: float) -> None:
        """The LB carries ``carried`` (fractions) since ``at`` after applying ``plan``. Only confirmed
        weights are learned from; a change of the split restarts the drain clock (section 4.7)."""
        if self.plan is None or plan.version != self.plan.version:
            return  # a newer plan was emitted meanwhile: it is what must be confirmed
        self._carry(carried, at)
        self.confirmed_version = plan.version
        if is_solved(plan):
            self.last_solved = plan

    def stop_plan(self, now: float, config: VipConfig) -> WeightPlan | None:
        """The plan to leave the LB on when this controller stops (``loop.on_stop``), ``None`` when
        what the LB carries is already that plan or the policy is ``keep``.

        ``last-solved``: the last solved plan the LB confirmed, over the DIPs still live (a drained,
        failed or removed DIP stays at 0; the rest renormalised); without one, capacity-proportional.
        ``capacity``: in proportion to each live DIP's estimated capacity (``w_max``); DIPs with no
        curve yet get the mean of the others', and when none has a curve every live DIP the same
        (``equal``). Never an all-zero plan: with no live DIP the weights in force stay.
        """
        policy = self.settings.loop.on_stop
        if policy == "keep":
            return None
        drained = set(config.drained)
        live = [n for n, d in self.dips.items() if not d.failed and not self.breaker.is_ejected(n)
                and n not in drained]
        if not live:
            return None
        note = f"controller stopping (loop.on_stop: {policy})"
        if policy == "last-solved" and self.last_solved is not None:
            kept = {n: self.last_solved.weights.get(n, 0.0) for n in live}
            if sum(kept.values()) > 0 and all(n in self.last_solved.weights for n in live):
                if self.plan is self.last_solved and self.pending is None:
                    return None  # the LB already carries it
                return self._emit(kept, now, PlanMethod.KEPT, [f"{note}: the last solved plan, "
                                  f"v{self.last_solved.version}"], force=True)
        ready = {n: self.dips[n].w_max for n in live if self.dips[n].ready}
        if policy != "equal" and ready:
            mean = sum(ready.values()) / len(ready)
            split = capacity_proportional({n: ready.get(n, mean) for n in live})
            return self._emit(split, now, PlanMethod.CAPACITY_PROPORTIONAL,
                              [f"{note}: in proportion to estimated capacity"], force=True)
        return self._emit({n: 1.0 for n in live}, now, PlanMethod.EQUAL_SPLIT,
                          [f"{note}: equal weights over the live DIPs"], force=True)

    def observe_lb(self, carried: Mapping[str, float], at: float) -> None:
        """The LB was read and carries ``carried``: e.g. at start, or changed behind the controller's back.
        Before the controller's first plan it is the operator's split, kept per DIP as its start share
        (the most a DIP seen only idle is given: :meth:`_floor`)."""
        self._carry(carried, at)
        if self.plan is None:
            for name, share in self.in_force.items():
                self.dips[name].start_share = share

    def refuse(self, plan: WeightPlan, reason: str, *, retry: bool = True) -> None:
        """The LB did not take ``plan`` (refused, or dry run): nothing it scheduled can be measured,
        and the weights in force stay the confirmed ones. With ``retry`` the next step plans again
        (and says why); a dry run does not retry, its plan just stays pending."""
        if self.plan is None or plan.version != self.plan.version:
            return
        self.scheduled = {}
        self._drain = None
        if retry:
            self._pending_reasons.append(f"plan v{plan.version} not applied: {reason}")

    def _carried(self) -> dict[str, float]:
        """The split the LB carries: confirmed, else the last plan's (before anything was confirmed)."""
        if self.in_force:
            return dict(self.in_force)
        return dict(self.plan.weights) if self.plan is not None else {}

    def _carry(self, carried: Mapping[str, float], at: float) -> None:
        split = {n: float(carried.get(n, 0.0)) for n in self.dips}
        total = sum(split.values())
        if total <= 0:
            return
        if abs(total - 1.0) > 1e-9:  # a split that already sums to 1 is kept bit for bit
            split = {n: w / total for n, w in split.items()}
        if not self.in_force or not _same_weights(self.in_force, split):
            self.applied_at = at
        self.in_force = split

    # --- 4. failures ----------------------------------------------------------------------------
    def _failures(self, now: float, observations: Mapping[str, Measurement]) -> list[str]:
        """Judge every fresh round, trusted or not: probes go to the DIP itself, so whether it answers
        does not depend on the split the LB is moving to (a DIP that dies while plans change every
        interval, as in a slow-start ramp, would otherwise never be seen dead)."""
        reasons = []
        for name, m in observations.items():
            dip = self.dips.get(name)
            if dip is None or not self._fresh(m, dip.last_checked_round, now):
                continue
            dip.last_checked_round = m.time
            measured_at = self.scheduled.get(name, 0.0)
            if m.successes == 0 and m.timeouts and not m.errors and dip.measuring is not None and measured_at > 0:
                # ours: only timeouts at the weight Algorithm 1 just gave it - overloaded by the measurement, not
                # dead (ELS blog: slow failures are not fast ones); the measurement takes it as a drop
                reasons.append(f"{name}: every probe timed out at its measurement weight {measured_at:.3f}: a drop "
                               "(overload), not a failure")
                continue
            if m.successes == 0:
                dip.fail_rounds += 1
                if not dip.failed and dip.fail_rounds >= self.settings.dynamics.failure_rounds:
                    dip.failed = True
                    self.scheduled.pop(name, None)
                    self.detector.reset(name)
                    what = "fast errors" if m.errors and not m.timeouts else "errors/timeouts"
                    reasons.append(f"failure: {name} answered no probe ({what}); removed and re-solved")
            else:
                dip.fail_rounds = 0
                if dip.failed:
                    dip.failed = False
                    dip.returned_at = now
                    dip.back_since = m.time
                    self.detector.reset(name)
                    reasons.append(f"recovered: {name} answers probes again; "
                                   + ("slow start on its kept curve" if dip.ready else "measuring"))
        return reasons

    # --- 5. circuit breaker ---------------------------------------------------------------------
    def _breaker(self, now: float, trusted: Mapping[str, Measurement]) -> list[str]:
        if self.plan is None or PlanFlag.MEASURING in self.plan.flags or self.measuring:
            return []  # measurement rounds overload DIPs on purpose; judge the steady state only
        live = [d for d in self.dips.values() if not d.failed and d.ready and d.measuring is None]
        rounds = {d.name: trusted[d.name] for d in live if d.name in trusted and trusted[d.name].successes > 0}
        expected = {}
        for name, m in rounds.items():
            dip = self.dips[name]
            expected[name] = dip.curve_obj().latency(self._weight_of(name, m))
        decision = self.breaker.evaluate(now, rounds, expected, pool=len(live),
                                         capacity={d.name: d.w_max for d in live})
        for name in decision.returned:
            if name in self.dips:
                self.dips[name].returned_at = now
                self.detector.reset(name)
        reasons = list(decision.notes)
        reasons += [f"circuit breaker returned {n} (slow start)" for n in decision.returned]
        return reasons

    # --- 6. measurement phase -------------------------------------------------------------------
    def _equal_share(self) -> float:
        live = [d for d in self.dips.values() if not d.failed]
        return 1.0 / max(1, len(live))

    def _advance_measurements(self, now: float, trusted: Mapping[str, Measurement]) -> list[str]:
        reasons = []
        equal = self._equal_share()
        tol = self.settings.measurement.trust_tolerance
        for name, m in trusted.items():
            dip = self.dips[name]
            if dip.measuring is None or dip.failed or (m.successes == 0 and m.weight <= 0):
                continue
            if self._drain is not None and self._drain.dip == name:
                self.scheduled.pop(name, None)  # held at 0 by the drain probe; its l_0 comes from there
                continue
            weight = self._weight_of(name, m)
            planned = self.scheduled.get(name)
            scheduled = planned is not None and abs(weight - planned) <= max(1e-9, tol * planned)
            expected = dip.curve_obj().latency(weight) if dip.measuring.refresh and dip.curve is not None else None
            dip.measuring.record(weight, m, self.settings, equal, now, scheduled=scheduled, expected=expected)
            if scheduled:
                self.scheduled.pop(name, None)
            if dip.measuring.done:
                reasons += self._finish_measurement(dip, now)
        return reasons

    def _finish_measurement(self, dip: DipState, now: float) -> list[str]:
        m = dip.measuring
        assert m is not None
        dip.l0 = m.l0
        clean = [(w, latency) for w, latency, dropped in m.points if not dropped]
        if m.l0 is not None and not any(w <= 0 for w, _ in clean):
            clean.insert(0, (0.0, m.l0))  # a refresh starts at the current weight; l_0 is still known
        drops = [(w, latency) for w, latency, dropped in m.points if dropped]
        w_max = m.w_max
        if m.refresh and not drops and self.settings.refresh.needs_room and dip.ready:
            # It stopped before it found a limit: beyond its last weight the old curve still stands.
            top = max((w for w, _ in clean), default=0.0)
            clean += [(w, latency) for w, latency in dip.points if w > top * 1.05]
            drops = [(w, latency) for w, latency in dip.drop_points if w > top * 1.05]
            w_max = max(w_max, dip.w_max)
        dip.points = clean[-self.settings.fitting.max_points:]
        dip.drop_points = drops[-self.settings.fitting.max_points:]
        dip.measuring = None
        dip.iterations = m.iterations
        self.detector.reset(dip.name)
        if w_max <= 0 or len({round(w, 12) for w, _ in clean}) < 2:
            dip.curve, dip.w_max = None, 0.0
            return [f"curve: {dip.name} dropped at every weight tried; only the minimum weight"]
        reason = self._fit(dip, now, w_max=w_max)
        return [f"curve: {dip.name} measured in {m.iterations} iterations, w_max={w_max:.4f}; {reason}"]

    def _fit(self, dip: DipState, now: float, *, w_max: float) -> str:
        drop_latency = self.settings.measurement.drop_latency_factor * dip.l0 if dip.l0 else None
        result = fit_curve(dip.points, model=self.settings.fitting.curve_model, w_max=w_max,
                           drop_points=dip.drop_points, drop_latency=drop_latency)
        dip.curve = result.curve.to_dict()
        dip.model = result.model
        dip.fit_error = result.error
        dip.w_max = w_max
        dip.fitted_at = now
        self._curves_changed = True
        self._curves_version += 1
        err = "n/a" if result.error is None else f"{result.error:.3f}"
        return f"{result.model} curve (leave-one-out error {err})"

    # --- 6b. learning from every round (learning.method = estimate) ------------------------------
    def _learn(self, now: float, trusted: Mapping[str, Measurement], remeasure: set[str]) -> list[str]:
        """Add each trusted round to its DIP's evidence and refit every DIP's curve and cap
        (:mod:`knapsack_lb.controller.estimation`). A remeasure request, or a round that disagrees
        with the curve beyond its confidence bound, forgets the DIP's older rounds. A returning DIP's
        rounds are judged on their own noise, not scaled by its fit's dispersion: the rounds that
        dispute its kept curve are the ones that inflate that dispersion (as in the ramp hold), and a
        DIP back on a slower host was otherwise never relearned and ended its ramp past capacity."""
        s = self.settings
        z = s.learning.confidence
        reasons = []
        for name in sorted(remeasure):
            if name in self.dips:
                self.dips[name].evidence = self.dips[name].evidence[-1:]
                reasons.append(f"remeasure requested: {name} learns afresh from its next rounds")
        latest = {}
        confirmations = s.dynamics.change_confirmations
        for name, m in trusted.items():
            dip = self.dips.get(name)
            if dip is None or dip.failed:
                continue
            evidence = round_evidence(m, self._weight_of(name, m))
            if evidence is None:
                continue
            latest[name] = evidence
            dip.evidence = [e for e in dip.evidence if now - e.time <= s.learning.window] + [evidence]
        self.round_spread = between_round_spread((d.evidence for d in self.dips.values() if not d.failed),
                                                 s.measurement.trust_tolerance, s.learning.confidence)
        traffic = self._traffic(latest, now) if latest else None
        drop_level = self._drop_levels()
        if traffic is not None:
            apart = set(traffic.apart) | self._apart_from_traffic(traffic, latest, drop_level)
            for dip in self.dips.values():
                if dip.name in apart:
                    dip.evidence = dip.evidence[-confirmations:]
                elif not dip.failed:
                    dip.evidence = shifted(dip.evidence, traffic.k, confirmations)
                # a rollback's hold compared plans across the change (the first rounds under new traffic make
                # the plan in force look worse): it says nothing about the DIP
                dip.release()
            self.traffic_changed_at = min(e.time for d in self.dips.values() if not d.failed
                                          for e in d.evidence[-confirmations:])
            self.guard.reset()  # the plans before the change were measured under the old traffic
            reasons.append(traffic.describe())
            reasons += [f"change: {n} moved against the traffic change, beyond its curve's noise: "
                        f"relearning from the last {confirmations} rounds" for n in sorted(apart - set(traffic.apart))]
        for name, evidence in latest.items():
            dip = self.dips[name]
            off = self._off_curve(dip, drop_level[name]) if traffic is None else 0
            if off != 0:
                expected = dip.curve_obj().latency(evidence.weight)
                since = dip.evidence[-confirmations - 1].time if len(dip.evidence) > confirmations else -math.inf
                dip.evidence = dip.evidence[-confirmations:]
                seen = f"{evidence.mean * 1e3:.1f}ms" if evidence.n else "no successful probe"
                reasons.append(f"change: {name} measured {seen} ({evidence.failed:.0%} failed) at weight "
                               f"{evidence.weight:.3f}, its curve said {expected * 1e3:.1f}ms; relearning from the "
                               f"last {confirmations} rounds")
                if off > 0:
                    reasons += self._released(name, evidence.weight, since)
                    reasons += self._unremedied(name, evidence.weight)
        if self.in_force and self.confirmed_version and latest:
            self.guard.observe(self.confirmed_version, self.in_force, latest)
        self._read_light(trusted)
        lowest = [min((e.mean for e in d.evidence if e.n > 0), default=math.inf) for d in self.dips.values()]
        prior = pool_prior(lowest)
        lights, reference = self._light_latencies()
        live = [d for d in self.dips.values() if not d.failed]
        for dip in live:
            if not dip.evidence:
                continue
            est = estimate(dip.evidence, prior, z=z, tolerance=s.measurement.trust_tolerance,
                           drop_factor=s.measurement.drop_latency_factor,
                           failure_share=s.measurement.drop_failure_share, floor=self._floor(dip, len(live)),
                           spread=self.round_spread,
                           unloaded=unloaded_latency(reference, lights[dip.name]),
                           under_load=seen_under_load(lights[dip.name], reference, z), remembered=dip.unloaded)
            if est is None:
                continue
            reasons += self._take_estimate(dip, est, now)
        return reasons

    @staticmethod
    def _floor(dip: DipState, live: int) -> float:
        """The cap of a DIP whose latency has not risen at any weight seen: ``START_SHARE`` of an equal
        split over the ``live`` DIPs, and no more than the operator's own split gave it (its start
        share). At layer 4 a DIP the operator weighted at 1 of 87 units can go its first rounds without
        a connection; seen idle only, a quarter of an equal share was 1.3x its capacity (a 1-vCPU DIP
        among 16-vCPU ones). How it fails: a DIP the operator under-weighted grows from its start share
        by the fit's bounded step, not from the floor."""
        floor = START_SHARE / max(1, live)
        if dip.start_share is not None and dip.start_share > 0:
            return min(floor, dip.start_share)
        return floor

    def _released(self, name: str, weight: float, since: float) -> list[str]:
        """The holds of a rollback that compared plans across ``name``'s slowdown are lifted
        (:meth:`PlanGuard.across_change`), as a traffic change lifts every hold."""
        held = self.guard.across_change(name, weight, since, self.settings.measurement.trust_tolerance)
        for other in held:
            self.dips[other].release()
        if not held:
            return []
        return [f"guard: the last rollback compared plans across {name}'s slowdown; "
                f"{', '.join(sorted(held))} no longer held"]

    def _unremedied(self, name: str, weight: float) -> list[str]:
        """The guard forgets a previous plan that gives ``name`` the weight it was just found slow at
        (:meth:`PlanGuard.slowed`)."""
        if not self.guard.slowed(name, weight, self.settings.measurement.trust_tolerance):
            return []
        return [f"guard: the plan before gives {name} the weight it slowed at; no plan measured before is "
                "restored"]

    def _apart_from_traffic(self, traffic: TrafficChange, latest: Mapping[str, RoundEvidence],
                            drop_level: Mapping[str, float]) -> set[str]:
        """The DIPs the traffic test could not judge (their weights moved) whose newest rounds moved
        against the traffic - faster than their curves as traffic rose, or slower as it fell: their
        own capacity changed at the same time (a DIP back at full capacity as traffic rises), as for
        the judged DIPs that moved the other way. Shifting their older rounds instead would mix
        rounds from two capacities at one weight, and the curve between them keeps the DIP at its
        old cap (in the fluid dynamics a DIP restored to its capacity stayed at 0.54 of the oracle's
        share). A DIP that moved with the traffic but more than ``k`` says is left to the shift: near
        a knee a small error in ``k`` is a large one in latency. ``drop_level``: :meth:`_drop_levels`."""
        against = -1 if traffic.k < 1 else 1
        return {name for name in latest
                if name not in traffic.apart and self._off_curve(self.dips[name], drop_level[name]) == against}

    def _light_latencies(self) -> tuple[dict[str, float], float | None]:
        """Each DIP's light latency (:func:`light_latency`) and the pool's (:func:`pool_prior` of them)."""
        lights = {name: light_latency(d.evidence, self.settings.learning.confidence) for name, d in self.dips.items()}
        return lights, pool_prior(list(lights.values()))

    def _drop_levels(self) -> dict[str, float]:
        """Each DIP's drop level: the latency at which a round is the paper's drop (section 4.3),
        ``drop_latency_factor`` times the unloaded latency the estimator's drop test reads
        (:func:`unloaded_latency` of the pool's light latency and the DIP's); inf when not known.
        Not the fit's own unloaded latency: with a steep knee shape it can come out far too high (80 ms
        on the live demo for a DIP whose rounds took 47 ms and up)."""
        lights, reference = self._light_latencies()
        factor = self.settings.measurement.drop_latency_factor
        return {name: factor * unloaded if (unloaded := unloaded_latency(reference, light)) else math.inf
                for name, light in lights.items()}

    def _off_curve(self, dip: DipState, drop_level: float) -> int:
        """+1 (slower) or -1 (faster) when a DIP's newest rounds confirm a change against its curve
        (:func:`change_direction`: no faster verdict where the curve predicts ``drop_level`` or more);
        0 without one, or without a learned curve to judge by. Rounds from before the DIP's last
        failure confirm nothing: it may have come back on another host, and a relearning that kept
        one of them mixed two capacities (a DIP back at 0.75 of its capacity, fitted with its last
        round from before, got a cap above its new saturation and a plan at 101 % of it)."""
        if dip.failed or dip.curve is None or dip.curve.get("kind") != "utilisation":
            return 0
        s = self.settings
        return change_direction(dip.rounds_since_back(), dip.curve_obj(), z=s.learning.confidence,
                                threshold=s.dynamics.capacity_change_threshold,
                                failure_share=s.measurement.drop_failure_share,
                                dispersion=1.0 if dip.returned_at is not None else dip.dispersion,
                                confirmations=s.dynamics.change_confirmations, spread=self.round_spread,
                                drop_latency=drop_level)

    def _traffic(self, latest: Mapping[str, RoundEvidence], now: float) -> TrafficChange | None:
        """This step's traffic test: on the VIP's counted rate where the LB counts (its newest read
        stamped with the VIP's probe latency under the plan in force), else, or where it counts bytes
        and their rate calls nothing, on the DIPs' rounds (section 4.5), whose call stands, where the
        LB counts, only when its rate bears it out (:func:`corroborated`)."""
        counted = self.vip_rates[-1] if self.vip_rates else None
        if counted is not None and counted.time == now:
            measured = vip_latency(self.in_force, latest)
            self.vip_rates[-1] = replace(counted, latency=None if measured is None else measured[0])
        change = self._rate_change(clients_only=not counted.counts_requests) if counted is not None else None
        if change is None and (counted is None or not counted.counts_requests):
            change = self._traffic_change()
            s = self.settings
            if change is not None and counted is not None and not corroborated(
                    change, self._reads_since_change(), confirmations=s.dynamics.change_confirmations,
                    z=s.learning.confidence):
                return None
        return change

    def _rate_change(self, *, clients_only: bool) -> TrafficChange | None:
        """The traffic test on the VIP's counted rate since the last traffic change (:func:`rate_change`);
        ``clients_only`` (a rate of bytes, layer 4): taken only where the VIP's probe latency moved the same way."""
        s = self.settings
        return rate_change(self._reads_since_change(), confirmations=s.dynamics.change_confirmations,
                           threshold=s.dynamics.traffic_change_threshold, z=s.learning.confidence,
                           clients_only=clients_only)

    def _reads_since_change(self) -> list[RateReading]:
        """The VIP's counted rates read since the last traffic change: the reads the rate tests compare."""
        return [r for r in self.vip_rates if r.time > self.traffic_changed_at]

    def _traffic_change(self) -> TrafficChange | None:
        """Section 4.5's traffic test on the DIPs' rounds (:mod:`knapsack_lb.controller.traffic`)."""
        s = self.settings
        live = [d for d in self.dips.values() if not d.failed and d.evidence]
        curves = {d.name: (d.curve_obj(), d.w_max) for d in live
                  if d.curve is not None and d.curve.get("kind") == "utilisation"}
        return traffic_change({d.name: d.evidence for d in live}, curves,
                              confirmations=s.dynamics.change_confirmations, tolerance=s.measurement.trust_tolerance,
                              threshold=s.dynamics.traffic_change_threshold, quorum=s.dynamics.traffic_change_quorum,
                              since=self.traffic_changed_at, spread=self.round_spread)

    def _take_estimate(self, dip: DipState, est: Estimate, now: float) -> list[str]:
        """Install an estimate as the DIP's curve and cap; say so when the DIP was overloaded."""
        cap, relaxed = est.cap, list(est.relaxed)
        if dip.held is not None and now < dip.held_until:
            # a rollback holds it at the weight it had under the better plan
            cap, relaxed = min(cap, dip.held), [min(r, dip.held) for r in relaxed]
        reasons = []
        if est.overloaded and not dip.overloaded:
            reasons.append(f"overload: {dip.name} at weight {dip.evidence[-1].weight:.3f}; cap now {cap:.3f}")
            reasons += self._unremedied(dip.name, dip.evidence[-1].weight)
        dip.overloaded, dip.dispersion = est.overloaded, est.dispersion
        changed_cap = abs(cap - dip.w_max) > PLAN_CHANGE_EPSILON
        dip.curve, dip.model, dip.w_max, dip.l0, dip.fitted_at = est.curve.to_dict(), "utilisation", cap, est.s, now
        dip.relaxed = relaxed
        dip.ceiling = est.ceiling
        if est.unloaded is not None:
            dip.unloaded = est.unloaded
        dip.points = [(e.weight, e.mean) for e in dip.evidence if e.n > 0][-self.settings.fitting.max_points:]
        dip.fit_error = None
        if changed_cap or reasons:
            self._curves_changed = True
        self._curves_version += 1
        return reasons

    # --- 7. dynamics ----------------------------------------------------------------------------
    def _dynamics(self, now: float, trusted: Mapping[str, Measurement]) -> list[str]:
        if self.plan is None:
            return []
        # Section 4.5 acts on the steady state: measurement rounds move weights on purpose. Ours: a
        # DIP in slow start is still watched then - its kept curve is the one most likely wrong
        # (it may come back on a slower host) and its weight is the one being raised.
        steady = PlanFlag.MEASURING not in self.plan.flags and not self.measuring
        rounds: dict[str, RoundView] = {}
        curves: dict[str, tuple[LatencyCurve, float]] = {}
        overload_only: set[str] = set()
        for name, m in trusted.items():
            dip = self.dips[name]
            if not dip.ready or dip.measuring is not None or dip.failed or self.breaker.is_ejected(name):
                continue
            if not steady and dip.returned_at is None:
                if not self.settings.dynamics.overload_watch:
                    continue
                overload_only.add(name)  # ours: an overloaded DIP is not left so while others measure
            if m.successes == 0 or m.latency_mean is None:
                continue
            weight = self._weight_of(name, m)
            watch = self.settings.dynamics.overload_watch
            drop = self.settings.measurement.drop_latency_factor * dip.l0 if dip.l0 and watch else math.inf
            lower = None
            if m.latency_std is not None and m.successes >= 2 and math.isfinite(m.latency_std):
                lower = mean_lower_bound(m.latency_mean, m.latency_std, m.successes, self.settings.learning.confidence)
            # a relative leave-one-out error e is about ln(1 + e) in log-latency
            curve_error = math.log1p(dip.fit_error) if dip.fit_error is not None else 0.0
            rounds[name] = RoundView(weight, m.latency_mean, m.timeouts / m.sent if m.sent else 1.0,
                                     round_noise(m.latency_mean, m.latency_p50, m.latency_p90, m.successes), drop,
                                     lower, curve_error)
            curves[name] = (dip.curve_obj(), dip.w_max)
        if not rounds:
            return []
        # ours: while a few DIPs measure, the rest still show a traffic change (the paper waits for the steady state)
        pool = steady or (self.settings.dynamics.overload_watch
                          and len(overload_only) >= POOL_WHILE_MEASURING * len(self.dips))
        verdict = self.detector.observe(rounds, curves, pool=pool, overload_only=frozenset(overload_only))
        if verdict.traffic_factor is not None:
            for dip in self.dips.values():
                if dip.ready:
                    self._rescale(dip, verdict.traffic_factor)
        for name, k in verdict.capacity.items():
            dip = self.dips[name]
            if name in verdict.remeasure:
                if k < 1:
                    self._rescale(dip, k)  # the cut guards now; Algorithm 1 refines from the cut curve
                self._start_refresh(dip, now)
                continue
            self._rescale(dip, k)
            if name in verdict.observed and self.settings.dynamics.learn_operating_points:
                self._learn_point(dip, *verdict.observed[name], now=now, loss=k < 1)
        return list(verdict.notes)

    def _learn_point(self, dip: DipState, weight: float, latency: float, *, now: float, loss: bool) -> None:
        """Ours: keep the averaged observation at the operating point and refit, so a curve whose
        *shape* is wrong there (not its scale) is corrected too; nearby old points are replaced. After
        a loss the point is where the DIP was too slow: it never raises ``w_max`` back above the cut."""
        dip.points = [(w, lat) for w, lat in dip.points if w <= 0 or abs(w - weight) > 0.05 * weight]
        dip.points = [*dip.points, (weight, latency)][-self.settings.fitting.max_points:]
        if len({round(w, 12) for w, _ in dip.points}) >= 2:
            self._fit(dip, now, w_max=dip.w_max if loss else max(dip.w_max, weight))

    def _rescale(self, dip: DipState, k: float) -> None:
        """Section 4.5: multiply the curve's weights (and w_max, and its points) by ``k``."""
        dip.curve = dip.curve_obj().scaled(k).to_dict()
        dip.w_max *= k
        dip.relaxed = [r * k for r in dip.relaxed]
        dip.ceiling *= k
        dip.points = [(w * k, latency) for w, latency in dip.points]
        dip.drop_points = [(w * k, latency) for w, latency in dip.drop_points]
        self._curves_changed = True
        self._curves_version += 1

    def _refresh(self, now: float, remeasure: set[str]) -> list[str]:
        reasons = []
        for name in sorted(remeasure):
            dip = self.dips.get(name)
            if dip is not None and dip.measuring is None and not dip.failed:
                self._start_refresh(dip, now)
                reasons.append(f"remeasure requested: {name} back to measurement")
        ready = {d.name: d for d in self.dips.values() if d.ready and d.measuring is None and not d.failed}
        under = [d.name for d in self.dips.values() if d.measuring is not None and d.measuring.refresh]
        due = refresh_candidates(
            {n: d.fitted_at for n, d in ready.items()}, {n: d.w_max for n, d in self.dips.items() if d.ready},
            under, now=now, period=self.settings.refresh.period, budget=self.settings.refresh.budget,
        )
        for name in due:
            self._start_refresh(self.dips[name], now)
            reasons.append(f"refresh: {name}'s curve is older than {self.settings.refresh.period:.0f}s")
        return reasons

    def _start_refresh(self, dip: DipState, now: float) -> None:
        """Re-measure with Algorithm 1 from the current weight (at most ``w_max``), l_0 known; the old
        ``w_max`` - or the knee of the current curve when lower (``refresh.needs_room``) - is the
        threshold beyond which the run is cautious."""
        current = self._carried().get(dip.name, 0.0)
        if dip.w_max > 0:
            current = min(current, dip.w_max)  # after a capacity cut: not at the weight that overloaded it
        m = DipMeasurement(dip.name, enqueued_at=now, refresh=True, l0=dip.l0, pending_zero=dip.l0 is None,
                           pending_equal=False, w_cur=current)
        m.target = max(current, self.settings.rails.min_weight, 1e-4) if dip.l0 is not None else None
        m.threshold = dip.w_max if dip.w_max > 0 else None  # ssthresh: cautious steps beyond the old w_max
        if m.threshold is not None and self.settings.refresh.needs_room and dip.curve is not None:
            knee = knee_weight(dip.curve_obj(), self.settings.refresh.knee_elasticity, dip.w_max)
            if knee is not None:
                m.threshold = min(m.threshold, knee)  # beyond the curve's knee only with evidence of room
        dip.measuring = m

    # --- 8. the plan ----------------------------------------------------------------------------
    def _plan(self, now: float, config: VipConfig | None, reasons: list[str]) -> WeightPlan | None:
        if config is not None and config.paused:
            self._pending_reasons = reasons
            return None
        names = list(self.dips)
        drained = set(config.drained) if config is not None else set()
        reasons = reasons + self._note_drains(now, drained)
        # a drain wins over a pin: the operator takes the DIP out of service, whatever it was held at
        pins = {n: w for n, w in config.pins.items() if n not in drained} if config is not None else {}
        live = [n for n in names if not self.dips[n].failed and not self.breaker.is_ejected(n) and n not in drained]
        if not live:
            return self._no_live_dip(now, reasons)
        # a pinned DIP cannot be measured (its weight is the operator's): it waits, and does not hold the VIP
        # in measurement rounds
        measuring = [n for n in live if self.dips[n].measuring is not None and n not in pins]
        if measuring:
            return self._measurement_round(now, live, measuring, pins, reasons)
        if self._estimating:
            notes: list[str] = []
            if self._challenger_stays(now, live, pins, reasons, notes):
                return None
            reasons = reasons + notes
            rollback = self._rollback(now, live, pins, reasons)
            if rollback is not None:
                return rollback
        if (self._estimating and self.plan is not None and not reasons
                and now < self.applied_at + self.drain_time + self.settings.loop.interval - 1e-9):
            return None  # the last plan has not been observed yet: learn from it before moving again
        plan = self._solve_plan(now, config, live, pins, drained, reasons)
        if plan is None and self._estimating and not reasons:
            return self._challenge(now, live, pins, self._objective(config))
        return plan

    def _explores(self, weights: Mapping[str, float]) -> bool:
        """Whether a plan takes some DIP past every weight it was seen at (beyond ``trust_tolerance``):
        that is how the learner's bounded step learns a DIP far below its knee, and a small DIP's step
        is smaller than ``LEARNED_CHANGE`` - left unsent, it held a returned 4-vCPU DIP at a third of
        its share for the rest of a run (its cap grew to 0.0145 from 0.0127, the plan never moved)."""
        tolerance = self.settings.measurement.trust_tolerance
        for name, dip in self.dips.items():
            weight, top = weights.get(name, 0.0), max((e.weight for e in dip.evidence), default=math.inf)
            if weight > top and not same_weight(weight, top, tolerance):
                return True
        return False

    def _objective(self, config: VipConfig | None) -> str:
        """The VIP's objective, else the solver settings' default."""
        return config.objective if config is not None else self.settings.solver.objective

    def _capacity_plan(self, live: Sequence[str], pins: Mapping[str, float]) -> dict[str, float] | None:
        """The capacity-proportional plan over the live DIPs (pins kept): the split the controller could
        always send instead of a solved one. None when some live DIP has no curve, or when the caps
        (less the rails' headroom) do not carry the VIP: then that split would run a DIP past its cap."""
        free = [n for n in live if n not in pins]
        if not free or any(not self.dips[n].ready for n in free):
            return None
        limits = {n: self._limit(n, self.dips[n].w_max) for n in free}
        share = 1.0 - sum(pins.get(n, 0.0) for n in live)
        if sum(limits.values()) * (1 - self.settings.rails.overload_headroom) < share - 1e-9:
            return None
        split = {n: w * share for n, w in capacity_proportional(limits).items()}
        return {n: split.get(n, pins.get(n, 0.0)) for n in self.dips}

    def _challenge(self, now: float, live: list[str], pins: Mapping[str, float], objective: str) -> WeightPlan | None:
        """Send the capacity-proportional plan as a challenger to the solved plan in force, when that plan
        has been measured, the two differ by at least ``CHALLENGE_MOVE`` of the traffic and the challenger
        takes no DIP past every weight it was seen at (:mod:`knapsack_lb.controller.guard`, "The challenger")."""
        s = self.settings
        plan, record, last = self.plan, self.guard.state.current, self.guard.state.challenge
        if (objective != "mean" or self._balancing != "weighted" or plan is None or plan.flags
                or plan.method not in SOLVER_METHODS or plan.version != self.confirmed_version
                or record is None or record.version != plan.version or len(record.values) < MIN_ROUNDS
                or any(d.held is not None and now < d.held_until for d in self.dips.values())):
            return None
        target = self._capacity_plan(live, pins)
        if target is None:
            return None
        fixed = {n: 0.0 for n in self.dips if n not in live} | {n: w for n, w in pins.items() if n in live}
        weights = apply_rails(target, previous=self._carried() or None, healthy={n for n in live if n not in pins},
                              min_weight=s.rails.min_weight, max_change=s.rails.max_weight_change, fixed=fixed)
        if moved(weights, plan.weights) < CHALLENGE_MOVE or self._explores(weights):
            return None
        if last is not None and not last.stale(plan.weights, weights, now, s.learning.window):
            return None
        note = (f"challenge: the capacity-proportional plan moves {moved(weights, plan.weights):.0%} of the traffic "
                f"from the solved plan v{plan.version} ({record.mean * 1e3:.1f}ms); measured against it")
        emitted = self._emit(weights, now, PlanMethod.CAPACITY_PROPORTIONAL, [note], flags=(PlanFlag.CHALLENGE,))
        if emitted is not None:
            self.guard.state.challenge = Challenge(dict(plan.weights), plan.version, dict(emitted.weights),
                                                   emitted.version, now)
        return emitted

    def _challenger_stays(self, now: float, live: list[str], pins: Mapping[str, float], reasons: Sequence[str],
                          notes: list[str]) -> bool:
        """Whether the challenger in force stays: while it is measured, and after it measured better until
        something happens, its caps move by ``CHALLENGE_MOVE`` or half a learning window passes. A
        decision that brings the solved plan back is said in ``notes``."""
        challenge = self.guard.state.challenge
        if challenge is None or challenge.won is False:
            return False
        in_force = self.plan is not None and self.plan.version == challenge.version
        if challenge.won is None:
            if reasons or not in_force:
                self.guard.state.challenge = None  # something happened: the trial says nothing
                return False
            cur, prev = self.guard.state.current, self.guard.state.previous
            won = self.guard.decide(self.settings.learning.confidence, GUARD_THRESHOLD, now)
            if won is None:
                return True
            assert cur is not None
            solved = f"v{prev.version} {prev.mean * 1e3:.1f}ms" if prev is not None else "not measured since"
            verdict = (f"challenge: capacity-proportional v{cur.version} measured {cur.mean * 1e3:.1f}ms, "
                       f"the solved plan {solved}")
            if won:
                self.events_log.append((now, f"{verdict}; the capacity-proportional plan stays"))
                return True
            notes.append(f"{verdict}; the solved plan is back")
            return False
        target = self._capacity_plan(live, pins)
        if (reasons or not in_force or target is None or moved(target, challenge.weights) >= CHALLENGE_MOVE
                or now - challenge.decided >= CHALLENGE_SPACING * self.settings.learning.window):
            self.guard.state.challenge = None
            return False
        return True

    def _note_drains(self, now: float, drained: set[str]) -> list[str]:
        """A DIP leaving the operator's drain comes back like a recovered one: slow start from
        ``rails.min_weight`` on its kept curve, never at once to its solved share."""
        reasons = []
        for name, dip in self.dips.items():
            if dip.drained and name not in drained:
                dip.returned_at = now
                self.detector.reset(name)
                reasons.append(f"undrained: {name} ramps up from {self.settings.rails.min_weight:g} (slow start)")
            elif name in drained and not dip.drained:
                reasons.append(f"drained: {name} set to 0 by the operator")
            dip.drained = name in drained
        return reasons

    def _rollback(self, now: float, live: list[str], pins: Mapping[str, float],
                  reasons: list[str]) -> WeightPlan | None:
        """The guard (:mod:`knapsack_lb.controller.guard`): restore the previous plan when the one in force
        measured significantly worse; the DIPs it had raised are held at their old weights for a while
        (released early when the comparison turns out to have spanned a traffic change or a DIP's own
        slowdown: :meth:`_released`)."""
        s = self.settings
        better = self.guard.verdict(s.learning.confidence, GUARD_THRESHOLD, s.measurement.trust_tolerance)
        current = self.guard.state.current
        if better is None or current is None:
            return None
        weights = {n: better.weights.get(n, 0.0) for n in live if n not in pins}
        mass = sum(weights.values())
        if mass <= 0:
            self.guard.forget()
            return None
        free = 1.0 - sum(w for n, w in pins.items() if n in live)
        weights = {n: w / mass * free for n, w in weights.items()}
        held = [n for n, w in weights.items() if current.weights.get(n, 0.0) > w]
        for name in held:
            self.dips[name].held, self.dips[name].held_until = weights[name], now + s.learning.window / 2
        self.guard.forget(Rollback(now, dict(weights), held))
        weights.update({n: w for n, w in pins.items() if n in live})
        note = (f"guard: plan v{current.version} measured {current.mean * 1e3:.1f}ms, v{better.version} "
                f"{better.mean * 1e3:.1f}ms (+-{2 * math.sqrt(current.variance + better.variance) * 1e3:.1f}); "
                f"restored v{better.version}'s weights")
        return self._emit(weights, now, PlanMethod.KEPT, [*reasons, note], flags=(PlanFlag.ROLLED_BACK,), force=True)

    def _emit(self, weights: Mapping[str, float], now: float, method: PlanMethod, reasons: Sequence[str],
              predicted: Mapping[str, float] | None = None, objective: float = math.nan,
              objective_kind: str = "mean", solve_seconds: float = 0.0, flags: Sequence[PlanFlag] = (),
              force: bool = False) -> WeightPlan | None:
        full = {n: max(0.0, float(weights.get(n, 0.0))) for n in self.dips}
        total = sum(full.values())
        if total <= 0:  # never an all-zero plan
            full = {n: 1 / len(full) for n in full}
            total = 1.0
        full = {n: w / total for n, w in full.items()}
        restated = self.plan is not None and _same_weights(self.plan.weights, full)
        if not force and not reasons and restated:
            return None
        if not reasons:  # every plan says why it exists
            reasons = [("slow start: the ramp's next step" if PlanFlag.SLOW_START in flags else
                        "curves updated from new rounds: re-solved" if self._curves_changed else
                        "the next step toward the solved plan (rails limit each change)")]
        self.version += 1
        plan = WeightPlan(
            vip=self.vip, weights=full, predicted_latency=dict(predicted or {}), objective=objective,
            objective_kind=objective_kind, method=method, solve_seconds=solve_seconds, version=self.version,
            computed_at=now, reasons=tuple(reasons), flags=tuple(flags),
        )
        self.plan = plan
        self._curves_changed = False
        return plan

    def _no_live_dip(self, now: float, reasons: list[str]) -> WeightPlan | None:
        note = "no live DIP (all failed, ejected or drained): keeping the last plan, never an all-zero plan"
        if self.plan is not None:
            if reasons:
                self._pending_reasons = []
                return self._emit(self.plan.weights, now, PlanMethod.KEPT, [*reasons, note],
                                  flags=(PlanFlag.NO_LIVE_DIP,), force=True)
            return None
        return self._emit({n: 1.0 for n in self.dips}, now, PlanMethod.EQUAL_SPLIT, [*reasons, note],
                          flags=(PlanFlag.NO_LIVE_DIP,))

    def _awaiting(self, now: float) -> bool:
        if not self.scheduled:
            return False
        waiting = [n for n in self.scheduled if n in self.dips and not self.dips[n].failed]
        timeout = self.drain_time + 3 * self.settings.loop.interval
        return bool(waiting) and now - self.applied_at < timeout

    def _measurement_round(
        self, now: float, live: list[str], measuring: list[str], pins: Mapping[str, float], reasons: list[str]
    ) -> WeightPlan | None:
        if self._awaiting(now):
            self._pending_reasons = reasons
            return None
        self.scheduled = {}
        equal = self._equal_share()
        zero_first = not self._cold_start or self.plan is not None
        requests = []
        for name in measuring:
            m = self.dips[name].measuring
            assert m is not None
            wanted = m.wanted(equal, zero_first=zero_first)
            if wanted is not None:
                requests.append(MeasurementRequest(name, wanted, m.priority, m.enqueued_at))
        if self._drain_due(now) and self.plan is not None:
            for i, req in enumerate(requests):
                if req.weight == 0 and self._carried().get(req.dip, 0.0) > 0:
                    self._drain = DrainProbe(req.dip, now)
                    requests[i] = MeasurementRequest(req.dip, 0.0, -1, req.enqueued_at)
                    break
        if self._drain is not None:
            requests = [MeasurementRequest(r.dip, 0.0, -1, r.enqueued_at) if r.dip == self._drain.dip else r
                        for r in requests]
        pinned = {n: w for n, w in pins.items() if n in live}
        movable = [n for n in live if n not in pinned]
        budget = 1.0 - sum(pinned.values()) if pinned else 1.0
        finished = [n for n in movable if self.dips[n].ready and self.dips[n].measuring is None]
        others = [n for n in movable if n not in finished and n not in measuring]
        max_zero = max(1, math.floor(self.settings.measurement.zero_batch_share * len(live)))
        solve_remainder = None
        if finished:
            def solve_remainder(dips: Sequence[str], total: float) -> Mapping[str, float]:
                objective = self.settings.solver.objective
                first = self._solve(list(dips), total, {}, objective).weights
                return self._hold_ramps(list(dips), total, {}, objective, first, self._ramp_caps(now, first, dips))
        capacity = {n: self._capacity_estimate(n, equal) for n in movable}
        by_capacity = self.settings.measurement.remainder == "capacity"
        schedule = schedule_round(requests, finished, others, solve_remainder, max_zero=max_zero,
                                  capacity=capacity if by_capacity else None, fallback_capacity=capacity,
                                  budget=budget)
        self.scheduled = dict(schedule.scheduled)
        self.measurement_rounds += 1
        note = (f"measurement round {self.measurement_rounds}: {len(schedule.scheduled)} DIPs at Algorithm 1 weights, "
                f"{len(schedule.deferred)} deferred; remainder {schedule.remainder:.3f} by {schedule.remainder_method}")
        weights = {n: schedule.weights.get(n, 0.0) for n in self.dips}
        if schedule.remainder_method != "solver":  # the solver already held the ramps (_hold_ramps)
            self._slow_start_measurement(now, weights, schedule.scheduled, movable)
        weights.update(pinned)
        return self._emit(weights, now, PlanMethod.MEASUREMENT,
                          [*reasons, note] + ([schedule.note] if schedule.note else []), flags=(PlanFlag.MEASURING,),
                          force=True)

    def _hold_disputed_ramps(self, now: float, trusted: Mapping[str, Measurement]) -> list[str]:
        """Ours: a ramp climbs on evidence, not on time alone. A returning DIP whose newest round sits
        significantly above its kept curve (:func:`change_direction` on that round alone) holds its
        ramp for an interval: it may have come back on a slower host, and the next step would raise it
        on a curve its rounds dispute. A second such round is the capacity change the learner or the
        detector acts on; a time-only ramp (HAProxy's and Envoy's slow start) would meanwhile have
        finished at the old curve's weight. The round is judged on its own noise (at least its DIP's
        pooled spread of one probe), not scaled by the fit's dispersion: the rounds that dispute a kept
        curve are the ones that inflate it (25x on the fluid dynamics' return phase), and a hold costs
        one interval of the ramp, not the curve. A DIP back from a failure then forgets its rounds from
        before it: a curve fitted on both hosts' rounds kept its old cap (two capacities mixed, a
        dispersion of 2.6), and the ramp's next step took a DIP back at 0.75 of its capacity to 100 %."""
        s = self.settings
        reasons = []
        for name, m in trusted.items():
            dip = self.dips.get(name)
            if dip is None or dip.returned_at is None or not dip.ready or dip.failed or dip.measuring is not None:
                continue
            evidence = round_evidence(m, self._weight_of(name, m))
            if evidence is None or evidence.weight <= 0:
                continue
            if change_direction([*dip.evidence, evidence], dip.curve_obj(), z=s.learning.confidence,
                                threshold=s.dynamics.capacity_change_threshold,
                                failure_share=s.measurement.drop_failure_share, spread=self.round_spread) == 1:
                dip.returned_at = min(now, dip.returned_at + s.loop.interval)
                dip.ramp_held_at = now
                dip.evidence = dip.rounds_since_back()
                reasons.append(f"slow start held: {name} measured {evidence.mean * 1e3:.1f}ms at weight "
                               f"{evidence.weight:.3f}, above its curve")
        return reasons

    def _ramp_caps(self, now: float, solved: Mapping[str, float], live: Sequence[str]) -> dict[str, float]:
        """Slow start: a returning DIP's cap rises linearly from ``min_weight`` to its solved weight; in a
        step that held its ramp (:meth:`_hold_disputed_ramps`) it is not raised above what it carries.
        Holding the ramp's clock alone still raised it when its solved share grew (the stretch for the
        other returning DIP's hold): a DIP back at 0.75 of its capacity went on from 93 % to 101 % busy
        on the step its 93 % round was seen above its curve."""
        s = self.settings.rails
        ramp: dict[str, float] = {}
        if s.slow_start > 0:
            carried = self._carried()
            for name in live:
                back = self.dips[name].returned_at
                if back is not None and now - back < s.slow_start:
                    ramp[name] = s.min_weight + solved.get(name, 0.0) * (now - back) / s.slow_start
                    if self.dips[name].ramp_held_at == now:
                        ramp[name] = min(ramp[name], max(carried.get(name, 0.0), s.min_weight))
                elif back is not None:
                    self.dips[name].returned_at = None
        return ramp

    def _hold_ramps(self, names: list[str], total: float, pins: Mapping[str, float], objective: str,
                    solved: Mapping[str, float], ramp: Mapping[str, float],
                    limits: Mapping[str, float] | None = None) -> dict[str, float]:
        """Slow start through the solver: a returning DIP whose ``solved`` share exceeds its ``ramp``
        cap (:meth:`_ramp_caps` of that solution) is pinned at the cap and the solver places the rest,
        so every other DIP stays within its curve's cap (``w_max``); handing the excess out in
        proportion to the weights instead (as :meth:`_slow_start_measurement` must when no solver
        is at hand) can push a large DIP past its ``w_max``. Raises what the solver raises."""
        over = {n: cap for n, cap in ramp.items() if solved.get(n, 0.0) > cap and n not in pins}
        if not over:
            return dict(solved)
        return dict(self._solve(names, total, {**pins, **over}, objective, limits).weights)

    def _stretched(self, limits: Mapping[str, float], names: Sequence[str],
                   need: float) -> tuple[dict[str, float], str]:
        """``limits`` widened for ``names`` until their caps (less the rails' headroom) carry ``need``
        with ``STRETCH_FREEDOM`` to spare, each still below its curve's asymptote, and how.

        First by confidence, when every DIP has a fit to relax: the caps at the most confident of
        the learner's looser levels (``DipState.relaxed``) that carry it. A level moves each DIP by
        its own uncertainty: one seen at its knee stays near it and one seen far below its knee
        takes the room, where one common factor gave every DIP the same share of room and lifted a
        DIP just backed off from an overload straight back to the weight that overloaded it (on the
        live demo a DIP that dropped at 0.172, its cap cut to 0.123, was stretched to 0.135-0.169
        and ran 100 % busy).
        Else every cap of the loosest level is stretched by one factor: no level carries it, or the
        caps have no confidence scale to compare (Algorithm 1's measured caps; a DIP seen at one
        weight or overloaded at every weight it was seen at). Measured against giving such a DIP
        its cap at every level, which lost on the fluid dynamics benchmark (docs/decisions/controller.md)."""
        headroom = 1 - self.settings.rails.overload_headroom
        target = need * STRETCH_FREEDOM
        levels = min((len(self.dips[n].relaxed) for n in names), default=0)
        wider = dict(limits)
        for level in range(levels):
            wider = {**limits, **{n: self._limit(n, max(limits[n], self.dips[n].relaxed[level])) for n in names}}
            if sum(wider[n] for n in names) * headroom >= target:
                return wider, f"relaxed to their {RELAXED_LEVELS[level]:g}-z confidence bounds"
        room = sum(wider[n] for n in names) * headroom
        stretch = target / max(room, 1e-12)
        loosest = f"at their {RELAXED_LEVELS[levels - 1]:g}-z bounds " if levels else ""
        return ({**wider, **{n: self._limit(n, wider[n] * stretch) for n in names}},
                f"{loosest}stretched x{stretch:.3f}")

    def _ramps_leave_no_room(self, names: list[str], pins: Mapping[str, float], solved: Mapping[str, float],
                             ramp: Mapping[str, float], limits: Mapping[str, float], held: Mapping[str, float],
                             spare: float) -> bool:
        """Whether slow start holds a returning DIP below its solved share while the others' caps (the
        learner's, stretched or not) carry the rest, but with less room than a stretch leaves the solver
        (``STRETCH_FREEDOM``): the solver would then have to fill every other cap, the one of a DIP seen at
        its knee too. The stretch counted the returning DIP's room, which its ramp does not let it take;
        on the live day-2 tour a drain filled a 0.4-capacity DIP to its asymptote that way (102 % busy)."""
        if not self._estimating or not any(solved.get(n, 0.0) > cap for n, cap in ramp.items() if n not in pins):
            return False
        headroom = 1 - self.settings.rails.overload_headroom
        room = sum(limits[n] for n in names if n not in held and n not in pins) * headroom
        return spare - 1e-9 <= room < spare * STRETCH_FREEDOM - 1e-9  # less: over capacity, which the solver says

    def _widen_for_ramps(self, names: list[str], total: float, pins: Mapping[str, float], objective: str,
                         solved: Mapping[str, float], ramp: Mapping[str, float], limits: Mapping[str, float],
                         held: Mapping[str, float], spare: float) -> tuple[dict[str, float], str] | None:
        """The learner's caps are confidence bounds, not capacities: when the others' caps cannot carry
        what the ramps hold back, they are widened as when the caps do not cover the VIP
        (:meth:`_stretched`), and the solver places the rest by the curves; spreading it
        in proportion to the caps instead puts most on a DIP whose knee was never seen (a small DIP
        in the day-2 tour went to 107 % that way). ``(weights, how)``, or None for Algorithm 1's
        measured caps or when even the stretched caps cannot carry it."""
        others = [n for n in names if n not in held and n not in pins]
        room = sum(limits[n] for n in others)
        if not self._estimating or not others or room <= 0:
            return None
        wider, how = self._stretched(limits, others, spare)
        try:
            return self._hold_ramps(names, total, pins, objective, solved, ramp, wider), how
        except (KnapsackLBError, ValueError, ArithmeticError):
            return None

    def _slow_start_measurement(self, now: float, weights: dict[str, float], scheduled: Mapping[str, float],
                                live: Sequence[str]) -> None:
        """Slow start holds in measurement rounds too: a returning DIP's share of a remainder that was
        not solved (spread by capacity or split equally) is capped by its ramp and the excess goes to
        the other unscheduled DIPs by their weights."""
        ramp = {n: cap for n, cap in self._ramp_caps(now, weights, live).items() if n not in scheduled}
        excess = sum(max(0.0, weights[n] - cap) for n, cap in ramp.items())
        takers = {n: w for n, w in weights.items() if n not in scheduled and n not in ramp and w > 0}
        if excess <= 0 or not takers:
            return
        for name, cap in ramp.items():
            weights[name] = min(weights[name], cap)
        mass = sum(takers.values())
        for name, w in takers.items():
            weights[name] = w + excess * w / mass

    def _capacity_estimate(self, name: str, equal: float) -> float:
        """A DIP's estimated capacity as a weight: ``w_max`` of its curve, else the largest weight it
        served without a drop while measuring, never below the equal share until it dropped there."""
        dip = self.dips[name]
        if dip.ready and dip.measuring is None:
            return dip.w_max
        m = dip.measuring
        if m is None:
            return equal
        if m.w_drop is not None and m.w_drop <= equal:
            return max(m.w_max, 0.5 * m.w_drop)
        return max(m.w_max, equal)

    def _solve(self, names: list[str], total: float, pins: Mapping[str, float], objective: str,
               limits: Mapping[str, float] | None = None) -> SolveResult:
        """The solver on ``names``' curves (caps ``w_max``, or ``limits``), their weights summing to ``total``;
        behind a least-connections LB the DIPs' relative capacities instead (:meth:`_relative_capacities`)."""
        if self._balancing == "least_connections":
            return self._relative_capacities(names, total, pins)
        s = self.settings
        entries = []
        for name in names:
            dip = self.dips[name]
            curve = dip.curve_obj()
            cap = (dip.w_max if limits is None else limits[name]) * (1 - s.rails.overload_headroom)
            cap = min(cap, curve.upper_bound * (1 - 1e-3))  # infinite from there on: stay below it
            entries.append((name, curve, cap, 0.0, pins.get(name)))
        request = SolveRequest(tuple(entries), total, objective, s.solver.method, s.solver.levels, s.solver.units,
                               s.solver.time_limit)
        return self.solver(request)

    def _relative_capacities(self, names: list[str], total: float, pins: Mapping[str, float]) -> SolveResult:
        """Weights for a least-connections LB (:mod:`~knapsack_lb.controller.least_connections`): the
        unpinned DIPs' capacities between the learner's confidence bounds (``w_max`` and ``ceiling``),
        at the operator's split (their start shares; one of a DIP slower than the DIPs weighted alike
        scaled down by its speed, :func:`slow_hosts`) wherever the bounds allow it. The caps that bound
        the solver's shares do not apply: the LB, not the weight, decides a DIP's share, and a DIP that
        slows down holds more connections and gets fewer requests. Raises what
        :func:`capacity_split` raises (no capacity to split by)."""
        pinned = sum(pins.get(n, 0.0) for n in names)
        unpinned = [n for n in names if n not in pins]
        slower = slow_hosts(self._peer_latencies(unpinned), self.settings.learning.confidence)
        prior = {n: self.dips[n].start_share for n in unpinned}
        prior.update({n: share * slower[n] for n, share in prior.items() if share and n in slower})
        free = {n: CapacityInterval(self.dips[n].w_max, max(self.dips[n].ceiling, self.dips[n].w_max, 1e-9), prior[n])
                for n in unpinned}
        weights = {n: pins[n] for n in names if n in pins}
        split = capacity_split(free, total - pinned) if free else None
        if split is not None:
            weights.update(split.weights)
        predicted = {n: self.dips[n].curve_obj().latency(w) for n, w in weights.items()}
        finite = [w * predicted[n] for n, w in weights.items() if math.isfinite(predicted[n])]
        note = split.describe() if split is not None else ""
        if slower:
            note += "; slower than the DIPs weighted alike: " + ", ".join(
                f"{n} x{f:.2f}" for n, f in sorted(slower.items()))
        return SolveResult(weights, predicted, sum(finite) / max(total, 1e-12), PlanMethod.RELATIVE_CAPACITY, 0.0,
                           note)

    def _peer_latencies(self, names: Sequence[str]) -> dict[str, PeerLatency]:
        """Each of ``names`` with an operator share and a successful round: its rounds pooled, for
        :func:`slow_hosts`."""
        out = {}
        for name in names:
            dip = self.dips[name]
            if not dip.start_share:
                continue
            try:
                rounds = pooled(dip.evidence)
            except ValueError:  # no successful probe yet
                continue
            out[name] = PeerLatency(dip.start_share, rounds.mean, rounds.stderr)
        return out

    def _limit(self, name: str, cap: float) -> float:
        """The most the solver can give a DIP: ``cap``, below its curve's asymptote and the share its light
        requests say it saturates at."""
        dip = self.dips[name]
        saturation = dip.saturation_share if dip.saturation_share is not None else math.inf
        return min(cap, dip.curve_obj().upper_bound * (1 - 1e-3), saturation)

    def _read_light(self, trusted: Mapping[str, Measurement]) -> None:
        """Each DIP's saturation share from its light requests (:mod:`knapsack_lb.controller.light_rounds`):
        its newest :data:`LIGHT_POOL` rounds since its last change (its evidence's oldest round) at the share
        it carried last (rounds at no share left out), read in the unit the waits fit, with its fitted
        unloaded latency for a worker pool's. None where they tell nothing: none sent, too few answered, or
        no share carried since its last change."""
        tolerance = self.settings.measurement.trust_tolerance
        for name, m in trusted.items():
            evidence = round_evidence(m, self._weight_of(name, m)) if name in self.dips else None
            # at the share it carried, as its other evidence; a round that carried nothing says nothing of the
            # share it saturates at, and would hide the rounds that did
            if evidence is not None and evidence.weight > 0 and m.light_latencies:
                kept = self.light_rounds.get(name, [])
                self.light_rounds[name] = [*kept, (m.time, evidence.weight, m.light_latencies)]
        for name, dip in self.dips.items():
            rounds = self.light_rounds.get(name, [])
            dip.saturation_share = None
            if not rounds or dip.failed or not dip.evidence:
                continue
            share = rounds[-1][1]
            since = dip.evidence[0].time
            rounds = [r for r in rounds if r[0] >= since and same_weight(r[1], share, tolerance)][-LIGHT_POOL:]
            self.light_rounds[name] = rounds
            pooled = light_round(latencies for _, _, latencies in rounds)
            if pooled is not None:
                z = self.settings.learning.confidence
                load = light_load(pooled, dip.l0, z)
                dip.saturation_share = load.saturation_share(share)
                unit = dip.l0 or light_latency(dip.evidence, z)
                if math.isfinite(unit) and unit > 0:
                    self.light_costs[name] = min(1.0, pooled.base / unit)

    def _solve_plan(
        self, now: float, config: VipConfig | None, live: list[str], pins: Mapping[str, float], drained: set[str],
        reasons: list[str],
    ) -> WeightPlan | None:
        s = self.settings
        self._balancing = config.balancing if config is not None else "weighted"
        ready = [n for n in live if self.dips[n].ready]
        # dropped at every weight tried (with no curve anywhere the split is over every live DIP)
        starved = [n for n in live if not self.dips[n].ready] if ready else []
        objective = self._objective(config)
        flags: list[PlanFlag] = []
        fixed: dict[str, float] = {n: 0.0 for n in self.dips if n not in live}
        fixed.update({n: w for n, w in pins.items() if n in self.dips})
        pinned = sum(pins.get(n, 0.0) for n in ready)

        def capacity(limits: Mapping[str, float]) -> float:
            return pinned + sum(limits[n] * (1 - s.rails.overload_headroom) for n in ready if n not in pins)

        limits = {n: self._limit(n, self.dips[n].w_max) for n in ready}
        cap_sum = capacity(limits)
        free_total = 1.0 - sum(w for n, w in pins.items() if n in self.dips and n not in ready)
        if self._balancing == "least_connections":
            cap_sum = max(cap_sum, free_total)  # the caps bound shares, which the LB sets, not the weights
        if ready and cap_sum < free_total - 1e-9:
            # the pool needs more than the DIPs' caps: widened with room for the solver to choose
            limits, how = self._stretched(limits, [n for n in limits if n not in pins], free_total - pinned)
            if self._curves_changed:
                reasons = [*reasons, f"the DIPs' caps sum to {cap_sum:.3f} < {free_total:.3f}: {how}"]
            cap_sum = capacity(limits)
        method = ""
        note = ""  # the solver's word on how, for the reasons
        predicted: dict[str, float] = {}
        objective_value = math.nan
        seconds = 0.0
        start = ""  # why the plan is the LB's weights or an equal split: nothing learned yet
        if not ready:
            # the operator's weights are evidence too (weights by VM size, say): nothing learned yet is no reason
            # to move the LB away from them, unless it carries a live DIP at 0 (never measured there)
            carried = {n: self.in_force.get(n, 0.0) for n in live} if self.in_force else {}
            if carried and min(carried.values()) > 0:
                solved = {n: w / sum(carried.values()) for n, w in carried.items()}
                method = PlanMethod.KEPT
                start = "no curve is usable yet: the weights the LB carries, over the live DIPs"
            else:
                solved = {n: 1.0 / len(live) for n in live}
                method = PlanMethod.EQUAL_SPLIT
                start = "no curve is usable yet: equal split over live DIPs"
        elif cap_sum < free_total - 1e-9:
            solved = capacity_proportional(limits)
            method = PlanMethod.CAPACITY_PROPORTIONAL
            flags.append(PlanFlag.OVER_CAPACITY)
            reasons = [*reasons, f"over capacity: the DIPs' w_max sum to {cap_sum:.3f} < {free_total:.3f}; traffic "
                       "spread in proportion to estimated capacity"]
        else:
            try:
                key = (tuple(ready), tuple(sorted(pins.items())), objective, free_total, self._balancing,
                       self._curves_version)
                if self._solve_cache is not None and self._solve_cache[0] == key:
                    result = self._solve_cache[1]
                else:
                    result = self._solve(ready, free_total, pins, objective, limits)
                    self._solve_cache = (key, result)
                solved, predicted, objective_value = result.weights, result.predicted_latency, result.objective
                method, seconds, note = result.method, result.seconds, result.note
            except (KnapsackLBError, ValueError, ArithmeticError) as exc:
                if self.plan is None or not s.rails.keep_last_plan_on_error:
                    solved = capacity_proportional({n: self.dips[n].w_max for n in ready})
                    method = PlanMethod.CAPACITY_PROPORTIONAL
                else:
                    kept = {n: w for n, w in self.plan.weights.items() if n in live}
                    mass = sum(kept.values())
                    solved = {n: w / mass for n, w in kept.items()} if mass > 0 else kept
                    method = PlanMethod.KEPT
                flags.append(PlanFlag.SOLVER_FAILED)
                fallback = "kept the last good plan" if method is PlanMethod.KEPT else "capacity-proportional split"
                reasons = [*reasons, f"solver failed ({type(exc).__name__}: {exc}); {fallback}"]
                if method is PlanMethod.KEPT and sum(solved.values()) <= 0:
                    solved = capacity_proportional({n: self.dips[n].w_max for n in ready})
                    method = PlanMethod.CAPACITY_PROPORTIONAL
        ramp: dict[str, float] | None = None
        if method not in (PlanMethod.EQUAL_SPLIT, PlanMethod.CAPACITY_PROPORTIONAL, PlanMethod.KEPT):
            ramp = self._ramp_caps(now, solved, ready)
            held = {n: min(solved.get(n, 0.0), cap) for n, cap in ramp.items()}
            spare = free_total - sum(held.values()) - sum(w for n, w in pins.items() if n in ready)
            cramped = self._ramps_leave_no_room(ready, pins, solved, ramp, limits, held, spare)
            widened = (self._widen_for_ramps(ready, free_total, pins, objective, solved, ramp, limits, held, spare)
                       if cramped else None)
            try:
                if widened is None:
                    solved = self._hold_ramps(ready, free_total, pins, objective, solved, ramp, limits)
                else:
                    solved, how = widened
                    reasons = [*reasons, f"returning DIPs ramp up: the others' caps {how}, placed by their curves"]
            except (KnapsackLBError, ValueError, ArithmeticError):
                # the others' w_max cannot carry what the ramps hold back: over capacity until they are up (widened
                # already when cramped, and it failed)
                if not cramped:
                    widened = self._widen_for_ramps(ready, free_total, pins, objective, solved, ramp, limits, held,
                                                    spare)
                if widened is not None:
                    solved, how = widened
                    reasons = [*reasons, f"over capacity while returning DIPs ramp up: the others' caps {how}, "
                               "placed by their curves"]
                else:
                    rest = capacity_proportional({n: self.dips[n].w_max for n in ready
                                                  if n not in held and n not in pins})
                    solved = {**{n: w * spare for n, w in rest.items()}, **held,
                              **{n: w for n, w in pins.items() if n in ready}}
                    reasons = [*reasons, "over capacity while returning DIPs ramp up: the others' w_max cannot "
                               "carry the rest; spread in proportion to estimated capacity"]
                flags.append(PlanFlag.OVER_CAPACITY)
        solved = {n: solved.get(n, 0.0) for n in self.dips}
        for name in starved:
            solved[name] = 0.0
        healthy = {n for n in live if n not in pins}
        if ramp is None:
            ramp = self._ramp_caps(now, solved, live)
        if ramp:
            flags.append(PlanFlag.SLOW_START)
            if (not reasons and not self._curves_changed and self.plan is not None
                    and now < self.applied_at + self.drain_time + s.loop.interval - 1e-9):
                return None  # ours: the ramp steps once its last step was observed (rounds are stale until then)
        previous = None if self.plan is None or PlanFlag.MEASURING in self.plan.flags else self._carried()
        if self._estimating and previous is None:
            previous = self._carried() or {n: 1.0 / len(live) for n in live}  # what the LB carries at the start
        weights = apply_rails(
            solved, previous=previous, healthy=healthy, min_weight=s.rails.min_weight,
            max_change=s.rails.max_weight_change, ramp_caps=ramp, fixed=fixed,
        )
        if not reasons and not flags and self.plan is not None and (self._estimating or start):
            # refitted curves that move no weight noticeably, or nothing learned and nothing left to move (the
            # start restated every tick until a curve is usable): the LB keeps the plan it has
            epsilon = PLAN_CHANGE_EPSILON if start else LEARNED_CHANGE
            if _same_weights(self.plan.weights, {n: weights.get(n, 0.0) for n in self.dips}, epsilon) \
                    and not self._explores(weights):
                return None
        if start:
            reasons = [*reasons, start]
        if reasons or self._curves_changed or self.plan is None:
            models = sorted({self.dips[n].model for n in ready})
            how = f"solved {len(ready)} curves ({', '.join(models) or 'none'}) with {method}"
            reasons = [*reasons, f"{how}: {note}" if note else how]
        for name in weights:
            if name not in predicted and self.dips[name].ready:
                predicted[name] = self.dips[name].curve_obj().latency(weights[name])
        return self._emit(weights, now, method, reasons, predicted, objective_value, objective, seconds, flags)
