"""Hand-made LB views and outcomes for policy rule tests (pure logic, no simulator)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from knapsack_lb.sim.policies.base import Outcome, Request, Status


@dataclass
class FakeView:
    """An LbView whose counts, weights and time the test sets by hand."""

    n: int
    now: float = 0.0
    counts: dict[int, int] = field(default_factory=dict)
    weights: dict[int, float] = field(default_factory=dict)

    @property
    def dip_names(self) -> Sequence[str]:
        return tuple(f"s{i + 1}" for i in range(self.n))

    def outstanding(self, dip: int) -> int:
        return self.counts.get(dip, 0)

    def weight(self, dip: int) -> float:
        return self.weights.get(dip, 1.0)


def request(
    client: str = "10.0.0.1", *, excluded: Sequence[int] = (), attempt: int = 0, rid: int = 1, time: float = 0.0
) -> Request:
    return Request(id=rid, client=client, time=time, attempt=attempt, excluded=frozenset(excluded))


def outcome(dip: int, latency: float, status: Status = "ok", *, probe: bool = False, at: float = 0.0) -> Outcome:
    return Outcome(request_id=1, dip=dip, sent_at=at, finished_at=at + latency, status=status, probe=probe)
