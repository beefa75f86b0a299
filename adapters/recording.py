"""An adapter that records plans instead of pushing them: for tests, dry runs and the
simulator, where the "load balancer" is a Python object."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adapters.base import ApplyResult, CheckResult, quantise
from knapsack_lb.model import WeightPlan


class RecordingAdapter:
    """Keeps every applied plan; ``fail_next`` makes the next ``apply`` fail (fault tests)."""

    name = "recording"

    def __init__(self, resolution: int = 10_000) -> None:
        self.resolution = resolution
        self.applied: list[WeightPlan] = []
        self.fail_next: str | None = None
        self._current: dict[str, float] = {}

    @classmethod
    def from_config(cls, raw: Mapping[str, Any]) -> RecordingAdapter:
        resolution = raw.get("resolution", 10_000)
        if not isinstance(resolution, int) or resolution < 1:
            from knapsack_lb.errors import InvalidInputError

            raise InvalidInputError("adapter.settings.resolution", resolution, "must be an integer >= 1")
        return cls(resolution=resolution)

    def apply(self, plan: WeightPlan) -> ApplyResult:
        if self.fail_next is not None:
            reason, self.fail_next = self.fail_next, None
            return ApplyResult(ok=False, adapter=self.name, reason=reason)
        q = quantise(plan.weights, self.resolution)
        total = sum(q.weights.values())
        self._current = {d: w / total for d, w in q.weights.items()}
        self.applied.append(plan)
        return ApplyResult(ok=True, adapter=self.name, lb_weights=q.weights, quantisation_error=q.error)

    def read(self) -> dict[str, float]:
        return dict(self._current)

    def check(self) -> CheckResult:
        return CheckResult(ok=True, adapter=self.name, detail=f"{len(self.applied)} plans recorded")
