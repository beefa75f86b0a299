"""BLOC's headline claims (BLOC paper, sections VI.B and VI.E) against the simulator.

Scenario ``bloc-40x10``: 40 sidecar frontends, 10 one-at-a-time backends at 250 ms, Cap = 10.
The baseline is P2C least connections (the BLOC proxy's "P2C Least Connection", Istio/Envoy's
least_request) *without* BLOC's server side: its run switches AQM and chips off, as the paper's
LeastConnection deployment has neither.

* VI.B (closed loop, hey): BLOC's 10-90 percentile range 2.77 s -> 0.97 s (2-4x narrower), p99
  about 2x lower, 0.93% more completed requests; few failures (Fig. 12b: 346 of 12,000).
* VI.E (open loop, Poisson): LeastConnection "becomes overloaded with very poor performance after
  35 req/sec" while BLOC "gracefully" handles 47 req/s; at the highest rate BLOC drops 16% and
  LeastConnection more than 80%. LC's losses are timeouts (the 20 s client timeout of section II):
  the backlog keeps growing, so they grow with the length of the run.
"""

from __future__ import annotations

from knapsack_lb.sim.metrics import SimResult
from knapsack_lb.sim.reproduce import ClaimRow, Experiment
from knapsack_lb.sim.simulation import run
from knapsack_lb.sim.spec import Scenario, load_scenario

SCENARIO = "bloc-40x10"
LC = "least_connections_p2c"
BLOC = "bloc"


def without_bloc_server(scenario: Scenario) -> Scenario:
    """The LeastConnection deployment: no AQM, no chips (the same as the LC entry's ``server`` in the
    shipped scenario; kept so that a scenario without that entry still runs LC this way)."""
    return scenario.with_changes(server={"aqm": False, "chips": False})


def run_pair(scenario: Scenario, seed: int) -> tuple[SimResult, SimResult]:
    """(LC, BLOC) on the same scenario and seed; LC without BLOC's server side."""
    lc = run(without_bloc_server(scenario), scenario.policy(LC), seed)
    bloc = run(scenario, scenario.policy(BLOC), seed)
    return lc, bloc


def lost(result: SimResult) -> float:
    """Share of requests that did not succeed (AQM rejections, drops, timeouts, errors)."""
    return result.error_rate + result.drop_rate


def closed_loop(seed: int, duration: float = 120.0) -> list[ClaimRow]:
    scenario = load_scenario(SCENARIO).with_changes(duration=duration, warmup=min(20.0, duration / 4))
    lc, bloc = run_pair(scenario, seed)
    command = f"klb sim compare {SCENARIO}"
    range_ratio = lc.spread_10_90 / bloc.spread_10_90 if bloc.spread_10_90 > 0 else float("inf")
    p99_ratio = lc.p99 / bloc.p99 if bloc.p99 > 0 else float("inf")
    more = 100.0 * (bloc.throughput - lc.throughput) / lc.throughput if lc.throughput > 0 else 0.0
    return [
        ClaimRow("bloc", "10-90 percentile range vs P2C least connections, 40 frontends x 10 backends",
                 "spread_10_90", "2.77 s vs 0.97 s (2-4x narrower)",
                 f"{lc.spread_10_90:.2f} s vs {bloc.spread_10_90:.2f} s ({range_ratio:.1f}x narrower)",
                 1.5 <= range_ratio <= 8.0, command),
        ClaimRow("bloc", "p99 latency vs P2C least connections", "p99", "about 2x lower",
                 f"{lc.p99:.2f} s vs {bloc.p99:.2f} s ({p99_ratio:.1f}x lower)", 1.4 <= p99_ratio <= 4.0, command,
                 "" if p99_ratio >= 1.8 else "the simulated backend sleeps exactly 250 ms, so AQM caps BLOC's tail "
                 f"at (Cap + 1) x 250 ms = 2.75 s; LC's p99 is {p99_ratio:.1f}x that"),
        ClaimRow("bloc", "completed requests vs P2C least connections", "throughput", "+0.93%",
                 f"{more:+.2f}% ({bloc.throughput:.1f} vs {lc.throughput:.1f} req/s)", more >= -2.0, command),
        ClaimRow("bloc", "failed requests in the closed loop", "drop_rate", "346 of 12,000 (2.9%)",
                 f"{lost(bloc):.1%}", lost(bloc) <= 0.06, command),
    ]


def poisson_sweep(seed: int, duration: float = 300.0, short: float = 120.0) -> list[ClaimRow]:
    base = load_scenario(SCENARIO)

    def at(rate: float, length: float) -> Scenario:
        return base.with_changes(clients={"kind": "open", "rate": rate}, duration=length, warmup=10.0)

    command = f"klb sim compare {SCENARIO} (clients: open, rate 35 / 47 / 50)"
    lc35, bloc35 = run_pair(at(35.0, short), seed)
    lc47, bloc47 = run_pair(at(47.0, short), seed)
    lc50, bloc50 = run_pair(at(50.0, duration), seed)
    holds_p90 = bloc47.p90 <= 1.5 * max(bloc35.p90, 2.0) and lc47.p90 >= 3.0 * bloc47.p90 \
        and lc35.p90 <= 1.5 * bloc35.p90
    return [
        ClaimRow("bloc", "Poisson load: LC collapses past 35 req/s, BLOC holds to 47 req/s", "p90",
                 "LC very poor after 35 req/s; BLOC graceful up to 47 req/s",
                 f"p90 at 35 req/s: LC {lc35.p90:.2f} s, BLOC {bloc35.p90:.2f} s; at 47 req/s: "
                 f"LC {lc47.p90:.2f} s, BLOC {bloc47.p90:.2f} s", holds_p90, command,
                 "the 10 backends serve 40 req/s; in the simulator LC is still stable at 35 req/s (87.5% load) "
                 "and diverges from 40 req/s on"),
        ClaimRow("bloc", "Poisson load, highest rate: requests lost", "drop_rate", "BLOC 16% vs LC more than 80%",
                 f"at 50 req/s over {duration:.0f} s: BLOC {lost(bloc50):.1%} vs LC {lost(lc50):.1%} "
                 f"(at 47 req/s over {short:.0f} s: BLOC {lost(bloc47):.1%}, LC {lost(lc47):.1%})",
                 lost(bloc50) <= 0.25 and lost(lc50) >= 3.0 * lost(bloc50), command,
                 "LC's losses are 20 s timeouts of a backlog that keeps growing, so they grow with the run "
                 "(a 5-minute run is needed to pass ~75%); BLOC's are 429s and stay flat"),
    ]


def with_capacity(scenario: Scenario, capacity: int | str) -> Scenario:
    """The same backends with another BLOC capacity (an integer or "dynamic")."""
    groups = [g.model_dump() | {"capacity": capacity} for g in scenario.dips]
    return scenario.with_changes(dips=groups)


def capacity_sensitivity(seed: int, duration: float = 120.0) -> list[ClaimRow]:
    """Section VI.C, Fig. 10: Cap = 10 (tuned), Cap = 15 (too aggressive) and dynamic vs LC."""
    scenario = load_scenario(SCENARIO).with_changes(duration=duration, warmup=min(20.0, duration / 4))
    lc = run(without_bloc_server(scenario), scenario.policy(LC), seed)
    results = {cap: run(with_capacity(scenario, cap), scenario.policy(BLOC), seed) for cap in (10, 15, "dynamic")}
    r10, r15, dyn = (results[c] for c in (10, 15, "dynamic"))
    command = f"klb sim run {SCENARIO} --policy bloc (dips[].capacity: 10 / 15 / dynamic)"
    values = ", ".join(f"Cap={c}: {r.spread_10_90:.2f} s" for c, r in results.items())
    values += f", LC: {lc.spread_10_90:.2f} s"
    dynamic_better = dyn.spread_10_90 < 0.9 * lc.spread_10_90
    return [
        ClaimRow("bloc", "capacity: the tuned Cap = 10 is tightest, Cap = 15 looser, both better than LC",
                 "spread_10_90", "Cap=10 tightest; Cap=15 better than LC", values,
                 r10.spread_10_90 < 0.9 * r15.spread_10_90 and r15.spread_10_90 < 0.9 * lc.spread_10_90, command),
        ClaimRow("bloc", "dynamic capacity (30 s running average) also improves over LC", "spread_10_90, p99",
                 "better than LC, looser than Cap=10",
                 f"range {dyn.spread_10_90:.2f} s vs LC {lc.spread_10_90:.2f} s; p99 {dyn.p99:.2f} s vs "
                 f"{lc.p99:.2f} s; {lost(dyn):.0%} of attempts lost", dynamic_better, command,
                 "" if dynamic_better else
                 "the 30 s averages of the active requests settle unevenly (5 to 15 on the ten backends with "
                 "seed 1), so some backends admit longer queues than the tuned 10 and others bounce requests "
                 "off 429s; the gain over LC is small and depends on the seed"),
    ]


EXPERIMENTS: list[Experiment] = [
    Experiment("bloc", "40x10 closed loop (hey)", closed_loop),
    Experiment("bloc", "40x10 capacity sensitivity", capacity_sensitivity),
    Experiment("bloc", "40x10 Poisson sweep", poisson_sweep),
]
