"""Prequal-style probing with hot-cold lexicographic (HCL) selection.

Source: B. Wydrowski, R. Kleinberg, S. Rumble, A. Archer, "Load is not what you should
balance: Introducing Prequal" (USENIX NSDI 2024), sections 3-4 as we know them (the paper is
not among the project's seeds; this is from memory and simplified where marked).

* Asynchronous probes: each query triggers ``probes_per_query`` probes to replicas drawn at
  random without replacement; a probe answer carries the replica's requests in flight (RIF)
  and its latency estimate for a query arriving now (``Outcome.server_inflight``,
  ``Outcome.extra["latency_estimate"]``; without an estimate we use the probe's own round
  trip plus this client's recent mean latency for that replica).
* Probe pool: at most ``pool_size`` entries, one per replica (a newer probe replaces an older
  one of the same replica), the oldest evicted when full; an entry expires after ``max_age``
  seconds or after ``reuse_limit`` uses.
* HCL selection: the hot/cold threshold is the ``q_rif`` quantile of the RIFs in the pool; a
  replica is cold if its RIF is below it. If any pooled replica is cold, pick the cold one
  with the lowest latency estimate; otherwise the one with the lowest RIF.
* After a query is sent on the strength of a probe, the entry's RIF is incremented (the query
  just added to it) — our reading of the paper's probe reuse; the threshold uses the pool,
  not the paper's longer-lived RIF distribution estimate (simplification).
* Empty pool: a uniformly random replica (the paper's fallback).

How it fails: probes cost server work and network; with a tiny pool or long probe delay
the information is stale and selection degrades to random.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from knapsack_lb.errors import InvalidInputError
from knapsack_lb.sim.policies.base import LbView, Outcome, Request
from knapsack_lb.sim.policies.registry import PolicyContext


@dataclass
class ProbeEntry:
    dip: int
    rif: float
    latency: float
    received_at: float
    uses: int = 0


def rif_quantile(rifs: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``rifs`` (nearest rank: the smallest value with at least q of the mass)."""
    if not rifs:
        return math.inf
    ordered = sorted(rifs)
    rank = max(0, math.ceil(q * len(ordered)) - 1)
    return ordered[rank]


def hot_cold_select(entries: Sequence[ProbeEntry], q_rif: float) -> ProbeEntry | None:
    """HCL: among cold entries (RIF below the ``q_rif`` quantile) the lowest latency; else the lowest RIF."""
    if not entries:
        return None
    threshold = rif_quantile([e.rif for e in entries], q_rif)
    cold = [e for e in entries if e.rif < threshold]
    if cold:
        return min(cold, key=lambda e: (e.latency, e.rif, e.dip))
    return min(entries, key=lambda e: (e.rif, e.latency, e.dip))


class PrequalPolicy:
    """Prequal with HCL selection.

    Defaults (ours): ``probes_per_query`` 3, ``pool_size`` 16, ``max_age`` 1.0 s, ``reuse_limit`` 2,
    ``q_rif`` 0.75, ``probe_interval`` 0.005 s (how often the caller sends the probes recent
    queries triggered).
    """

    name = "prequal"

    def __init__(self, *, probes_per_query: int = 3, pool_size: int = 16, max_age: float = 1.0,
                 reuse_limit: int = 2, q_rif: float = 0.75, latency_alpha: float = 0.2,
                 probe_interval: float = 0.005) -> None:
        if probes_per_query < 0:
            raise InvalidInputError("probes_per_query", probes_per_query, "must be >= 0")
        if pool_size < 1:
            raise InvalidInputError("pool_size", pool_size, "must be >= 1")
        if not max_age > 0:
            raise InvalidInputError("max_age", max_age, "must be > 0 seconds")
        if reuse_limit < 1:
            raise InvalidInputError("reuse_limit", reuse_limit, "must be >= 1")
        if not 0 < q_rif <= 1:
            raise InvalidInputError("q_rif", q_rif, "must be in (0, 1]")
        if not probe_interval > 0:
            raise InvalidInputError("probe_interval", probe_interval, "must be > 0 seconds")
        self.probe_interval = probe_interval  # probes owed by recent queries leave at this period
        self.probes_per_query = probes_per_query
        self.pool_size = pool_size
        self.max_age = max_age
        self.reuse_limit = reuse_limit
        self.q_rif = q_rif
        self.latency_alpha = latency_alpha
        self.pool: dict[int, ProbeEntry] = {}
        self._owed = 0
        self._mean_latency: dict[int, float] = {}

    def _prune(self, now: float) -> None:
        for dip, entry in list(self.pool.items()):
            if now - entry.received_at > self.max_age or entry.uses >= self.reuse_limit:
                del self.pool[dip]

    def add_probe(self, entry: ProbeEntry) -> None:
        self.pool[entry.dip] = entry
        while len(self.pool) > self.pool_size:
            oldest = min(self.pool.values(), key=lambda e: (e.received_at, e.dip))
            del self.pool[oldest.dip]

    def pick(self, request: Request, view: LbView, rng: random.Random) -> int | None:
        self._owed += self.probes_per_query
        self._prune(view.now)
        entries = [e for e in self.pool.values() if e.dip not in request.excluded and e.dip < len(view.dip_names)]
        chosen = hot_cold_select(entries, self.q_rif)
        if chosen is not None:
            chosen.uses += 1
            chosen.rif += 1
            if chosen.uses >= self.reuse_limit:
                del self.pool[chosen.dip]
            return chosen.dip
        candidates = [d for d in range(len(view.dip_names)) if d not in request.excluded]
        return rng.choice(candidates) if candidates else None

    def observe(self, outcome: Outcome, view: LbView) -> None:
        dip = outcome.dip
        if not outcome.probe:
            if outcome.status == "ok":
                previous = self._mean_latency.get(dip)
                self._mean_latency[dip] = outcome.latency if previous is None else \
                    (1 - self.latency_alpha) * previous + self.latency_alpha * outcome.latency
            return
        if outcome.server_inflight is None:
            return
        estimate = outcome.extra.get("latency_estimate")
        if estimate is None:
            estimate = outcome.latency + self._mean_latency.get(dip, 0.0)
        self.add_probe(ProbeEntry(dip, float(outcome.server_inflight), estimate, outcome.finished_at))

    def probe_targets(self, view: LbView, rng: random.Random) -> Sequence[int]:
        n = len(view.dip_names)
        owed, self._owed = self._owed, 0
        if n == 0 or owed == 0:
            return ()
        targets: list[int] = []
        while owed > 0:
            batch = min(owed, n)
            targets.extend(rng.sample(range(n), batch))
            owed -= batch
        return targets


def make_prequal(ctx: PolicyContext) -> PrequalPolicy:
    """Prequal (NSDI'24): probes of requests-in-flight and latency, hot-cold lexicographic selection."""
    return PrequalPolicy(**dict(ctx.params))
