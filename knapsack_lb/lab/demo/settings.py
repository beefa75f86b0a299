"""Every knob of the demo, with its unit and default (docs/demo.md explains the choices).

The workload models KnapsackLB's layer-4 setting (KnapsackLB paper sections 2.1 and 6.2;
docs/design.md "When weights can beat least-connections"): CPU-bound DIPs (processor
sharing) with relative capacities 1, 1, 0.8, 0.8, 0.6, 0.6 (the paper's 3-DIP pool doubled),
Poisson requests at 70 % of the pool's capacity, carried by long-lived keep-alive client
connections that are replaced at a steady rate, so new weights only reach new connections
(section 4.7, drain time).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from knapsack_lb.errors import InvalidInputError
from knapsack_lb.lab.demo.settle import plan_cycle, settle_window

DEFAULT_CAPACITIES = (1.0, 1.0, 0.8, 0.8, 0.6, 0.6)
LIGHT_WORK = 0.01  # an emulator's GET /light does this share of its mean request's work
LIGHT_PATH = "/light"


@dataclass(frozen=True)
class DemoSettings:
    """One demo run. Times in seconds; rates in requests per second."""

    capacities: tuple[float, ...] = DEFAULT_CAPACITIES  # relative service rate per DIP
    service_time: float = 0.020  # work of one request on a capacity-1 DIP
    distribution: str = "fixed"  # the same computation per request, as the paper's DIPs (section 2.1)
    load: float = 0.70  # offered load as a fraction of the pool's total capacity
    connections: int = 200  # client connections open at any time
    connection_lifetime: float = 6.0  # mean lifetime (uniform in [0.5, 1.5] x this)
    client_timeout: float = 3.0  # a client closes its connection when an answer is this late
    phase_seconds: float = 60.0  # measured length of each phase
    warmup_seconds: float = 5.0  # start of each phase not counted (connections settle)
    learn_min_seconds: float = 30.0  # KnapsackLB learns at least this long before its phase
    learn_max_seconds: float = 300.0  # ... and at most this long (traffic not counted)
    settle_seconds: float = 10.0  # no learned weight moves this long (at least two plan cycles) before counting
    probe_requests: int = 5  # probe requests per DIP per round (sequential, one connection)
    probe_interval: float = 2.0  # seconds between probe rounds
    controller_interval: float = 2.0  # seconds between controller steps
    light_requests: int = 0  # light requests per DIP per round to the emulators' GET /light (0: not sent)
    drain_time: float = 9.0  # controller trusts rounds this long after a weight change: the longest
    # connection lifetime, so old connections have finished (section 4.7)
    seed: int = 1
    quick: bool = False
    extras: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.capacities) < 2 or any(not 0 < c <= 10 for c in self.capacities):
            raise InvalidInputError("capacities", self.capacities, "need at least two values in (0, 10]")
        checks = {
            "service_time": 0.001 <= self.service_time <= 1.0,
            "load": 0.05 <= self.load < 1.0,
            "connections": 1 <= self.connections <= 2000,
            "connection_lifetime": 0.5 <= self.connection_lifetime <= 600,
            "phase_seconds": 5 <= self.phase_seconds <= 3600,
            "warmup_seconds": 0 <= self.warmup_seconds < self.phase_seconds,
            "learn_min_seconds": 0 <= self.learn_min_seconds <= self.learn_max_seconds,
            "learn_max_seconds": 5 <= self.learn_max_seconds <= 3600,
            "settle_seconds": 0 <= self.settle_seconds <= 3600,
            "probe_requests": 1 <= self.probe_requests <= 1000,
            "light_requests": 0 <= self.light_requests <= 1000,
            "probe_interval": 0.2 <= self.probe_interval <= 60,
            "controller_interval": 0.2 <= self.controller_interval <= 60,
            "drain_time": 0 <= self.drain_time <= 600,
            "distribution": self.distribution in ("fixed", "exponential", "lognormal"),
            "client_timeout": 0.1 <= self.client_timeout <= 600,
        }
        for name, ok in checks.items():
            if not ok:
                raise InvalidInputError(name, getattr(self, name), "is out of range (see docs/demo.md)")

    @classmethod
    def quick_preset(cls, **overrides: Any) -> DemoSettings:
        """``--quick``: the same workload, shorter phases and connection lifetimes (under 5 minutes)."""
        base = cls(
            phase_seconds=20.0, warmup_seconds=4.0, connection_lifetime=6.0, drain_time=5.0,
            learn_min_seconds=20.0, learn_max_seconds=140.0, settle_seconds=6.0, quick=True,
        )
        return replace(base, **overrides)

    @property
    def settle_window(self) -> float:
        """How long no learned weight may move before the KnapsackLB phase is counted
        (:mod:`knapsack_lb.lab.demo.settle`)."""
        return settle_window(self.settle_seconds, plan_cycle(drain_time=self.drain_time,
                                                             probe_interval=self.probe_interval,
                                                             controller_interval=self.controller_interval))

    @property
    def names(self) -> list[str]:
        return [f"dip-{i + 1}" for i in range(len(self.capacities))]

    @property
    def total_capacity(self) -> float:
        """Requests per second the whole pool can serve."""
        return sum(self.capacities) / self.service_time

    @property
    def request_rate(self) -> float:
        """Offered load in requests per second."""
        return self.load * self.total_capacity

    @property
    def probe_load_share(self) -> float:
        """Work the probes add, as a fraction of the pool's capacity (light requests at their work)."""
        per_round = self.probe_requests + self.light_requests * LIGHT_WORK
        probe_rate = len(self.capacities) * per_round / self.probe_interval
        return probe_rate / self.total_capacity

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["capacities"] = list(self.capacities)
        data.update(
            request_rate=self.request_rate, total_capacity=self.total_capacity,
            probe_load_share=self.probe_load_share,
            requests_per_connection=self.request_rate / self.connections * self.connection_lifetime,
            connection_replacement_rate=self.connections / self.connection_lifetime,
        )
        return data


def probe_spec(settings: DemoSettings, timeout: float) -> dict[str, Any]:
    """The VIP's ``probe`` section: the demo's probe budget, and its light requests when it sends any."""
    spec: dict[str, Any] = {"path": "/probe", "requests_per_round": settings.probe_requests,
                            "interval": settings.probe_interval, "timeout": timeout}
    if settings.light_requests:
        spec.update(light_path=LIGHT_PATH, light_requests_per_round=settings.light_requests)
    return spec
