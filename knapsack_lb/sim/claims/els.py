"""The ELS blog's second benchmark (ELS blog, "SECOND BENCHMARK") against the simulator.

Scenario ``els-failing``: one router, 4 machines with log-normal job sizes, one failing 50% of
its requests fast, load ramped from almost nothing to the pool's capacity. The blog's error-rate
graph: round robin stays at about 12.5% (1/4 of the traffic x 1/2), JSQ starts at about 12.5% and
rises to about 17.5% (a machine that fails fast has a short queue, so JSQ feeds it), ELS starts far
lower and rises steadily with load ("a feature and not a bug": when the others saturate, a fast
failure and a client retry beat a long wait). And: "JSQ has the best latency but it comes at the
cost of the highest error rate of all three."

Error rates are measured per fifth of the ramp (by request start time).
"""

from __future__ import annotations

import numpy as np

from knapsack_lb.sim.metrics import STATUS_CODES, SimResult
from knapsack_lb.sim.reproduce import ClaimRow, Experiment, run_many
from knapsack_lb.sim.spec import Scenario, ServiceSpec, load_scenario

SCENARIO = "els-failing"
RR, JSQ, ELS = "round_robin", "least_connections", "els"
BANDS = 5


def error_rates_by_band(result: SimResult, duration: float, bands: int = BANDS) -> list[float]:
    """Error share of the requests started in each of ``bands`` equal slices of the ramp."""
    start = np.asarray(result.series["start"])
    status = np.asarray(result.series["status"])
    rates = []
    for k in range(bands):
        lo, hi = duration * k / bands, duration * (k + 1) / bands
        mask = (start >= lo) & (start < hi)
        n = int(mask.sum())
        rates.append(float((status[mask] == STATUS_CODES["error"]).sum()) / n if n else 0.0)
    return rates


def reduced(duration: float = 120.0, mean_service: float = 0.08) -> Scenario:
    """The ramp in ``duration`` seconds with slower jobs (fewer requests, same shape in load)."""
    scenario = load_scenario(SCENARIO)
    ramp = [{"at": p.at * duration / scenario.duration, "load": p.load} for p in scenario.clients.ramp]
    return scenario.with_changes(
        duration=duration,
        service=ServiceSpec(kind=scenario.service.kind, mean=mean_service, sigma=scenario.service.sigma).model_dump(),
        clients={"ramp": ramp},
    )


def _fmt(rates: list[float]) -> str:
    return " -> ".join(f"{100 * r:.1f}%" for r in rates)


def second_benchmark(seed: int) -> list[ClaimRow]:
    scenario = reduced()
    results = run_many(scenario, [RR, JSQ, ELS], seed)
    rr, jsq, els = (error_rates_by_band(results[p], scenario.duration) for p in (RR, JSQ, ELS))
    command = f"klb sim compare {SCENARIO}"
    p75 = {p: float(np.percentile(results[p].latencies, 75)) for p in (RR, JSQ, ELS)}
    total_error = {p: results[p].error_rate for p in (RR, JSQ, ELS)}
    return [
        ClaimRow("els", "round robin's error rate over the load ramp", "error_rate by fifth of the ramp",
                 "about 12.5% throughout", _fmt(rr), all(0.10 <= r <= 0.15 for r in rr), command),
        ClaimRow("els", "JSQ's error rate over the load ramp", "error_rate by fifth of the ramp",
                 "starts about 12.5%, rises to about 17.5%", _fmt(jsq),
                 jsq[-1] >= 0.15 and jsq[-1] > jsq[0] and jsq[-1] > rr[-1], command,
                 "JSQ's first fifth is already above 12.5%: at 2-20% load queues still form with "
                 "log-normal jobs, and the failing machine's is the shortest"),
        ClaimRow("els", "ELS' error rate over the load ramp", "error_rate by fifth of the ramp",
                 "far below round robin at low load, rising with load", _fmt(els),
                 els[0] <= 0.6 * 0.125 and els[-1] > els[0], command),
        ClaimRow("els", "JSQ: best latency at the cost of the highest error rate", "p75, error_rate",
                 "JSQ best p75, highest error rate",
                 ", ".join(f"{p} p75 {1000 * p75[p]:.0f} ms err {100 * total_error[p]:.1f}%" for p in (RR, JSQ, ELS)),
                 min(p75, key=lambda p: p75[p]) == JSQ and max(total_error, key=lambda p: total_error[p]) == JSQ,
                 command),
    ]


EXPERIMENTS: list[Experiment] = [Experiment("els", "one machine failing 50%, load ramp", second_benchmark)]
