"""Sticky sessions with expiry (L7 report, "Sticky Sessions").

A client (its address, or an ID it sends) is remembered with the DIP it was given and the time of
its last request; its next requests go to the same DIP, bypassing the inner policy, as long as the
mapping is younger than ``expiry`` seconds (refreshed by every request) and the DIP is not excluded
(unhealthy, already tried). Otherwise the inner policy picks and the mapping is replaced.
How it fails: clients that keep sending never move back to a recovered DIP, so after a failover
the survivors stay overloaded (the report's observation).
"""

from __future__ import annotations

import random

from knapsack_lb.sim.policies.base import LbView, Policy, Request
from knapsack_lb.sim.policies.wrapper import PolicyWrapper


class StickySessions(PolicyWrapper):
    def __init__(self, inner: Policy, *, expiry: float = 10.0) -> None:
        super().__init__(inner)
        if expiry <= 0:
            raise ValueError(f"sticky expiry must be > 0 (got {expiry})")
        self.expiry = expiry
        self.sessions: dict[str, tuple[int, float]] = {}
        self.reused = 0  # requests sent along a live mapping
        self.expired = 0  # mappings dropped because the client was idle longer than expiry
        self.broken = 0  # mappings dropped because their DIP was excluded (unhealthy, tried)
        self.max_reused_idle = 0.0  # longest idle gap after which a mapping was still used
        self.name = f"{inner.name}+sticky"

    def pick(self, request: Request, view: LbView, rng: random.Random) -> int | None:
        now = view.now
        entry = self.sessions.get(request.client)
        if entry is not None:
            dip, last = entry
            idle = now - last
            if idle <= self.expiry and dip not in request.excluded:
                self.sessions[request.client] = (dip, now)
                self.reused += 1
                self.max_reused_idle = max(self.max_reused_idle, idle)
                return dip
            if idle > self.expiry:
                self.expired += 1
            else:
                self.broken += 1
            del self.sessions[request.client]
        chosen = self.inner.pick(request, view, rng)
        if chosen is not None:
            self.sessions[request.client] = (chosen, now)
        return chosen
