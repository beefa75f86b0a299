"""Base of policies that wrap another (health checks, sticky sessions, shedding).

A wrapper delegates ``pick``/``observe``/``probe_targets`` and, through ``__getattr__``, any optional
attribute of the inner policy the simulator asks for (``probe_interval``, ``probe_timeout``,
``should_retry``), so wrapping never hides a document policy's hooks.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from knapsack_lb.sim.policies.base import LbView, Outcome, Policy, Request


class PolicyWrapper:
    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name

    def __getattr__(self, attr: str) -> Any:
        if attr == "inner":  # not yet set (during unpickling, copying)
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    def pick(self, request: Request, view: LbView, rng: random.Random) -> int | None:
        return self.inner.pick(request, view, rng)

    def observe(self, outcome: Outcome, view: LbView) -> None:
        self.inner.observe(outcome, view)

    def probe_targets(self, view: LbView, rng: random.Random) -> Sequence[int]:
        return self.inner.probe_targets(view, rng)
