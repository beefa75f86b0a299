"""Active health checks with failover (L7 report, "Health Checks").

Every ``interval`` seconds the LB instance checks every DIP (a probe answered without service); a
DIP that answers with an error, or not within ``timeout``, is marked unhealthy and excluded from
selection until a later check succeeds. Selection is delegated to the inner policy with the
unhealthy DIPs added to ``Request.excluded`` (failover); when every DIP is unhealthy the request is
rejected (the report's LB "rejects any requests until the servers recover").
How it fails: between a crash and the next failed check (up to ``interval`` + ``timeout``) requests
still go to the dead DIP; a shorter interval costs more check traffic (the report's trade-off).
The inner policy's own probes are not sent (one probe schedule per LB instance).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

from knapsack_lb.sim.policies.base import LbView, Outcome, Policy, Request
from knapsack_lb.sim.policies.wrapper import PolicyWrapper


class HealthChecked(PolicyWrapper):
    def __init__(self, inner: Policy, *, interval: float = 3.0, timeout: float = 2.0) -> None:
        super().__init__(inner)
        if interval <= 0 or timeout <= 0:
            raise ValueError(f"health check interval and timeout must be > 0 (got {interval}, {timeout})")
        self.probe_interval = interval
        self.probe_timeout = timeout
        self.unhealthy: set[int] = set()
        self.name = f"{inner.name}+health"

    def pick(self, request: Request, view: LbView, rng: random.Random) -> int | None:
        if self.unhealthy:
            request = replace(request, excluded=request.excluded | self.unhealthy)
            if len(request.excluded) >= len(view.dip_names):
                return None
        return self.inner.pick(request, view, rng)

    def observe(self, outcome: Outcome, view: LbView) -> None:
        if outcome.probe:
            if outcome.status == "ok":
                self.unhealthy.discard(outcome.dip)
            else:
                self.unhealthy.add(outcome.dip)
            return
        self.inner.observe(outcome, view)

    def probe_targets(self, view: LbView, rng: random.Random) -> Sequence[int]:
        return range(len(view.dip_names))
