"""KnapsackLB in the simulator: the project's real controller on simulated time with simulated probes.

Every ``ControllerSettings.interval`` (5 s, section 5) a probe round runs against every DIP: the
KLM sends ``knapsack.probe_requests`` requests straight to each DIP, bypassing the LB (section 3.2),
spread over the latter ``probe_window`` part of the interval (so a round sees the weights in effect,
not the transition from the last change; at layer 4 old connections keep their DIP, section 4.7).
The probe requests are real requests: they queue and are served like client traffic. At the end of
the interval the round becomes one ``Measurement`` per DIP (successes, errors, timeouts, latency
mean and percentiles, failure latency) and ``VipController.step(now, observations)`` runs,
unchanged; a new ``WeightPlan`` is pushed to every MUX's smooth weighted round robin, where it
applies to new connections (layer 4) or new requests (layer 7).

How it fails: while curves are being built (Algorithm 1, 8-10 iterations of 1-2 rounds in the
paper, section 6.1) the weights are measurement weights, not optimal ones; ``warmup`` should cover
that phase when comparing steady states. The clock is ``SimClock`` over the engine.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np

from knapsack_lb.clock import SimClock
from knapsack_lb.controller.core import VipController
from knapsack_lb.controller.settings import ControllerSettings
from knapsack_lb.model import Measurement, WeightPlan
from knapsack_lb.sim.metrics import SimResult
from knapsack_lb.sim.policies.base import Outcome
from knapsack_lb.sim.simulation import Simulation
from knapsack_lb.sim.spec import PolicySpec, Scenario


class KnapsackDriver:
    """Attaches a ``VipController`` and a simulated KLM to a ``Simulation``."""

    def __init__(self, sim: Simulation, settings: ControllerSettings | None = None, vip: str = "vip") -> None:
        self.sim = sim
        spec = sim.scenario.knapsack
        overrides = dict(spec.settings)
        overrides.setdefault("interval", spec.probe_interval)
        self.settings = settings or ControllerSettings.model_validate(overrides)
        self.clock = SimClock(lambda: sim.engine.now)
        self.controller = VipController(vip, sim.names, self.settings, rng=random.Random(f"{sim.seed}/controller"))
        self.vip = vip
        self.rng = random.Random(f"{sim.seed}/klm")
        self.probe_requests = spec.probe_requests
        self.probe_timeout = spec.probe_timeout
        self.probe_window = spec.probe_window
        self.weights = [1.0 / len(sim.names)] * len(sim.names)
        self.round: list[list[Outcome]] = [[] for _ in sim.names]
        self.plans: list[dict[str, Any]] = []
        sim.set_weights(self.weights)

    def start(self) -> None:
        interval = self.settings.interval
        self._schedule_round(0.0)
        self.sim.engine.every(interval, self._step, until=self.sim.scenario.duration)

    def _schedule_round(self, start: float) -> None:
        interval = self.settings.interval
        begin = start + interval * (1.0 - self.probe_window)
        span = interval * self.probe_window
        lb = self.sim.lbs[0]
        for dip in range(len(self.sim.names)):
            for i in range(self.probe_requests):
                at = begin + span * (i + self.rng.random()) / self.probe_requests
                at = min(at, start + interval - self.probe_timeout - 1e-6) if span > self.probe_timeout else at
                self.sim.engine.at(max(at, self.sim.engine.now), self._send, (lb, dip))

    def _send(self, item: tuple[Any, int]) -> None:
        lb, dip = item
        self.sim.send_probe(lb, dip, timeout=self.probe_timeout, serve=True, on_outcome=self.round[dip].append)

    def _measurement(self, dip: int, now: float) -> Measurement:
        outcomes = self.round[dip]
        ok = np.array([o.latency for o in outcomes if o.status == "ok"])
        failures = [o.latency for o in outcomes if o.status in ("error", "rejected")]
        timeouts = sum(1 for o in outcomes if o.status == "timeout")
        pct = np.percentile(ok, [50, 90, 99]) if ok.size else None
        return Measurement(
            vip=self.vip,
            dip=self.sim.names[dip],
            time=now,
            weight=self.weights[dip],
            sent=len(outcomes),
            successes=int(ok.size),
            errors=len(failures),
            timeouts=timeouts,
            latency_mean=float(ok.mean()) if ok.size else None,
            latency_p50=float(pct[0]) if pct is not None else None,
            latency_p90=float(pct[1]) if pct is not None else None,
            latency_p99=float(pct[2]) if pct is not None else None,
            failure_latency_mean=float(np.mean(failures)) if failures else None,
            worker="sim-klm",
        )

    def _step(self, now: float) -> None:
        observations = {
            self.sim.names[d]: self._measurement(d, now) for d in range(len(self.sim.names)) if self.round[d]
        }
        self.round = [[] for _ in self.sim.names]
        plan = self.controller.step(now, observations)
        if plan is not None:
            self.apply(plan, now)
        if now + self.settings.interval <= self.sim.scenario.duration:
            self._schedule_round(now)

    def apply(self, plan: WeightPlan, now: float) -> None:
        self.weights = [float(plan.weights.get(name, 0.0)) for name in self.sim.names]
        if sum(self.weights) <= 0:
            return  # never push an all-zero plan (the controller should not produce one)
        self.sim.set_weights(self.weights)
        self.plans.append(
            {
                "time": now,
                "weights": dict(zip(self.sim.names, self.weights, strict=True)),
                "flags": list(plan.flags),
                "reasons": list(plan.reasons),
                "method": plan.method,
            }
        )


def run_knapsack(
    scenario: Scenario,
    spec: PolicySpec,
    seed: int | None = None,
    progress: Callable[[float], None] | None = None,
) -> SimResult:
    sim = Simulation(scenario, spec, seed)
    driver = KnapsackDriver(sim, vip=_vip_name(scenario.name))
    driver.start()
    result = sim.run(progress)
    result.series["plans"] = driver.plans
    result.series["controller_events"] = list(driver.controller.events_log)
    return result


def _vip_name(name: str) -> str:
    clean = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in name)
    return clean or "vip"
