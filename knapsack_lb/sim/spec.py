"""Scenario specification: the YAML file a user writes, validated with pydantic.

Every field is documented in docs/simulator.md. Names of DIPs follow ``knapsack_lb.names``
rules loosely (letters, digits, ``. _ -``); events and spikes select DIPs by name or by
0-based index. Times are seconds of simulated time, rates requests per second.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from knapsack_lb.errors import InvalidInputError

SCENARIO_DIR = Path(__file__).resolve().parent.parent / "scenarios"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ServiceSpec(_Frozen):
    """Service time of one request on a DIP of speed 1 (the DIP divides it by its speed)."""

    kind: Literal["fixed", "exponential", "lognormal"] = Field("exponential", description="Distribution.")
    mean: float = Field(0.01, gt=0, description="Mean service time in seconds at speed 1.")
    sigma: float = Field(1.0, gt=0, description="Lognormal: standard deviation of the underlying normal.")


class DipGroupSpec(_Frozen):
    """One DIP, or ``count`` identical DIPs named ``name-1 .. name-count``."""

    name: str = Field(description="DIP name, or the prefix when count > 1.")
    count: int = Field(1, ge=1, le=10_000, description="How many identical DIPs this entry describes.")
    workers: int = Field(1, ge=1, le=4096, description="Parallel workers (cores) c.")
    discipline: Literal["fcfs", "ps"] = Field(
        "ps", description="fcfs: c workers and a FIFO queue; ps: processor sharing over c cores."
    )
    speed: float = Field(1.0, gt=0, description="Speed of each worker (service time is divided by it).")
    weight: float = Field(
        1.0, ge=0, description="Configured weight (used by weighted policies until a controller pushes weights)."
    )
    capacity: int | Literal["dynamic"] | None = Field(
        None,
        description="BLOC's Cap: requests allowed to wait (beyond those in service) for AQM and chips; "
        "'dynamic' = the average active requests (in service included) of the last 30 s window (BLOC IV-D); "
        "None = workers.",
    )
    service: ServiceSpec | None = Field(None, description="Per-group service time; None = the scenario's.")
    error_probability: float = Field(0.0, ge=0, le=1, description="Each request fails with this probability.")

    @field_validator("capacity")
    @classmethod
    def _capacity_positive(cls, value: int | str | None) -> int | str | None:
        if isinstance(value, int) and value < 0:
            raise ValueError(f"capacity must be >= 0 or 'dynamic' (got {value})")
        return value

    error_latency: Literal["fast", "slow"] = Field(
        "fast", description="fast: the failure answers at once; slow: after full service."
    )


class SpikeSpec(_Frozen):
    """Transient extra delay on the paths to some DIPs (DL3 section V: netem on a server's veth)."""

    dips: tuple[str | int, ...] = Field(description="DIPs whose paths get the spikes.")
    extra: float = Field(
        gt=0, description="Extra one-way delay in seconds while a spike lasts (applies to each direction)."
    )
    duration: float = Field(gt=0, description="Seconds a spike lasts.")
    per_minute: float = Field(gt=0, description="Spikes per minute.")
    pattern: Literal["poisson", "periodic"] = Field(
        "poisson", description="Spike start times: Poisson or evenly spaced with a random phase."
    )
    lbs: tuple[int, ...] | None = Field(None, description="LB instances whose paths are affected; None = all.")


class NetworkSpec(_Frozen):
    rtt: float = Field(0.0, ge=0, description="Base round-trip time between an LB and a DIP in seconds.")
    spikes: tuple[SpikeSpec, ...] = Field((), description="Transient delay spikes.")


class RatePoint(_Frozen):
    at: float = Field(ge=0, description="Time in seconds.")
    rate: float | None = Field(None, ge=0, description="Requests (or sessions) per second at this time.")
    load: float | None = Field(None, ge=0, description="Or: fraction of the pool's total capacity.")


class ClientSpec(_Frozen):
    """Where traffic comes from.

    open: Poisson requests at ``rate`` (or ``load`` x pool capacity) or a piecewise-linear ``ramp``;
    closed: ``concurrency`` workers each sending the next request when the last one ends (like hey);
    sessions: layer 4: ``concurrency`` client connections (or as many as make ``load`` x capacity at
    ``think_time``), each carrying ``requests_per_session`` sequential requests with ``think_time``
    between a response and the next request (keep-alive), then replaced by a new connection.
    """

    kind: Literal["open", "closed", "sessions"] = Field("open", description="Traffic model.")
    rate: float | None = Field(None, gt=0, description="open: requests per second.")
    load: float | None = Field(
        None,
        gt=0,
        description="open: rate = load x total capacity; "
        "sessions: concurrency = load x capacity x (think_time + mean service).",
    )
    ramp: tuple[RatePoint, ...] = Field((), description="open: rate over time, linear between points.")
    concurrency: int = Field(10, ge=1, le=100_000, description="closed: parallel workers; sessions: open connections.")
    think_time: float = Field(0.0, ge=0, description="closed/sessions: mean exponential pause before the next request.")
    requests_per_session: int = Field(20, ge=1, description="sessions: requests carried by one connection.")
    count: int = Field(100, ge=1, le=1_000_000, description="Distinct client addresses.")
    pause_after_failure: float = Field(
        0.05,
        ge=0,
        description="closed/sessions: seconds a client waits after a failed or dropped request before the next "
        "(a 503 from the LB comes back at once; without a pause a closed loop would spin in zero time).",
    )


class RetrySpec(_Frozen):
    max_attempts: int = Field(1, ge=1, le=20, description="Attempts per request including the first (1 = no retries).")
    on: tuple[Literal["error", "timeout", "rejected"], ...] = Field(
        ("error", "timeout", "rejected"),
        description="Statuses that trigger a retry unless the policy decides (should_retry).",
    )
    backoff: float = Field(0.0, ge=0, description="Seconds before a retry is sent.")

    @model_validator(mode="before")
    @classmethod
    def _on_alias(cls, data: Any) -> Any:
        # YAML 1.1 reads a bare `on:` key as the boolean true; accept it, and `retry_on`, as `on`
        if isinstance(data, dict):
            data = dict(data)
            for alias in (True, "retry_on"):
                if alias in data:
                    data["on"] = data.pop(alias)
        return data


class HealthCheckSpec(_Frozen):
    interval: float = Field(3.0, gt=0, description="Seconds between health checks of every DIP.")
    timeout: float = Field(2.0, gt=0, description="Seconds before a silent DIP counts as unhealthy.")


class StickySpec(_Frozen):
    expiry: float = Field(10.0, gt=0, description="Seconds of client inactivity after which the mapping is forgotten.")


class SheddingSpec(_Frozen):
    threshold: int = Field(5, ge=0, description="Simultaneous requests at the LB instance (sim_conn_threshold).")
    strategy: Literal["hard", "exponential"] = Field(
        "hard", description="hard: shed above the threshold; exponential: with 1 - e^(-K(n - threshold))."
    )
    k: float = Field(0.3, gt=0, description="K of the exponential strategy.")


class LbSpec(_Frozen):
    instances: int = Field(1, ge=1, le=10_000, description="LB instances (MUXes or sidecars), each with its own view.")
    assignment: Literal["random", "by_client"] = Field(
        "random",
        description="random: each request/connection reaches a random instance (ECMP); "
        "by_client: client i always uses instance i mod N (sidecars).",
    )
    layer: Literal[4, 7] = Field(
        7, description="7: every request is placed; 4: connections are placed once (needs clients.kind sessions)."
    )
    timeout: float | None = Field(
        None, gt=0, description="Seconds before an attempt counts as a timeout; None = wait forever."
    )
    retries: RetrySpec = Field(RetrySpec(), description="Retries on another DIP (layer 7 only).")


class ServerFeatures(_Frozen):
    piggyback_inflight: bool = Field(False, description="Responses carry the DIP's in-flight count (DL3).")
    aqm: bool = Field(
        False,
        description="A DIP rejects (429) a request that would push its in-flight count above capacity (BLOC III-C).",
    )
    chips: bool = Field(False, description="Responses carry a confidence chip unless r < q / (0.8 cap) (BLOC III-A).")
    report_utilization: bool = Field(
        False, description="Responses carry the DIP's utilisation and qps over the last window (ORCA)."
    )


class ServerOverride(_Frozen):
    """Per-policy server features (``PolicySpec.server``): a field left out (None) keeps the scenario's.

    The simulator runs one policy per run, so the DIPs of that run behave as the policy's deployment
    would; e.g. BLOC's LeastConnection baseline has neither AQM nor chips (BLOC section VI).
    """

    piggyback_inflight: bool | None = Field(None, description="Replaces server.piggyback_inflight if set.")
    aqm: bool | None = Field(None, description="Replaces server.aqm if set.")
    chips: bool | None = Field(None, description="Replaces server.chips if set.")
    report_utilization: bool | None = Field(None, description="Replaces server.report_utilization if set.")


class EventSpec(_Frozen):
    """Something that happens at a scheduled time."""

    at: float = Field(ge=0, description="Time in seconds.")
    kind: Literal[
        "fail", "restart", "capacity", "errors", "traffic", "weights",
        "pin", "unpin", "drain", "undrain", "pause", "resume", "dry_run", "apply_fail",
    ] = Field(description="What happens: to the DIPs and the traffic, or (pin ... apply_fail) what an operator "
              "does to KnapsackLB's VIP and its load balancer.")
    dips: tuple[str | int, ...] = Field(
        (), description="DIPs concerned (fail, restart, capacity, errors, pin, unpin, drain, undrain)."
    )
    mode: Literal["fast", "hang"] = Field(
        "fast", description="fail: fast = refuses at once; hang = never answers (needs lb.timeout)."
    )
    speed: float | None = Field(
        None, gt=0, description="capacity: new speed factor relative to the DIP's configured speed."
    )
    probability: float | None = Field(None, ge=0, le=1, description="errors: new error probability.")
    latency: Literal["fast", "slow"] = Field("fast", description="errors: failure latency.")
    factor: float | None = Field(None, gt=0, description="traffic: multiply the offered rate by this.")
    weight: float | None = Field(None, ge=0, le=1, description="pin: the weight the DIP is held at.")
    enabled: bool | None = Field(None, description="dry_run: on (true) or off (false).")
    count: int | None = Field(None, ge=1, description="apply_fail: how many applies in a row the LB refuses.")
    weights: tuple[float, ...] | None = Field(
        None, description="weights: the configured weights every LB instance uses from now on, in DIP order "
        "(a reference plan that changes when the pool does)."
    )

    @model_validator(mode="after")
    def _needs(self) -> EventSpec:
        need = {"capacity": "speed", "errors": "probability", "traffic": "factor", "pin": "weight",
                "dry_run": "enabled", "apply_fail": "count", "weights": "weights"}.get(self.kind)
        if need is not None and getattr(self, need) is None:
            raise ValueError(f"event kind {self.kind!r} at {self.at} needs field {need!r}")
        if self.kind in ("fail", "restart", "capacity", "errors", *OPERATOR_DIP_EVENTS) and not self.dips:
            raise ValueError(f"event kind {self.kind!r} at {self.at} needs 'dips'")
        return self


class PolicySpec(_Frozen):
    """One policy to run: a registry name plus optional wrappers; ``label`` names it in results."""

    name: str = Field(description="Registry name (klb sim policies).")
    label: str | None = Field(None, description="Name in tables and plots; default: name.")
    params: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the policy factory.")
    health_check: HealthCheckSpec | None = Field(None, description="Wrap in active health checks with failover.")
    sticky: StickySpec | None = Field(None, description="Wrap in sticky sessions.")
    shedding: SheddingSpec | None = Field(None, description="Wrap in LB load shedding.")
    server: ServerOverride | None = Field(
        None,
        description="Server features for this policy's run: the fields given replace the scenario's `server` "
        "(e.g. a baseline without BLOC's aqm/chips); None = the scenario's.",
    )

    def server_features(self, scenario_features: ServerFeatures) -> ServerFeatures:
        """The features this policy runs with: the scenario's, with the fields this spec sets replaced."""
        if self.server is None:
            return scenario_features
        given = {field: value for field, value in self.server.model_dump().items() if value is not None}
        return scenario_features.model_copy(update=given)

    @property
    def display(self) -> str:
        return self.label or self.name


OPERATOR_DIP_EVENTS = ("pin", "unpin", "drain", "undrain")
OPERATOR_EVENTS = (*OPERATOR_DIP_EVENTS, "pause", "resume", "dry_run", "apply_fail")


class KnapsackSpec(_Frozen):
    """KnapsackLB controller inside the simulator (policy name 'knapsack')."""

    lb: Literal["haproxy", "nginx", "envoy", "powerdns", "recording"] = Field(
        "haproxy", description="Which load balancer's integer weights the simulated LB carries (rounded exactly "
        "as that adapter rounds them)."
    )
    data_plane: Literal["smooth_wrr", "weighted_least_connections"] = Field(
        "smooth_wrr", description="How the MUXes use the learned weights: smooth weighted round robin (layer 4), "
        "or weighted least connections (layer 7, as HAProxy leastconn does)."
    )
    probe_interval: float = Field(5.0, gt=0, description="Seconds between probe rounds (KLM).")
    probe_requests: int = Field(20, ge=1, description="Probe requests per DIP per round (N).")
    probe_timeout: float = Field(1.0, gt=0, description="Seconds before a probe request counts as a timeout.")
    probe_window: float = Field(
        0.5, gt=0, le=1, description="Probes are spread over this last fraction of each interval (after a change)."
    )
    light_requests: int = Field(
        0, ge=0, le=10_000,
        description="Light requests per DIP per round, to a fixed-work URL on every DIP (ProbeSpec.light_path), "
        "spread like the probes; 0: the DIPs have no such URL.")
    light_work: float = Field(
        0.01, gt=0, le=1, description="A light request's work as a share of the DIP's mean service time.")
    settings: dict[str, Any] = Field(default_factory=dict, description="ControllerSettings overrides.")


class Scenario(_Frozen):
    name: str = Field("scenario", description="Scenario name.")
    description: str = Field("", description="What it models and which document it comes from.")
    duration: float = Field(60.0, gt=0, description="Simulated seconds of traffic.")
    warmup: float = Field(0.0, ge=0, description="Requests started before this time are not counted.")
    window: float = Field(1.0, gt=0, description="Seconds per time-series window (utilisation, throughput).")
    seed: int = Field(1, description="Default seed.")
    service: ServiceSpec = Field(ServiceSpec(), description="Default service time.")
    dips: tuple[DipGroupSpec, ...] = Field(description="The DIP pool.")
    network: NetworkSpec = Field(NetworkSpec(), description="Paths between LBs and DIPs.")
    clients: ClientSpec = Field(ClientSpec(), description="Traffic.")
    lb: LbSpec = Field(LbSpec(), description="Load balancer instances.")
    server: ServerFeatures = Field(ServerFeatures(), description="Server-side features.")
    events: tuple[EventSpec, ...] = Field((), description="Scheduled changes.")
    policies: tuple[PolicySpec, ...] = Field((), description="Policies `klb sim compare` runs.")
    knapsack: KnapsackSpec = Field(KnapsackSpec(), description="KnapsackLB settings.")

    @field_validator("policies", mode="before")
    @classmethod
    def _policy_strings(cls, value: Any) -> Any:
        if isinstance(value, list | tuple):
            return tuple({"name": v} if isinstance(v, str) else v for v in value)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        if self.warmup >= self.duration:
            raise ValueError(f"warmup ({self.warmup}) must be below duration ({self.duration})")
        if (self.lb.layer == 4) != (self.clients.kind == "sessions"):
            raise ValueError("lb.layer 4 goes with clients.kind 'sessions' and vice versa")
        c = self.clients
        if c.kind == "open" and c.rate is None and c.load is None and not c.ramp:
            raise ValueError("clients: give rate, load or ramp for open traffic")
        if any(e.kind == "fail" and e.mode == "hang" for e in self.events) and self.lb.timeout is None:
            raise ValueError("a 'hang' failure needs lb.timeout (otherwise requests wait forever)")
        names = self.dip_names()
        if len(set(names)) != len(names):
            raise ValueError(f"DIP names must be unique (got {names})")
        for e in self.events:
            self.resolve(e.dips)
            if e.weights is not None and (len(e.weights) != len(names) or min(e.weights) < 0 or sum(e.weights) <= 0):
                raise ValueError(f"event 'weights' at {e.at} needs {len(names)} weights >= 0, not all 0 "
                                 f"(got {list(e.weights)})")
        for s in self.network.spikes:
            self.resolve(s.dips)
        return self

    def dip_names(self) -> list[str]:
        out: list[str] = []
        for g in self.dips:
            out.extend([g.name] if g.count == 1 else [f"{g.name}-{i}" for i in range(1, g.count + 1)])
        return out

    def dip_groups(self) -> list[DipGroupSpec]:
        """One entry per DIP (groups expanded)."""
        return [g for g in self.dips for _ in range(g.count)]

    def resolve(self, refs: tuple[str | int, ...]) -> list[int]:
        """DIP references (names, group prefixes or indexes) -> sorted indexes."""
        names = self.dip_names()
        groups = self.dip_groups()
        out: set[int] = set()
        for ref in refs:
            if isinstance(ref, int):
                if not 0 <= ref < len(names):
                    raise ValueError(f"DIP index {ref} out of range 0..{len(names) - 1}")
                out.add(ref)
            elif ref in names:
                out.add(names.index(ref))
            elif any(g.name == ref for g in groups):
                out.update(i for i, g in enumerate(groups) if g.name == ref)
            else:
                raise ValueError(
                    f"unknown DIP {ref!r} (known: {', '.join(names[:8])}{' ...' if len(names) > 8 else ''})"
                )
        return sorted(out)

    def mean_service(self) -> float:
        """The pool's mean service time (s) at its DIPs' speeds, weighted by their capacity."""
        groups = self.dip_groups()
        speeds = [g.workers * g.speed for g in groups]
        weighted = sum((g.service or self.service).mean / g.speed * s for g, s in zip(groups, speeds, strict=True))
        return weighted / sum(speeds)

    def total_capacity(self) -> float:
        """Requests per second the pool serves at 100% utilisation."""
        total = 0.0
        for g in self.dip_groups():
            mean = (g.service or self.service).mean
            total += g.workers * g.speed / mean
        return total

    def policy(self, name: str) -> PolicySpec:
        """The scenario's policy with this label or name, or a bare registry name."""
        for p in self.policies:
            if p.display == name:
                return p
        for p in self.policies:
            if p.name == name:
                return p
        return PolicySpec(name=name)

    def with_changes(self, **updates: Any) -> Scenario:
        """A validated copy with top-level fields replaced (nested dicts merge into models)."""
        data = self.model_dump()
        for key, value in updates.items():
            if isinstance(value, dict) and isinstance(data.get(key), dict):
                data[key] = {**data[key], **value}
            else:
                data[key] = value
        return Scenario.model_validate(data)


def shipped_scenarios() -> list[str]:
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))


def load_scenario(spec: str | Path) -> Scenario:
    """Load a scenario from a YAML path or a shipped name; errors name the field and value."""
    path = Path(spec)
    if not path.exists():
        candidate = SCENARIO_DIR / f"{spec}.yaml"
        if not candidate.exists():
            raise InvalidInputError(
                "scenario",
                str(spec),
                f"no such file and no shipped scenario (shipped: {', '.join(shipped_scenarios())})",
            )
        path = candidate
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise InvalidInputError("scenario", str(path), f"not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise InvalidInputError("scenario", str(path), "must be a YAML mapping")
    raw.setdefault("name", path.stem)
    return parse_scenario(raw, source=str(path))


def parse_scenario(raw: dict[str, Any], source: str = "scenario") -> Scenario:
    try:
        return Scenario.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or "scenario"
        raise InvalidInputError(loc, err.get("input"), f"{err['msg']} (in {source})") from exc
