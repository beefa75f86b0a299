"""KnapsackLB in the simulator: the project's control loop on simulated time with simulated probes.

Every ``ControllerSettings.interval`` (5 s, section 5) a probe round runs against every DIP: the
KLM sends ``knapsack.probe_requests`` requests straight to each DIP, bypassing the LB (section 3.2),
spread over the latter ``probe_window`` part of the interval (so a round sees the weights in effect,
not the transition from the last change; at layer 4 old connections keep their DIP, section 4.7).
The simulated LB counts what it sends each DIP, as a real LB's per-server counters do (HAProxy's
``show stat``: requests at layer 7, bytes at layer 4), and the loop stamps each round with the DIP's
share of the VIP's traffic from them (at layer 4 it lags the weights by the connections'
lifetimes). The number of probes per DIP is the controller's probe budget when it has one
(requests at layer 7 give it the VIP's rate, so the 3 % cap on a DIP's probe load holds), else
``knapsack.probe_requests``. Where the scenario gives its DIPs a fixed-work URL
(``knapsack.light_requests`` > 0) each DIP also gets that many light requests a round, each of
``knapsack.light_work`` of the DIP's mean service, spread like the probes and queued like requests.
At layer 7 the simulated LB also times every client request it sends (:class:`SimLbTimer`, as
HAProxy's log times each request's response, ``Tr``), over the same window as the probes, and the loop pools that into
each DIP's round; the controller's budget then gives the probes their floor.
The probe requests are real requests: they queue and are served like client traffic. At the end of
the interval the round is summarised by the live probes' own function (:func:`knapsack_lb.rounds.summarise`)
and the one :class:`~knapsack_lb.loop.ControlLoop` ticks: the controller steps, and a plan goes to a
simulated load balancer that rounds it to the integers of ``knapsack.lb`` exactly as that LB's adapter
does (HAProxy 0-256 by default) before every MUX's data plane uses it: smooth weighted round robin at
layer 4, weighted least connections at layer 7 (``knapsack.data_plane``). New weights apply to new
connections (layer 4) or new requests (layer 7).

Operator paths run too: scenario events ``pin``, ``unpin``, ``drain``, ``undrain``, ``pause``,
``resume``, ``dry_run`` change the VIP's configuration the loop reads, and ``apply_fail`` makes the
simulated LB refuse the next applies. The result's series say what happened (``plans``, ``applies``,
``operator``).

How it fails: while curves are being built (Algorithm 1, 8-10 iterations of 1-2 rounds in the
paper, section 6.1) the weights are measurement weights, not optimal ones; ``warmup`` should cover
that phase when comparing steady states. The clock is ``SimClock`` over the engine.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from typing import Any

from knapsack_lb.clock import SimClock
from knapsack_lb.controller.core import VipController
from knapsack_lb.controller.settings import ControllerSettings
from knapsack_lb.loop import ControlLoop, Observation, QuantisingSink, fixed, run_now
from knapsack_lb.model import (
    ApplyResult,
    Balancing,
    DipConfig,
    Measurement,
    ProbeSpec,
    TimedRequests,
    Traffic,
    VipConfig,
    WeightPlan,
)
from knapsack_lb.quantise import quantiser
from knapsack_lb.rounds import RoundSamples, summarise
from knapsack_lb.sim.metrics import SimResult
from knapsack_lb.sim.policies.base import Outcome
from knapsack_lb.sim.policies.registry import PolicyContext
from knapsack_lb.sim.policies.round_robin import SmoothWeightedRoundRobin, make_smooth_wrr
from knapsack_lb.sim.simulation import Simulation
from knapsack_lb.sim.spec import OPERATOR_EVENTS, EventSpec, PolicySpec, Scenario

DATA_PLANES = {"smooth_wrr": "knapsack", "weighted_least_connections": "weighted_least_connections"}


def sim_address(index: int) -> str:
    """A DIP's address in the simulator's VIP configuration (only its shape matters)."""
    return f"10.{index // 62500 % 256}.{index // 250 % 250}.{index % 250 + 1}:80"


class SimKlm:
    """The simulated probes: requests straight to each DIP, one round per interval, summarised
    like the live worker's rounds and stamped with the split the simulated LB carries."""

    def __init__(self, sim: Simulation, vip: str, interval: float, carried: Callable[[], Mapping[str, float]],
                 timer: SimLbTimer | None = None) -> None:
        spec = sim.scenario.knapsack
        self.sim = sim
        self.vip = vip
        self.interval = interval
        self.carried = carried
        self.rng = random.Random(f"{sim.seed}/klm")
        self.probe_requests = spec.probe_requests
        self.probe_timeout = spec.probe_timeout
        self.probe_window = spec.probe_window
        self.light_requests = spec.light_requests
        self.light_sizes = [spec.light_work * mean for mean in sim.mean_size]
        self.light_rng = random.Random(f"{sim.seed}/klm-light")  # apart, so probes go out as they would without
        self.round: list[list[Outcome]] = [[] for _ in sim.names]
        self.light_round: list[list[Outcome]] = [[] for _ in sim.names]
        self.sent = 0  # probe requests scheduled so far
        self.light_sent = 0  # light requests scheduled so far
        self.timer = timer  # the LB's timings, reset when a round's probe window opens

    def schedule(self, start: float, budget: Mapping[str, int] | None = None) -> None:
        """Schedule the next round: ``budget`` requests per DIP (by name), else ``probe_requests``, and
        ``light_requests`` light requests of fixed work."""
        begin = start + self.interval * (1.0 - self.probe_window)
        lb = self.sim.lbs[0]
        if self.timer is not None:
            self.sim.engine.at(max(begin, self.sim.engine.now), self.timer.reset)
        for dip, name in enumerate(self.sim.names):
            count = budget.get(name, self.probe_requests) if budget else self.probe_requests
            self.sent += count
            for at in self._times(start, count, self.rng):
                self.sim.engine.at(at, self._send, (lb, dip))
            self.light_sent += self.light_requests
            for at in self._times(start, self.light_requests, self.light_rng):
                self.sim.engine.at(at, self._send_light, (lb, dip))

    def _times(self, start: float, count: int, rng: random.Random) -> list[float]:
        """One time at random in each of ``count`` equal slots of the probe window. The window ends a
        probe timeout before the interval does, so that every request is answered or timed out within
        its round, where that leaves it any length; else it is the whole window."""
        begin = start + self.interval * (1.0 - self.probe_window)
        end = start + self.interval - self.probe_timeout
        span = end - begin if begin < end else self.interval * self.probe_window
        now = self.sim.engine.now
        return [max(begin + span * (i + rng.random()) / count, now) for i in range(count)]

    def _send(self, item: tuple[Any, int]) -> None:
        lb, dip = item
        self.sim.send_probe(lb, dip, timeout=self.probe_timeout, serve=True, on_outcome=self.round[dip].append)

    def _send_light(self, item: tuple[Any, int]) -> None:
        lb, dip = item
        self.sim.send_probe(lb, dip, timeout=self.probe_timeout, serve=True, on_outcome=self.light_round[dip].append,
                            size=self.light_sizes[dip])

    def take(self, now: float) -> dict[str, Measurement]:
        """The round that just ended, per DIP that was probed."""
        carried = self.carried()
        equal = 1.0 / len(self.sim.names)
        out = {}
        for dip, outcomes in enumerate(self.round):
            if not outcomes:
                continue
            name = self.sim.names[dip]
            light = self.light_round[dip]
            out[name] = summarise(_samples(outcomes), vip=self.vip, dip=name, time=now,
                                  weight=carried.get(name, equal) if carried else equal, worker="sim-klm",
                                  light=_samples(light) if light else None)
        self.round = [[] for _ in self.sim.names]
        self.light_round = [[] for _ in self.sim.names]
        return out


def _samples(outcomes: list[Outcome]) -> RoundSamples:
    samples = RoundSamples()
    for o in outcomes:
        if o.status == "ok":
            samples.success_latencies.append(o.latency)
        elif o.status == "timeout":
            samples.add_timeout(o.latency)
        else:
            samples.add_error(o.status, o.latency)
    return samples


class SimLbTimer:
    """What the simulated LB timed of each DIP's client attempts since it was last reset: successes,
    their sum and sum of squares, failures (any other answer, a timeout included)."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.reset()

    def reset(self, _: Any = None) -> None:
        n = len(self.names)
        self.successes = [0] * n
        self.total = [0.0] * n
        self.squares = [0.0] * n
        self.failures = [0] * n

    def attempt(self, dip: int, status: str, latency: float) -> None:
        if status == "ok":
            self.successes[dip] += 1
            self.total[dip] += latency
            self.squares[dip] += latency * latency
        else:
            self.failures[dip] += 1

    def take(self) -> dict[str, TimedRequests]:
        """What was timed per DIP (DIPs with nothing timed left out), then reset."""
        out = {}
        for dip, name in enumerate(self.names):
            n = self.successes[dip]
            if n == 0 and self.failures[dip] == 0:
                continue
            mean = self.total[dip] / n if n else None
            std = None
            if n >= 2 and mean is not None:
                std = math.sqrt(max(0.0, (self.squares[dip] - n * mean * mean) / (n - 1)))
            out[name] = TimedRequests(n, mean, std, self.failures[dip])
        self.reset()
        return out


class KnapsackDriver:
    """Attaches a :class:`ControlLoop` (the live one), a simulated KLM and a simulated LB to a simulation."""

    def __init__(self, sim: Simulation, settings: ControllerSettings | None = None, vip: str = "vip") -> None:
        self.sim = sim
        spec = sim.scenario.knapsack
        overrides = dict(spec.settings)
        overrides["loop"] = {"interval": spec.probe_interval, **overrides.get("loop", {})}
        self.settings = settings or ControllerSettings.model_validate(overrides)
        self.vip = vip
        balancing: Balancing = "least_connections" if spec.data_plane == "weighted_least_connections" else "weighted"
        self.config = VipConfig(name=vip, objective=self.settings.solver.objective, balancing=balancing,
                                probe=ProbeSpec(requests_per_round=spec.probe_requests, interval=spec.probe_interval,
                                                timeout=spec.probe_timeout,
                                                light_path="/light" if spec.light_requests else None,
                                                light_requests_per_round=spec.light_requests or 50),
                                dips=tuple(DipConfig(name=n, address=sim_address(i)) for i, n in enumerate(sim.names)))
        self.controller = VipController(vip, sim.names, self.settings, rng=random.Random(f"{sim.seed}/controller"))
        self.timer = SimLbTimer(sim.names) if sim.scenario.lb.layer == 7 else None
        if self.timer is not None:
            sim.on_attempt = self.timer.attempt
        self.sink = QuantisingSink(spec.lb, self._push, counters=self._counters,
                                   timed=self.timer.take if self.timer is not None else lambda: None)
        self.klm = SimKlm(sim, vip, self.settings.loop.interval, lambda: self.sink.carried, self.timer)
        clock = SimClock(lambda: sim.engine.now)
        # the LB carries the scenario's configured weights, as its adapter would round them, and the loop
        # reads them before its first step, as the live one does
        configured = dict(zip(sim.names, sim.configured_weights, strict=True))
        if sum(configured.values()) <= 0:
            configured = dict.fromkeys(sim.names, 1.0)
        self.sink.carried = quantiser(spec.lb)(configured).fractions()
        self._push(self.sink.carried)
        self.loop = ControlLoop(self.controller, self, fixed(self.sink), clock.now, read_at_start=True,
                                on_apply=self._applied)
        self.plans: list[dict[str, Any]] = []
        self.applies: list[dict[str, Any]] = []
        self.operator: list[dict[str, Any]] = []

    # --- the loop's source ------------------------------------------------------------------------
    async def observe(self, now: float) -> Observation | None:
        return Observation(self.klm.take(now), self.config)

    # --- the simulated load balancer ----------------------------------------------------------------
    def _push(self, carried: dict[str, float]) -> None:
        weights = [float(carried.get(name, 0.0)) for name in self.sim.names]
        if sum(weights) > 0:  # never an all-zero split (the controller never plans one)
            self.sim.set_weights(weights)

    def _counters(self) -> Traffic:
        kind = "requests" if self.sim.scenario.lb.layer == 7 else "bytes"
        return Traffic(kind, dict(zip(self.sim.names, map(float, self.sim.recorder.served), strict=True)))

    def _applied(self, plan: WeightPlan, result: ApplyResult, at: float) -> None:
        self.applies.append({"time": at, "version": plan.version, "ok": result.ok, "reason": result.reason})
        if result.ok:
            self.plans.append({"time": at, "weights": dict(self.sink.carried), "flags": list(plan.flags),
                               "reasons": list(plan.reasons), "method": plan.method})

    # --- operator events ---------------------------------------------------------------------------------
    def _operator(self, ev: EventSpec) -> None:
        names = [self.sim.names[i] for i in self.sim.scenario.resolve(ev.dips)] if ev.dips else []
        config = self.config
        if ev.kind == "pin":
            assert ev.weight is not None
            config = config.model_copy(update={"pins": {**config.pins, **dict.fromkeys(names, ev.weight)}})
        elif ev.kind == "unpin":
            config = config.model_copy(update={"pins": {d: w for d, w in config.pins.items() if d not in names}})
        elif ev.kind == "drain":
            config = config.model_copy(update={"drained": tuple(dict.fromkeys([*config.drained, *names]))})
        elif ev.kind == "undrain":
            config = config.model_copy(update={"drained": tuple(d for d in config.drained if d not in names)})
        elif ev.kind in ("pause", "resume"):
            config = config.model_copy(update={"paused": ev.kind == "pause"})
        elif ev.kind == "dry_run":
            config = config.model_copy(update={"dry_run": bool(ev.enabled)})
        elif ev.kind == "apply_fail":
            assert ev.count is not None
            self.sink.fail_next.extend([f"simulated {self.sink.lb} refused the plan"] * ev.count)
        self.config = VipConfig.model_validate(config.model_dump())
        self.operator.append({"time": self.sim.engine.now, "kind": ev.kind, "dips": names})

    # --- time -------------------------------------------------------------------------------------------
    def start(self) -> None:
        interval = self.settings.loop.interval
        for ev in self.sim.scenario.events:
            if ev.kind in OPERATOR_EVENTS:
                self.sim.engine.at(ev.at, self._operator, ev)
        self.loop.count_from(self._counters(), 0.0)
        self.klm.schedule(0.0)
        self.sim.engine.every(interval, self._step, until=self.sim.scenario.duration)

    def _step(self, now: float) -> None:
        run_now(self.loop.tick(now))
        if now + self.settings.loop.interval <= self.sim.scenario.duration:
            self.klm.schedule(now, self.loop.budget)


def make_knapsack_mux(ctx: PolicyContext) -> SmoothWeightedRoundRobin:
    """KnapsackLB: the project's controller pushes weights into smooth WRR."""
    return make_smooth_wrr(ctx)


def run_knapsack(
    scenario: Scenario,
    spec: PolicySpec,
    seed: int | None = None,
    progress: Callable[[float], None] | None = None,
) -> SimResult:
    """One KnapsackLB run: the data plane of ``knapsack.data_plane`` carries the controller's weights."""
    data_plane = DATA_PLANES[scenario.knapsack.data_plane]
    sim_spec = spec if data_plane == spec.name else spec.model_copy(update={"name": data_plane,
                                                                            "label": spec.display})
    sim = Simulation(scenario, sim_spec, seed)
    driver = KnapsackDriver(sim, vip=_vip_name(scenario.name))
    driver.start()
    result = sim.run(progress)
    result.series["plans"] = driver.plans
    result.series["applies"] = driver.applies
    result.series["operator"] = driver.operator
    result.series["controller_events"] = list(driver.controller.events_log)
    result.series["probes_sent"] = driver.klm.sent
    result.series["light_sent"] = driver.klm.light_sent
    return result


def _vip_name(name: str) -> str:
    clean = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in name)
    return clean or "vip"
