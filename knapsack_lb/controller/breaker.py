"""A relative circuit breaker after the ELS blog ("Relative circuit breaker").

An absolute breaker ("eject below 80 % success") shuts a whole service down when a shared
dependency makes every DIP fail 25 % of requests. ELS ejects a machine only when it does
*substantially worse than the pool*. Here a DIP is ejected when, in a probe round with at
least ``min_requests`` requests,

* its error share (answered with an error) is at least ``error_rate_threshold`` and at least
  ``relative_error_factor`` times the pool's median error share, or
* its success latency was at least ``relative_latency_factor`` times what its curve expects
  at its weight for ``latency_rounds`` rounds in a row, while the pool's median of the same
  ratio stayed below half of that (the whole pool being slow is a traffic change, not a bad
  DIP; one DIP slower than its curve is first a capacity change, which the controller
  rescales within ``dynamics.change_confirmations`` rounds - the breaker only acts if that did not help).

Fast failures are not fast service: latency is judged on successful requests only, and a
DIP that answers quickly with errors is judged by its error share (ELS measures failure
latency apart for the same reason). Timeouts are overload, the capacity detector's business.
At most ``max_ejected_share`` of the pool (rounded down,
but never all DIPs) is out at once; the worst go first. An ejected DIP returns after
``ejection_time``, doubled on each repeat up to ``max_ejection_time``; the controller then
brings it back with slow start.

How it fails: with very few DIPs the median is the DIP itself; with two DIPs the breaker can
eject at most ``floor(0.3 * 2) = 0`` - a small pool is protected by the cap, on purpose.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field

from knapsack_lb.controller.settings import CircuitBreakerSettings
from knapsack_lb.model import Measurement


@dataclass
class Ejection:
    until: float
    count: int


@dataclass(frozen=True)
class BreakerDecision:
    ejected: tuple[str, ...] = ()
    returned: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass
class BreakerState:
    """What the breaker remembers between rounds (persisted with the controller's state)."""

    ejections: dict[str, Ejection] = field(default_factory=dict)
    history: dict[str, int] = field(default_factory=dict)
    slow_rounds: dict[str, int] = field(default_factory=dict)


@dataclass
class RelativeCircuitBreaker:
    settings: CircuitBreakerSettings
    state: BreakerState = field(default_factory=BreakerState)

    @property
    def ejections(self) -> dict[str, Ejection]:
        return self.state.ejections

    def is_ejected(self, dip: str) -> bool:
        return dip in self.state.ejections

    def evaluate(
        self, now: float, rounds: Mapping[str, Measurement], expected: Mapping[str, float], pool: int,
        capacity: Mapping[str, float] | None = None,
    ) -> BreakerDecision:
        """Judge this round's probe results. ``expected``: dip -> latency its curve predicts now;
        ``pool``: number of live DIPs (ejected ones included); ``capacity`` (ours): each live DIP's
        estimated capacity as a weight (``w_max``) - a DIP is kept in when the others could not
        carry the whole VIP without it (ejecting an overloaded large DIP would overload the rest:
        a cascade, not a cure)."""
        s = self.settings
        returned = tuple(sorted(d for d, e in self.state.ejections.items() if now >= e.until))
        for dip in returned:
            del self.state.ejections[dip]
        if not s.enabled:
            return BreakerDecision(returned=returned)
        judged = {d: m for d, m in rounds.items() if m.sent >= s.min_requests and d not in self.state.ejections}
        if len(judged) < 2:
            return BreakerDecision(returned=returned)
        fail_share = {d: m.errors / m.sent for d, m in judged.items()}
        ratio = {
            d: m.latency_mean / expected[d]
            for d, m in judged.items()
            if m.latency_mean is not None and expected.get(d, 0) > 0 and math.isfinite(expected[d])
        }
        median_fail = statistics.median(fail_share.values())
        median_ratio = statistics.median(ratio.values()) if ratio else 1.0
        badness: dict[str, tuple[float, str]] = {}
        for dip, share in fail_share.items():
            if share >= s.error_rate_threshold and share >= s.relative_error_factor * max(median_fail, 0.01):
                badness[dip] = (10 + share, f"fails {share:.0%} of probes (pool median {median_fail:.0%})")
        for dip, r in ratio.items():
            slow = r >= s.relative_latency_factor and median_ratio < r / 2
            self.state.slow_rounds[dip] = self.state.slow_rounds.get(dip, 0) + 1 if slow else 0
            if dip not in badness and slow and self.state.slow_rounds[dip] >= s.latency_rounds:
                badness[dip] = (r / s.relative_latency_factor, f"latency {r:.1f}x its curve (pool median "
                                f"{median_ratio:.1f}x)")
        room = min(math.floor(s.max_ejected_share * pool), pool - 1) - len(self.state.ejections)
        ejected: list[str] = []
        kept: list[str] = []
        notes: list[str] = []
        for dip in sorted(badness, key=lambda d: -badness[d][0])[: max(0, room)]:
            if capacity is not None:
                rest = sum(w for d, w in capacity.items() if d != dip and d not in self.state.ejections)
                if rest < 1.0:
                    kept.append(dip)
                    notes.append(f"circuit breaker kept {dip} in ({badness[dip][1]}): the other DIPs' estimated "
                                 f"capacity {rest:.2f} cannot carry the VIP")
                    continue
            count = self.state.history.get(dip, 0) + 1
            self.state.history[dip] = count
            duration = min(s.max_ejection_time, s.ejection_time * 2 ** (count - 1))
            self.state.ejections[dip] = Ejection(now + duration, count)
            self.state.slow_rounds.pop(dip, None)
            ejected.append(dip)
            notes.append(f"circuit breaker ejected {dip} for {duration:.0f}s: {badness[dip][1]}")
        skipped = sorted(set(badness) - set(ejected) - set(kept))
        if skipped:
            notes.append(f"circuit breaker cap ({s.max_ejected_share:.0%} of {pool}) kept {skipped} in")
        return BreakerDecision(tuple(ejected), returned, tuple(notes))
