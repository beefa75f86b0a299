"""Every knob of the controller, grouped by the part of the loop it tunes.

``ControllerSettings`` is frozen pydantic so it can be read from YAML, from the admin API and
from the store, and passed unchanged to the simulator. Groups: ``loop`` (timing and leases),
``learning`` (how curves are learned), ``probe_budget`` (probe requests per DIP), ``measurement``
(Algorithm 1), ``fitting`` (curves), ``solver``, ``dynamics`` (traffic and capacity changes,
failures), ``refresh`` (periodic re-measurement), ``drain``, ``breaker`` (relative circuit
breaker) and ``rails`` (guard rails around every plan). Defaults follow the KnapsackLB paper
where it gives a number (section 4.3: D = 5 % of w_max, drop at 5x the weight-0 latency, pace 1;
section 4.5: 20 % capacity threshold, 5 % refresh budget; section 5: 5 s interval). Each feature
beyond the paper has a switch; :meth:`ControllerSettings.paper` turns all of them off (with it,
every DIP gets the same probe requests, as in section 5). docs/controller.md explains each
feature (the anchors in the descriptions), and
docs/decisions/controller.md how its default was chosen.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

CurveModelChoice = Literal["quadratic", "queueing", "piecewise", "auto"]
SolverObjective = Literal["mean", "sum", "max"]
SolverMethod = Literal["auto", "exact", "ilp", "ilp-multistep"]
BEYOND = "docs/controller.md#better-than-the-paper-each-switchable"
# flat names of releases before the settings were grouped -> where each lives now
MOVED = {
    **{name: f"loop.{name}" for name in ("interval", "measurement_max_age", "lease_ttl")},
    **{name: f"measurement.{name}" for name in ("drop_latency_factor", "drop_failure_share", "convergence_fraction",
                                                "pace", "run_capped_by_drop", "zero_batch_share", "trust_tolerance")},
    "max_measurement_iterations": "measurement.max_iterations", "measurement_remainder": "measurement.remainder",
    "curve_model": "fitting.curve_model",
    "min_fit_points": "fitting.min_points", "max_fit_points": "fitting.max_points",
    **{f"solver_{name}": f"solver.{name}" for name in ("objective", "method", "levels", "units", "time_limit")},
    **{name: f"dynamics.{name}" for name in ("traffic_change_threshold", "traffic_change_quorum",
                                             "capacity_change_threshold", "learn_operating_points", "remeasure_on_gain",
                                             "remeasure_after_loss", "overload_watch", "traffic_drift_threshold",
                                             "change_confirmations", "failure_rounds")},
    **{f"refresh_{name}": f"refresh.{name}" for name in ("period", "budget", "cautious_step", "knee_elasticity",
                                                         "needs_room")},
    "drain_time": "drain.time", "drain_measure_period": "drain.measure_period",
    "circuit_breaker": "breaker", "safety": "rails",
}


class _Group(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class LoopSettings(_Group):
    """Timing of the loop and of the controllers' leases (paper section 5)."""

    interval: float = Field(5.0, gt=0, le=3600, description="Seconds between controller steps per VIP (paper: 5 s).")
    measurement_max_age: float = Field(15.0, gt=0, description="Probe rounds older than this are ignored (s).")
    lease_ttl: float | None = Field(
        None, gt=0, le=3600, description="Seconds a controller's lease on a VIP lasts unrenewed; then another takes "
        "it over. Leases are renewed every third of it, also during a pass. Default: the interval, so that a dead "
        "controller's VIPs are stepped by the others within two intervals."
    )

    def lease_seconds(self) -> float:
        """``lease_ttl``, or the interval when it is not set."""
        return self.lease_ttl if self.lease_ttl is not None else self.interval
    on_stop: Literal["last-solved", "capacity", "equal", "keep"] = Field(
        "last-solved",
        description="The plan a stopping controller (SIGTERM, SIGINT) leaves each VIP's LB on: the last solved plan "
        "the LB confirmed (else capacity-proportional, else equal), capacity-proportional, equal weights over the "
        "live DIPs, or keep whatever is in force. Paused and dry-run VIPs are never touched. "
        "See docs/operations.md#stopping-klb.",
    )


class LearningSettings(_Group):
    """How curves are learned: from every probe round with its standard error (the default), or by the
    paper's Algorithm 1 (section 4.3). docs/controller.md#learning-from-every-round-the-default."""

    method: Literal["estimate", "algorithm1"] = Field(
        "estimate", description="estimate: fit every DIP's curve from every round, plans solved from the first "
        "round, caps on confidence bounds; algorithm1: the paper's measurement phase, then solve."
    )
    confidence: float = Field(
        2.0, ge=1, le=5, description="z: decisions use bounds this many standard errors wide (2 = about 95 %)."
    )
    window: float = Field(600.0, gt=0, description="Seconds of rounds a DIP's curve is fitted on.")


class ProbeBudgetSettings(_Group):
    """How a VIP's probe requests are shared among its DIPs each round: by uncertainty within a cap on
    probe load, or uniformly (paper section 5: the same N per DIP). docs/probes.md#the-probe-budget."""

    allocation: Literal["uncertainty", "uniform"] = Field(
        "uncertainty", description="uncertainty: more requests to the DIPs whose latency at their weight is least "
        "known, the VIP's total (requests_per_round x DIPs) kept; uniform: requests_per_round to every DIP (paper)."
    )
    load_cap: float = Field(
        0.03, gt=0, le=1, description="Most of a DIP's estimated capacity its probes may take (requests per round <= "
        "load_cap x capacity x interval); a DIP of unknown capacity gets at most requests_per_round."
    )
    floor: int = Field(
        3, ge=1, le=100_000, description="Fewest requests a DIP gets per round (at most requests_per_round); with the "
        "circuit breaker on, at least its min_requests."
    )


class MeasurementSettings(_Group):
    """Algorithm 1 (paper section 4.3) and the scheduling of measurement rounds (section 4.6)."""

    drop_latency_factor: float = Field(
        5.0, gt=1, description="A round is a 'drop' at this many times the weight-0 latency (paper: 5x)."
    )
    drop_failure_share: float = Field(
        0.01, ge=0, lt=1, description="... or when more than this share of its probe requests failed."
    )
    convergence_fraction: float = Field(
        0.05, gt=0, lt=1, description="D: a DIP is measured when a step changes its weight by less than this "
        "fraction of w_max (paper: 5 %)."
    )
    pace: float = Field(1.0, gt=0, le=10, description="alpha: pace of the 'run' phase (paper: 1).")
    run_capped_by_drop: bool = Field(
        True, description=f"A run step stops at the midpoint to the smallest weight that dropped ({BEYOND})."
    )
    drop_needs_proof: bool = Field(
        True, description="A drop its round's confidence bound does not prove is measured again and the pooled "
        f"rounds decide ({BEYOND})."
    )
    max_iterations: int = Field(12, ge=2, le=100, description="Weights tried per DIP before measuring stops.")
    zero_batch_share: float = Field(
        0.1, gt=0, le=0.5, description="Share of the pool held at weight 0 at once for the weight-0 latency (at "
        "least one DIP)."
    )
    remainder: Literal["solver", "capacity"] = Field(
        "solver", description=f"Where a measurement round's remainder goes: solved (paper) or by capacity ({BEYOND})."
    )
    trust_tolerance: float = Field(
        0.02, ge=0, lt=0.5, description="A round counts as taken at the scheduled weight within this relative distance."
    )


class FittingSettings(_Group):
    """Weight-latency curves (paper section 4.2)."""

    curve_model: CurveModelChoice = Field(
        "auto", description=f"quadratic (paper), queueing, piecewise, or auto: per DIP, by leave-one-out error "
        f"({BEYOND})."
    )
    min_points: int = Field(3, ge=2, description="Drop-free points a curve needs before it is fitted.")
    max_points: int = Field(24, ge=3, description="Most recent drop-free points kept per DIP.")

    @model_validator(mode="after")
    def _points(self) -> FittingSettings:
        if self.max_points < self.min_points:
            raise ValueError(f"max_points ({self.max_points}) must be >= min_points ({self.min_points})")
        return self


class SolverSettings(_Group):
    """The weight solver (paper sections 3.3 and 4.4; docs/solver.md)."""

    objective: SolverObjective = Field(
        "mean", description="mean (traffic-weighted request latency), sum (paper) or max. A VIP's own objective wins."
    )
    method: SolverMethod = Field("auto", description="Method passed to knapsack_lb.solver.solve.")
    levels: int = Field(10, ge=2, le=1000, description="ILP weight levels per DIP (paper: 10).")
    units: int = Field(100_000, ge=100, description="Integer weight units of the exact solvers.")
    time_limit: float = Field(10.0, gt=0, description="Seconds the solver may take before it counts as failed.")


class DynamicsSettings(_Group):
    """Traffic and capacity changes and failures (paper section 4.5; docs/controller.md#shift-and-rescale)."""

    traffic_change_threshold: float = Field(
        0.1, gt=0, lt=5, description="Traffic change: the pool's median deviation from the curves exceeds this."
    )
    traffic_change_quorum: float = Field(
        0.6, gt=0.5, le=1, description="'Most DIPs': share of judged DIPs that must move the same way."
    )
    capacity_change_threshold: float = Field(
        0.2, gt=0, lt=5, description="Capacity change: one DIP off its curve by more than this (paper: 20 %)."
    )
    change_confirmations: int = Field(
        2, ge=1, le=10, description="Rounds in a row a deviation must persist before it is acted on (paper: 1)."
    )
    traffic_drift_threshold: float = Field(
        0.03, ge=0, lt=1, description=f"Correct a pool-wide drift below a traffic change past this (0 = off; {BEYOND})."
    )
    learn_operating_points: bool = Field(
        True, description=f"On a capacity change also learn the point at the current weight and refit ({BEYOND})."
    )
    remeasure_on_gain: bool = Field(
        True, description=f"A capacity gain sends the DIP back to Algorithm 1 instead of a rescale ({BEYOND})."
    )
    remeasure_after_loss: bool = Field(
        True, description=f"A DIP whose curve was cut for a capacity loss is re-measured from the cut curve ({BEYOND})."
    )
    overload_watch: bool = Field(
        True, description=f"Overload cuts w_max at once, also while other DIPs measure ({BEYOND})."
    )
    failure_rounds: int = Field(
        1, ge=1, le=10, description="Rounds in a row without a successful probe before a DIP counts as failed."
    )


class RefreshSettings(_Group):
    """Periodic re-measurement of finished curves (paper section 4.5)."""

    period: float = Field(1800.0, ge=0, description="Seconds after which a finished curve is re-measured (0 = never).")
    budget: float = Field(
        0.05, ge=0, le=1, description="Most of the pool's estimated capacity under refresh at once (paper: 5 %)."
    )
    cautious_step: float = Field(
        0.1, ge=0, le=1, description=f"Past its threshold a refresh grows a weight by at most this fraction ({BEYOND})."
    )
    knee_elasticity: float = Field(
        4.0, ge=0, description=f"Arc elasticity that marks a curve's knee, where a refresh stops (0 = off; {BEYOND})."
    )
    needs_room: bool = Field(
        True, description=f"A refresh passes the knee only when the latency there is well below the curve ({BEYOND})."
    )


class DrainSettings(_Group):
    """Drain time: how long after a weight change its latency is trusted (paper section 4.7)."""

    time: float = Field(0.0, ge=0, description="Starting value of the drain time, until it is measured (s).")
    measure_period: float = Field(
        7200.0, ge=0, description="Seconds between drain-time measurements (paper: 120 min; 0 = never)."
    )


class CircuitBreakerSettings(_Group):
    """Relative circuit breaker after ELS: a DIP is ejected only when it is much worse than the
    rest of the pool, never more than ``max_ejected_share`` of it, never all of it; failures are
    judged on their own so a fast error is not fast service."""

    enabled: bool = Field(True, description="Off = paper: only total failure removes a DIP.")
    error_rate_threshold: float = Field(
        0.5, gt=0, le=1, description="Eject at this share of probes answered with an error ..."
    )
    relative_error_factor: float = Field(3.0, ge=1, description="... and this many times the pool's median share.")
    relative_latency_factor: float = Field(
        5.0, ge=1, description="Eject at this many times the curve's weight-0 latency while the pool median is below "
        "half of it."
    )
    latency_rounds: int = Field(4, ge=1, description="Rounds in a row a DIP must be that slow.")
    max_ejected_share: float = Field(0.3, ge=0, lt=1, description="Most of the pool's DIPs ejected at once.")
    min_requests: int = Field(10, ge=1, description="Probe requests a round needs before a DIP can be judged.")
    ejection_time: float = Field(30.0, gt=0, description="Seconds an ejected DIP stays out.")
    max_ejection_time: float = Field(300.0, gt=0, description="Ejection time doubles on repeats up to this (s).")

    @model_validator(mode="after")
    def _times(self) -> CircuitBreakerSettings:
        if self.max_ejection_time < self.ejection_time:
            raise ValueError(f"max_ejection_time ({self.max_ejection_time}) must be >= ejection_time "
                             f"({self.ejection_time})")
        return self


class RailsSettings(_Group):
    """Guard rails around every plan (not in the paper; each can be switched off)."""

    min_weight: float = Field(
        0.002, ge=0, lt=0.5, description="Every healthy, non-drained DIP keeps this share so its curve stays fresh "
        "(0 = paper)."
    )
    max_weight_change: float = Field(
        0.25, gt=0, le=1, description="Largest change of one weight in one step (1 = off; failures are exempt)."
    )
    slow_start: float = Field(30.0, ge=0, description="Seconds over which a returning DIP ramps up (0 = off).")
    keep_last_plan_on_error: bool = Field(
        True, description="When solving fails keep the last good plan, failed DIPs removed."
    )
    overload_headroom: float = Field(
        0.0, ge=0, lt=0.5, description="Solve with w_max scaled by (1 - headroom) (0 = paper)."
    )


class ControllerSettings(_Group):
    """Controller parameters (KnapsackLB sections 4.2-4.7 and 5), grouped; see the module docstring."""

    loop: LoopSettings = Field(default_factory=LoopSettings, description="Timing and leases.")
    learning: LearningSettings = Field(default_factory=LearningSettings, description="How curves are learned.")
    probe_budget: ProbeBudgetSettings = Field(
        default_factory=ProbeBudgetSettings, description="How probe requests are shared among a VIP's DIPs."
    )
    measurement: MeasurementSettings = Field(default_factory=MeasurementSettings, description="Algorithm 1.")
    fitting: FittingSettings = Field(default_factory=FittingSettings, description="Curve fitting.")
    solver: SolverSettings = Field(default_factory=SolverSettings, description="The weight solver.")
    dynamics: DynamicsSettings = Field(default_factory=DynamicsSettings, description="Traffic, capacity, failures.")
    refresh: RefreshSettings = Field(default_factory=RefreshSettings, description="Re-measuring finished curves.")
    drain: DrainSettings = Field(default_factory=DrainSettings, description="Drain time.")
    breaker: CircuitBreakerSettings = Field(
        default_factory=CircuitBreakerSettings, description="Relative circuit breaker (ELS)."
    )
    rails: RailsSettings = Field(default_factory=RailsSettings, description="Guard rails around every plan.")

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        if isinstance(data, dict):
            moved = [f"{old!r} is now {MOVED[old]!r}" for old in data if old in MOVED and old not in cls.model_fields]
            if moved:
                raise ValueError("controller settings are grouped: " + "; ".join(moved))
        return data

    @model_validator(mode="after")
    def _consistent(self) -> ControllerSettings:
        if 0 < self.refresh.cautious_step <= self.measurement.convergence_fraction:
            raise ValueError(f"refresh.cautious_step ({self.refresh.cautious_step}) must be 0 or larger than "
                             f"measurement.convergence_fraction ({self.measurement.convergence_fraction}), or a "
                             "capped step ends the run")
        return self

    def tuned(self, **groups: dict[str, Any]) -> ControllerSettings:
        """A validated copy with some fields of some groups replaced:
        ``settings.tuned(loop={"interval": 2.0}, rails={"slow_start": 0})``. Unknown groups or
        fields are errors that name them."""
        data = self.model_dump()
        for group, fields in groups.items():
            if group not in data or not isinstance(data[group], dict):
                raise ValueError(f"unknown controller settings group {group!r} (known: {', '.join(data)})")
            data[group] = {**data[group], **fields}
        return ControllerSettings.model_validate(data)

    @classmethod
    def paper(cls) -> ControllerSettings:
        """The paper's behaviour: quadratic curves, sum objective, no circuit breaker, no rails."""
        return cls().tuned(
            learning={"method": "algorithm1"},
            probe_budget={"allocation": "uniform"},
            fitting={"curve_model": "quadratic"},
            solver={"objective": "sum"},
            measurement={"run_capped_by_drop": False, "drop_needs_proof": False},
            dynamics={"change_confirmations": 1, "learn_operating_points": False, "remeasure_on_gain": False,
                      "remeasure_after_loss": False, "overload_watch": False, "traffic_drift_threshold": 0.0},
            refresh={"cautious_step": 0.0, "knee_elasticity": 0.0, "needs_room": False},
            breaker={"enabled": False},
            rails={"min_weight": 0.0, "max_weight_change": 1.0, "slow_start": 0.0, "overload_headroom": 0.0},
        )
