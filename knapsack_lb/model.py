"""Data that crosses module boundaries: plans, measurements, VIP/DIP configuration.

Units: time and latency in **seconds** (floats), weights as fractions of the VIP's
traffic in [0, 1]. ``WeightPlan`` and ``Measurement`` are frozen dataclasses (they are
produced once and only read); configuration is pydantic, because it is validated from
YAML files, the admin API and the store.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from knapsack_lb.errors import InvalidInputError, short_repr
from knapsack_lb.names import parse_address, validate_name

WEIGHT_SUM_TOLERANCE = 1e-9
# What an HTTP/1.1 client can send as is (RFC 3986 path characters, RFC 9110 tokens and field values)
PROBE_PATH = re.compile(r"^/[!#$%&()*+,\-./0-9:;=?@A-Z\[\]_a-z~]{0,2047}$")
HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,64}$")
HEADER_VALUE = re.compile(r"^[\t\x20-\x7e]{0,1024}$")
FRAMING_HEADERS = frozenset({"content-length", "transfer-encoding", "connection", "upgrade", "expect"})
MAX_PROBE_HEADERS = 32

Objective = Literal["mean", "sum", "max"]
Balancing = Literal["weighted", "least_connections"]


class PlanMethod(StrEnum):
    """How a plan's weights were made (``WeightPlan.method``)."""

    MANUAL = "manual"  # set by hand (tests, benchmarks, the operator)
    EXACT_GREEDY = "exact-greedy"  # the exact solver, every DIP's cost convex on the grid
    EXACT_DP = "exact-dp"  # the exact solver's dynamic program (some cost not convex)
    EXACT_BISECTION = "exact-bisection"  # the exact solver for the "max" objective
    ILP = "ilp"  # the paper's ILP (section 4.4)
    ILP_MULTISTEP = "ilp-multistep"  # the paper's multi-step ILP
    MEASUREMENT = "measurement"  # a measurement round of Algorithm 1 (section 4.6)
    EQUAL_SPLIT = "equal-split"  # nothing known yet
    CAPACITY_PROPORTIONAL = "capacity-proportional"  # over capacity, or the solver failed
    RELATIVE_CAPACITY = "relative-capacity"  # behind a least-connections LB: learned relative capacities
    KEPT = "kept"  # the last good plan, restated


# the methods by which the solver places weights for latency (not a fallback, a measurement or a restatement)
SOLVER_METHODS = frozenset({PlanMethod.EXACT_GREEDY, PlanMethod.EXACT_DP, PlanMethod.EXACT_BISECTION, PlanMethod.ILP,
                            PlanMethod.ILP_MULTISTEP})
# the methods of a plan placed from learned curves: the solver's, and behind least connections the learned relative
# capacities
LEARNED_METHODS = SOLVER_METHODS | {PlanMethod.RELATIVE_CAPACITY}


class PlanFlag(StrEnum):
    """What makes a plan other than a plain solved plan (``WeightPlan.flags``)."""

    MEASURING = "measuring"  # Algorithm 1 is measuring some DIPs; the weights are its round
    SOLVER_FAILED = "solver-failed"
    OVER_CAPACITY = "over-capacity"  # the DIPs' estimated capacities do not cover the VIP
    SLOW_START = "slow-start"  # a returning or new DIP is ramping up
    NO_LIVE_DIP = "no-live-dip"  # every DIP failed, ejected or drained: the last plan is kept
    ROLLED_BACK = "rolled-back"  # the plan before measured better than the newest: restored
    CHALLENGE = "challenge"  # the capacity-proportional plan, tried against the solved plan in force


E = TypeVar("E", bound=StrEnum)


def _enum_member(kind: type[E], field_name: str, value: object) -> E:
    allowed = [m.value for m in kind]
    if not isinstance(value, str) or value not in allowed:
        raise InvalidInputError(field_name, value, f"must be one of {allowed}")
    return kind(value)


@dataclass(frozen=True)
class WeightPlan:
    """Weights for one VIP's DIPs, and why.

    ``weights`` are floats summing to 1 (checked on construction); a DIP with weight 0
    gets no new traffic. ``predicted_latency`` is the latency (seconds) each DIP's curve
    predicts at its weight. ``method`` names the solver that produced the plan (``exact``,
    ``ilp``, ``ilp-multistep``, ``equal-split``, ``capacity-proportional`` ...) and
    ``reasons`` the events behind it, in the order they were handled. Adapters only read it.
    """

    vip: str
    weights: Mapping[str, float]
    predicted_latency: Mapping[str, float] = field(default_factory=dict)
    objective: float = math.nan
    objective_kind: str = "mean"
    method: PlanMethod = PlanMethod.MANUAL
    solve_seconds: float = 0.0
    version: int = 0
    computed_at: float = 0.0
    reasons: tuple[str, ...] = ()
    flags: tuple[PlanFlag, ...] = ()

    def __post_init__(self) -> None:
        validate_name("vip", self.vip)
        if not self.weights:
            raise InvalidInputError("weights", dict(self.weights), "a plan needs at least one DIP")
        total = 0.0
        for dip, weight in self.weights.items():
            validate_name("dip", dip)
            if not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight < 0:
                raise InvalidInputError("weight", weight, "must be a finite number >= 0", dip=dip)
            total += weight
        if abs(total - 1.0) > 1e-6:
            raise InvalidInputError("weights", dict(self.weights), f"must sum to 1, sum is {total:.9f}")
        object.__setattr__(self, "weights", dict(self.weights))
        object.__setattr__(self, "predicted_latency", dict(self.predicted_latency))
        object.__setattr__(self, "reasons", tuple(self.reasons))
        object.__setattr__(self, "method", _enum_member(PlanMethod, "method", self.method))
        object.__setattr__(self, "flags", tuple(_enum_member(PlanFlag, "flags", f) for f in self.flags))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["reasons"] = list(self.reasons)
        data["method"] = self.method.value
        data["flags"] = [f.value for f in self.flags]
        data["objective"] = None if math.isnan(self.objective) else self.objective
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WeightPlan:
        objective = data.get("objective")
        return cls(
            vip=data["vip"],
            weights={str(k): float(v) for k, v in data["weights"].items()},
            predicted_latency={str(k): float(v) for k, v in data.get("predicted_latency", {}).items()},
            objective=math.nan if objective is None else float(objective),
            objective_kind=str(data.get("objective_kind", "mean")),
            method=data.get("method", PlanMethod.MANUAL),
            solve_seconds=float(data.get("solve_seconds", 0.0)),
            version=int(data.get("version", 0)),
            computed_at=float(data.get("computed_at", 0.0)),
            reasons=tuple(data.get("reasons", ())),
            flags=tuple(data.get("flags", ())),
        )


@dataclass(frozen=True)
class Traffic:
    """What a load balancer counted per DIP so far: cumulative ``counters`` of one ``kind``
    (``requests`` where the LB sees requests, ``bytes`` sent back to clients at layer 4, where it does
    not). Only differences between two reads of the same kind mean anything; a counter that went
    down says the LB restarted its counting (a reload)."""

    kind: str
    counters: Mapping[str, float]


@dataclass(frozen=True)
class ApplyResult:
    """What pushing a plan into a load balancer did (an adapter, or a simulated LB). ``ok`` False
    means nothing changed on the LB and ``reason`` says why; ``lb_weights`` are the integers the
    LB carries; ``warnings`` name best-effort parts that failed (e.g. a state file not written)."""

    ok: bool
    adapter: str
    lb_weights: Mapping[str, int] = field(default_factory=dict)
    quantisation_error: float = 0.0
    seconds: float = 0.0
    reason: str = ""
    warnings: tuple[str, ...] = ()

    def carried(self) -> dict[str, float]:
        """The split the LB carries after this apply (``lb_weights`` normalised; empty if none)."""
        total = sum(self.lb_weights.values())
        return {d: (w / total if total else 0.0) for d, w in self.lb_weights.items()}


@dataclass(frozen=True)
class Measurement:
    """One probe round against one DIP (section 5, KLM): what was sent and what came back.

    Success latencies (mean, p50, p90, p99) are over successful requests only;
    ``failure_latency_mean`` is over failures, kept apart because a fast failure is not
    fast service (ELS blog). ``None`` means "no such request in the round".
    """

    vip: str
    dip: str
    time: float
    weight: float
    sent: int
    successes: int
    errors: int
    timeouts: int
    latency_mean: float | None
    latency_p50: float | None
    latency_p90: float | None
    latency_p99: float | None
    failure_latency_mean: float | None
    worker: str
    latency_std: float | None = None  # sample standard deviation of the successes (the round's own spread)
    share: float | None = None  # the DIP's share of the VIP's requests over the round, from the LB's counters
    lb_timed: int = 0  # how many of ``sent`` are client requests the LB timed, not probes (rounds.with_lb_timings)
    light_latencies: tuple[float, ...] = ()  # light requests that answered (ProbeSpec.light_path), s, sorted
    light_failures: int = 0  # light requests that failed or timed out (not in light_latencies)


    def __post_init__(self) -> None:
        validate_name("vip", self.vip)
        validate_name("dip", self.dip)
        for name in ("sent", "successes", "errors", "timeouts"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise InvalidInputError(name, value, "must be an integer >= 0", dip=self.dip)
        if self.successes + self.errors + self.timeouts != self.sent:
            raise InvalidInputError(
                "sent", self.sent, "must equal successes + errors + timeouts", dip=self.dip
            )
        if self.share is not None and not (math.isfinite(self.share) and 0.0 <= self.share <= 1.0):
            raise InvalidInputError("share", self.share, "must be a fraction in [0, 1]", dip=self.dip)
        if not isinstance(self.lb_timed, int) or not 0 <= self.lb_timed <= self.sent:
            raise InvalidInputError("lb_timed", self.lb_timed, "must be an integer in [0, sent]", dip=self.dip)
        if not isinstance(self.light_failures, int) or self.light_failures < 0:
            raise InvalidInputError("light_failures", self.light_failures, "must be an integer >= 0", dip=self.dip)
        bad = [x for x in self.light_latencies if not (isinstance(x, float | int) and math.isfinite(x) and x >= 0)]
        if bad:
            raise InvalidInputError("light_latencies", bad[0], "must be finite seconds >= 0", dip=self.dip)

    @property
    def failures(self) -> int:
        return self.errors + self.timeouts

    @property
    def success_rate(self) -> float:
        return self.successes / self.sent if self.sent else 0.0

    @property
    def latency_stderr(self) -> float | None:
        """The standard error of ``latency_mean`` from the round's own spread (None below two successes)."""
        if self.latency_std is None or self.successes < 2:
            return None
        return self.latency_std / math.sqrt(self.successes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Measurement:
        def opt(key: str) -> float | None:
            value = data.get(key)
            return None if value is None else float(value)

        return cls(
            vip=str(data["vip"]),
            dip=str(data["dip"]),
            time=float(data["time"]),
            weight=float(data["weight"]),
            sent=int(data["sent"]),
            successes=int(data["successes"]),
            errors=int(data["errors"]),
            timeouts=int(data["timeouts"]),
            latency_mean=opt("latency_mean"),
            latency_p50=opt("latency_p50"),
            latency_p90=opt("latency_p90"),
            latency_p99=opt("latency_p99"),
            failure_latency_mean=opt("failure_latency_mean"),
            worker=str(data.get("worker", "")),
            latency_std=opt("latency_std"),
            share=opt("share"),
            lb_timed=int(data.get("lb_timed", 0)),
            light_latencies=tuple(float(x) for x in data.get("light_latencies", ())),
            light_failures=int(data.get("light_failures", 0)),
        )


@dataclass(frozen=True)
class TimedRequests:
    """What a load balancer timed of one DIP's client requests over a round: the ``successes`` and
    their mean (s) and standard deviation (``None``: not known, a source that keeps a mean only), and
    the ``failures`` it saw (errors the DIP answered or connections it refused). Only a layer-7 LB
    has them: the simulator's times every request, the HAProxy, Nginx and Envoy adapters read them from
    the LB's access logs (docs/probes.md, "What the LB timed")."""

    successes: int
    latency_mean: float | None
    latency_std: float | None = None
    failures: int = 0

    def __post_init__(self) -> None:
        for name in ("successes", "failures"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise InvalidInputError(name, value, "must be an integer >= 0")
        if self.successes and (self.latency_mean is None or not math.isfinite(self.latency_mean)
                               or self.latency_mean < 0):
            raise InvalidInputError("latency_mean", self.latency_mean, "must be a finite number of seconds >= 0")
        if self.latency_std is not None and (not math.isfinite(self.latency_std) or self.latency_std < 0):
            raise InvalidInputError("latency_std", self.latency_std, "must be a finite number of seconds >= 0")


class ProbeSpec(BaseModel):
    """How probes measure a VIP's DIPs (section 5, KLM)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    method: Literal["GET", "HEAD", "POST"] = Field("GET", description="HTTP method of a probe request.")
    path: str = Field("/", description="Request path (and query) sent to each DIP, starting with '/'.")
    headers: dict[str, str] = Field(default_factory=dict, description="Extra request headers.")
    expected_status: int = Field(200, ge=100, le=599, description="Status that counts as success.")
    requests_per_round: int = Field(100, ge=1, le=100_000, description="Requests per DIP per round (N).")
    interval: float = Field(5.0, gt=0, le=3600, description="Seconds between rounds.")
    timeout: float = Field(1.0, gt=0, le=60, description="Seconds before a request counts as a timeout.")
    spread: float = Field(
        0.8, ge=0, le=1,
        description="Share of the interval over which a DIP's requests are spread, one at a random time in each "
                    "equal slot, so that a round sees the DIP's time average; 0 sends them back to back.")
    light_path: str | None = Field(
        None,
        description="Path (and query) of a light request of fixed, tiny work on every DIP (a few percent of a "
                    "request's), sent beside the probes on a connection of its own: its time above its own unloaded "
                    "latency is queueing, so the share of light requests that waited shows how busy a many-worker "
                    "DIP is long before its mean latency rises (docs/probes.md, \"Light probes\"). None: not sent.")
    light_requests_per_round: int = Field(
        50, ge=1, le=100_000, description="Light requests per DIP per round, spread like the probes (with light_path).")

    @field_validator("path", "light_path")
    @classmethod
    def _path(cls, value: str | None) -> str | None:
        if value is not None and not PROBE_PATH.fullmatch(value):
            raise ValueError(
                f"path must start with '/' and hold only printable ASCII without spaces, quotes, '<>\\^`{{|}}' "
                f"(percent-encode the rest): {short_repr(value)}"
            )
        return value

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > MAX_PROBE_HEADERS:
            raise ValueError(f"at most {MAX_PROBE_HEADERS} headers, got {len(value)}")
        for name, text in value.items():
            if not HEADER_NAME.fullmatch(name):
                raise ValueError(
                    f"header name {short_repr(name)} must be an HTTP token (letters, digits, !#$%&'*+-.^_`|~)"
                )
            if name.lower() in FRAMING_HEADERS:
                raise ValueError(f"header {name!r} is set by the probe client itself")
            if not HEADER_VALUE.fullmatch(text):
                raise ValueError(
                    f"header {name!r}: the value must be printable ASCII (and tab), at most 1024 characters"
                )
        return value


class DipConfig(BaseModel):
    """One backend (DIP) of a VIP."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = Field(description="Identifier used in keys, plans and LB configs (letters, digits, . _ -).")
    address: str = Field(description="'host:port' (IPv6 as '[::1]:80') that probes reach directly.")
    min_weight: float | None = Field(None, ge=0, le=1, description="Lower bound on the DIP's weight.")
    max_weight: float | None = Field(None, ge=0, le=1, description="Upper bound on the DIP's weight.")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return validate_name("name", value)

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        parse_address("address", value)
        return value

    @property
    def host_port(self) -> tuple[str, int]:
        return parse_address("address", self.address)


class AdapterSpec(BaseModel):
    """Which of the operator's load balancers takes the VIP's weights, and the VIP's part of its settings.

    The load balancers themselves (adapter, sockets, files, binaries, URLs, secrets) are the
    operator's: they are defined in the configuration file's ``load_balancers`` section and can
    never be written through the admin API. A VIP picks one by name and may set only the fields
    that adapter lets a VIP set (``vip_fields``: the DIP-to-server mapping).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    lb: str | None = Field(
        None, description="Name of a load balancer in the configuration file's load_balancers section. None: plans "
        "are computed and stored but pushed nowhere."
    )
    settings: dict[str, Any] = Field(
        default_factory=dict, description="The VIP's part of the load balancer's settings (only the adapter's "
        "vip_fields, e.g. servers: DIP name -> server)."
    )

    @model_validator(mode="before")
    @classmethod
    def _no_inline_adapter(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "name" in data:
            raise InvalidInputError(
                "name", data["name"], "a VIP cannot name an adapter and its settings: load balancers are defined by "
                "the operator under load_balancers in the configuration file; select one with adapter.lb",
            )
        return data

    @field_validator("lb")
    @classmethod
    def _lb(cls, value: str | None) -> str | None:
        return None if value is None else validate_name("adapter.lb", value)


class VipConfig(BaseModel):
    """A VIP: its DIPs, how they are probed, where weights go, and operator overrides.

    Overrides (``paused``, ``dry_run``, ``pins``, ``drained``) are written by the admin API
    and persisted in the store; the controller honours them on its next step.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = Field(description="VIP identifier (letters, digits, . _ -).")
    dips: tuple[DipConfig, ...] = Field(default=(), description="Backends behind the VIP.")
    probe: ProbeSpec = Field(ProbeSpec(), description="How DIPs are probed.")
    adapter: AdapterSpec = Field(AdapterSpec(), description="Where weights are pushed.")
    objective: Objective = Field("mean", description="Solver objective: mean, sum (paper) or max.")
    balancing: Balancing = Field(
        "weighted", description="What the load balancer does with the weights: 'weighted' (round robin, random, "
        "hashing: a weight is a share of the traffic; the solver's latency-minimising shares) or "
        "'least_connections' (HAProxy leastconn, Nginx least_conn, Envoy LEAST_REQUEST: a weight scales a server's "
        "connection count; the learned relative capacities, the operator's weights where the rounds do not "
        "contradict them).")
    paused: bool = Field(False, description="Controller computes nothing for this VIP.")
    dry_run: bool = Field(False, description="Plans are computed and stored but never pushed.")
    pins: dict[str, float] = Field(default_factory=dict, description="DIP name -> fixed weight.")
    drained: tuple[str, ...] = Field(default=(), description="DIPs held at weight 0.")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return validate_name("name", value)

    @model_validator(mode="after")
    def _consistent(self) -> VipConfig:
        names = [dip.name for dip in self.dips]
        known = set(names)
        if len(known) != len(names):
            duplicates = sorted(name for name, count in Counter(names).items() if count > 1)
            raise ValueError(f"dips: duplicate DIP names {duplicates[:10]}")
        for dip, weight in self.pins.items():
            if dip not in known:
                raise ValueError(f"pins: unknown DIP {dip!r}")
            if not 0 <= weight <= 1 or not math.isfinite(weight):
                raise ValueError(f"pins: weight of {dip!r} must be in [0, 1], got {weight!r}")
        if sum(self.pins.values()) > 1 + WEIGHT_SUM_TOLERANCE:
            raise ValueError(f"pins: pinned weights sum to {sum(self.pins.values())} > 1")
        for dip in self.drained:
            if dip not in known:
                raise ValueError(f"drained: unknown DIP {dip!r}")
        return self

    def dip(self, name: str) -> DipConfig:
        for dip in self.dips:
            if dip.name == name:
                return dip
        raise KeyError(name)
