"""``klb bench light-probes``: what light probes of fixed work tell of a DIP's capacity, against
what rounds of the application's requests tell.

One simulated DIP (:class:`knapsack_lb.sim.server.SimDip`, the simulator's own queue: ``workers``
FCFS workers or processor sharing over ``workers`` cores) serves Poisson requests of mean service
1 (time is in units of it) at ``utilisation`` of its capacity, with exponential, lognormal (sigma 1)
or fixed service. Every ``PROBE_SPACING`` units on average a light probe of ``LIGHT_WORK`` units of
fixed work arrives; it *waited* when it took longer than its own work. Per case the bench reports:

* the share of light probes that waited against Erlang's C formula (exact for M/M/c and, by
  insensitivity, for processor sharing; approximate for FCFS with other service);
* the capacity read from that share (:func:`knapsack_lb.controller.waiting.capacity_from_waited_share`,
  with the carried rate and the mean service as inputs) over the true capacity, with its bounds at
  two standard errors;
* the utilisation read without the rate, from the waited share and the mean excess of the probes
  that waited (:func:`knapsack_lb.controller.waiting.load_from_light_probes`; the excess in units of
  the probe's own work under processor sharing, of the mean service behind FCFS workers), as the
  capacity it implies (the carried rate over it) over the true capacity, with its bounds;
* both estimates again from each block of ``BLOCK`` consecutive probes (a round's worth): how many
  blocks give one (no wait, no estimate) and the median and 90th percentile of their error;
* the mean latency of the application's requests over the unloaded one, against M/M/c's;
* the relative standard error of the capacity read from ``n`` probes, both ways: from the waited
  share of ``n`` light probes, and from the mean latency of ``n`` application probes with the
  unloaded latency known exactly (M/M/c's mean and variance of the sojourn, the derivative taken
  over a real number of workers). The second is the signal KnapsackLB's rounds carry.

How it fails: one seeded run per case; the light probes add ``LIGHT_WORK / PROBE_SPACING`` of one
worker's load (0.2 %), which the true capacity leaves out. A real probe also waits for the
network: its unloaded latency must be known to well under the wait it is to see, which this bench
does not model (no network). Bad arguments raise :class:`~knapsack_lb.errors.InvalidInputError`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from knapsack_lb.controller.waiting import capacity_from_waited_share, erlang_c, load_from_light_probes
from knapsack_lb.errors import InvalidInputError
from knapsack_lb.sim.engine import Engine
from knapsack_lb.sim.server import Answer, Job, SimDip
from knapsack_lb.sim.service_time import sampler
from knapsack_lb.sim.spec import ServiceSpec

LIGHT_WORK = 0.01  # a light probe's work, in units of the application's mean service
PROBE_SPACING = 5.0  # mean time between light probes, in the same units
WARMUP = 200.0  # units of time before the first probe
PRECISION_PROBES = (20, 50, 100)
BLOCK = 50  # consecutive probes per block (a round's worth)
Discipline = Literal["fcfs", "ps"]
Service = Literal["exponential", "lognormal", "fixed"]


@dataclass(frozen=True)
class LightProbeCase:
    """One DIP: ``workers`` at ``utilisation`` of its capacity."""

    workers: int
    utilisation: float
    discipline: Discipline
    service: Service


@dataclass(frozen=True)
class LightProbeResult:
    """What one case measured (ratios over the truth; ``None`` where the estimate is unbounded)."""

    case: LightProbeCase
    probes: int
    waited: int
    waited_share: float
    erlang_c: float
    capacity_over_truth: float | None  # the estimate from the waited share / the true capacity
    low_over_truth: float | None
    high_over_truth: float | None
    # the utilisation read from the waits alone, as a capacity (carried rate / utilisation) over the truth
    rate_free_over_truth: float | None
    rate_free_low_over_truth: float | None  # from the utilisation's upper bound
    rate_free_high_over_truth: float | None  # from its lower bound (None: unbounded)
    blocks: int
    blocks_estimated: int  # blocks in which some probe waited (and not every one)
    # |estimate / truth - 1| over those blocks, median and 90th percentile: (with the rate, without it)
    block_error: dict[str, tuple[float, float] | None]
    mean_over_unloaded: float  # the application's requests, measured
    mmc_mean_over_unloaded: float
    # probes -> relative standard error of the capacity: (from the waited share, from the mean latency)
    capacity_stderr: dict[int, tuple[float, float]] = field(default_factory=dict)


def default_cases() -> list[LightProbeCase]:
    """1, 4 and 16 workers at 50, 70 and 85 %, both disciplines, the three service distributions."""
    return [LightProbeCase(w, u, d, s) for w in (1, 4, 16) for u in (0.5, 0.7, 0.85)
            for d in ("fcfs", "ps") for s in ("exponential", "lognormal", "fixed")]


def _sojourn_moments(servers: float, offered: float) -> tuple[float, float]:
    """M/M/c's mean and variance of the sojourn, in units of the mean service."""
    waits = erlang_c(servers, offered)
    gap = servers - offered
    return 1 + waits / gap, 1 + waits * (2 - waits) / gap**2


def capacity_stderr(servers: int, utilisation: float, probes: int) -> tuple[float, float]:
    """Relative standard error of a capacity read from ``probes`` probes: (from the waited share of
    light probes, from the mean latency of application probes with the unloaded latency known)."""
    offered = servers * utilisation
    step = 1e-4 * servers
    waits = erlang_c(servers, offered)
    d_waits = (erlang_c(servers + step, offered) - erlang_c(servers - step, offered)) / (2 * step)
    variance = _sojourn_moments(servers, offered)[1]
    d_mean = (_sojourn_moments(servers + step, offered)[0] - _sojourn_moments(servers - step, offered)[0]) / (2 * step)
    by_waits = math.sqrt(waits * (1 - waits) / probes) / abs(d_waits) / servers if d_waits else math.inf
    by_mean = math.sqrt(variance / probes) / abs(d_mean) / servers if d_mean else math.inf
    return by_waits, by_mean


def run_case(case: LightProbeCase, *, probes: int = 4000, seed: int = 1) -> LightProbeResult:
    """One DIP until ``probes`` light probes have been sent (see the module docstring)."""
    if not isinstance(probes, int) or probes < 1:
        raise InvalidInputError("probes", probes, "must be an integer >= 1")
    if not 0 < case.utilisation < 1:
        raise InvalidInputError("utilisation", case.utilisation, "must be a share strictly between 0 and 1")
    if case.workers < 1:
        raise InvalidInputError("workers", case.workers, "must be >= 1")
    engine = Engine()
    rng = random.Random(f"light-probes/{seed}/{case}")
    dip = SimDip(engine, 0, "dip", workers=case.workers, discipline=case.discipline, speed=1.0,
                 capacity=case.workers, error_probability=0.0, error_latency="fast", rng=random.Random(seed))
    size = sampler(ServiceSpec(kind=case.service, mean=1.0, sigma=1.0), rng)
    rate = case.workers * case.utilisation
    light: list[float] = []
    served: list[float] = []
    sent = [0]

    def light_done(job: Job, status: Answer, inflight: int, chip: bool) -> None:
        light.append(engine.now - job.arrived)

    def request_done(job: Job, status: Answer, inflight: int, chip: bool) -> None:
        served.append(engine.now - job.arrived)

    def request(_: Any) -> None:
        dip.arrive(Job(size(), request_done, None))
        engine.after(rng.expovariate(rate), request)

    def probe(_: Any) -> None:
        if sent[0] < probes:
            sent[0] += 1
            dip.arrive(Job(LIGHT_WORK, light_done, None))
            engine.after(rng.expovariate(1 / PROBE_SPACING), probe)

    engine.after(0.0, request)
    engine.after(WARMUP, probe)
    # the probes' spacings sum to PROBE_SPACING x probes, give or take a few times its square root
    horizon = WARMUP + PROBE_SPACING * (probes + 6 * math.sqrt(probes))
    for _ in range(1000):  # bounded: a stable queue answers the last probes within a few hundred units
        engine.run(horizon)
        horizon += 100.0
        if sent[0] == probes and len(light) == probes:
            break
    else:
        raise RuntimeError(f"{case}: {probes - len(light)} light probes unanswered")
    # a wait's length in units of the mean service behind workers, of the probe's own work under sharing
    unit = LIGHT_WORK if case.discipline == "ps" else 1.0
    excess = [(t - LIGHT_WORK) / unit if t > LIGHT_WORK * (1 + 1e-9) else 0.0 for t in light]
    waited = sum(1 for e in excess if e > 0)
    truth = float(case.workers)  # requests per unit of time (the probes take 0.2 % of one worker)
    estimate = capacity_from_waited_share(waited, len(light), rate=rate, unloaded=1.0)
    load = load_from_light_probes(waited, len(light), sum(excess))

    def over_truth(value: float | None) -> float | None:
        return None if value is None else value / truth

    def from_utilisation(value: float | None) -> float | None:
        return None if not value else case.utilisation / value

    with_rate: list[float] = []
    without_rate: list[float] = []
    for start in range(0, len(excess) - BLOCK + 1, BLOCK):
        block = excess[start:start + BLOCK]
        block_waited = sum(1 for e in block if e > 0)
        if 0 < block_waited < BLOCK:
            # with some but not every probe waited, both estimates exist
            read = capacity_from_waited_share(block_waited, BLOCK, rate=rate, unloaded=1.0).capacity
            utilisation = load_from_light_probes(block_waited, BLOCK, sum(block)).utilisation
            assert read is not None and utilisation is not None
            with_rate.append(abs(read / truth - 1))
            without_rate.append(abs(case.utilisation / utilisation - 1))

    def spread(errors: list[float]) -> tuple[float, float] | None:
        if not errors:
            return None
        ranked = sorted(errors)
        return ranked[len(ranked) // 2], ranked[min(len(ranked) - 1, int(0.9 * len(ranked)))]

    return LightProbeResult(
        case=case, probes=len(light), waited=waited, waited_share=waited / len(light),
        erlang_c=erlang_c(case.workers, rate), capacity_over_truth=over_truth(estimate.capacity),
        low_over_truth=over_truth(estimate.low), high_over_truth=over_truth(estimate.high),
        rate_free_over_truth=from_utilisation(load.utilisation), rate_free_low_over_truth=from_utilisation(load.high),
        rate_free_high_over_truth=from_utilisation(load.low), blocks=len(light) // BLOCK,
        blocks_estimated=len(with_rate),
        block_error={"with_rate": spread(with_rate), "without_rate": spread(without_rate)},
        mean_over_unloaded=sum(served) / len(served),
        mmc_mean_over_unloaded=_sojourn_moments(case.workers, rate)[0],
        capacity_stderr={n: capacity_stderr(case.workers, case.utilisation, n) for n in PRECISION_PROBES})


def run_light_probes(cases: Sequence[LightProbeCase] | None = None, *, probes: int = 4000, seed: int = 1,
                     on_case: Callable[[LightProbeCase], None] | None = None) -> dict[str, Any]:
    """Every case, then a JSON-ready report."""
    results = []
    for case in cases if cases is not None else default_cases():
        results.append(run_case(case, probes=probes, seed=seed))
        if on_case is not None:
            on_case(case)
    rows = [{**asdict(r), "case": asdict(r.case),
             "capacity_stderr": {str(n): {"waited_share": w, "mean_latency": m}
                                 for n, (w, m) in r.capacity_stderr.items()}} for r in results]
    return {"benchmark": "light-probes", "seed": seed, "probes": probes, "light_work": LIGHT_WORK,
            "probe_spacing": PROBE_SPACING, "cases": rows}


def plot_reads(labels: Sequence[str], reads: Mapping[str, Sequence[float | None]], path: Path, title: str) -> Path:
    """One marker per case and read (estimate / truth; ``None`` left out) against the truth's line,
    the cases along the x axis; a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(8.0, 0.22 * len(labels) + 3), 4.5))
    for (name, values), marker in zip(reads.items(), "osD^v", strict=False):
        points = [(i, v) for i, v in enumerate(values) if v is not None]
        ax.plot([i for i, _ in points], [v for _, v in points], marker, ms=4, label=name, alpha=0.8)
    ax.axhline(1.0, color="grey", ls="--", lw=1)
    ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=7)
    ax.set_ylabel("capacity read / true capacity")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot(report: dict[str, Any], path: Path) -> Path:
    """The simulated bench's reads per case: with the carried rate, without it."""
    cases = report["cases"]
    labels = [f"{c['case']['workers']}w {round(100 * c['case']['utilisation'])}% {c['case']['discipline']} "
              f"{c['case']['service'][:4]}" for c in cases]
    reads = {"waited share, with the carried rate": [c["capacity_over_truth"] for c in cases],
             "waits alone, without the rate": [c["rate_free_over_truth"] for c in cases]}
    return plot_reads(labels, reads, path, f"light probes on the simulator's DIP ({report['probes']} per case)")
