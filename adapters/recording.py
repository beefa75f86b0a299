"""An adapter that records plans instead of pushing them: for tests, dry runs and the
simulator, where the "load balancer" is a Python object."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import ConfigDict, Field

from adapters.base import AdapterSettings, ApplyResult, CheckResult, parse_settings, quantise
from knapsack_lb.model import WeightPlan


class RecordingSettings(AdapterSettings):
    """Settings of the recording adapter."""

    model_config = ConfigDict(strict=True)

    resolution: int = Field(10_000, ge=1, le=1_000_000_000, description="Integer weight units per plan.")


class RecordingAdapter:
    """Keeps every applied plan; ``fail_next`` makes the next ``apply`` fail (fault tests)."""

    name = "recording"
    Settings: ClassVar[type[RecordingSettings]] = RecordingSettings

    def __init__(self, resolution: int = 10_000) -> None:
        self.resolution = resolution
        self.applied: list[WeightPlan] = []
        self.fail_next: str | None = None
        self._current: dict[str, float] = {}

    @classmethod
    def from_config(cls, raw: Mapping[str, Any]) -> RecordingAdapter:
        return cls(resolution=parse_settings(RecordingSettings, raw).resolution)

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
