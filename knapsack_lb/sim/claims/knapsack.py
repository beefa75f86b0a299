"""KnapsackLB claims: sections 6.2 (Table 4, the 3-DIP pool) and 6.3 (dynamics).

The paper reports "up to 45% lower latency for 79% of requests" (a CDF-wise gain); we compare the mean
latency of successful requests, the steadier number. A claim holds when KnapsackLB is lower and the
reduction is within half to double the paper's. The 30-DIP runs are time-scaled (service and think
times x4: the same utilisations and latency ratios at a quarter of the requests) so that the whole
reproduction stays within minutes; the commands in the rows run the full-size scenarios.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

from knapsack_lb.errors import InvalidInputError
from knapsack_lb.sim.metrics import SimResult
from knapsack_lb.sim.reproduce import ClaimRow, Experiment, percent_lower, run_many
from knapsack_lb.sim.simulation import run
from knapsack_lb.sim.spec import Scenario, load_scenario
from knapsack_lb.solver.oracle import mmc_latency, oracle_split

_BISECTIONS = 40  # the closed loop's rate to 1e-12 of the pool's capacity
DOC = "knapsack"


def time_scaled(sc: Scenario, k: float, **changes: Any) -> Scenario:
    """Every time of the workload x k (service, think, RTT, timeouts, probe timeout, drain time), same load."""
    c = sc.clients
    kn = sc.knapsack
    drain = dict(kn.settings.get("drain", {}))
    updates: dict[str, Any] = {
        "service": {"mean": sc.service.mean * k},
        "clients": {"think_time": c.think_time * k},
        "network": {"rtt": sc.network.rtt * k},
        "knapsack": {
            "probe_timeout": kn.probe_timeout * k,
            "settings": {**kn.settings, "drain": {**drain, "time": float(drain.get("time", 0.0)) * k}},
        },
    }
    if sc.lb.timeout is not None:
        updates["lb"] = {"timeout": sc.lb.timeout * k}
    updates.update(changes)
    return sc.with_changes(**updates)


def _rows_vs(
    results: dict[str, Any], cmd: str, claims: list[tuple[str, float]], note: str, who: str = "knapsack"
) -> list[ClaimRow]:
    klb = results[who]
    label = "KnapsackLB" if who == "knapsack" else "reference: a correct static plan (oracle capacity weights)"
    rows = []
    for other, paper in claims:
        gain = percent_lower(klb.mean, results[other].mean)
        holds = 0.5 * paper <= gain <= min(100.0, 2.0 * paper)
        rows.append(
            ClaimRow(
                document=DOC,
                claim=f"{label} lower latency than {other}",
                metric="mean latency, % lower",
                document_value=f"{paper:.0f}% lower",
                holds=holds,
                command=cmd,
                simulated_value=f"{gain:.0f}% lower ({klb.mean * 1000:.1f} vs {results[other].mean * 1000:.1f} ms)",
                note=note,
            )
        )
    return rows


def paper30(seed: int) -> list[ClaimRow]:
    # the controller's curves are complete at about 305 s in this run (layer 4: every measurement round waits
    # the drain time), so its steady state is measured from 550 s (docs/results/simulator.md)
    sc = time_scaled(load_scenario("knapsack-paper30"), 4.0, duration=700.0, warmup=550.0)
    # the baselines need no learning phase: a shorter run measures their steady state
    short = sc.with_changes(duration=140.0, warmup=20.0)
    baselines = ["round_robin", "least_connections", "oracle_capacity_weights"]
    results = {**run_many(short, baselines, seed), **run_many(sc, ["knapsack"], seed)}
    cmd = "klb sim compare knapsack-paper30"
    note = "Table 4 unweighted; 30 DIPs (16x1, 8x2, 4x4, 2x8 vCPUs), layer 4, 4 MUXes, time-scaled x4"
    return _rows_vs(results, cmd, [("round_robin", 45.0), ("least_connections", 23.0)], note) + _rows_vs(
        results,
        cmd,
        [("round_robin", 45.0), ("least_connections", 23.0)],
        note + "; what the layer-4 model allows",
        who="oracle_capacity_weights",
    )


def three_dip(seed: int) -> list[ClaimRow]:
    sc = load_scenario("knapsack-3dip").with_changes(duration=400.0, warmup=200.0)
    short = sc.with_changes(duration=220.0, warmup=20.0)
    baselines = ["round_robin", "least_connections", "oracle_capacity_weights"]
    results = {**run_many(short, baselines, seed), **run_many(sc, ["knapsack"], seed)}
    cmd = "klb sim compare knapsack-3dip"
    note = "section 6.2, capacities 1, 0.8, 0.6, weights 1:1:1 for RR/LC, layer 4"
    return _rows_vs(results, cmd, [("round_robin", 37.0), ("least_connections", 29.0)], note) + _rows_vs(
        results,
        cmd,
        [("round_robin", 37.0), ("least_connections", 29.0)],
        note + "; what the layer-4 model allows",
        who="oracle_capacity_weights",
    )


def _weights_at(plans: list[dict[str, Any]], t: float) -> dict[str, float]:
    current: dict[str, float] = {}
    for p in plans:
        if p["time"] <= t:
            current = p["weights"]
    return current


def _group(weights: dict[str, float], prefix: str, names: list[str] | None = None) -> float:
    return sum(v for k, v in weights.items() if (k.startswith(prefix) if names is None else k in names))


def optimal_split(sc: Scenario, failed: frozenset[str] = frozenset(), speeds: Mapping[str, float] | None = None,
                  traffic: float = 1.0) -> dict[str, float]:
    """The split that minimises the pool's true mean latency: every DIP an M/M/c at its speed (exact for
    exponential service, FCFS or processor sharing), ``failed`` DIPs out, a DIP of ``speeds`` at that
    factor of its speed, the load x ``traffic`` (:func:`~knapsack_lb.solver.oracle.oracle_split`).

    Open traffic arrives at ``load`` x the pool's capacity. Layer-4 sessions are a closed loop: the
    ``load`` x capacity x (think time + service) connections each wait for their answer (a round trip
    and the DIP's latency) before they think again, so the rate is the fixed point of
    ``rate = connections / (think + rtt + latency(rate))``. It is bisected with the latency of the
    capacity-proportional split (above the optimum's), then moved one step with the optimum's
    latency at that rate: the rate is slightly low, never beyond the pool."""
    c = sc.clients
    if c.load is None:
        raise InvalidInputError("clients.load", None, "the optimum needs the offered load as a share of capacity")
    factor = speeds or {}
    servers = {name: (g.workers, g.speed * factor.get(name, 1.0) / (g.service or sc.service).mean)
               for name, g in zip(sc.dip_names(), sc.dip_groups(), strict=True) if name not in failed}
    latency = {name: functools.partial(mmc_latency, n, mu) for name, (n, mu) in servers.items()}
    capacity = {name: n * mu for name, (n, mu) in servers.items()}

    def mean_latency(split: Mapping[str, float], rate: float) -> float:
        return math.fsum(w * latency[name](w * rate) for name, w in split.items() if w > 0)

    offered = c.load * sc.total_capacity() * traffic
    if c.kind == "sessions":
        connections = c.load * sc.total_capacity() * (c.think_time + sc.mean_service()) * traffic
        total = sum(capacity.values())
        proportional = {name: cap / total for name, cap in capacity.items()}

        def rate_at(waited: float) -> float:  # the rate when each answer takes ``waited`` s at the DIP
            return min(offered, connections / (c.think_time + sc.network.rtt + waited))

        low, high = 0.0, min(offered, (1 - 1e-9) * total)
        for _ in range(_BISECTIONS):
            mid = (low + high) / 2
            low, high = (mid, high) if mid < rate_at(mean_latency(proportional, mid)) else (low, mid)
        offered = rate_at(mean_latency(oracle_split(latency, capacity, low), low))
    return oracle_split(latency, capacity, offered)


def optimal_plans(sc: Scenario) -> list[dict[str, Any]]:
    """The optimum (:func:`optimal_split`) from the start and after each failure, restart, capacity and
    traffic event, as the controller's plans are recorded (``time``, ``weights``): what a controller
    that knew the true curves at once would send. The dynamics rows are read against it."""
    names = sc.dip_names()
    failed: set[str] = set()
    speeds: dict[str, float] = {}
    traffic = 1.0
    plans = [{"time": 0.0, "weights": optimal_split(sc)}]
    for ev in sorted(sc.events, key=lambda e: e.at):
        hit = [names[i] for i in sc.resolve(tuple(ev.dips or ()))]
        if ev.kind == "fail":
            failed.update(hit)
        elif ev.kind == "restart":
            failed.difference_update(hit)
        elif ev.kind == "capacity" and ev.speed is not None:
            speeds.update(dict.fromkeys(hit, ev.speed))
        elif ev.kind == "traffic" and ev.factor is not None:
            traffic *= ev.factor
        else:
            continue
        plans.append({"time": ev.at, "weights": optimal_split(sc, frozenset(failed), speeds, traffic)})
    return plans


def _optimum_run(sc: Scenario, seed: int) -> SimResult:
    """The scenario under weighted round robin carrying :func:`optimal_plans`, each from its event on."""
    plans = optimal_plans(sc)
    names = sc.dip_names()
    start = plans[0]["weights"]  # identical DIPs get equal shares: one weight per group
    dips = [{**g.model_dump(), "weight": start.get(g.name if g.count == 1 else f"{g.name}-1", 0.0)} for g in sc.dips]
    events = [*(e.model_dump(exclude_none=True) for e in sc.events),
              *({"at": p["time"], "kind": "weights", "weights": [p["weights"].get(n, 0.0) for n in names]}
                for p in plans[1:])]
    return run(sc.with_changes(dips=dips, events=sorted(events, key=lambda e: e["at"])), "weighted_round_robin", seed)


def first_event(sc: Scenario, kind: str, slower: bool = False) -> float:
    """When the scenario's first ``kind`` event happens (with ``slower``, the first capacity event that slows
    DIPs). Raises :class:`InvalidInputError` naming ``events`` when it has none."""
    for ev in sorted(sc.events, key=lambda e: e.at):
        if ev.kind == kind and (not slower or (ev.speed is not None and ev.speed < 1.0)):
            return ev.at
    raise InvalidInputError("events", kind, "the dynamics rows need a failure, a capacity drop and a traffic change")


def dynamics(seed: int) -> list[ClaimRow]:
    """Each row reads the plan in force just before its change against the plan some seconds after it,
    the change's time taken from the scenario's events (each starts from the steady state the one
    before left, as the paper's experiments do)."""
    sc = time_scaled(load_scenario("knapsack-dynamics"), 4.0)
    result = run(sc, "knapsack", seed)
    plans = result.series["plans"]
    best = optimal_plans(sc)
    cmd = "klb sim run knapsack-dynamics --policy knapsack --json"
    rows = []
    failure, slowdown, surge = (first_event(sc, "fail"), first_event(sc, "capacity", slower=True),
                                first_event(sc, "traffic"))
    before = _weights_at(plans, failure - 1)
    after = _weights_at(plans, failure + 20)
    failed = ["ds3-1", "ds3-2"]
    gone = _group(after, "", failed)
    freed = _group(before, "", failed)

    def shift(b: dict[str, float], a: dict[str, float]) -> tuple[float, float]:
        larger = ["ds3-3", "ds3-4", "f8-1", "f8-2"]
        return (_group(a, "ds1") + _group(a, "ds2") - _group(b, "ds1") - _group(b, "ds2"),
                _group(a, "", larger) - _group(b, "", larger))

    small, big = shift(before, after)
    best_small, best_big = shift(_weights_at(best, failure - 1), _weights_at(best, failure + 20))
    rows.append(
        ClaimRow(
            DOC,
            "failed DIPs lose their weight, mostly to the larger DIPs",
            "weight shift after DIP-25,26 fail",
            "DIP-1..24 +0.039, DIP-27..30 +0.066",
            f"failed {freed:.3f} -> {gone:.3f}; DIP-1..24 {small:+.3f}, DIP-27..30 {big:+.3f} "
            f"(optimum {best_small:+.3f}, {best_big:+.3f})",
            holds=bool(gone < 0.01 and big > small and before),
            command=cmd,
            note="weights 20 s after the failure vs just before; optimum: the split of least true mean latency",
        )
    )
    pre_cap = _weights_at(plans, slowdown - 1)
    post_cap = _weights_at(plans, slowdown + 85)
    ds3_before, ds3_after = _group(pre_cap, "ds3"), _group(post_cap, "ds3")
    cut = percent_lower(ds3_after, ds3_before)
    best_cut = percent_lower(_group(_weights_at(best, slowdown + 85), "ds3"),
                             _group(_weights_at(best, slowdown - 1), "ds3"))
    rows.append(
        ClaimRow(
            DOC,
            "a capacity drop moves weight off the slowed DIPs",
            "weight of DIP-25..28 after losing 1 of 4 cores",
            "15-17% lower",
            f"{cut:.0f}% lower ({ds3_before:.3f} -> {ds3_after:.3f}; optimum {best_cut:.0f}% lower)",
            holds=bool(pre_cap and 5.0 <= cut <= 40.0),
            command=cmd,
            note="weights 85 s after the change vs just before; optimum: the split of least true mean latency",
        )
    )
    pre_tr = _weights_at(plans, surge - 1)
    post_tr = _weights_at(plans, surge + 75)
    def larger(w: dict[str, float]) -> float:
        return _group(w, "ds3") + _group(w, "f8")

    big_share = larger(post_tr) - larger(pre_tr)
    best_share = larger(_weights_at(best, surge + 75)) - larger(_weights_at(best, surge - 1))
    rows.append(
        ClaimRow(
            DOC,
            "+10% traffic is absorbed mostly by the larger DIPs",
            "share change of DIP-25..30 after +10% traffic",
            "DIP-25..30 absorb most",
            f"{big_share:+.3f} (optimum {best_share:+.3f})",
            holds=bool(pre_tr and big_share > 0),
            command=cmd,
            note="weights 75 s after the change vs just before; optimum: the split of least true mean latency",
        )
    )
    def busiest(series: dict[str, Any]) -> float:
        windows = zip(series["window_times"], series["utilization"], strict=True)
        return max((max(u) for t, u in windows if t > sc.warmup and u), default=0.0)

    worst = busiest(result.series)
    best_worst = busiest(_optimum_run(sc, seed).series)
    rows.append(
        ClaimRow(
            DOC,
            "no DIP is overloaded through the dynamics",
            "max DIP utilisation per 5 s window after warm-up",
            "none overloaded",
            f"{worst:.2f} (optimum {best_worst:.2f})",
            holds=worst < 0.97,
            command=cmd,
            note="optimum: weighted round robin on the split of least true mean latency, changed at each event",
        )
    )
    return rows


EXPERIMENTS = [
    Experiment(DOC, "30-DIP pool (Table 3), layer 4", paper30),
    Experiment(DOC, "3-DIP pool (1, 0.8, 0.6), layer 4", three_dip),
    Experiment(DOC, "dynamics (section 6.3)", dynamics),
]
