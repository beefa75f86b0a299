"""Paths between LB instances and DIPs: a base round-trip time plus transient spikes.

A spike adds ``extra`` seconds to each direction of every path to the chosen DIPs (optionally
only from some LB instances) while it lasts: DL3 section V injects 80 ms lasting 200 ms, 12 times
a minute, with netem on one server's interface. Spike start times are drawn once per run from the
scenario's seed (Poisson, or evenly spaced with a random phase), so a run is reproducible.
A message's delay is decided when it is sent (no reordering of a message already in flight).
"""

from __future__ import annotations

import bisect
import random

from knapsack_lb.sim.spec import Scenario


class Network:
    def __init__(self, scenario: Scenario, rng: random.Random) -> None:
        self.one_way = scenario.network.rtt / 2.0
        n = len(scenario.dip_names())
        # per DIP: sorted starts, and parallel lists of (end, extra, lbs)
        self._starts: list[list[float]] = [[] for _ in range(n)]
        self._spans: list[list[tuple[float, float, frozenset[int] | None]]] = [[] for _ in range(n)]
        horizon = scenario.duration + 60.0
        for spike in scenario.network.spikes:
            lbs = frozenset(spike.lbs) if spike.lbs is not None else None
            gap = 60.0 / spike.per_minute
            times: list[float] = []
            t = rng.uniform(0, gap) if spike.pattern == "periodic" else rng.expovariate(1.0 / gap)
            while t < horizon:
                times.append(t)
                t += gap if spike.pattern == "periodic" else rng.expovariate(1.0 / gap)
            for dip in scenario.resolve(spike.dips):
                for start in times:
                    self._starts[dip].append(start)
                    self._spans[dip].append((start + spike.duration, spike.extra, lbs))
        for dip in range(n):
            order = sorted(range(len(self._starts[dip])), key=self._starts[dip].__getitem__)
            self._starts[dip] = [self._starts[dip][i] for i in order]
            self._spans[dip] = [self._spans[dip][i] for i in order]
        self.has_spikes = any(self._starts)

    def extra(self, lb: int, dip: int, now: float) -> float:
        """Spike delay active on path (lb, dip) at ``now`` (0 when none)."""
        starts = self._starts[dip]
        if not starts:
            return 0.0
        i = bisect.bisect_right(starts, now)
        total = 0.0
        # spikes are short; look back over the few that could still be active
        for j in range(i - 1, max(-1, i - 8), -1):
            end, extra, lbs = self._spans[dip][j]
            if end > now and (lbs is None or lb in lbs):
                total = max(total, extra)
        return total

    def delay(self, lb: int, dip: int, now: float) -> float:
        """One-way delay of a message sent now on path (lb, dip)."""
        if not self.has_spikes:
            return self.one_way
        return self.one_way + self.extra(lb, dip, now)

    def spike_intervals(self, dip: int) -> list[tuple[float, float]]:
        return [(s, span[0]) for s, span in zip(self._starts[dip], self._spans[dip], strict=True)]
