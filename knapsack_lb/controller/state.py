"""What a VIP's controller remembers, and its one serialiser.

A restarted controller resumes from the store exactly where the dead one stopped, so
everything :class:`~knapsack_lb.controller.core.VipController` needs across steps lives in
typed dataclasses gathered by :class:`ControllerState`. pydantic writes and reads the whole
tree: no hand-written ``to_dict`` / ``from_dict`` pair per class. Non-finite numbers (a curve's
latency beyond its asymptote, "never" as ``-inf``) are written as the JSON strings
``"Infinity"``, ``"-Infinity"`` and ``"NaN"``, so a state is always valid JSON and a store write
never fails on it.

Fails with :class:`~knapsack_lb.errors.InvalidInputError` naming the first bad field when a
stored state is of another ``state_version`` or does not validate (the caller starts afresh).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from knapsack_lb.controller.breaker import BreakerState
from knapsack_lb.controller.dynamics import DetectorState
from knapsack_lb.controller.estimation import RoundEvidence
from knapsack_lb.controller.guard import GuardState
from knapsack_lb.controller.measurement import DipMeasurement
from knapsack_lb.controller.traffic import RateReading
from knapsack_lb.curves import LatencyCurve, curve_from_dict
from knapsack_lb.errors import InvalidInputError, short_repr
from knapsack_lb.model import WeightPlan

STATE_VERSION: Literal[2] = 2


@dataclass
class DipState:
    """Everything the controller knows about one DIP."""

    name: str
    measuring: DipMeasurement | None = None
    curve: dict[str, Any] | None = None
    model: str = ""
    fit_error: float | None = None
    w_max: float = 0.0
    fitted_at: float = 0.0
    points: list[tuple[float, float]] = field(default_factory=list)
    drop_points: list[tuple[float, float]] = field(default_factory=list)
    l0: float | None = None
    failed: bool = False
    fail_rounds: int = 0
    returned_at: float | None = None
    ramp_held_at: float = -math.inf  # the step its slow start was last held at (its weight not raised there)
    back_since: float = -math.inf  # its first round after its last failure: older rounds are another host's
    last_round: float = -math.inf  # the newest trusted round
    last_checked_round: float = -math.inf  # the newest round the failure check has seen (trusted or not)
    iterations: int = 0
    evidence: list[RoundEvidence] = field(default_factory=list)  # the learner's rounds (learning.method estimate)
    overloaded: bool = False
    relaxed: list[float] = field(default_factory=list)  # its caps at looser confidence levels (the learner)
    ceiling: float = math.inf  # the upper confidence bound of its saturation weight (the learner)
    dispersion: float = 1.0  # how much more its rounds vary than their own spread says (the learner's fit)
    held: float | None = None  # after a rollback: the weight it may not exceed until ``held_until``
    held_until: float = -math.inf
    drained: bool = False  # the operator drains it: leaving the drain is a return (slow start)
    start_share: float | None = None  # the share the LB's own split gave it before the controller's first plan
    saturation_share: float | None = None  # where its light requests say it saturates (controller.light_rounds)
    unloaded: float | None = None  # its unloaded latency as its own rounds told it (kept across relearning)

    @property
    def ready(self) -> bool:
        return self.curve is not None and self.w_max > 0

    def rounds_since_back(self) -> list[RoundEvidence]:
        """Its rounds since its first one after its last failure (``back_since``): older ones are another host's."""
        return [e for e in self.evidence if e.time >= self.back_since]

    def release(self) -> None:
        """Lift a rollback's hold (``held``): the plans it compared no longer say anything about this DIP."""
        self.held, self.held_until = None, -math.inf

    def curve_obj(self) -> LatencyCurve:
        assert self.curve is not None
        return curve_from_dict(self.curve, dip=self.name)


@dataclass
class DrainProbe:
    """Section 4.7's drain-time measurement in progress: ``dip`` was cut to 0 at ``switch``;
    ``series`` holds its (time, mean latency) rounds since."""

    dip: str
    switch: float
    series: list[tuple[float, float]] = field(default_factory=list)


class ControllerState(BaseModel):
    """One VIP controller's whole state, as stored (``VipController.state()``)."""

    model_config = ConfigDict(extra="ignore", ser_json_inf_nan="strings")  # the loop adds its counters

    state_version: Literal[2] = STATE_VERSION
    vip: str
    dips: dict[str, DipState]
    plan: WeightPlan | None = None
    applied_at: float = -math.inf
    confirmed_version: int = 0
    in_force: dict[str, float] = Field(default_factory=dict)
    scheduled: dict[str, float] = Field(default_factory=dict)
    version: int = 0
    drain_time: float
    drain_measured_at: float | None = None
    drain_probe: DrainProbe | None = None
    rounds: int = 0
    measurement_rounds: int = 0
    detector: DetectorState = Field(default_factory=DetectorState)
    breaker: BreakerState = Field(default_factory=BreakerState)
    guard: GuardState = Field(default_factory=GuardState)
    last_solved: WeightPlan | None = None
    traffic_changed_at: float = -math.inf  # the learner's last traffic change (section 4.5)
    vip_rates: list[RateReading] = Field(default_factory=list)  # the VIP's counted rate per step (LB counters)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types only (non-finite numbers as strings): safe for any JSON writer."""
        result: dict[str, Any] = json.loads(self.model_dump_json())
        return result

    @classmethod
    def from_dict(cls, data: Any) -> ControllerState:
        version = data.get("state_version") if isinstance(data, dict) else None
        if version != STATE_VERSION:
            raise InvalidInputError("state_version", version, f"expected {STATE_VERSION}")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(part) for part in error["loc"])
            raise InvalidInputError(f"controller_state.{where}", short_repr(error.get("input")), error["msg"]) from None
