"""End-to-end controller scenarios in virtual time on the fluid model (``klb bench controller``).

* ``paper30``: the paper's Table 3 pool (16 x 1, 8 x 2, 4 x 4, 2 x 8 vCPU) at 70 % load. Real
  capacities do not scale with vCPUs (section 6.2): the 4-vCPU DS3 VMs run below linear (each
  core at 80 %), the 8-vCPU F-series cores are 17.5 % faster (section 2.2.1: 15-20 %), and a
  seeded third of the DIPs loses 10-40 % to noisy neighbours (section 1: up to 40 %).
* ``two-dip``: capacities 1 and 19 with equal unloaded latency (section 3.4: about 0.05 / 0.95).
* ``dynamics``: paper30, then the paper's section 6.3 sequence: DIP-25 and DIP-26 (4 vCPU)
  fail; they return while DIP-25..28 lose 25 % capacity; capacities are restored and traffic
  rises 10 %.

Each run: the controller builds its curves from a cold start (Algorithm 1 rounds), solves, and
settles; the result is compared with the true optimum (oracle), round robin and weights
proportional to vCPUs, all evaluated on the same true model. Times are virtual seconds.

Per dynamics phase, ``max_planned_utilisation`` is the largest true utilisation of any DIP
under any plan emitted in the phase (a plan emitted before the event is detected still
carries the old weights, so a capacity drop shows here at once); ``max_raised_utilisation``
counts only DIPs whose weight the plan raised - what the controller itself drove a DIP to.
``vs_oracle`` compares the phase's last plan with the oracle; ``vs_oracle_settled`` the
mean latency over the phase's last ``SETTLED_ROUNDS`` intervals (a refresh or a correction
in flight counts), which is what "within 5 % after settling" is judged on.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from knapsack_lb.controller.core import VipController
from knapsack_lb.controller.settings import ControllerSettings
from knapsack_lb.errors import InvalidInputError
from knapsack_lb.lab.fluid import FluidDip, FluidLab, FluidModel, PlanQuality, vip_config
from knapsack_lb.model import PlanFlag

SCENARIOS = ("paper30", "two-dip", "dynamics", "operator")
SERVICE_RATE = 100.0  # requests/s per nominal core (10 ms per request)
LOAD = 0.7
SETTLED_ROUNDS = 12  # the last minute of a phase: its time-averaged latency is the settled result


def paper30_dips(seed: int) -> list[FluidDip]:
    """Table 3: DIP-1..16 DS1v2 (1 vCPU), 17..24 DS2v2 (2), 25..28 DS3v2 (4), 29..30 F8sv2 (8)."""
    rng = np.random.default_rng(seed)
    kinds = [(1, 1.0)] * 16 + [(2, 1.0)] * 8 + [(4, 0.8)] * 4 + [(8, 1.175)] * 2
    noisy = set(rng.choice(30, size=10, replace=False).tolist())
    dips = []
    for i, (vcpus, speed) in enumerate(kinds):
        jitter = float(rng.uniform(0.97, 1.03))
        loss = float(rng.uniform(0.1, 0.4)) if i in noisy else 0.0
        dips.append(FluidDip(f"dip-{i + 1}", servers=vcpus, service_rate=SERVICE_RATE * speed * jitter * (1 - loss),
                             vcpus=vcpus))
    return dips


def two_dip_dips() -> list[FluidDip]:
    return [FluidDip("small", 1, SERVICE_RATE, vcpus=1), FluidDip("large", 19, SERVICE_RATE, vcpus=19)]


@dataclass(frozen=True)
class Event:
    at: float
    name: str
    apply: Callable[[FluidModel], None]
    expect: str  # substring of the controller's reason that shows it handled the event


def _quality_dict(q: PlanQuality) -> dict[str, Any]:
    return {"mean_ms": round(q.mean_latency * 1000, 4), "p99_ms": round(q.p99_latency * 1000, 4),
            "overloaded_dips": len(q.overloaded), "max_utilisation": round(q.max_utilisation, 4)}


def _baselines(model: FluidModel) -> dict[str, Any]:
    live = [d for d in model.dips if not d.failed]
    rr = {d.name: (1.0 if not d.failed else 0.0) for d in model.dips}
    vcpu = {d.name: (float(d.vcpus) if not d.failed else 0.0) for d in model.dips}
    oracle = model.oracle()
    return {
        "oracle": _quality_dict(oracle.quality),
        "round_robin": _quality_dict(model.quality(rr)),
        "by_vcpu": _quality_dict(model.quality(vcpu)),
        "_oracle_mean": oracle.quality.mean_latency,
        "_vcpu_mean": model.quality(vcpu).mean_latency,
        "_live": len(live),
    }


class Run:
    """Drives one controller against one fluid model, one probe round per interval."""

    def __init__(self, model: FluidModel, settings: ControllerSettings, seed: int,
                 on_tick: Callable[[float], None] | None = None, start: Mapping[str, float] | None = None) -> None:
        """``start``: the weights the LB carries before the controller's first plan, which it reads at start
        as a deployed one does (default: an equal split, unread: the controller starts from nothing)."""
        self.on_tick = on_tick
        self.model = model
        self.settings = settings
        self.ctl = VipController(model.vip, model.names, settings, rng=random.Random(seed))
        self.lab = FluidLab(model, vip_config(model.vip, model.names, objective=settings.solver.objective))
        self.loop = self.lab.loop(self.ctl)
        self.plans = 0
        self.max_util_after_build = 0.0
        self.max_raised_util = 0.0
        self.built_at: float | None = None
        self.log: list[tuple[float, str]] = []
        if start:  # carried long enough to be in full effect when the controller starts
            model.set_weights(start, -model.drain_time)
            self.lab.sink.carried = dict(start)
        else:
            model.set_weights({n: 1.0 for n in model.names}, 0.0)

    @property
    def now(self) -> float:
        return self.lab.now

    def tick(self) -> None:
        before = self.ctl.plan.weights if self.ctl.plan is not None else {}
        plan = self.lab.tick(self.loop, self.settings.loop.interval).plan
        if plan is not None:
            self.plans += 1
            for reason in plan.reasons:
                self.log.append((self.now, reason))
            if self.built_at is not None:
                util = self.model.utilisation(plan.weights)
                self.max_util_after_build = max(self.max_util_after_build, max(util.values()))
                raised = [u for n, u in util.items() if plan.weights.get(n, 0.0) > before.get(n, 0.0) + 1e-9]
                self.max_raised_util = max(self.max_raised_util, *raised, 0.0)
        if self.built_at is None and not self.ctl.measuring and self.ctl.plan is not None \
                and PlanFlag.MEASURING not in self.ctl.plan.flags:
            self.built_at = self.now
        if self.on_tick is not None:
            self.on_tick(self.now)

    def run_until_built(self, max_rounds: int = 200) -> None:
        for _ in range(max_rounds):
            if self.built_at is not None:
                return
            self.tick()
        raise InvalidInputError("max_rounds", max_rounds, "curves were not built in time")

    def settle(self, rounds: int) -> None:
        for _ in range(rounds):
            self.tick()

    def current_quality(self) -> PlanQuality:
        assert self.ctl.plan is not None
        return self.model.quality(self.ctl.plan.weights)


def _measurement_summary(run: Run) -> dict[str, Any]:
    iterations = [d.iterations for d in run.ctl.dips.values()]
    return {
        "iterations_max": max(iterations),
        "iterations_mean": round(float(np.mean(iterations)), 2),
        "measurement_rounds": run.ctl.measurement_rounds,
        "curves_built_after_s": run.built_at,
        "curve_models": {m: sum(1 for d in run.ctl.dips.values() if d.model == m)
                         for m in sorted({d.model for d in run.ctl.dips.values()})},
    }


def _compare(run: Run) -> dict[str, Any]:
    base = _baselines(run.model)
    klb = run.current_quality()
    out = {"knapsacklb": _quality_dict(klb), **{k: v for k, v in base.items() if not k.startswith("_")}}
    out["vs_oracle"] = round(klb.mean_latency / base["_oracle_mean"] - 1, 4)
    out["below_by_vcpu"] = round(1 - klb.mean_latency / base["_vcpu_mean"], 4)
    return out


def _settle(run: Run, rounds: int) -> float:
    """Run ``rounds`` intervals; the mean latency over the last ``SETTLED_ROUNDS`` of them relative
    to the oracle (refreshes and corrections in flight count)."""
    run.settle(max(0, rounds - SETTLED_ROUNDS))
    means = []
    for _ in range(min(rounds, SETTLED_ROUNDS)):
        run.tick()
        means.append(run.current_quality().mean_latency)
    return _relative_to_oracle(run.model, means)


def _relative_to_oracle(model: FluidModel, means: list[float]) -> float:
    """Mean of the plans' mean latencies relative to the oracle's (0.05 = 5 % above)."""
    return round(float(np.mean(means)) / model.oracle().quality.mean_latency - 1, 4)


def run_static(name: str, dips: list[FluidDip], seed: int, settings: ControllerSettings,
               settle_rounds: int = 24, on_tick: Callable[[float], None] | None = None) -> dict[str, Any]:
    model = FluidModel(dips, total_rate=LOAD * sum(d.capacity for d in dips), vip=name, seed=seed)
    run = Run(model, settings, seed, on_tick)
    run.run_until_built()
    settled = _settle(run, settle_rounds)
    assert run.ctl.plan is not None
    result = {"scenario": name, "seed": seed, "dips": len(dips), "load": LOAD, **_measurement_summary(run),
              **_compare(run), "vs_oracle_settled": settled,
              "max_utilisation_after_build": round(run.max_util_after_build, 4)}
    if name == "two-dip":
        result["weights"] = {n: round(w, 4) for n, w in run.ctl.plan.weights.items()}
        result["oracle_weights"] = {n: round(w, 4) for n, w in model.oracle().weights.items()}
    return result


def run_dynamics(seed: int, settings: ControllerSettings, phase_rounds: int = 36,
                 on_tick: Callable[[float], None] | None = None) -> dict[str, Any]:
    dips = paper30_dips(seed)
    model = FluidModel(dips, total_rate=LOAD * sum(d.capacity for d in dips), vip="dynamics", seed=seed)
    run = Run(model, settings, seed, on_tick)
    run.run_until_built()
    steady = _settle(run, 24)
    base_rate = model.total_rate
    phases: list[dict[str, Any]] = [{"phase": "steady", **_compare(run), "vs_oracle_settled": steady}]

    def fail(m: FluidModel) -> None:
        m.fail("dip-25")
        m.fail("dip-26")

    def capacity(m: FluidModel) -> None:
        m.restore("dip-25")
        m.restore("dip-26")
        for n in ("dip-25", "dip-26", "dip-27", "dip-28"):
            m.set_capacity_factor(n, 0.75)

    def traffic(m: FluidModel) -> None:
        for n in ("dip-25", "dip-26", "dip-27", "dip-28"):
            m.set_capacity_factor(n, 1.0)
        m.set_total_rate(base_rate * 1.1)

    events = [("two large DIPs fail (dip-25, dip-26)", fail, "failure:"),
              ("dip-25/26 return; dip-25..28 lose 25% capacity", capacity, "capacity change"),
              ("capacities restored; traffic +10%", traffic, "traffic change")]
    for title, change, expect in events:
        start = run.now
        max_util_before, raised_before = run.max_util_after_build, run.max_raised_util
        run.max_util_after_build = run.max_raised_util = 0.0
        change(model)
        first_seen: float | None = None
        settled: list[float] = []
        for i in range(phase_rounds):
            run.tick()
            if first_seen is None and any(t > start and expect in r for t, r in run.log):
                first_seen = run.now
            if i >= phase_rounds - SETTLED_ROUNDS:
                settled.append(run.current_quality().mean_latency)
        handled = [t for t, r in run.log if t > start and expect in r]
        phase = {"phase": title, "event_at_s": start, "handled_at_s": first_seen,
                 "detection_delay_s": None if first_seen is None else first_seen - start,
                 "intervals_to_handle": None if first_seen is None else math.ceil((first_seen - start)
                                                                                  / settings.loop.interval),
                 "reactions": len(handled),
                 "max_planned_utilisation": round(run.max_util_after_build, 4),
                 "max_raised_utilisation": round(run.max_raised_util, 4), **_compare(run),
                 "vs_oracle_settled": _relative_to_oracle(model, settled)}
        phases.append(phase)
        run.max_util_after_build = max(run.max_util_after_build, max_util_before)
        run.max_raised_util = max(run.max_raised_util, raised_before)
    return {"scenario": "dynamics", "seed": seed, "dips": 30, "load": LOAD, **_measurement_summary(run),
            "phases": phases, "events_logged": [f"{t:.0f}s {r}" for t, r in run.log if t > 0][-60:]}


def run_operator(seed: int, settings: ControllerSettings, phase_rounds: int = 12,
                 on_tick: Callable[[float], None] | None = None) -> dict[str, Any]:
    """What an operator does, through the loop, once paper30's curves are built: pin DIP-29 (8 vCPU)
    at 0.1, drain DIP-17, undrain it while the LB refuses three plans in a row, lift the pin. Per
    phase: the pinned and drained DIPs' weights as the LB carries them, the refused applies, and the
    settled latency against the oracle (the oracle knows neither pin nor drain)."""
    dips = paper30_dips(seed)
    model = FluidModel(dips, total_rate=LOAD * sum(d.capacity for d in dips), vip="operator", seed=seed)
    run = Run(model, settings, seed, on_tick)
    run.run_until_built()
    base = run.lab.config

    def configure(**changes: Any) -> None:
        run.lab.config = run.lab.config.model_copy(update=changes)

    def undrain_refused() -> None:
        run.lab.sink.fail_next.extend(["admin socket unreachable"] * 3)
        configure(drained=())

    steps: list[tuple[str, Callable[[], None]]] = [
        ("pin dip-29 at 0.1", lambda: configure(pins={"dip-29": 0.1})),
        ("drain dip-17", lambda: configure(drained=("dip-17",))),
        ("undrain dip-17; the LB refuses 3 plans", undrain_refused),
        ("unpin dip-29", lambda: configure(pins={})),
    ]
    assert base.pins == {}
    phases = []
    for title, act in steps:
        act()
        refused = 0
        carried_while: list[dict[str, float]] = []
        for _ in range(phase_rounds):
            outcome = run.lab.tick(run.loop, settings.loop.interval)
            refused += outcome.applied is not None and not outcome.applied.ok
            carried_while.append(dict(run.ctl.in_force))
        in_force = run.ctl.in_force
        oracle = model.oracle().quality.mean_latency
        phases.append({"phase": title, "refused_applies": refused,
                       "dip-29": round(in_force.get("dip-29", 0.0), 4), "dip-17": round(in_force.get("dip-17", 0.0), 4),
                       "dip-17_max_during": round(max(c.get("dip-17", 0.0) for c in carried_while), 4),
                       "vs_oracle": round(model.quality(in_force).mean_latency / oracle - 1, 4)})
    return {"scenario": "operator", "seed": seed, "dips": 30, "load": LOAD, **_measurement_summary(run),
            "phases": phases}


def expected_rounds(name: str) -> int:
    """Roughly how many control intervals a scenario runs (for progress bars)."""
    return {"paper30": 45, "two-dip": 36, "dynamics": 45 + 3 * 36, "operator": 45 + 4 * 12}.get(name, 50)


def run_scenario(name: str, *, seed: int = 1, settings: ControllerSettings | None = None,
                 on_tick: Callable[[float], None] | None = None) -> dict[str, Any]:
    """Run one scenario end to end in virtual time; ``on_tick(now)`` after every interval."""
    settings = settings or ControllerSettings()
    if name == "paper30":
        return run_static("paper30", paper30_dips(seed), seed, settings, on_tick=on_tick)
    if name == "two-dip":
        return run_static("two-dip", two_dip_dips(), seed, settings, on_tick=on_tick)
    if name == "dynamics":
        return run_dynamics(seed, settings, on_tick=on_tick)
    if name == "operator":
        return run_operator(seed, settings, on_tick=on_tick)
    raise InvalidInputError("scenario", name, f"must be one of {list(SCENARIOS)}")


def summarise(result: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in result.items() if not isinstance(v, (dict, list)))
