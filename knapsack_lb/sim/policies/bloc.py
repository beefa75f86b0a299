"""BLOC: load balancing with overload control for sidecar load balancers.

Source: R. Bhattacharya and T. Wood, "BLOC: Balancing Load with Overload Control In the
Microservices Architecture" (IEEE ACSOS 2022; BLOC paper), sections III and IV.

Which half runs where
---------------------
Server side (the downstream's ingress proxy; the simulator's DIP model calls these functions):

* ``issue_chip`` — section IV.A: on every response the server draws ``r`` uniform in (0, 1]
  and attaches a confidence chip unless ``r < q / (0.8 * cap)``, ``q`` the requests queued at
  the server. So ``P(no chip) = min(1, q / (0.8 cap))``: 0.5 at ``q = 0.4 cap``, 1 from
  ``q = 0.8 cap`` on, which keeps at least 20% of capacity for upstreams without chips.
* ``aqm_admits`` — section IV.C: a request that would push the queue above capacity is
  rejected with HTTP 429.
* ``DynamicCapacity`` — section IV.D: capacity fixed by the operator, or the cumulative
  average of the requests in the server's queue over a 30 s window, recomputed every 30 s,
  admitting everything during the first window.

Client side (the upstream's egress proxy; ``BlocPolicy``):

* section IV.B: per-downstream chip counts; a downstream is Active when this upstream holds a
  chip for it and it has not rejected a request recently, Inactive otherwise. A request spends
  a chip. Requests go to the Active list by P2C least connections (this upstream's own
  outstanding requests).
* sections IV.B-C: a 429 drops every chip for that downstream, moves it to the Inactive list
  and starts its "reset" (backoff) timer. The rejected request is retried by the caller on
  another DIP (``Request.excluded`` holds the DIPs tried; the retry count is the caller's).
* section IV.B-C: with no Active downstream, the request probes an Inactive one whose reset
  timer has expired; the probe restarts its timer and does not make it Active — only a
  successful reply carrying a chip does. With no such downstream the request is dropped
  (``pick`` returns ``None``) rather than queued past its SLO.

How it fails: it needs the server half: without chips (``server.chips`` off in a scenario)
every downstream stays Inactive and most requests are dropped. With a capacity set too high,
chips keep flowing and AQM rejects late (the paper's Cap=15 run); too low, and goodput is lost
to drops. The dynamic capacity follows the
load it sees, so a lightly loaded server gets a small capacity (we keep it at least 1).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from knapsack_lb.errors import InvalidInputError
from knapsack_lb.sim.policies.base import LbView, Outcome, Request
from knapsack_lb.sim.policies.registry import PolicyContext

CHIP_RESERVE = 0.8  # section IV.A: chips stop at 80% of capacity


def no_chip_probability(queued: int, capacity: float) -> float:
    """``P(no chip) = min(1, q / (0.8 cap))`` (section IV.A)."""
    if capacity <= 0:
        return 1.0
    return min(1.0, max(0.0, queued / (CHIP_RESERVE * capacity)))


def issue_chip(queued: int, capacity: float, rng: random.Random) -> bool:
    """The server's chip decision: ``r`` uniform in (0, 1]; no chip if ``r < q / (0.8 cap)``."""
    r = 1.0 - rng.random()  # (0, 1]
    if capacity <= 0:
        return False
    return not r < queued / (CHIP_RESERVE * capacity)


def aqm_admits(queued: int, capacity: float | None) -> bool:
    """AQM (section IV.C): admit unless one more request would push the queue above capacity.

    ``capacity`` ``None`` means not known yet (the first dynamic window): admit everything.
    """
    if capacity is None:
        return True
    return queued + 1 <= capacity


class DynamicCapacity:
    """Section IV.D: capacity = cumulative average of the active requests over the last 30 s window.

    ``sample(now, active)`` is called on every arrival with the requests at the server (in
    service included: "the number of active requests in its queue"); at each
    window boundary the window's average becomes the capacity (rounded up, at least 1) and a
    new average starts. ``capacity(now)`` is ``None`` during the first window (admit all).
    """

    def __init__(self, window: float = 30.0, start: float = 0.0) -> None:
        if window <= 0:
            raise InvalidInputError("window", window, "must be > 0 seconds")
        self.window = window
        self._window_end = start + window
        self._sum = 0.0
        self._count = 0
        self._capacity: float | None = None

    def _roll(self, now: float) -> None:
        while now >= self._window_end:
            if self._count:
                self._capacity = max(1.0, math.ceil(self._sum / self._count))
            self._sum, self._count = 0.0, 0
            self._window_end += self.window

    def sample(self, now: float, queued: int) -> None:
        self._roll(now)
        self._sum += queued
        self._count += 1

    def capacity(self, now: float) -> float | None:
        self._roll(now)
        return self._capacity


class BlocPolicy:
    """BLOC's upstream load balancer (sections IV.B and IV.C).

    Parameters: ``reset_interval`` [1.0 s] backoff after a 429 and minimum time between two
    probes of the same Inactive downstream (the paper's "reset" / "probe" timer; its value is
    not given in the paper); ``start_active`` [False] whether downstreams start Active with
    ``initial_chips`` [1] chips (the paper starts without chips: the first requests probe).
    """

    name = "bloc"

    def __init__(self, *, reset_interval: float = 1.0, start_active: bool = False, initial_chips: int = 1) -> None:
        if not reset_interval > 0:
            raise InvalidInputError("reset_interval", reset_interval, "must be > 0 seconds")
        if initial_chips < 0:
            raise InvalidInputError("initial_chips", initial_chips, "must be >= 0")
        self.reset_interval = reset_interval
        self.start_active = start_active
        self.initial_chips = initial_chips
        self.chips: dict[int, int] = {}
        self._timer_until: dict[int, float] = {}  # reset/probe timer per downstream
        self._rejected_at: dict[int, float] = {}
        self._initialised = False

    def _init(self, view: LbView) -> None:
        if not self._initialised:
            self._initialised = True
            if self.start_active:
                for dip in range(len(view.dip_names)):
                    self.chips[dip] = self.initial_chips

    def is_active(self, dip: int, now: float) -> bool:
        """Active: this upstream holds a chip and the downstream is not backing off."""
        return self.chips.get(dip, 0) > 0 and self._timer_until.get(dip, -math.inf) <= now

    def active(self, view: LbView) -> list[int]:
        return [d for d in range(len(view.dip_names)) if self.is_active(d, view.now)]

    def pick(self, request: Request, view: LbView, rng: random.Random) -> int | None:
        self._init(view)
        now = view.now
        active = [d for d in self.active(view) if d not in request.excluded]
        if active:
            if len(active) == 1:
                chosen = active[0]
            else:
                a, b = rng.sample(active, 2)
                oa, ob = view.outstanding(a), view.outstanding(b)
                chosen = a if oa < ob or (oa == ob and rng.random() < 0.5) else b
            self.chips[chosen] -= 1  # a request spends a chip
            return chosen
        probeable = [d for d in range(len(view.dip_names))
                     if d not in request.excluded and self._timer_until.get(d, -math.inf) <= now]
        if not probeable:
            return None  # section IV.B: dropped rather than queued past its SLO
        chosen = rng.choice(probeable)
        self._timer_until[chosen] = now + self.reset_interval  # probing restarts the timer
        return chosen

    def observe(self, outcome: Outcome, view: LbView) -> None:
        self._init(view)
        dip = outcome.dip
        if outcome.status == "rejected":
            self.chips[dip] = 0  # drop every chip for it
            self._timer_until[dip] = max(self._timer_until.get(dip, -math.inf), outcome.finished_at
                                         + self.reset_interval)
            self._rejected_at[dip] = outcome.finished_at
            return
        if outcome.status == "ok" and outcome.chip:
            if outcome.sent_at < self._rejected_at.get(dip, -math.inf):
                return  # a chip granted before the rejection: already dropped
            self.chips[dip] = self.chips.get(dip, 0) + 1
            # A chip from a successful probe ends the backoff: the downstream becomes Active.
            self._timer_until.pop(dip, None)

    def should_retry(self, request: Request, outcome: Outcome, view: LbView) -> bool:
        """Section IV.C: a request rejected with 429 is retried on another DIP (the caller bounds retries)."""
        return outcome.status == "rejected"

    def probe_targets(self, view: LbView, rng: random.Random) -> Sequence[int]:
        return ()  # BLOC probes with real requests (pick), not separate probes


def make_bloc(ctx: PolicyContext) -> BlocPolicy:
    """BLOC (ACSOS'22 IV): confidence chips, Active/Inactive lists, backoff on 429, P2C least connections."""
    return BlocPolicy(**dict(ctx.params))
