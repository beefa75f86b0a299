"""Every knob of the controller, with its unit, default and meaning.

``ControllerSettings`` is frozen pydantic so it can be read from YAML, from the admin API
and from the store, and passed unchanged to the simulator. Defaults follow the KnapsackLB
paper (KnapsackLB paper) where it gives a number (section 4.3: D = 5 % of w_max, drop at
5x the weight-0 latency, pace 1; section 4.5: 20 % capacity threshold, 5 % refresh budget;
section 5: 5 s interval); the "better than the paper" features (curve model selection,
relative circuit breaker, safety rails) each have a switch that restores the paper's
behaviour. docs/controller.md explains each feature and how to turn it off.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

CurveModelChoice = Literal["quadratic", "queueing", "piecewise", "auto"]
SolverObjective = Literal["mean", "sum", "max"]
SolverMethod = Literal["auto", "exact", "ilp", "ilp-multistep"]


class CircuitBreakerSettings(BaseModel):
    """Relative circuit breaker after ELS: a DIP is ejected only when it is
    much worse than the rest of the pool, never more than ``max_ejected_share`` of the pool,
    never all of it; failures are judged on their own so a fast error is not fast service."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    enabled: bool = Field(
        True, description="Run the relative circuit breaker (off = paper: only total failure removes a DIP)."
    )
    error_rate_threshold: float = Field(
        0.5, gt=0, le=1,
        description="Eject when the DIP's share of probes answered with an error is at least this (fraction).",
    )
    relative_error_factor: float = Field(
        3.0, ge=1, description="... and at least this many times the pool's median error share (dimensionless)."
    )
    relative_latency_factor: float = Field(
        5.0, ge=1, description="Eject when the DIP's latency at its weight is this many times its own curve's weight-0 "
        "latency AND the pool median of the same ratio is below half of it (dimensionless)."
    )
    latency_rounds: int = Field(
        4, ge=1, description="Rounds in a row a DIP must be that slow before the latency rule ejects it (after the "
        "capacity detector had its chance to rescale)."
    )
    max_ejected_share: float = Field(
        0.3, ge=0, lt=1, description="Never eject more than this fraction of the pool's DIPs at once (fraction)."
    )
    min_requests: int = Field(10, ge=1, description="Probe requests a DIP needs in a round before it can be judged.")
    ejection_time: float = Field(30.0, gt=0, description="Seconds an ejected DIP stays out before it may return (s).")
    max_ejection_time: float = Field(
        300.0, gt=0, description="Ejection time doubles on repeat ejections up to this (s)."
    )


class SafetySettings(BaseModel):
    """Guard rails around every plan (not in the paper; each can be switched off)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    min_weight: float = Field(
        0.002, ge=0, lt=0.5, description="Minimum weight of every healthy, non-drained DIP so none starves and its "
        "curve stays fresh (fraction of VIP traffic; 0 = off, as in the paper)."
    )
    max_weight_change: float = Field(
        0.25, gt=0, le=1, description="Largest change of one DIP's weight in one step, as a fraction of the VIP's "
        "traffic (1 = off). Applies to steady-state plans, not to failure removal."
    )
    slow_start: float = Field(
        30.0, ge=0, description="Seconds over which a returning DIP's weight ramps from min_weight to its solved "
        "weight (0 = off)."
    )
    keep_last_plan_on_error: bool = Field(
        True, description="When solving fails, keep the last good plan (adjusted only to remove failed DIPs)."
    )
    overload_headroom: float = Field(
        0.0, ge=0, lt=0.5, description="Solve with w_max scaled by (1 - headroom) so no DIP is planned right at its "
        "measured limit (fraction; 0 = paper)."
    )


class ControllerSettings(BaseModel):
    """Controller parameters (KnapsackLB sections 4.2-4.7 and 5) with their defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    # --- the loop (section 5) -----------------------------------------------------------
    interval: float = Field(5.0, gt=0, le=3600, description="Seconds between controller steps per VIP (paper: 5 s).")
    measurement_max_age: float = Field(
        15.0, gt=0, description="Ignore probe rounds older than this when deciding (s)."
    )
    lease_ttl: float = Field(
        15.0, gt=0, description="Seconds a controller's lease on a VIP lasts without renewal; a dead controller's VIPs "
        "are taken over after this (s)."
    )

    # --- measurement phase (section 4.3, Algorithm 1) -------------------------------------
    drop_latency_factor: float = Field(
        5.0, gt=1, description="A probe round counts as a 'drop' when its latency is at least this many times the "
        "weight-0 latency (paper: 5x)."
    )
    drop_failure_share: float = Field(
        0.01, ge=0, lt=1, description="... or when more than this share of its probe requests failed (fraction)."
    )
    convergence_fraction: float = Field(
        0.05, gt=0, lt=1, description="D: measurement is done when the weight change is within this fraction of w_max "
        "(paper: 5 %)."
    )
    pace: float = Field(
        1.0, gt=0, le=10, description="alpha: pace of the weight increase in the 'run' phase (paper: 1)."
    )
    run_capped_by_drop: bool = Field(
        True, description="Ours: a 'run' step never passes the midpoint to the smallest weight that already dropped "
        "(like TCP's ssthresh; saves iterations). False = the paper's unbounded run step."
    )
    max_measurement_iterations: int = Field(
        12, ge=2, le=100, description="Stop measuring a DIP after this many weights even if not converged."
    )
    zero_batch_share: float = Field(
        0.1, gt=0, le=0.5, description="At most this share of the pool's DIPs is held at weight 0 at once to measure "
        "their weight-0 latency at a cold start (fraction; at least one DIP)."
    )
    measurement_remainder: Literal["solver", "capacity"] = Field(
        "solver", description="Where a measurement round's remainder goes (section 4.6): 'solver' (paper) solves "
        "the finished DIPs' curves for it (it may pile it on a few DIPs), 'capacity' (ours) spreads it over every "
        "DIP not measured this round in proportion to its estimated capacity (w_max, else the equal share), so no "
        "DIP carries far more than its share while others are measured."
    )
    trust_tolerance: float = Field(
        0.02, ge=0, lt=0.5, description="A probe round counts as taken at the scheduled weight when within this "
        "relative distance of it (fraction)."
    )

    # --- curve fitting (section 4.2) ----------------------------------------------------
    curve_model: CurveModelChoice = Field(
        "auto", description="quadratic (paper), queueing a + b/(c - w), piecewise (convex piecewise linear), or auto "
        "(per DIP, lowest leave-one-out error)."
    )
    min_fit_points: int = Field(3, ge=2, description="Drop-free points a curve needs before it is fitted.")
    max_fit_points: int = Field(24, ge=3, description="Most recent drop-free points kept per DIP for fitting.")

    # --- solver (sections 3.3 and 4.4) ------------------------------------------------------
    solver_objective: SolverObjective = Field(
        "mean", description="mean (traffic-weighted request latency), sum (paper) or max. A VIP's own objective wins."
    )
    solver_method: SolverMethod = Field("auto", description="Solver method passed to knapsack_lb.solver.solve.")
    solver_levels: int = Field(10, ge=2, le=1000, description="ILP weight levels per DIP (paper: 10).")
    solver_units: int = Field(100_000, ge=100, description="Integer weight units for the exact solvers.")
    solver_time_limit: float = Field(10.0, gt=0, description="Seconds the solver may take before it counts as failed.")

    # --- dynamics (section 4.5) ------------------------------------------------------------
    traffic_change_threshold: float = Field(
        0.1, gt=0, lt=5, description="Traffic change: the median over the pool of each DIP's latency relative to its "
        "curve's estimate is off by more than this (fraction)."
    )
    traffic_change_quorum: float = Field(
        0.6, gt=0.5, le=1, description="'Most DIPs': share of judged DIPs that must move in the same direction to call "
        "a traffic change (fraction)."
    )
    capacity_change_threshold: float = Field(
        0.2, gt=0, lt=5, description="One DIP off its curve by more than this relative amount is a capacity change "
        "(paper: +/-20 %)."
    )
    learn_operating_points: bool = Field(
        True, description="Ours: on a capacity change, also add the averaged observation at the DIP's current weight "
        "to its points and refit (fixes curve shape, not just scale). False = the paper's pure rescale."
    )
    remeasure_on_gain: bool = Field(
        True, description="Ours: a capacity gain (latency below the curve) sends the DIP back to Algorithm 1 instead "
        "of rescaling its curve: in the flat part of a curve latency says little about capacity, so a rescale "
        "from it is a guess, and a noisy guess upward can plan the DIP past its true capacity. False = the paper's "
        "rescale (at half strength)."
    )
    remeasure_after_loss: bool = Field(
        True, description="Ours: after a capacity loss is rescaled (at once, for safety) the DIP is re-measured "
        "from the cut curve, so an estimate from one noisy inverse (or several compounding ones on a ramp) does "
        "not leave it pessimistic for good. False = rescale only (paper)."
    )
    refresh_cautious_step: float = Field(
        0.1, ge=0, le=1, description="Ours: a refresh's Algorithm 1 runs up to a threshold (the DIP's previous "
        "w_max, or its curve's knee with refresh_needs_room) and beyond it grows the weight by at most this fraction "
        "per iteration (TCP-like: the threshold is ssthresh), less where the last step's arc elasticity says the "
        "latency would rise more than 25 %, so that re-measuring a live DIP does not jump past its capacity. "
        "0 = the paper's unbounded run."
    )
    refresh_knee_elasticity: float = Field(
        4.0, ge=0, description="Ours: a refresh beyond its threshold stops when a step's arc elasticity "
        "ln(l_i/l_i-1)/ln(w_i/w_i-1) reaches this (about 80 % utilisation under M/M/c for any number of cores; the "
        "paper's 5x-l_0 drop comes near 97 % on 8 cores); the same elasticity on the current curve marks the knee "
        "that refresh_needs_room uses as the threshold. 0 = off."
    )
    overload_watch: bool = Field(
        True, description="Ours: overload acts at once - timeouts, or a drop-level latency (drop_latency_factor x "
        "l_0) 3 times the curve and beyond 4 standard errors cut the DIP's w_max to 90 % of what it served - and "
        "finished DIPs are watched during other DIPs' measurement rounds too, where the paper judges only the "
        "steady state: for overload (at a weight within their w_max), and the pool for a traffic change when at "
        "least 80 % of the DIPs are finished. A DIP whose capacity fell while another was being measured stayed "
        "above capacity until that measurement ended. False = timeouts only, steady state only (paper)."
    )
    refresh_needs_room: bool = Field(
        True, description="Ours: a refresh runs Algorithm 1 only up to the knee of the DIP's current curve (where "
        "its elasticity reaches refresh_knee_elasticity; the old w_max if that is lower) and goes further, by "
        "cautious steps, only if the latency there is at least capacity_change_threshold below the curve: a "
        "re-measurement is a bet that the DIP has room, and near capacity one interval of a lost bet costs more "
        "than the refresh can gain. Otherwise it ends there and keeps the old w_max and the old points above. "
        "False = Algorithm 1 up to the old w_max and cautious steps beyond it whatever the latency."
    )
    traffic_drift_threshold: float = Field(
        0.03, ge=0, lt=1, description="Ours: a pool-wide drift of the latencies against the curves smaller than a "
        "traffic change (e.g. what is left after one) is corrected once its slope-weighted estimate exceeds this "
        "capacity factor (fraction) and three standard errors, for change_confirmations rounds. 0 = off (paper)."
    )
    change_confirmations: int = Field(
        2, ge=1, le=10, description="Consecutive rounds a deviation must persist before it is acted on (1 = paper)."
    )
    refresh_period: float = Field(
        1800.0, ge=0, description="Seconds after which a finished curve is re-measured (0 = never)."
    )
    refresh_budget: float = Field(
        0.05, ge=0, le=1, description="At most this share of the pool's estimated capacity under refresh at once "
        "(paper: 5 %)."
    )
    failure_rounds: int = Field(
        1, ge=1, le=10, description="Consecutive rounds without a successful probe before a DIP counts as failed."
    )

    # --- drain time (section 4.7) -------------------------------------------------------
    drain_time: float = Field(
        0.0, ge=0, description="Seconds after a weight change before its latency is trusted (measured; this is the "
        "starting value)."
    )
    drain_measure_period: float = Field(
        7200.0, ge=0, description="Seconds between drain-time measurements (paper: 120 min; 0 = never measure)."
    )

    # --- better than the paper -------------------------------------------------------------
    circuit_breaker: CircuitBreakerSettings = Field(
        default_factory=CircuitBreakerSettings, description="Relative circuit breaker (ELS blog)."
    )
    safety: SafetySettings = Field(default_factory=SafetySettings, description="Guard rails around every plan.")

    @model_validator(mode="after")
    def _consistent(self) -> ControllerSettings:
        if self.max_fit_points < self.min_fit_points:
            raise ValueError(
                f"max_fit_points ({self.max_fit_points}) must be >= min_fit_points ({self.min_fit_points})"
            )
        if 0 < self.refresh_cautious_step <= self.convergence_fraction:
            raise ValueError(f"refresh_cautious_step ({self.refresh_cautious_step}) must be 0 or larger than "
                             f"convergence_fraction ({self.convergence_fraction}), or a capped step ends the run")
        if self.circuit_breaker.max_ejection_time < self.circuit_breaker.ejection_time:
            raise ValueError("circuit_breaker.max_ejection_time must be >= circuit_breaker.ejection_time")
        return self

    @classmethod
    def paper(cls) -> ControllerSettings:
        """The paper's behaviour: quadratic curves, sum objective, no circuit breaker, no rails."""
        return cls(
            curve_model="quadratic",
            solver_objective="sum",
            change_confirmations=1,
            run_capped_by_drop=False,
            learn_operating_points=False,
            remeasure_on_gain=False,
            remeasure_after_loss=False,
            refresh_cautious_step=0.0,
            refresh_knee_elasticity=0.0,
            refresh_needs_room=False,
            overload_watch=False,
            traffic_drift_threshold=0.0,
            circuit_breaker=CircuitBreakerSettings(enabled=False),
            safety=SafetySettings(min_weight=0.0, max_weight_change=1.0, slow_start=0.0, overload_headroom=0.0),
        )
