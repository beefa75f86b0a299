"""What a DIP's light requests say: how busy it ran, and so the share of the VIP it saturates at.

A light request (``ProbeSpec.light_path``) does a fixed, tiny piece of work, so any time it takes
above its own unloaded latency ``w`` is queueing (:mod:`knapsack_lb.controller.waiting`). A round
of them is read in three steps:

1. **The base.** ``w`` is never measured idle in service. Requests that found a free worker answer
   in ``w``, a share ``1 - C`` of them, at least 8 % at the highest utilisation a plan should run a
   DIP; so the 5th percentile of the rounds pooled (:data:`BASE_QUANTILE`) is ``w`` or a little
   above. Rounds are pooled at one load: the DIP's newest rounds at the share it carried last, since
   its last change (the caller's choice).
2. **The waits.** A request waited when it took more than the base by the timing's jitter (live
   tens of microseconds on a millisecond's work). The requests below the base are the fastest 5 %
   of those that did not wait, so they span at most a twentieth of the jitter's width when none
   waited (more when some did): the threshold is :data:`JITTER_SPAN` times their span, at least
   :data:`JITTER_FLOOR` of the base, the least stretch processor sharing over up to 64 cores gives a
   request that found every core busy (shorter ones are requests that others joined while they were
   served, which found a core free), and at most :data:`JITTER_CAP` of it (on a busy DIP the fastest
   5 % include waits, and their span is the waits', not the jitter's). A threshold set
   too high censors short waits, which :func:`~knapsack_lb.controller.waiting.load_from_light_probes`
   restores by their exponential tail. A request's excess is what lies beyond the threshold
   (:class:`LightRound`).
3. **The unit, and the load.** Behind a pool of workers a request that waits, waits for a worker
   to free: a service time's scale, ``S / g`` on average for ``g`` spare workers. Under processor
   sharing it is stretched: its own work's scale, ``w / g``. The two are 20-100x apart, and the
   waited share tells them apart: read in ``w`` a worker pool's long waits mean almost no spare
   capacity, which its share of requests that waited contradicts unless nearly all waited (a
   share below ``1 - g`` fits no number of workers). So a round is read in ``w`` where that fits
   (within the share's confidence interval) and in ``S`` (the DIP's unloaded latency, the
   learner's) where it does not; without ``S`` it is read in ``w``, which can only read a DIP
   busier than it is (:func:`light_load`). The DIP then saturates at the share it carried over
   the utilisation read.

How it fails: with fewer than :data:`MIN_WAITS` requests waited the rounds fix no load, only the
busiest a DIP of up to :data:`MAX_WORKERS` workers could have run with so few waits (a trust region:
a DIP raised to the share that allows shows its waits there, the next round); a DIP with more
workers than that could be busier; with every
request waited it cannot tell how far past its capacity the DIP ran (utilisation 1, the share it
carried). The base includes the network's round trip, so under processor sharing a long round trip
against a light request's work reads the DIP idler than it is (live on loopback, about 10 % on a
1 ms light request). Behind FCFS workers the waits follow the service's spread, so fixed service
reads as a busier DIP and more variable service as an idler one (``waiting``'s docstring).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from knapsack_lb.controller.waiting import (
    LightProbeLoad,
    load_from_light_probes,
    utilisation_from_waited_share,
    wilson_interval,
)
from knapsack_lb.rounds import nearest_rank

BASE_QUANTILE = 0.05  # the pooled rounds' quantile that is the light request's unloaded latency (step 1)
JITTER_FLOOR = 1 / 64  # the least jitter threshold, a share of the base (step 2)
JITTER_SPAN = 1 / BASE_QUANTILE  # the jitter threshold over the span of the requests below the base (step 2)
JITTER_CAP = 0.1  # the greatest jitter threshold, a share of the base (step 2)
MIN_LIGHT_REQUESTS = 20  # fewer answered light requests read nothing
MIN_WAITS = 5  # fewer waits fix no load: their summed excess fixes the spare workers only within 0.3-2.1x
MAX_WORKERS = 64  # the most workers (or cores) a DIP is taken to have where its waits cannot tell


@dataclass(frozen=True)
class LightRound:
    """Light requests pooled at one load: ``waited`` of ``probes`` took more than ``base`` by
    ``jitter``, ``excess`` seconds beyond that in all."""

    probes: int
    waited: int
    excess: float
    base: float
    jitter: float


def light_round(rounds: Iterable[Sequence[float]]) -> LightRound | None:
    """Pool rounds of light latencies (seconds) taken at one load (steps 1 and 2 of the module
    docstring); None for fewer than :data:`MIN_LIGHT_REQUESTS` answered or a base of zero."""
    ordered = sorted(x for latencies in rounds for x in latencies)
    if len(ordered) < MIN_LIGHT_REQUESTS:
        return None
    base = nearest_rank(ordered, BASE_QUANTILE)
    assert base is not None
    if base <= 0:
        return None
    jitter = min(max(JITTER_SPAN * (base - ordered[0]), JITTER_FLOOR * base), JITTER_CAP * base)
    threshold = base + jitter
    waits = [x - threshold for x in ordered if x > threshold]
    return LightRound(probes=len(ordered), waited=len(waits), excess=math.fsum(waits), base=base, jitter=jitter)


@dataclass(frozen=True)
class LightLoad:
    """How busy a DIP ran over a round, from its light requests: ``utilisation`` with ``low`` /
    ``high`` bounds, and the unit its waits were read in: ``"stretch"`` (processor sharing, the light
    request's own work) or ``"service"`` (a worker pool, the application's unloaded latency); with too
    few waits ``"none"``, ``utilisation`` None and ``high`` the busiest it could have run."""

    utilisation: float | None
    low: float
    high: float | None
    unit: str

    def saturation_share(self, carried: float) -> float | None:
        """The share of the VIP at which the DIP saturates, from the ``carried`` share it ran at: the
        best estimate, else (too few waits) the least the rounds allow; None: unbounded, or a DIP that
        carried nothing (its light requests then say nothing of its share)."""
        busy = self.utilisation if self.utilisation is not None else self.high
        if busy is None or busy <= 0 or carried <= 0:
            return None
        return carried / busy


def light_load(r: LightRound, unloaded: float | None, z: float) -> LightLoad:
    """The load ``r`` shows (step 3 of the module docstring): read in the light request's own work
    where that fits the share that waited, else in ``unloaded`` (the application's unloaded latency,
    seconds; None: read in the light request's own work whatever fits); bounds at ``z`` standard
    errors."""
    if r.waited < MIN_WAITS:
        return LightLoad(None, 0.0, _busiest_without_waits(r, z), "none")
    stretch = load_from_light_probes(r.waited, r.probes, r.excess / r.base, threshold=r.jitter / r.base, z=z)
    if unloaded is None or unloaded <= r.base or _fits(stretch, r, z):
        return _load(stretch, "stretch")
    service = load_from_light_probes(r.waited, r.probes, r.excess / unloaded, threshold=r.jitter / unloaded, z=z)
    return _load(service, "service")


def _busiest_without_waits(r: LightRound, z: float) -> float:
    """The greatest utilisation at which :data:`MAX_WORKERS` workers have no more of their arrivals wait
    than ``r``'s share at its upper confidence limit: fewer workers wait more at any utilisation, so no DIP
    of up to that many ran busier. A trust region: a DIP raised to the share this allows shows its waits at
    the next round there."""
    _, high = wilson_interval(r.waited, r.probes, z)
    return utilisation_from_waited_share(min(high, 1 - 1e-9), MAX_WORKERS)


def _fits(read: LightProbeLoad, r: LightRound, z: float) -> bool:
    """Whether ``read``'s spare workers fit some number of workers at least one: a share of
    requests that waited as high as one worker with that spare would give (``1 - spare``), within the
    share's confidence interval."""
    assert read.spare is not None
    _, high = wilson_interval(r.waited, r.probes, z)
    return read.spare >= 1 or high >= 1 - read.spare


def _load(read: LightProbeLoad, unit: str) -> LightLoad:
    utilisation = read.utilisation if read.utilisation is not None else read.high
    return LightLoad(utilisation, read.low, read.high, unit)
