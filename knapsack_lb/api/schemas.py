"""Request and response bodies of the admin API, declared so that the OpenAPI schema is exact.

Configuration bodies reuse :class:`knapsack_lb.model.VipConfig` / ``DipConfig`` as they are;
the models here are the read views (plans, curves, measurements, status) and the small
bodies of the override calls. Non-finite floats (an infinite predicted latency past a
queueing curve's capacity) become ``null``: JSON has no infinity.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from knapsack_lb.curves import curve_from_dict
from knapsack_lb.errors import InvalidInputError
from knapsack_lb.model import Measurement, WeightPlan
from knapsack_lb.store import CurveRecord

CURVE_SAMPLES = 41


def finite_or_none(value: object) -> float | None:
    """``value`` as a float, or ``None`` when it is missing, not a number, NaN or infinite."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def json_safe(value: Any) -> Any:
    """Recursively replace non-finite floats by ``None`` and tuples/sets by lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


class Problem(BaseModel):
    """An error: what is wrong, in words."""

    detail: str = Field(description="What went wrong, naming the field or object.")


class HealthOut(BaseModel):
    status: str = Field(description="'ok' when the process serves requests.")


class ReadyOut(BaseModel):
    status: str = Field(description="'ready' when the store answers, else 'unavailable'.")
    store: bool = Field(description="Whether the latency store answered a ping.")


class VipSummary(BaseModel):
    """One line of the VIP list."""

    name: str
    dips: list[str] = Field(description="DIP names.")
    paused: bool
    dry_run: bool
    pins: dict[str, float] = Field(description="DIP -> pinned weight.")
    drained: list[str] = Field(description="DIPs held at weight 0.")
    adapter: str | None = Field(description="The load balancer the VIP selects (None: plans are pushed nowhere).")
    plan_version: int | None = Field(description="Version of the current plan; null before the first.")


class PlanOut(BaseModel):
    """A ``WeightPlan``: weights per DIP (sum 1), predicted latency (s), solver, reasons."""

    vip: str
    version: int
    computed_at: float = Field(description="When the plan was computed (s, the controller's clock).")
    weights: dict[str, float] = Field(description="DIP -> fraction of the VIP's traffic; sums to 1.")
    predicted_latency: dict[str, float | None] = Field(description="DIP -> latency its curve predicts (s).")
    objective: float | None = Field(description="Objective value (s); null when unknown.")
    objective_kind: str = Field(description="mean, sum or max.")
    method: str = Field(description="Solver or rule that produced the plan.")
    solve_seconds: float = Field(description="Time the solver took (s).")
    reasons: list[str] = Field(description="Events behind the plan, in order.")
    flags: list[str] = Field(description="Warnings such as over-capacity.")

    @classmethod
    def of(cls, plan: WeightPlan) -> PlanOut:
        return cls(
            vip=plan.vip,
            version=plan.version,
            computed_at=finite_or_none(plan.computed_at) or 0.0,
            weights=dict(plan.weights),
            predicted_latency={d: finite_or_none(v) for d, v in plan.predicted_latency.items()},
            objective=finite_or_none(plan.objective),
            objective_kind=plan.objective_kind,
            method=plan.method,
            solve_seconds=finite_or_none(plan.solve_seconds) or 0.0,
            reasons=list(plan.reasons),
            flags=list(plan.flags),
        )


class CurveOut(BaseModel):
    """A fitted curve with the points it was fitted on and samples for plotting."""

    dip: str
    model: str = Field(description="quadratic, queueing or piecewise.")
    curve: dict[str, Any] = Field(description="The curve's parameters (curves.curve_from_dict form).")
    w_max: float | None = Field(description="Largest weight measured without drops (fraction).")
    points: list[list[float | None]] = Field(description="[weight, latency (s)] points the curve was fitted on.")
    fit_error: float | None = Field(description="Held-out fit error (s); null when unknown.")
    fitted_at: float | None = Field(description="When the curve was fitted (s, the controller's clock).")
    samples: list[list[float | None]] = Field(
        description="[weight, latency (s)] on a grid over [0, max(1.2 w_max, points)]; null past capacity."
    )
    extra: dict[str, Any] = Field(description="Model-specific extras.")

    @classmethod
    def of(cls, record: CurveRecord) -> CurveOut:
        points = [[finite_or_none(w), finite_or_none(lat)] for w, lat in record.points]
        w_max = finite_or_none(record.w_max)
        top = max([w_max or 0.0] + [p[0] or 0.0 for p in points])
        top = min(1.0, max(0.05, 1.2 * top))
        samples: list[list[float | None]] = []
        try:
            curve = curve_from_dict(record.curve, dip=record.dip)
            grid = np.linspace(0.0, top, CURVE_SAMPLES)
            values = curve.latencies(grid)
            samples = [[float(w), finite_or_none(float(v))] for w, v in zip(grid, values, strict=True)]
        except (InvalidInputError, ValueError, TypeError):
            samples = []
        return cls(
            dip=record.dip,
            model=record.model,
            curve=json_safe(dict(record.curve)),
            w_max=w_max,
            points=points,
            fit_error=finite_or_none(record.fit_error),
            fitted_at=finite_or_none(record.fitted_at),
            samples=samples,
            extra=json_safe(dict(record.extra)),
        )


class MeasurementOut(BaseModel):
    """One probe round against one DIP (KnapsackLB section 5, KLM); latencies in seconds."""

    model_config = ConfigDict(from_attributes=True)

    vip: str
    dip: str
    time: float = Field(description="When the round ended (s, the probe worker's clock).")
    weight: float | None = Field(description="Weight in effect during the round (fraction).")
    sent: int
    successes: int
    errors: int
    timeouts: int
    latency_mean: float | None = Field(description="Mean latency of successful requests (s).")
    latency_p50: float | None
    latency_p90: float | None
    latency_p99: float | None
    failure_latency_mean: float | None = Field(description="Mean time to a failure (s).")
    worker: str
    lb_timed: int = Field(0, description="How many of the requests are client requests the LB timed, not probes.")

    @classmethod
    def of(cls, m: Measurement) -> MeasurementOut:
        return cls(
            vip=m.vip, dip=m.dip, time=finite_or_none(m.time) or 0.0, weight=finite_or_none(m.weight), sent=m.sent,
            successes=m.successes, errors=m.errors, timeouts=m.timeouts,
            latency_mean=finite_or_none(m.latency_mean), latency_p50=finite_or_none(m.latency_p50),
            latency_p90=finite_or_none(m.latency_p90), latency_p99=finite_or_none(m.latency_p99),
            failure_latency_mean=finite_or_none(m.failure_latency_mean), worker=m.worker, lb_timed=m.lb_timed,
        )


class ControllerStateOut(BaseModel):
    """What the controller keeps about one VIP (measurement phase, curves' status, drain time ...)."""

    vip: str
    lease_owner: str | None = Field(description="Controller process holding the VIP's lease; null when none.")
    remeasure_pending: bool = Field(description="Whether re-measurement requests wait for the controller.")
    state: dict[str, Any] | None = Field(description="The controller's stored state; null before its first step.")


class StatusOut(BaseModel):
    """Live controller and probe processes, as they report themselves (status entries with a TTL)."""

    controllers: dict[str, dict[str, Any]] = Field(description="Controller member -> its last status.")
    probes: dict[str, dict[str, Any]] = Field(description="Probe worker -> its last status.")
    vips: list[str] = Field(description="Configured VIPs.")


class DryRunIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    enabled: bool = Field(description="true: compute and store plans but push nothing to the LB.")


class PinIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    weight: float = Field(ge=0, le=1, allow_inf_nan=False, description="Fixed weight of the DIP (fraction).")


class RemeasureOut(BaseModel):
    vip: str
    dips: list[str] = Field(description="DIPs whose re-measurement was requested.")


class SeriesPoint(BaseModel):
    time: float
    value: float | None


class DipView(BaseModel):
    """Everything the dashboard draws for one DIP."""

    name: str
    weight: float | None = Field(description="Weight in the current plan.")
    predicted_latency: float | None = Field(description="Latency the curve predicts at that weight (s).")
    measured_latency: float | None = Field(description="Latest probe mean latency (s).")
    measured_weight: float | None = Field(description="Weight in effect during the latest probe round.")
    pinned: float | None
    drained: bool
    lb_weight: float | None = Field(None, description="The share the load balancer confirmed it carries.")
    probe_errors: int = Field(0, description="Errors and timeouts in the latest probe round.")
    probe_sent: int = Field(0, description="Requests sent in the latest probe round.")
    learning: bool = Field(False, description="No usable curve yet (or Algorithm 1 measures it).")
    overloaded: bool = Field(False, description="The controller judges it overloaded at its weight.")
    curve: CurveOut | None
    weight_series: list[SeriesPoint] = Field(description="Planned weight over time (plan history).")
    latency_series: list[SeriesPoint] = Field(description="Probe mean latency over time (s).")


class DashboardOut(BaseModel):
    vip: str
    plan: PlanOut | None
    dips: list[DipView]
    paused: bool = Field(False, description="An operator paused the VIP: nothing is computed or pushed.")
    dry_run: bool = Field(False, description="Plans are computed but never pushed to the load balancer.")
    lb_version: int | None = Field(None, description="Version of the plan the load balancer confirmed last.")
    apply_error: str = Field("", description="Why the last push to the load balancer failed ('' when it did not).")
    apply_failures: int = Field(0, description="Failed pushes to the load balancer so far.")
