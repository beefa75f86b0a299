"""The student L7 load-balancer report (L7 load balancer report): its findings on the l7-basics setting.

10 closed-loop clients and CPU-limited servers (processor sharing, 0.25 s of CPU per request).
The report's numbers come from 20 s mininet runs; we run longer and compare directions and rough sizes.
"""

from __future__ import annotations

from knapsack_lb.sim.policies.hash_ring import HashRing
from knapsack_lb.sim.policies.sticky import StickySessions
from knapsack_lb.sim.reproduce import ClaimRow, Experiment, percent_lower, run_many
from knapsack_lb.sim.simulation import Simulation, client_address, run
from knapsack_lb.sim.spec import PolicySpec, Scenario, load_scenario

DOC = "l7"
CMD = "klb sim compare l7-basics"


def base(duration: float = 120.0) -> Scenario:
    return load_scenario("l7-basics").with_changes(duration=duration)


def scale_out(seed: int) -> list[ClaimRow]:
    three = base()
    one = three.with_changes(dips=[{"name": "s", "count": 1, "workers": 1, "discipline": "ps"}])
    r1, r3 = run(one, "round_robin", seed), run(three, "round_robin", seed)
    drop = percent_lower(r3.mean, r1.mean)
    ratio = r3.throughput / r1.throughput
    return [
        ClaimRow(
            DOC,
            "3 servers vs 1 halve latency",
            "mean latency, % lower",
            "about 50% lower",
            f"{drop:.0f}% lower ({r3.mean:.2f} vs {r1.mean:.2f} s)",
            holds=35.0 <= drop <= 80.0,
            command=CMD,
            note="an ideal LB in front of CPU-bound servers gets close to 1/3; the report's Python LB added its "
            "own delay",
        ),
        ClaimRow(
            DOC,
            "3 servers vs 1 double throughput",
            "successful requests/s, ratio",
            "about 2x",
            f"{ratio:.2f}x ({r3.throughput:.1f} vs {r1.throughput:.1f}/s)",
            holds=1.5 <= ratio <= 3.5,
            command=CMD,
        ),
    ]


def weighted(seed: int) -> list[ClaimRow]:
    sc = base().with_changes(
        dips=[
            {"name": "s1", "speed": 0.5, "weight": 1},
            {"name": "s2", "speed": 1.0, "weight": 2},
            {"name": "s3", "speed": 1.5, "weight": 3},
        ]
    )
    res = run_many(sc, ["round_robin", "weighted_round_robin", "least_connections", "least_response_time"], seed)
    rr, wrr = res["round_robin"], res["weighted_round_robin"]
    lat = percent_lower(wrr.mean, rr.mean)
    thr = 100.0 * (wrr.throughput / rr.throughput - 1.0)
    lc, lrt = res["least_connections"], res["least_response_time"]
    return [
        ClaimRow(
            DOC,
            "weighted RR beats RR on 1:2:3 capacities",
            "mean latency, % lower",
            "22% lower (0.729 vs 0.934 s)",
            f"{lat:.0f}% lower ({wrr.mean:.3f} vs {rr.mean:.3f} s)",
            holds=10.0 <= lat <= 60.0,
            command=CMD + " (capacities 1:2:3 from claims_l7.weighted)",
        ),
        ClaimRow(
            DOC,
            "weighted RR serves more on 1:2:3 capacities",
            "successful requests, % more",
            "22% more (264 vs 217 in 20 s)",
            f"{thr:.0f}% more ({wrr.throughput:.2f} vs {rr.throughput:.2f}/s)",
            holds=10.0 <= thr <= 80.0,
            command=CMD,
            note="closed loop: under RR every client keeps visiting the half-speed server, whose queue then "
            "holds most clients; requests there pass the 10 s timeout, so RR loses far more than the report's 18%",
        ),
        ClaimRow(
            DOC,
            "least connections beats least response time",
            "mean latency",
            "LC significantly better",
            f"LC {lc.mean:.3f} s vs LRT {lrt.mean:.3f} s",
            holds=lc.mean < lrt.mean,
            command=CMD,
            note="LRT herds onto whichever server looked fast; LC reacts to every request",
        ),
    ]


def failover(seed: int) -> list[ClaimRow]:
    # the report's failover test: 5 clients, 5 servers, hash ring, a server down at 5 s for 10 s
    interval = 3.0
    names = [f"s-{i}" for i in range(1, 6)]
    ring = HashRing(names)
    hits = [ring.lookup(client_address(i)) for i in range(5)]
    victim = max(set(hits), key=hits.count)  # a server that has clients
    sc = base(40.0).with_changes(
        warmup=0.0,
        dips=[{"name": "s", "count": 5, "workers": 1, "discipline": "ps"}],
        clients={"kind": "closed", "concurrency": 5, "count": 5},
        events=[{"at": 5.0, "kind": "fail", "dips": [victim]}, {"at": 15.0, "kind": "restart", "dips": [victim]}],
    )
    spec = PolicySpec(name="hash_ring", health_check={"interval": interval, "timeout": 2.0})
    result = run(sc, spec, seed)
    s = result.series
    errors = s["start"][s["status"] == 1]
    last = float(errors.max()) - 5.0 if errors.size else 0.0
    return [
        ClaimRow(
            DOC,
            "failover within one health-check interval",
            "time from failure to the last error",
            f"within the interval ({interval:.0f} s)",
            f"{last:.2f} s ({errors.size} errors)",
            holds=bool(errors.size > 0 and last <= interval + 0.01),
            command="klb sim run l7-basics --policy round_robin+health",
            note="5 clients, 5 servers, hash ring, health checks every 3 s (timeout 2 s), server down 5-15 s",
        )
    ]


def sticky(seed: int) -> list[ClaimRow]:
    expiry = 2.0
    sc = base(120.0).with_changes(clients={"kind": "closed", "concurrency": 10, "count": 10, "think_time": 1.0})
    sim = Simulation(sc, PolicySpec(name="round_robin", sticky={"expiry": expiry}), seed)
    sim.run()
    policy = sim.lbs[0].policy
    assert isinstance(policy, StickySessions)
    return [
        ClaimRow(
            DOC,
            "sticky sessions expire",
            "mappings expired / longest idle gap still served by the mapping",
            "expire after STICKY_TIMEOUT, refreshed by requests",
            f"{policy.expired} expired, {policy.reused} reused, longest reused gap {policy.max_reused_idle:.2f} s",
            holds=policy.expired > 0 and policy.reused > 0 and policy.max_reused_idle <= expiry,
            command=CMD,
            note=f"expiry {expiry:.0f} s, clients pause Exp(1 s) between requests",
        )
    ]


def shedding(seed: int) -> list[ClaimRow]:
    sc = base(120.0).with_changes(clients={"kind": "closed", "concurrency": 30, "count": 30, "think_time": 0.5})
    specs = [
        PolicySpec(name="round_robin", label="none"),
        PolicySpec(name="round_robin", label="hard", shedding={"threshold": 10, "strategy": "hard"}),
        PolicySpec(name="round_robin", label="exponential", shedding={"threshold": 10, "strategy": "exponential"}),
    ]
    res = run_many(sc, specs, seed)
    none, hard, expo = res["none"], res["hard"], res["exponential"]
    return [
        ClaimRow(
            DOC,
            "shedding lowers the latency of successful requests",
            "mean latency",
            "significantly lower",
            f"hard {hard.mean:.2f} s, none {none.mean:.2f} s",
            holds=hard.mean < 0.8 * none.mean,
            command=CMD,
        ),
        ClaimRow(
            DOC,
            "shedding keeps the useful work",
            "successful requests/s",
            "same or more",
            f"hard {hard.throughput:.2f}/s, none {none.throughput:.2f}/s",
            holds=hard.throughput >= 0.9 * none.throughput,
            command=CMD,
            note="within 10%: our servers do not fail under overload, so shedding cannot prevent the "
            "cascading failures that let the report's shedding gain work; a global threshold idles a server "
            "now and then",
        ),
        ClaimRow(
            DOC,
            "hard shedding beats exponential",
            "mean latency of successful requests",
            "hard lower",
            f"hard {hard.mean:.2f} s vs exponential {expo.mean:.2f} s (threshold 10, K = 0.3)",
            holds=hard.mean < expo.mean and hard.throughput >= 0.95 * expo.throughput,
            command=CMD,
        ),
    ]


EXPERIMENTS = [
    Experiment(DOC, "scale out 1 -> 3 servers", scale_out),
    Experiment(DOC, "weighted RR on 1:2:3", weighted),
    Experiment(DOC, "failover", failover),
    Experiment(DOC, "sticky sessions", sticky),
    Experiment(DOC, "load shedding", shedding),
]
