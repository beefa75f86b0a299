"""``klb bench robustness``: KnapsackLB with its defaults against an operator's own choices on many
random pools that nobody tuned for.

A seeded generator (:class:`PoolGenerator`) draws complete simulator scenarios: 3-40 DIPs with vCPU
counts of 1/2/4/8/16, noisy-neighbour slowdowns, FCFS worker pools or processor sharing,
exponential, lognormal or fixed service times, a load of 50-85 % of the true capacity, layer 4
(keep-alive connections placed once by several MUXes) or layer 7, and on a share of the pools one
event mid-run (a DIP fails, loses capacity, or traffic rises). Every pool runs, on the same seed:

* what an operator would set by hand: round robin, least connections, power of two choices, and
  weighted round robin and weighted least connections with weights by vCPU - all behind active
  health checks, as a deployed LB has them;
* an oracle static plan: the project's solver fed each DIP's true weight-latency curve
  (:func:`true_latency`, sampled on a grid), re-planned once when the event happens, in the same
  data plane as KnapsackLB's weights;
* KnapsackLB with its **default** settings: the only inputs are the DIP names and the probe budget.
  At layer 4 its weights go into smooth weighted round robin on the MUXes, at layer 7 into weighted
  least connections (HAProxy ``leastconn`` with weights).

Per pool and policy: mean and p99 latency over the whole run (learning included) and over the
steady window (the last ``STEADY_SHARE`` of the run, after any event); errors; for KnapsackLB the
time to its first solved plan, the highest true utilisation a plan drove a DIP to after that, and
its probe load as a share of the pool's capacity. The planned utilisation is what the weights would
drive as a plain split of the requests; neither data plane splits that way (at layer 4 a weight
places new connections only, and a slow DIP's connections send fewer requests; weighted least
connections sends less to a DIP whose requests pile up), so every policy also reports what its DIPs
were measured to carry: the highest busy share of a DIP's cores over the simulator's 5 s windows,
and the windows in which a DIP was busy at least ``SATURATED`` of the time (at its capacity: its
queue grows).

How it fails: the simulator cannot carry tens of thousands of requests per second for minutes, so
a pool whose offered rate exceeds ``max_rate`` has its service times scaled up by the factor
``time_scale`` (utilisations and latency ratios stay; the controller's interval and the connection
lifetimes do not scale, so such a pool is a slower pool, not the same one). The oracle's curves are
exact for exponential service and for processor sharing (the number in system is that of M/M/c
whatever the service distribution) and the Allen-Cunneen approximation for FCFS with other service
times; the oracle is a static plan per phase, so least connections can beat it.

One run is one random path: the arrivals, service times, connection placement and probe noise of
one simulation seed. At layer 4 a pool's whole-run ratio moves by a few percent from one path to
the next (a connection placed on another DIP early sends its requests there for a minute), which is
as large as the margin to a bar; ``paths`` runs every policy on several seeds (:func:`path_seed`; all
policies share each path's seed, common random numbers) and the summary takes each pool's ratio as
the geometric mean over its paths, with the count of better pools on each path beside it.
"""

from __future__ import annotations

import functools
import math
import os
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field

from knapsack_lb.lab.fluid import FluidDip, FluidModel
from knapsack_lb.model import LEARNED_METHODS, PlanFlag
from knapsack_lb.sim.metrics import STATUS_CODES
from knapsack_lb.sim.spec import EventSpec, PolicySpec, Scenario
from knapsack_lb.solver.oracle import erlang_c, oracle_split

VCPUS = (1, 2, 4, 8, 16)
STEADY_SHARE = 0.3  # the steady window: the last 30 % of the run
SATURATED = 0.99  # a DIP busy this share of a window is at its capacity
EVENT_AT = 0.5  # an event happens halfway through the run
MAX_LOAD_AFTER_EVENT = 0.92  # no event leaves the pool above this utilisation
ORACLE_MAX_UTILISATION = 0.97  # the oracle's curves end here: no plan runs a DIP nearer its limit
PROBE_SHARE = 0.03  # the probe budget a user gives: requests per round worth 3 % of capacity
BASELINES = ("round_robin", "least_connections", "power_of_two", "wrr_vcpu", "wlc_vcpu")
# the operator's choices each layer's bar is set against: a layer-4 LB balances connections by round robin, least
# connections or vCPU weights; a layer-7 one sends requests by least connections, plain or weighted by vCPU
LAYER_BASELINES: dict[int, tuple[str, ...]] = {4: ("round_robin", "least_connections", "wrr_vcpu"),
                                               7: ("least_connections", "wlc_vcpu")}
PATH_STRIDE = 1_000_003  # path k of a pool runs on its scenario's seed + k x this (path_seed)
MAX_PATHS = 20
REFERENCES = ("oracle", "capacity")  # policies that know the truth: what the best weights could do
POLICIES = (*BASELINES, *REFERENCES, "knapsack")


class PoolGenerator(BaseModel):
    """The generator's parameters (docs/results/robustness.md lists them with their meaning)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dips: tuple[int, int] = Field((3, 40), description="Fewest and most DIPs (log-uniform).")
    vcpus: tuple[int, ...] = Field(VCPUS, description="vCPU counts a DIP is drawn from.")
    neighbour_share: float = Field(0.4, ge=0, le=1, description="At most this share of DIPs has a noisy neighbour.")
    neighbour_slowdown: float = Field(0.4, ge=0, lt=1, description="... slowing it by up to this much.")
    service_mean: tuple[float, float] = Field((0.002, 0.05), description="Mean service time at speed 1 (s).")
    lognormal_sigma: tuple[float, float] = Field((0.5, 1.2), description="Sigma of lognormal service times.")
    load: tuple[float, float] = Field((0.5, 0.85), description="Offered load as a share of true capacity.")
    layer4_share: float = Field(0.5, ge=0, le=1, description="Share of pools at layer 4.")
    muxes: tuple[int, int] = Field((2, 8), description="MUXes at layer 4 (each places connections on its own).")
    lifetime: tuple[float, float] = Field((2.0, 60.0), description="Connection lifetime at layer 4 (s).")
    think_time: tuple[float, float] = Field((0.05, 0.5), description="Pause between a connection's requests (s).")
    event_share: float = Field(0.4, ge=0, le=1, description="Share of pools with one event mid-run.")
    capacity_loss: tuple[float, float] = Field((0.25, 0.5), description="Capacity a DIP loses in such an event.")
    traffic_rise: tuple[float, float] = Field((0.1, 0.2), description="Traffic rise in such an event.")
    max_rate: float = Field(1000.0, gt=0, description="Offered requests/s the simulator carries; beyond, time "
                            "is scaled (module docstring).")
    duration: float = Field(600.0, gt=60, description="Simulated seconds per run.")
    probe_interval: float = Field(5.0, gt=0, description="Seconds between probe rounds (the controller's default).")
    light_requests: int = Field(0, ge=0, le=1000, description="Light requests per DIP per round to a fixed-work URL "
                                "every DIP has (1 % of a mean request's work); 0: no such URL, the paper's black box.")


@dataclass(frozen=True)
class PoolDip:
    """The truth about one DIP."""

    name: str
    vcpus: int
    speed: float  # after its noisy neighbour
    speed_after: float  # after the event (0 = failed)

    def speed_in(self, after_event: bool) -> float:
        return self.speed_after if after_event else self.speed


@dataclass(frozen=True)
class Pool:
    """One generated pool: its scenario and the facts the oracle and the report need."""

    index: int
    scenario: Scenario
    dips: tuple[PoolDip, ...]
    discipline: Literal["fcfs", "ps"]
    service: str  # "exponential", "fixed" or "lognormal(sigma)"
    service_cv2: float  # squared coefficient of variation of the service time
    mean_service: float  # seconds at speed 1, after time scaling
    time_scale: float
    layer: Literal[4, 7]
    load: float
    offered_rate: float  # requests/s before the event
    rate_after: float  # requests/s after it
    event: str  # "none", "fail <dip>", "capacity <dip> x<speed>" or "traffic x<factor>"
    probe_requests: int

    @property
    def capacity(self) -> float:
        return sum(d.vcpus * d.speed for d in self.dips) / self.mean_service

    def rate(self, after_event: bool) -> float:
        """Offered requests/s before or after the event."""
        return self.rate_after if after_event else self.offered_rate

    def capacity_after(self) -> float:
        return sum(d.vcpus * d.speed_after for d in self.dips) / self.mean_service

    def describe(self) -> str:
        mix = ",".join(str(d.vcpus) for d in self.dips)
        return (f"{len(self.dips)} DIPs [{mix}] vCPU, {self.discipline} {self.service} "
                f"{self.mean_service / self.time_scale * 1000:.0f} ms, L{self.layer}, load {self.load:.2f}, "
                f"event {self.event}")


def _between(rng: random.Random, bounds: tuple[float, float]) -> float:
    return rng.uniform(*bounds)


def _log_between(rng: random.Random, bounds: tuple[float, float]) -> float:
    return math.exp(rng.uniform(math.log(bounds[0]), math.log(bounds[1])))


def generate_pool(index: int, seed: int, gen: PoolGenerator | None = None) -> Pool:
    """Pool ``index`` of the set drawn with ``seed``: the same arguments give the same pool."""
    gen = gen or PoolGenerator()
    rng = random.Random(f"robustness/{seed}/{index}")
    n = max(gen.dips[0], min(gen.dips[1], round(_log_between(rng, (gen.dips[0], gen.dips[1] + 0.99)) - 0.49)))
    vcpus = [rng.choice(gen.vcpus) for _ in range(n)]
    slowed = set(rng.sample(range(n), round(rng.uniform(0, gen.neighbour_share) * n)))
    speeds = [round(1.0 - rng.uniform(0, gen.neighbour_slowdown), 4) if i in slowed else 1.0 for i in range(n)]
    discipline: Literal["fcfs", "ps"] = rng.choice(("fcfs", "ps"))
    kind = rng.choice(("exponential", "lognormal", "fixed"))
    sigma = round(_between(rng, gen.lognormal_sigma), 2)
    cv2 = {"exponential": 1.0, "fixed": 0.0}.get(kind, math.exp(sigma**2) - 1)
    service = f"lognormal({sigma})" if kind == "lognormal" else kind
    mean = _log_between(rng, gen.service_mean)
    load = _between(rng, gen.load)
    layer: Literal[4, 7] = 4 if rng.random() < gen.layer4_share else 7
    capacity = sum(v * s for v, s in zip(vcpus, speeds, strict=True)) / mean
    scale = max(1.0, load * capacity / gen.max_rate)
    mean *= scale
    capacity /= scale
    names = [f"d{i + 1:02d}-{v}c" for i, v in enumerate(vcpus)]
    after = list(speeds)
    factor = 1.0
    event = "none"
    events: list[dict[str, Any]] = []
    at = round(gen.duration * EVENT_AT, 1)
    if rng.random() < gen.event_share:
        kind_of = rng.choice(("fail", "capacity", "traffic"))
        victim = rng.randrange(n)
        share = vcpus[victim] * speeds[victim] / mean / capacity
        if kind_of == "traffic":
            factor = min(1 + _between(rng, gen.traffic_rise), MAX_LOAD_AFTER_EVENT / load)
            if factor > 1.0:
                factor = math.floor(factor * 1e4) / 1e4
                events.append({"at": at, "kind": "traffic", "factor": factor})
                event = f"traffic x{factor:.2f}"
        elif kind_of == "fail" and load / (1 - share) <= MAX_LOAD_AFTER_EVENT and n > 1:
            after[victim] = 0.0
            events.append({"at": at, "kind": "fail", "dips": [names[victim]], "mode": "fast"})
            event = f"fail {names[victim]}"
        elif kind_of == "capacity":
            loss = min(_between(rng, gen.capacity_loss), (1 - load / MAX_LOAD_AFTER_EVENT) / share)
            loss = math.floor(loss * 1e4) / 1e4
            if loss > 0.05:
                after[victim] = speeds[victim] * (1 - loss)
                events.append({"at": at, "kind": "capacity", "dips": [names[victim]], "speed": 1 - loss})
                event = f"capacity {names[victim]} -{loss:.0%}"
        if not events:
            factor = 1.0
    rate = load * capacity
    probe_requests = max(3, min(20, math.floor(PROBE_SHARE * capacity * gen.probe_interval / n)))
    timeout = max(3.0, 100 * mean)
    if layer == 4:
        lifetime = _log_between(rng, gen.lifetime)
        think = _log_between(rng, gen.think_time)
        clients: dict[str, Any] = {"kind": "sessions", "load": round(load, 4), "think_time": round(think, 4),
                                   "requests_per_session": max(1, round(lifetime / (think + mean)))}
        lb: dict[str, Any] = {"layer": 4, "instances": rng.randint(*gen.muxes), "timeout": timeout}
        data_plane = "smooth_wrr"
    else:
        clients = {"kind": "open", "load": round(load, 4)}
        lb = {"layer": 7, "instances": 1, "timeout": timeout}
        data_plane = "weighted_least_connections"
    service_spec: dict[str, Any] = {"kind": kind, "mean": mean}
    if kind == "lognormal":
        service_spec["sigma"] = sigma
    scenario = Scenario.model_validate({
        "name": f"robustness-{seed}-{index:03d}",
        "description": "generated by klb bench robustness",
        "duration": gen.duration, "window": 5.0, "seed": seed * 1000 + index,
        "service": service_spec,
        "dips": [{"name": nm, "workers": v, "discipline": discipline, "speed": s, "weight": float(v)}
                 for nm, v, s in zip(names, vcpus, speeds, strict=True)],
        "clients": clients, "lb": lb, "events": events,
        "knapsack": {"lb": "haproxy", "data_plane": data_plane, "probe_interval": gen.probe_interval,
                     "probe_requests": probe_requests, "probe_timeout": timeout,
                     "light_requests": gen.light_requests},
    })
    dips = tuple(PoolDip(nm, v, s, a) for nm, v, s, a in zip(names, vcpus, speeds, after, strict=True))
    return Pool(index, scenario, dips, discipline, service, cv2, mean, scale, layer, load, rate,
                rate * factor, event, probe_requests)


def path_seed(pool: Pool, path: int) -> int:
    """The simulation seed of ``pool``'s random path ``path`` (0 to ``MAX_PATHS`` - 1): path 0 is the
    scenario's own seed, so a one-path gauge runs as it always did; every policy runs a path on the
    same seed, so their ratios on one path compare like with like."""
    if not 0 <= path < MAX_PATHS:
        raise ValueError(f"path must be 0-{MAX_PATHS - 1} (got {path})")
    return pool.scenario.seed + path * PATH_STRIDE


# --- the truth ----------------------------------------------------------------------------------------
def true_latency(vcpus: int, speed: float, mean_service: float, cv2: float, discipline: str, rate: float) -> float:
    """Mean sojourn time (s) of a DIP with ``vcpus`` workers at ``speed`` under Poisson ``rate``.

    Processor sharing over c cores: the number in system is M/M/c's whatever the service
    distribution, so T = s + C(c, a) s / (c (1 - rho)). FCFS: M/M/c's wait scaled by (1 + cv2) / 2
    (Allen-Cunneen; exact for exponential service, and Pollaczek-Khinchine for one worker).
    ``inf`` at or beyond capacity."""
    if speed <= 0:
        return math.inf if rate > 0 else mean_service
    service = mean_service / speed
    capacity = vcpus / service
    if rate >= capacity:
        return math.inf
    wait = erlang_c(vcpus, rate * service) / (capacity - rate)
    return service + wait * (1.0 if discipline == "ps" else (1 + cv2) / 2)


def oracle_plan(pool: Pool, after_event: bool = False, points: int = 48) -> dict[str, float]:
    """The project's exact solver on each live DIP's true curve (mean objective; :func:`oracle_split`)."""
    live = [(d, d.speed_in(after_event)) for d in pool.dips if d.speed_in(after_event) > 0]
    latency = {d.name: functools.partial(true_latency, d.vcpus, speed, pool.mean_service, pool.service_cv2,
                                         pool.discipline) for d, speed in live}
    capacity = {d.name: d.vcpus * speed / pool.mean_service for d, speed in live}
    split = oracle_split(latency, capacity, pool.rate(after_event), max_utilisation=ORACLE_MAX_UTILISATION,
                         points=points)
    return {d.name: split.get(d.name, 0.0) for d in pool.dips}


def capacity_plan(pool: Pool, after_event: bool = False) -> dict[str, float]:
    """Each DIP's share of the pool's true capacity (a failed DIP: 0)."""
    capacity = {d.name: d.vcpus * d.speed_in(after_event) for d in pool.dips}
    total = sum(capacity.values())
    return {name: c / total for name, c in capacity.items()}


def plan_latency(pool: Pool, weights: Mapping[str, float], after_event: bool = False) -> float:
    """True mean latency of a split (``inf`` if it overloads a DIP)."""
    rate = pool.rate(after_event)
    total = sum(weights.values())
    out = 0.0
    for d in pool.dips:
        w = weights.get(d.name, 0.0) / total
        if w > 0:
            speed = d.speed_in(after_event)
            out += w * true_latency(d.vcpus, speed, pool.mean_service, pool.service_cv2, pool.discipline, w * rate)
    return out


# --- the runs -----------------------------------------------------------------------------------------
def policy_run(pool: Pool, label: str) -> tuple[Scenario, PolicySpec]:
    """One policy of the gauge on this pool (a label of ``BASELINES``, ``REFERENCES`` or ``knapsack``):
    the scenario it runs on and its spec. Only the oracle calls the solver; ``capacity`` weights each
    DIP by its true capacity (vCPUs x speed, re-weighted at the event), the split a perfect capacity
    estimate would give, in KnapsackLB's data plane."""
    sc = pool.scenario
    checked = {"health_check": {"interval": 2.0, "timeout": 1.0}}
    if label in ("wrr_vcpu", "wlc_vcpu"):  # the scenario's configured weights are the vCPU counts
        name = "weighted_round_robin" if label == "wrr_vcpu" else "weighted_least_connections"
        return sc, PolicySpec.model_validate({"name": name, "label": label, **checked})
    if label in REFERENCES:
        weighted = "weighted_round_robin" if pool.layer == 4 else "weighted_least_connections"
        truth = oracle_plan if label == "oracle" else capacity_plan
        before = truth(pool)
        events = [e.model_dump() for e in sc.events]
        if sc.events:
            after = truth(pool, after_event=True)
            events.append({"at": sc.events[0].at, "kind": "weights", "weights": [after[g.name] for g in sc.dips]})
        oracle = sc.with_changes(dips=[{**g.model_dump(), "weight": before[g.name]} for g in sc.dips], events=events)
        return oracle, PolicySpec(name=weighted, label=label)
    if label not in (*BASELINES, "knapsack"):
        raise ValueError(f"unknown gauge policy {label!r} (known: {', '.join(POLICIES)})")
    if label == "knapsack":  # deployed beside an LB weighted by vCPU: it starts from the weights it reads there
        return sc, PolicySpec(name="knapsack")
    equal = sc.with_changes(dips=[{**g.model_dump(), "weight": 1.0} for g in sc.dips])
    return equal, PolicySpec.model_validate({"name": label, **checked})


@dataclass(frozen=True)
class Outcome:
    """What one policy did on one pool."""

    pool: int
    policy: str
    mean_ms: float
    p99_ms: float
    steady_mean_ms: float
    steady_p99_ms: float
    error_share: float
    wall_seconds: float
    first_solved_s: float | None = None
    # the plans' highest true utilisation of a DIP after the first solved plan, where a weight is a share (smooth
    # WRR); behind weighted least connections the LB sets the shares, and the measured busy share (max_busy) counts
    max_utilisation_after: float | None = None
    probe_share: float | None = None
    plans: int | None = None
    methods: dict[str, int] = field(default_factory=dict)
    flags: dict[str, int] = field(default_factory=dict)
    last_reasons: tuple[str, ...] = ()
    max_busy: float | None = None  # the highest measured busy share of a DIP in a window (KnapsackLB: after solving)
    saturated_windows: int | None = None  # windows in which some DIP was busy at least SATURATED of the time
    path: int = 0  # the random path (path_seed) the run took


def _window(series: Mapping[str, Any], since: float) -> tuple[float, float, float]:
    start = np.asarray(series["start"])
    latency = np.asarray(series["latency"])
    status = np.asarray(series["status"])
    counted = start >= since
    ok = counted & (status == STATUS_CODES["ok"])
    failed = counted & np.isin(status, [STATUS_CODES[c] for c in ("error", "timeout", "unfinished", "rejected",
                                                                   "dropped")])
    lat = latency[ok]
    if lat.size == 0:
        return math.nan, math.nan, 1.0
    return float(lat.mean()) * 1000, float(np.percentile(lat, 99)) * 1000, float(failed.sum() / counted.sum())


def _true_utilisation(pool: Pool, weights: Mapping[str, float], t: float) -> float:
    # a plan made at the event's instant was made on the rounds before it: it is judged on the pool it was made for
    after = bool(pool.scenario.events) and t > pool.scenario.events[0].at
    rate = pool.rate(after)
    total = sum(weights.values()) or 1.0
    worst = 0.0
    for d in pool.dips:
        speed = d.speed_in(after)
        share = weights.get(d.name, 0.0) / total
        if share <= 0:
            continue
        worst = max(worst, math.inf if speed <= 0 else share * rate * pool.mean_service / (d.vcpus * speed))
    return worst


def measured_busy(series: Mapping[str, Any], since: float) -> tuple[float | None, int]:
    """The highest busy share of any DIP over the windows that end after ``since``, and how many of
    those windows had a DIP busy at least ``SATURATED`` of the time."""
    busiest = [max(u) for t, u in zip(series.get("window_times", []), series.get("utilization", []), strict=True)
               if t > since and u]
    return (max(busiest) if busiest else None), sum(b >= SATURATED for b in busiest)


def run_one(pool: Pool, label: str, path: int = 0) -> Outcome:
    """One policy on one pool in the discrete-event simulator, on random path ``path``."""
    from knapsack_lb.sim.simulation import run

    scenario, spec = policy_run(pool, label)
    result = run(scenario, spec, path_seed(pool, path))
    steady_from = scenario.duration * (1 - STEADY_SHARE)
    mean, p99, errors = _window(result.series, 0.0)
    s_mean, s_p99, _ = _window(result.series, steady_from)
    busy, saturated = measured_busy(result.series, 0.0)
    base = Outcome(pool.index, label, mean, p99, s_mean, s_p99, errors, result.wall_seconds,
                   max_busy=busy, saturated_windows=saturated, path=path)
    if label != "knapsack":
        return base
    return _with_controller(base, pool, result.series.get("plans", []), result.series)


def _with_controller(base: Outcome, pool: Pool, plans: Sequence[Mapping[str, Any]],
                     series: Mapping[str, Any] | None = None) -> Outcome:
    solved_at = next((p["time"] for p in plans
                      if p["method"] in LEARNED_METHODS and PlanFlag.MEASURING not in p["flags"]), None)
    max_util = None
    busy, saturated = base.max_busy, base.saturated_windows
    if solved_at is not None:
        if pool.scenario.knapsack.data_plane == "smooth_wrr":
            max_util = max(_true_utilisation(pool, p["weights"], p["time"]) for p in plans if p["time"] >= solved_at)
        if series is not None:
            busy, saturated = measured_busy(series, solved_at)
    methods: dict[str, int] = {}
    flags: dict[str, int] = {}
    for p in plans:
        methods[str(p["method"])] = methods.get(str(p["method"]), 0) + 1
        for f in p["flags"]:
            flags[str(f)] = flags.get(str(f), 0) + 1
    if series is not None and "probes_sent" in series:  # what the probes really sent (the LB's timings lower it)
        light_work = series.get("light_sent", 0) * pool.scenario.knapsack.light_work  # in mean requests' work
        probe_rate = (series["probes_sent"] + light_work) / pool.scenario.duration
    else:
        probe_rate = len(pool.dips) * pool.probe_requests / pool.scenario.knapsack.probe_interval
    last = tuple(str(r) for r in plans[-1]["reasons"])[:6] if plans else ()
    return Outcome(**{**asdict(base), "first_solved_s": solved_at, "max_utilisation_after": max_util,
                      "max_busy": busy, "saturated_windows": saturated,
                      "probe_share": probe_rate / pool.capacity, "plans": len(plans), "methods": methods,
                      "flags": flags, "last_reasons": last})


def run_one_fluid(pool: Pool, label: str, path: int = 0) -> Outcome:
    """One policy on one pool in the fluid model (every DIP M/M/c; no connection placement), on random
    path ``path`` (the probes' noise)."""
    from knapsack_lb.controller.settings import ControllerSettings, LoopSettings
    from knapsack_lb.lab.bench.controller import Run

    gen_interval = pool.scenario.knapsack.probe_interval
    dips = [FluidDip(d.name, d.vcpus, d.speed / pool.mean_service, vcpus=d.vcpus) for d in pool.dips]
    drain = pool.scenario.clients.requests_per_session * (pool.scenario.clients.think_time + pool.mean_service) \
        if pool.layer == 4 else 0.0
    model = FluidModel(dips, total_rate=pool.offered_rate, vip="vip", drain_time=drain,
                       probe_requests=pool.probe_requests, timeout=pool.scenario.lb.timeout or 3.0,
                       seed=path_seed(pool, path))
    static = {"round_robin": {d.name: 1.0 for d in pool.dips},
              "wrr_vcpu": {d.name: float(d.vcpus) for d in pool.dips}}
    if label not in FLUID_POLICIES:
        raise ValueError(f"policy {label!r} has no fluid counterpart (fluid runs: {', '.join(FLUID_POLICIES)})")
    settings = ControllerSettings(loop=LoopSettings(interval=gen_interval))
    # deployed beside an LB weighted by vCPU, as in the simulator: it starts from the weights it reads there
    run = Run(model, settings, path_seed(pool, path), start=static["wrr_vcpu"]) if label == "knapsack" else None
    event = pool.scenario.events[0] if pool.scenario.events else None
    means: list[tuple[float, float, float]] = []
    plans: list[dict[str, Any]] = []
    t = 0.0
    oracle = model.oracle().weights if label == "oracle" else {}
    while t < pool.scenario.duration:
        if event is not None and t >= event.at:
            _fluid_event(model, pool, event)
            event = None
            if label == "oracle":
                oracle = model.oracle().weights
        if run is not None:
            run.tick()
            t = run.now
            plan = run.ctl.plan
            weights = model.effective_weights(t)
            if plan is not None and (not plans or plans[-1]["version"] != plan.version):
                plans.append({"time": t, "weights": dict(plan.weights), "flags": list(plan.flags),
                              "reasons": list(plan.reasons), "method": plan.method, "version": plan.version})
        else:
            t += gen_interval
            weights = oracle if label == "oracle" else {
                n: (0.0 if model.dip(n).failed else w) for n, w in static[label].items()}
        q = model.quality(weights)
        means.append((t, q.mean_latency * 1000, q.p99_latency * 1000))
    arr = np.array(means)
    steady = arr[arr[:, 0] >= pool.scenario.duration * (1 - STEADY_SHARE)]
    base = Outcome(pool.index, label, float(arr[:, 1].mean()), float(arr[:, 2].mean()), float(steady[:, 1].mean()),
                   float(steady[:, 2].mean()), 0.0, 0.0, path=path)
    return _with_controller(base, pool, plans) if label == "knapsack" else base


def _fluid_event(model: FluidModel, pool: Pool, event: EventSpec) -> None:
    if event.kind == "traffic":
        model.set_total_rate(pool.rate_after)
    for d in pool.dips:
        if d.speed_after <= 0 and d.speed > 0:
            model.fail(d.name)
        elif d.speed_after != d.speed:
            model.set_capacity_factor(d.name, d.speed_after / d.speed)


FLUID_POLICIES = ("round_robin", "wrr_vcpu", "oracle", "knapsack")


# --- the gauge ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PoolReport:
    """Every policy's outcome on one pool along one random path (:func:`path_seed`)."""

    pool: Pool
    outcomes: Mapping[str, Outcome]

    @property
    def path(self) -> int:
        """The random path its outcomes took (one for all of them)."""
        return next(iter(self.outcomes.values())).path

    def ratio(self, other: str, steady: bool = True, of: str = "knapsack") -> float:
        """``of``'s mean latency (KnapsackLB's by default) over ``other``'s: a policy's label, ``"best"``
        (the best of ``BASELINES`` run) or ``"layer"`` (the best of the pool's ``LAYER_BASELINES`` run;
        NaN when none ran)."""
        key = "steady_mean_ms" if steady else "mean_ms"
        mine = getattr(self.outcomes[of], key)
        if not math.isfinite(mine):  # no request succeeded in the window: as bad as it gets
            return math.inf
        if other in ("best", "layer"):
            among = BASELINES if other == "best" else LAYER_BASELINES[self.pool.layer]
            theirs = min((getattr(self.outcomes[b], key) for b in among if b in self.outcomes), default=math.nan)
        else:
            theirs = getattr(self.outcomes[other], key)
        return mine / theirs if theirs > 0 else math.nan

    def best_baseline(self) -> str:
        return min((b for b in BASELINES if b in self.outcomes), key=lambda b: self.outcomes[b].steady_mean_ms)

    def vcpu_weighted(self) -> str:
        return "wrr_vcpu" if self.pool.layer == 4 or "wlc_vcpu" not in self.outcomes else "wlc_vcpu"


def distribution(values: Iterable[float]) -> dict[str, float]:
    """Median, p90 and worst (nearest rank, so an infinite ratio stays infinite); NaN is left out."""
    arr = np.array([v for v in values if not math.isnan(v)])
    if arr.size == 0:
        return {"median": math.nan, "p90": math.nan, "worst": math.nan}
    return {"median": float(np.percentile(arr, 50, method="nearest")),
            "p90": float(np.percentile(arr, 90, method="nearest")), "worst": float(arr.max())}


def geometric_mean(ratios: Iterable[float]) -> float:
    """The geometric mean of latency ratios (the mean of their logs: a path at 0.8x and one at 1.25x
    cancel); infinite when any is (no request succeeded), NaN ratios left out, NaN when none is left."""
    logs = [math.log(r) if r > 0 else -math.inf for r in ratios if not math.isnan(r)]
    if not logs:
        return math.nan
    return math.inf if math.inf in logs else math.exp(math.fsum(logs) / len(logs))


def by_pool(reports: Sequence[PoolReport]) -> list[list[PoolReport]]:
    """The reports grouped by pool (each group is one pool's paths, by path), pools in the order first seen."""
    groups: dict[int, list[PoolReport]] = {}
    for r in reports:
        groups.setdefault(r.pool.index, []).append(r)
    return [sorted(g, key=lambda r: r.path) for g in groups.values()]


def per_pool(reports: Sequence[PoolReport], value: Callable[[PoolReport], float]) -> list[float]:
    """``value`` of each pool: the :func:`geometric_mean` over its paths (the value itself with one path)."""
    return [geometric_mean(value(r) for r in group) for group in by_pool(reports)]


def _paths(reports: Sequence[PoolReport]) -> list[int]:
    return sorted({r.path for r in reports})


def summarise(reports: Sequence[PoolReport]) -> dict[str, Any]:
    """The gauge's headline numbers over every pool. Ratios are per pool (:func:`per_pool`: the geometric
    mean over its paths); what a run did (first solved plan, utilisation, busy share, probe load) is over
    every run; a pool counts as saturated or never solved when it was on any path."""
    have_lc = all("least_connections" in r.outcomes for r in reports)
    pools = by_pool(reports)
    vcpu = per_pool(reports, lambda r: r.ratio(r.vcpu_weighted()))
    out: dict[str, Any] = {
        "pools": len(pools),
        "paths": len(_paths(reports)),
        "steady_vs_best_baseline": distribution(per_pool(reports, lambda r: r.ratio("best"))),
        "steady_vs_oracle": distribution(per_pool(reports, lambda r: r.ratio("oracle"))),
        "whole_run_vs_best_baseline": distribution(per_pool(reports, lambda r: r.ratio("best", steady=False))),
        "whole_run_vs_oracle": distribution(per_pool(reports, lambda r: r.ratio("oracle", steady=False))),
        "worse_than_vcpu_weights": sum(v > 1 for v in vcpu),
        "worse_than_vcpu_weights_by_5pct": sum(v > 1.05 for v in vcpu),
        "never_solved": sum(any(r.outcomes["knapsack"].first_solved_s is None for r in g) for g in pools),
        "first_solved_s": distribution(r.outcomes["knapsack"].first_solved_s or math.nan for r in reports),
        "max_utilisation_after_solved": distribution(r.outcomes["knapsack"].max_utilisation_after or math.nan
                                                     for r in reports),
        "probe_share": distribution(r.outcomes["knapsack"].probe_share or math.nan for r in reports),
        "max_busy_after_solved": distribution(_or_nan(r.outcomes["knapsack"].max_busy) for r in reports),
        # per policy: pools on which some DIP was measured at its capacity in some window (KnapsackLB: after solving)
        "saturated_pools": {label: sum(any(r.outcomes[label].saturated_windows for r in g) for g in pools)
                            for label in (reports[0].outcomes if reports else ())
                            if all(r.outcomes[label].saturated_windows is not None for r in reports)},
        "by_layer": {str(layer): layer_summary([r for r in reports if r.pool.layer == layer])
                     for layer in sorted({r.pool.layer for r in reports})},
    }
    if all("capacity" in r.outcomes for r in reports):
        # the ceiling of learning weights at all: the true capacities against the operator's vCPU weights
        out["steady_vs_capacity_weights"] = distribution(per_pool(reports, lambda r: r.ratio("capacity")))
        out["capacity_weights_vs_vcpu_weights"] = distribution(
            per_pool(reports, lambda r: r.ratio(r.vcpu_weighted(), of="capacity")))
    if have_lc:
        lc = per_pool(reports, lambda r: r.ratio("least_connections"))
        out["worse_than_least_connections"] = sum(v > 1 for v in lc)
        out["worse_than_least_connections_by_5pct"] = sum(v > 1.05 for v in lc)
    return out


def layer_summary(reports: Sequence[PoolReport]) -> dict[str, Any]:
    """One layer's pools against that layer's bar: KnapsackLB's mean latency over the best of the
    ``LAYER_BASELINES`` that ran (steady window and whole run) and over the oracle, per pool; how many
    pools it beat over the whole run (on the pool's mean over its paths, and on each path alone: the
    spread a single path hides); how many a plan drove past a DIP's true capacity after the first solved
    plan (on any path; layer 4, where a weight is a share), and the time to that plan. Where none of the
    layer's baselines ran (the fluid engine at layer 7), the counts against them are None."""
    whole = per_pool(reports, lambda r: r.ratio("layer", steady=False))
    pools = by_pool(reports)
    ran = [b for b in (LAYER_BASELINES[reports[0].pool.layer] if reports else ())
           if all(b in r.outcomes for r in reports)]

    def count(beats: Callable[[float], bool], values: Iterable[float]) -> int | None:
        return sum(beats(v) for v in values) if ran else None

    return {
        "pools": len(pools),
        "operator_baselines": ran,
        "steady_vs_operator": distribution(per_pool(reports, lambda r: r.ratio("layer"))),
        "steady_vs_oracle": distribution(per_pool(reports, lambda r: r.ratio("oracle"))),
        "whole_run_vs_operator": distribution(whole),
        "better_whole_run": count(lambda v: v < 1, whole),
        "worse_whole_run_by_5pct": count(lambda v: v > 1.05, whole),
        "better_whole_run_per_path": [count(lambda v: v < 1, (r.ratio("layer", steady=False) for r in reports
                                                              if r.path == k)) for k in _paths(reports)],
        "above_capacity_after_solved": sum(any((r.outcomes["knapsack"].max_utilisation_after or 0.0) > 1.0
                                               for r in g) for g in pools),
        "first_solved_s": distribution(r.outcomes["knapsack"].first_solved_s or math.nan for r in reports),
    }


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else value


def worst_pools(reports: Sequence[PoolReport], count: int = 4) -> list[PoolReport]:
    """The pools where KnapsackLB's steady mean is furthest above the best baseline."""
    return sorted(reports, key=lambda r: -r.ratio("best"))[:count]


def gauge_policies(engine: Literal["sim", "fluid"], chosen: Sequence[str] | None = None) -> tuple[str, ...]:
    """The policies a gauge runs: ``chosen`` (every policy of the engine when None) with KnapsackLB and
    the oracle always among them (every ratio is KnapsackLB's, and the steady bar is set by the oracle),
    in the engine's order. Raises ValueError naming an unknown label."""
    known = FLUID_POLICIES if engine == "fluid" else POLICIES
    if chosen is None:
        return known
    for label in chosen:
        if label not in known:
            raise ValueError(f"policies: unknown {engine} policy {label!r} (known: {', '.join(known)})")
    wanted = {*chosen, "knapsack", "oracle"}
    return tuple(label for label in known if label in wanted)


def run_gauge(pools: Sequence[Pool], engine: Literal["sim", "fluid"] = "sim", workers: int | None = None,
              on_done: Callable[[Outcome], None] | None = None, *, paths: int = 1,
              policies: Sequence[str] | None = None) -> list[PoolReport]:
    """Every policy (:func:`gauge_policies`) on every pool along ``paths`` random paths each, in parallel
    over ``workers`` processes (default: the CPUs); one report per pool and path, by pool then path."""
    labels = gauge_policies(engine, policies)
    if not 1 <= paths <= MAX_PATHS:
        raise ValueError(f"paths must be 1-{MAX_PATHS} (got {paths})")
    fn = run_one_fluid if engine == "fluid" else run_one
    tasks = [(p, label, k) for p in pools for label in labels for k in range(paths)]
    # the slow runs first, so that the last minutes are not one process alone
    tasks.sort(key=lambda t: (t[1] != "knapsack", -len(t[0].dips)))
    results: dict[tuple[int, str, int], Outcome] = {}
    workers = workers or os.cpu_count() or 1
    if workers <= 1:
        for pool, label, k in tasks:
            results[(pool.index, label, k)] = outcome = fn(pool, label, k)
            if on_done:
                on_done(outcome)
    else:
        with ProcessPoolExecutor(max_workers=workers) as executor:
            futures = [executor.submit(fn, pool, label, k) for pool, label, k in tasks]
            for future in as_completed(futures):
                outcome = future.result()
                results[(outcome.pool, outcome.policy, outcome.path)] = outcome
                if on_done:
                    on_done(outcome)
    return [PoolReport(p, {label: results[(p.index, label, k)] for label in labels})
            for p in pools for k in range(paths)]


def save_specs(pools: Sequence[Pool], directory: Path) -> list[Path]:
    """Each pool's scenario as YAML, with the gauge's policies, for ``klb sim compare``."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for pool in pools:
        data = pool.scenario.model_dump(mode="json", exclude_defaults=True)
        data["description"] = pool.describe() + (
            "; configured weights are the vCPU counts (wrr_vcpu, wlc_vcpu); round robin, least connections and "
            "power of two ignore them; the oracle plan: " +
            ", ".join(f"{n}={w:.4f}" for n, w in oracle_plan(pool).items()))
        data["policies"] = [policy_run(pool, label)[1].model_dump(mode="json", exclude_defaults=True)
                            | {"label": label} for label in (*BASELINES, "knapsack")]
        path = directory / f"{pool.scenario.name}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        paths.append(path)
    return paths


def _strict(value: Any) -> Any:
    """JSON-safe: non-finite numbers become ``None``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_strict(v) for v in value]
    return value


def report_json(reports: Sequence[PoolReport], engine: str, seed: int) -> dict[str, Any]:
    """Every pool's numbers and the summary; non-finite numbers (a policy that never answered) are null."""
    return _strict({
        "engine": engine, "seed": seed, "summary": summarise(reports),
        "pools": [{"index": r.pool.index, "path": r.path, "pool": r.pool.describe(), "layer": r.pool.layer,
                   "time_scale": round(r.pool.time_scale, 3), "probe_requests": r.pool.probe_requests,
                   "steady_vs_best": r.ratio("best"), "best_baseline": r.best_baseline(),
                   "steady_vs_oracle": r.ratio("oracle"), "whole_run_vs_operator": r.ratio("layer", steady=False),
                   "outcomes": {k: asdict(o) for k, o in r.outcomes.items()}} for r in reports],
    })


def plot(reports: Sequence[PoolReport], path: Path) -> Path:
    """Left: KnapsackLB over the best baseline and over the oracle per pool (the geometric mean over its
    paths), sorted; right: their CDFs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, (bars, cdf) = plt.subplots(1, 2, figsize=(12, 4.5))
    series = {"vs best operator baseline (steady)": per_pool(reports, lambda r: r.ratio("best")),
              "vs oracle static plan (steady)": per_pool(reports, lambda r: r.ratio("oracle")),
              "vs best operator baseline (whole run)": per_pool(reports, lambda r: r.ratio("best", steady=False))}
    for name, values in series.items():
        finite = np.sort(np.array([v for v in values if math.isfinite(v)]))
        bars.plot(range(1, finite.size + 1), finite, marker="o", ms=3, label=name)
        cdf.step(finite, np.arange(1, finite.size + 1) / max(finite.size, 1), where="post", label=name)
    bars.axhline(1.0, color="grey", ls="--", lw=1)
    cdf.axvline(1.0, color="grey", ls="--", lw=1)
    for ax in (bars, cdf):
        ax.grid(alpha=0.3)
    bars.set_yscale("log")
    bars.set_xlabel("pool (sorted)")
    bars.set_ylabel("KnapsackLB mean latency / other")
    cdf.set_xscale("log")
    plain = FuncFormatter(lambda value, _: f"{value:g}")  # ratios near 1: "1.1", not "1.1 x 10^0"
    for axis in (bars.yaxis, cdf.xaxis):
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(plain)
    cdf.set_xlabel("KnapsackLB mean latency / other")
    cdf.set_ylabel("share of pools")
    cdf.legend(fontsize=8)
    paths = len(_paths(reports))
    fig.suptitle(f"KnapsackLB (defaults) on {len(by_pool(reports))} random pools"
                 + (f", {paths} random paths each" if paths > 1 else ""))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
