"""The one control loop: source -> step -> sink -> confirmation (KnapsackLB paper, section 5).

Every environment runs this loop around the pure :meth:`VipController.step`; only its two ends
differ, the way SimPy runs the same process code on virtual or real time:

* a :class:`Source` says what the probes measured and how the operator configured the VIP:
  the latency store (live, :class:`StoreSource`), the simulator's probes, the fluid model, a test fake;
* a :class:`Sink` is the load balancer: an adapter (live, in :mod:`knapsack_lb.service`), a
  simulated LB that quantises exactly like the target LB's adapter and can be told to fail
  (:class:`QuantisingSink`), the fluid model, a recorder.

One :meth:`ControlLoop.tick`:

1. read the source (rounds, configuration, re-measure requests); a paused VIP is left alone;
2. step the controller; in dry run it steps on no rounds at all, so it plans from what it knows
   and learns nothing from weights that never reached the LB;
3. hand a new - or still pending - plan to the sink (unless dry run) and record what the LB
   reports: the controller learns only the split the LB confirmed (:meth:`VipController.confirm`,
   with the time it was confirmed, which starts the drain clock), a refused plan is recorded as
   refused (:meth:`VipController.refuse`) and the last confirmed weights stay in force;
   Where the sink counts traffic (``Sink.traffic``, e.g. HAProxy's ``show stat``), each round
   taken since the last tick is stamped with its DIP's real share of the VIP's traffic over that
   time (:class:`ShareMeter`): at layer 4 the weights move new connections only, so the share a DIP
   carries lags its weight by the connections' lifetimes, and the learner places each round at the
   share it really carried. Where the sink times the client requests too (``Sink.timings``: a
   layer-7 LB), what it timed of each DIP is pooled into that DIP's round
   (:func:`knapsack_lb.rounds.pool_lb_timings`);
4. with no plan to push, read the LB back and re-apply the confirmed plan when the LB carries
   something else (an operator edited it, a reload lost runtime weights);
5. persist the plan, the curves, the state and the confirmed split (:class:`StateSink`), and the
   probe budget: how many requests each DIP's probes get next round
   (:meth:`VipController.probe_budget`; not in dry run or while paused, nor with the ``uniform``
   allocation: then the budget stored last expires and the probes send ``requests_per_round``).

Sources and sinks are asynchronous: the live ones wait on Redis and on the LB. The simulator and
the fluid model never wait; they drive the same coroutine to completion with :func:`run_now`.
How it fails: a source or sink error propagates to the caller (the service logs it and retries the
VIP on its next tick); a sink that cannot be read is not a drift.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

from knapsack_lb.controller.core import VipController
from knapsack_lb.controller.traffic import RateReading
from knapsack_lb.errors import KnapsackLBError, StalePlanError, short_repr
from knapsack_lb.model import ApplyResult, Measurement, TimedRequests, Traffic, VipConfig, WeightPlan
from knapsack_lb.quantise import quantiser
from knapsack_lb.rounds import pool_lb_timings
from knapsack_lb.store import InForce, LatencyStore

log = logging.getLogger(__name__)

T = TypeVar("T")
DRIFT_TOLERANCE = 0.01  # total variation distance between the confirmed split and the LB's before re-applying
APPLY_FAILURES = "apply_failures"  # counters kept in the stored controller state (the API's metrics)
APPLY_WARNINGS = "apply_warnings"
APPLY_ERROR = "apply_error"  # the reason the last apply failed, "" when it succeeded
BUDGET_TTL_INTERVALS = 3  # a stored probe budget lasts this many intervals: a dead controller's goes back to uniform


def run_now(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never waits (a simulated source and sink) to its end, synchronously."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    coroutine.close()
    raise RuntimeError("run_now: the coroutine waited; use an event loop for sources and sinks that wait")


def split_distance(a: Mapping[str, float], b: Mapping[str, float]) -> float:
    """Total variation distance between two splits: the share of traffic that goes elsewhere."""
    names = set(a) | set(b)
    return 0.5 * sum(abs(a.get(n, 0.0) - b.get(n, 0.0)) for n in names)


def weight_changes(before: Mapping[str, float], after: Mapping[str, float], top: int = 4) -> str:
    """The largest moves from one split to another, e.g. ``"b 0.250->0.400, c 0.250->0.100"``."""
    names = sorted(set(before) | set(after), key=lambda n: -abs(after.get(n, 0.0) - before.get(n, 0.0)))
    moved = [n for n in names if abs(after.get(n, 0.0) - before.get(n, 0.0)) >= 5e-4][:top]
    return ", ".join(f"{n} {before.get(n, 0.0):.3f}->{after.get(n, 0.0):.3f}" for n in moved) or "no change"


@dataclass(frozen=True)
class Observation:
    """What a source has for one tick: the newest probe round per DIP, the VIP's configuration
    (with the operator's overrides) and the DIPs the operator asked to re-measure."""

    rounds: Mapping[str, Measurement]
    config: VipConfig
    remeasure: frozenset[str] = frozenset()


class Source(Protocol):
    """Where rounds and configuration come from. ``None``: the VIP is gone."""

    async def observe(self, now: float) -> Observation | None: ...


class Sink(Protocol):
    """The load balancer. ``apply`` is all or nothing and never raises for an unreachable LB;
    ``read`` returns the split the LB carries (fractions by DIP), ``None`` when it cannot be read."""

    async def apply(self, plan: WeightPlan) -> ApplyResult: ...

    async def read(self) -> Mapping[str, float] | None: ...

    # optional: ``async def traffic(self) -> Traffic | None`` - what the LB counted per DIP so far
    # optional: ``async def timings(self) -> Mapping[str, TimedRequests] | None`` - the client requests
    # the LB timed per DIP since it was last asked (None: it times none)


READS_KEPT = 4  # counter reads a round's share may span: the newest and the three before it


@dataclass
class ShareMeter:
    """Each DIP's share of the VIP's traffic between reads of the LB's counters (one read a tick)."""

    reads: list[tuple[float, Traffic]] = field(default_factory=list)  # the newest ``READS_KEPT``, oldest first

    def update(self, traffic: Traffic | None, now: float) -> None:
        """Take the read at ``now``. A missing read, or a counter of another kind, starts the history again."""
        if traffic is None or (self.reads and self.reads[-1][1].kind != traffic.kind):
            self.reads = []
        if traffic is not None:
            self.reads = [*self.reads, (now, traffic)][-READS_KEPT:]

    def windows(self) -> list[tuple[float, dict[str, float] | None]]:
        """For each kept read before the newest, newest first: when it was taken, and each DIP's share
        of what the LB counted from it to the newest read (None: nothing counted, or a counter went
        down - the LB restarted its counting)."""
        if not self.reads:
            return []
        newest = self.reads[-1][1]
        return [(t, None if (counted := _counted(base, newest)) is None else _shares(counted))
                for t, base in reversed(self.reads[:-1])]

    def latest(self) -> RateReading | None:
        """What the LB counted per second between the last two reads (of the newest read's kind),
        stamped with the newest: when something was counted between them (no counter went down)."""
        if len(self.reads) < 2:
            return None
        (since, previous), (now, newest) = self.reads[-2:]
        counted = _counted(previous, newest)
        return None if counted is None or now <= since else RateReading(now, sum(counted.values()) / (now - since),
                                                                          now - since, newest.kind)

    @property
    def rate(self) -> float | None:
        """The VIP's requests per second between the last two reads (:meth:`latest`), where the LB counts requests."""
        latest = self.latest()
        return None if latest is None or not latest.counts_requests else latest.rate

    def reading(self, now: float) -> RateReading | None:
        """The VIP's counted rate read at ``now`` (:meth:`latest`), when the counters were read then."""
        latest = self.latest()
        return latest if latest is not None and latest.time == now else None


def _counted(base: Traffic, newest: Traffic) -> dict[str, float] | None:
    """What the LB counted per DIP from ``base`` to ``newest``; None when nothing was, or a counter went down."""
    deltas = {n: c - base.counters.get(n, 0.0) for n, c in newest.counters.items()}
    return None if sum(deltas.values()) <= 0 or any(d < 0 for d in deltas.values()) else deltas


def _shares(counted: Mapping[str, float]) -> dict[str, float]:
    total = sum(counted.values())
    return {n: d / total for n, d in counted.items()}


def with_shares(rounds: Mapping[str, Measurement], meter: ShareMeter) -> dict[str, Measurement]:
    """``rounds`` stamped with their DIP's share over the counters' window that holds them, unless the
    prober already did: from the newest read taken before the round started to the newest read
    (:meth:`ShareMeter.windows`); none when no kept read is that old.

    A probe round is stamped with the time it started and is read at the first tick after it ended:
    its requests fall between two consecutive reads only when it ran within one tick, so a round that
    started before the previous read takes the share over both windows."""
    windows = meter.windows()
    out = {}
    for name, m in rounds.items():
        shares = next((known for since, known in windows if since < m.time), None) if m.share is None else None
        out[name] = replace(m, share=min(1.0, max(0.0, shares[name]))) if shares is not None and name in shares else m
    return out


class StateSink(Protocol):
    """Where the loop persists what it decided (the latency store; the lab may keep nothing)."""

    async def put_plan(self, plan: WeightPlan) -> None: ...

    async def put_curves(self, vip: str, curves: Any, replace: bool = False) -> None: ...

    async def put_controller_state(self, vip: str, state: Mapping[str, Any]) -> None: ...

    async def put_in_force(self, vip: str, in_force: InForce) -> None: ...

    async def put_probe_budget(self, vip: str, budget: Mapping[str, int], ttl: float) -> None: ...

    async def current_plan(self, vip: str) -> WeightPlan | None: ...


@dataclass
class TickOutcome:
    """What one tick did (for logs, status, tests and the lab's reports)."""

    vip: str
    plan: WeightPlan | None = None
    applied: ApplyResult | None = None
    pushed: bool = False
    reapplied: bool = False
    skipped: str = ""
    error: str = ""
    round_time: float | None = None  # time of the newest probe round the step saw (None: no round)


@dataclass
class ControlLoop:
    """One VIP's control loop; see the module docstring. ``sinks`` gives the load balancer of the
    VIP as configured now (the operator may select another; ``None``: it selects none; use
    :func:`fixed` for one sink); ``clock`` gives the confirmation time
    (the loop's ``now`` plus however long the LB took); ``read_at_start`` reads the LB before the
    first step so the controller starts from what it really carries (the operator's weights, or
    anything a previous controller left; the simulator's LB starts on the scenario's weights)."""

    controller: VipController
    source: Source
    sinks: Callable[[VipConfig], Sink | None]
    clock: Callable[[], float]
    state: StateSink | None = None
    read_at_start: bool = False
    counters: dict[str, int] = field(default_factory=dict)
    on_apply: Callable[[WeightPlan, ApplyResult, float], None] | None = None
    _started: bool = False
    _failing: int = 0  # applies refused in a row
    apply_error: str = ""  # why the last apply failed ("" once one succeeds), kept with the state
    budget: dict[str, int] | None = None  # probe requests per DIP for the next round (None: uniform)
    _shares: ShareMeter = field(default_factory=ShareMeter)

    @property
    def vip(self) -> str:
        return self.controller.vip

    async def tick(self, now: float) -> TickOutcome:
        ctl = self.controller
        outcome = TickOutcome(self.vip)
        observation = await self.source.observe(now)
        if observation is None:
            outcome.skipped = "no configuration"
            return outcome
        config = observation.config
        outcome.round_time = max((m.time for m in observation.rounds.values()), default=None)
        try:
            sink = self.sinks(config)
        except KnapsackLBError as exc:  # the configuration names a load balancer that cannot be built
            sink, outcome.error = None, f"no load balancer for the VIP: {exc}"
        if not self._started:
            self._started = True
            if self.read_at_start and sink is not None and not config.dry_run:
                carried = await sink.read()
                if carried:
                    ctl.observe_lb(carried, self.clock())
        if config.paused:
            ctl.step(now, {}, config=config)  # nothing is computed; its pending reasons are kept
            outcome.skipped = "paused"
            return outcome
        rounds = {} if config.dry_run else observation.rounds
        rate = None
        if rounds and sink is not None:
            rounds = await self._stamp_shares(sink, rounds, now)
            rate = self._shares.reading(now)
            timings = getattr(sink, "timings", None)
            timed = await timings() if callable(timings) else None
            if timed:
                rounds = pool_lb_timings(rounds, timed)
        outcome.plan = ctl.step(now, rounds, config=config, remeasure=observation.remeasure, rate=rate)
        if outcome.plan is not None and self.state is not None:
            await self.state.put_plan(outcome.plan)
            # the controller's curves replace the stored ones: a DIP removed from the VIP leaves no stale curve
            await self.state.put_curves(self.vip, ctl.curve_records(), replace=True)
        if config.dry_run:
            outcome.skipped = "dry run"
            if outcome.plan is not None:
                ctl.refuse(outcome.plan, "dry run", retry=False)
        elif sink is None:
            outcome.skipped = outcome.skipped or "no load balancer selected"
            if outcome.plan is not None and outcome.error:
                ctl.refuse(outcome.plan, outcome.error, retry=False)
        else:
            await self._push(sink, outcome)
        await self._persist()
        if not config.dry_run:
            await self._put_probe_budget(config)
        return outcome

    async def stop(self, now: float) -> TickOutcome:
        """The controller stops: leave the LB on the plan ``loop.on_stop`` names
        (:meth:`VipController.stop_plan`), applied and confirmed like any plan, and persisted. A paused
        or dry-run VIP, or one with no load balancer, is left as it is; a refused apply leaves the
        last confirmed weights (all or nothing, as always)."""
        ctl = self.controller
        outcome = TickOutcome(self.vip)
        observation = await self.source.observe(now)
        if observation is None or observation.config.paused or observation.config.dry_run:
            outcome.skipped = "not touched on stop (paused, dry run or no configuration)"
            return outcome
        try:
            sink = self.sinks(observation.config)
        except KnapsackLBError as exc:
            sink, outcome.error = None, f"no load balancer for the VIP: {exc}"
        if sink is None:
            outcome.skipped = outcome.skipped or "no load balancer selected"
            return outcome
        outcome.plan = ctl.stop_plan(now, observation.config)
        if outcome.plan is None:
            outcome.skipped = "the load balancer already carries the plan to stop on"
            return outcome
        if self.state is not None:
            await self.state.put_plan(outcome.plan)
        await self._push(sink, outcome)
        await self._persist()
        return outcome

    def count_from(self, traffic: Traffic | None, now: float) -> None:
        """Take the LB's counters at ``now`` as the start of the first round's share (the lab starts
        its LB at time 0, before the first tick); without it the first round carries no share."""
        self._shares.update(traffic, now)

    async def _stamp_shares(self, sink: Sink, rounds: Mapping[str, Measurement], now: float,
                            ) -> Mapping[str, Measurement]:
        traffic = getattr(sink, "traffic", None)
        if not callable(traffic):
            return rounds
        self._shares.update(await traffic(), now)
        return with_shares(rounds, self._shares)

    async def _push(self, sink: Sink, outcome: TickOutcome) -> None:
        ctl = self.controller
        pending = ctl.pending
        if pending is not None:
            result = await self._apply(sink, pending)
            outcome.applied = result
            outcome.pushed = result.ok
            if not result.ok:
                outcome.error = f"the load balancer refused plan v{pending.version}: {result.reason}"
            return
        if ctl.plan is None or not ctl.in_force:
            return
        carried = await sink.read()
        if carried is None or split_distance(carried, ctl.in_force) <= DRIFT_TOLERANCE:
            return
        if self.state is not None:  # the fence: a newer plan in the store is another owner's, not drift
            stored = await self.state.current_plan(self.vip)
            if stored is not None and stored.version > ctl.plan.version:
                raise StalePlanError(self.vip, ctl.plan.version, stored.version)
        log.warning("the load balancer carries another split than the confirmed plan (an edit or a reload "
                    "behind the controller's back); re-applying",
                    extra={"vip": self.vip, "distance": round(split_distance(carried, ctl.in_force), 4),
                           "lb_vs_plan": weight_changes(ctl.in_force, carried)})
        result = await self._apply(sink, ctl.plan, reapply=True)
        outcome.applied = result
        outcome.reapplied = result.ok
        if not result.ok:
            outcome.error = f"re-applying plan v{ctl.plan.version} failed: {result.reason}"

    async def _apply(self, sink: Sink, plan: WeightPlan, *, reapply: bool = False) -> ApplyResult:
        before = dict(self.controller.in_force)
        result = await sink.apply(plan)
        at = self.clock()
        self._log_apply(plan, result, before, reapply)
        if result.ok:
            carried = result.carried() or dict(plan.weights)
            self.controller.confirm(plan, carried, at)
            if self.state is not None:
                await self.state.put_in_force(self.vip, InForce(self.controller.in_force, plan.version, at))
            if result.warnings:
                self.counters[APPLY_WARNINGS] = self.counters.get(APPLY_WARNINGS, 0) + 1
        else:
            self.counters[APPLY_FAILURES] = self.counters.get(APPLY_FAILURES, 0) + 1
            if not reapply:
                self.controller.refuse(plan, result.reason or "refused")
        if self.on_apply is not None:
            self.on_apply(plan, result, at)
        return result

    def _log_apply(self, plan: WeightPlan, result: ApplyResult, before: Mapping[str, float], reapply: bool) -> None:
        """One INFO line per applied plan, one WARNING per failure with the LB's own reason, and one
        INFO line when the LB takes plans again after failures."""
        fields = {"vip": self.vip, "version": plan.version, "method": str(plan.method)}
        self.apply_error = "" if result.ok else (result.reason or "refused")
        if not result.ok:
            self._failing += 1
            log.warning("the load balancer refused the plan; it keeps the last confirmed weights",
                        extra={**fields, "reason": short_repr(result.reason, 300), "failures_in_a_row": self._failing})
            return
        if self._failing:
            log.info("the load balancer takes plans again", extra={**fields, "after_failures": self._failing})
            self._failing = 0
        log.info("plan re-applied" if reapply else "plan applied", extra={
            **fields, "changes": weight_changes(before, result.carried() or plan.weights),
            "reason": short_repr(plan.reasons[-1] if plan.reasons else "", 200),
            **({"warnings": list(result.warnings)} if result.warnings else {})})

    async def _put_probe_budget(self, config: VipConfig) -> None:
        """Work out the probe budget for the next round (:attr:`budget`; the lab's probes read it there)
        and store it for the probe workers, valid for ``BUDGET_TTL_INTERVALS`` intervals."""
        ctl = self.controller
        if ctl.settings.probe_budget.allocation == "uniform":
            self.budget = None
            return
        self.budget = ctl.probe_budget(config, self._shares.rate)
        if self.state is not None:
            ttl = BUDGET_TTL_INTERVALS * max(ctl.settings.loop.interval, config.probe.interval)
            await self.state.put_probe_budget(self.vip, self.budget, ttl)

    async def _persist(self) -> None:
        if self.state is None:
            return
        state = self.controller.to_dict()
        state.update(self.counters)
        state[APPLY_ERROR] = self.apply_error
        await self.state.put_controller_state(self.vip, state)


# --- sources and sinks every environment can use -----------------------------------------------------


def fixed(sink: Sink | None) -> Callable[[VipConfig], Sink | None]:
    """The same sink whatever the VIP's configuration (the lab's load balancers)."""
    return lambda config: sink


@dataclass
class StoreSource:
    """The live source: one snapshot of the VIP from the latency store per tick, and the
    re-measure requests taken (each exactly once)."""

    store: LatencyStore
    vip: str

    async def observe(self, now: float) -> Observation | None:
        snap = await self.store.snapshot(self.vip)
        if snap.config is None:
            return None
        remeasure = await self.store.take_remeasure_requests(self.vip) if snap.remeasure else set()
        return Observation(snap.latest, snap.config, frozenset(remeasure))


@dataclass
class QuantisingSink:
    """A load balancer in the lab: weights become the integers the LB kind ``lb`` takes (exactly as
    its adapter rounds them), ``push`` hands the carried split to the model (the simulator's MUXes,
    the fluid model), ``fail_next`` makes the next applies fail with a reason, and ``counters`` are
    the LB's per-DIP counters as an adapter's ``traffic`` reads them (None: it counts nothing), and
    ``timed`` the client requests it timed per DIP since the last call (``Sink.timings``; None: none)."""

    lb: str
    push: Callable[[dict[str, float]], None]
    fail_next: list[str] = field(default_factory=list)
    carried: dict[str, float] = field(default_factory=dict)
    applied: list[tuple[WeightPlan, ApplyResult]] = field(default_factory=list)
    counters: Callable[[], Traffic | None] = lambda: None  # what the LB counted per DIP (``Sink.traffic``)
    timed: Callable[[], Mapping[str, TimedRequests] | None] = lambda: None  # ``Sink.timings``

    async def traffic(self) -> Traffic | None:
        return self.counters()

    async def timings(self) -> Mapping[str, TimedRequests] | None:
        return self.timed()

    async def apply(self, plan: WeightPlan) -> ApplyResult:
        if self.fail_next:
            result = ApplyResult(ok=False, adapter=self.lb, reason=self.fail_next.pop(0))
        else:
            q = quantiser(self.lb)(plan.weights)
            self.carried = q.fractions()
            self.push(dict(self.carried))
            result = ApplyResult(ok=True, adapter=self.lb, lb_weights=q.weights, quantisation_error=q.error)
        self.applied.append((plan, result))
        return result

    async def read(self) -> Mapping[str, float] | None:
        return dict(self.carried) if self.carried else None


@dataclass
class ExactSink:
    """A load balancer that carries a plan's fractions exactly (the fluid model's idealised LB, and a
    recorder in tests): ``push`` receives the plan's weights; ``fail_next`` makes applies fail."""

    push: Callable[[dict[str, float]], None] = lambda weights: None
    fail_next: list[str] = field(default_factory=list)
    carried: dict[str, float] = field(default_factory=dict)
    applied: list[WeightPlan] = field(default_factory=list)

    async def apply(self, plan: WeightPlan) -> ApplyResult:
        if self.fail_next:
            return ApplyResult(ok=False, adapter="exact", reason=self.fail_next.pop(0))
        self.carried = dict(plan.weights)
        self.applied.append(plan)
        self.push(dict(plan.weights))
        return ApplyResult(ok=True, adapter="exact")

    async def read(self) -> Mapping[str, float] | None:
        return dict(self.carried) if self.carried else None


@dataclass
class FunctionSource:
    """A source from a plain function of time (the lab's probes, a test's script)."""

    rounds: Callable[[float], Mapping[str, Measurement]]
    config: Callable[[], VipConfig]
    remeasure: Callable[[], frozenset[str]] = frozenset

    async def observe(self, now: float) -> Observation | None:
        return Observation(self.rounds(now), self.config(), self.remeasure())
