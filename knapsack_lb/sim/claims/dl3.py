"""DL3's headline claims (DL3 paper, section V.B) against the simulator.

Scenario ``dl3-netdelay``: 8 client sidecars at 20 requests/s each, 8 servers, an 80 ms delay on
the path to one server lasting 200 ms, 12 times a minute; DL3 with T_load = 10 and T_RTT = 10 ms
against least connections (P2C, the BLOC proxy's LC that DL3 was built on), 120 s as in the paper.

* Fig. 6: without delays DL3 is on par with LC.
* Fig. 7: with the delays, the average and p99 of both stay close to the baseline, and DL3's
  p99.99 is 33% better than LC's (LC's p99.99 +50% over its baseline, DL3's +2%).

Besides the percentiles we count the requests a spike delayed (latency above the pool's normal
tail plus half the spike): the mechanism the paper credits ("DL3 ... picks another server").
"""

from __future__ import annotations

from knapsack_lb.sim.metrics import SimResult
from knapsack_lb.sim.reproduce import ClaimRow, Experiment, percent_lower
from knapsack_lb.sim.simulation import run
from knapsack_lb.sim.spec import Scenario, load_scenario

SCENARIO = "dl3-netdelay"
LC = "least_connections_p2c"
DL3 = "dl3"


def without_delays(scenario: Scenario) -> Scenario:
    return scenario.with_changes(network={"rtt": scenario.network.rtt, "spikes": []})


def delayed_requests(result: SimResult, baseline: SimResult, spike_round_trip: float) -> int:
    """Successful requests slower than the no-delay run's p99.99 plus half the spike."""
    threshold = baseline.p9999 + spike_round_trip / 2.0
    return int((result.latencies > threshold).sum())


def network_delay(seed: int) -> list[ClaimRow]:
    scenario = load_scenario(SCENARIO)
    calm = without_delays(scenario)
    lc = run(scenario, scenario.policy(LC), seed)
    dl3 = run(scenario, scenario.policy(DL3), seed)
    lc0 = run(calm, calm.policy(LC), seed)
    dl30 = run(calm, calm.policy(DL3), seed)
    command = f"klb sim compare {SCENARIO}"
    better = percent_lower(dl3.p9999, lc.p9999)
    spike = max((2 * s.extra for s in scenario.network.spikes), default=0.0)
    hit_lc = delayed_requests(lc, lc0, spike)
    hit_dl3 = delayed_requests(dl3, lc0, spike)
    par_mean = abs(dl30.mean - lc0.mean) / lc0.mean
    par_p99 = abs(dl30.p99 - lc0.p99) / lc0.p99
    rise = {name: (with_.mean / without.mean - 1.0, with_.p99 / without.p99 - 1.0)
            for name, with_, without in (("LC", lc, lc0), ("DL3", dl3, dl30))}
    return [
        ClaimRow("dl3", "p99.99 with 80 ms / 200 ms path delays, 12 per minute, vs least connections", "p9999",
                 "33% better", f"{1000 * lc.p9999:.1f} ms vs {1000 * dl3.p9999:.1f} ms ({better:.0f}% better)",
                 better >= 15.0, command,
                 "a client learns of a spike only from its own traffic to that server: about 2.5 requests/s "
                 "per client and server, rarely one in flight, so the first request into each spike is always "
                 "delayed, and at most ~20% of the delayed requests can be avoided; tens of delayed requests "
                 "remain in 18,000 and set the p99.99 (the paper's testbed, per-connection TCP RTT on "
                 "persistent connections, evidently saw spikes earlier)" if better < 15.0 else ""),
        ClaimRow("dl3", "requests delayed by a spike (mechanism: DL3 picks another server)", "delayed requests",
                 "fewer than LC", f"LC {hit_lc}, DL3 {hit_dl3} ({percent_lower(hit_dl3, max(hit_lc, 1)):.0f}% fewer)",
                 hit_dl3 < hit_lc, command),
        ClaimRow("dl3", "without delays DL3 is on par with least connections", "mean, p99",
                 "on par", f"mean {1000 * lc0.mean:.1f} vs {1000 * dl30.mean:.1f} ms, p99 {1000 * lc0.p99:.1f} vs "
                 f"{1000 * dl30.p99:.1f} ms", par_mean <= 0.10 and par_p99 <= 0.15, command),
        ClaimRow("dl3", "the delays leave the mean and p99 of both almost unchanged", "mean, p99",
                 "almost similar to the baseline",
                 "; ".join(f"{n}: mean {100 * m:+.0f}%, p99 {100 * p:+.0f}%" for n, (m, p) in rise.items()),
                 all(abs(m) <= 0.10 and abs(p) <= 0.20 for m, p in rise.values()), command),
    ]


EXPERIMENTS: list[Experiment] = [Experiment("dl3", "8x8 with path delay spikes", network_delay)]
