"""A fluid model of a VIP's DIPs: the controller's test environment in virtual time.

Each DIP is an M/M/c queue (``servers`` cores, each serving ``service_rate`` requests/s,
FCFS; Erlang C). The VIP receives Poisson traffic at ``total_rate`` requests/s, split by
the weights in effect, so DIP ``d`` sees ``lambda_d = w_d * total_rate``. The model answers
"what would a probe round see at these weights and this load" (:meth:`FluidModel.measure`,
sampling the real sojourn-time distribution of ``probe_requests`` requests, so the noise of
a 100-request average is the real one) and computes the true optimum (:meth:`oracle`).

Run-time changes: ``set_capacity_factor`` (noisy neighbour, vCPU change), ``fail`` /
``restore``, ``set_total_rate`` (traffic), a fast-failing error share per DIP. A new weight
only takes full effect after ``drain_time`` seconds (old connections finish, KnapsackLB
section 4.7): the effective weights move linearly from the old to the new plan over that time.

Overload (``lambda_d >= capacity``) has no steady state: a probe then sees timeouts for the
excess share and latencies near the timeout; aggregate metrics count those requests at the
timeout and report the DIP as overloaded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from knapsack_lb.controller.core import VipController
from knapsack_lb.errors import InvalidInputError
from knapsack_lb.loop import ControlLoop, ExactSink, FunctionSource, TickOutcome, fixed, run_now
from knapsack_lb.model import DipConfig, Measurement, VipConfig
from knapsack_lb.names import validate_name
from knapsack_lb.rounds import RoundSamples, summarise
from knapsack_lb.solver.oracle import erlang_c, mmc_latency


@dataclass
class FluidDip:
    """One DIP: ``servers`` cores at ``service_rate`` requests/s each, scaled by ``capacity_factor``."""

    name: str
    servers: int
    service_rate: float
    vcpus: int = 1
    capacity_factor: float = 1.0
    failed: bool = False
    error_rate: float = 0.0
    failure_latency: float = 0.0005

    def __post_init__(self) -> None:
        validate_name("dip", self.name)
        if self.servers < 1:
            raise InvalidInputError("servers", self.servers, "must be >= 1", dip=self.name)
        if not self.service_rate > 0:
            raise InvalidInputError("service_rate", self.service_rate, "must be > 0", dip=self.name)

    @property
    def rate_per_server(self) -> float:
        return self.service_rate * self.capacity_factor

    @property
    def capacity(self) -> float:
        """Requests/s the DIP can serve (0 when failed)."""
        return 0.0 if self.failed else self.servers * self.rate_per_server

    def _wait(self, rate: float) -> tuple[float, float]:
        """(probability of waiting, rate of the exponential wait) at arrival ``rate``."""
        mu = self.rate_per_server
        return erlang_c(self.servers, rate / mu), self.servers * mu - rate

    def mean_latency(self, rate: float) -> float:
        """Mean sojourn time (s) at arrival ``rate``; ``inf`` at or beyond capacity."""
        if rate >= self.capacity:
            return math.inf
        return mmc_latency(self.servers, self.rate_per_server, rate)

    def exceed(self, rate: float, t: float) -> float:
        """P(sojourn > t) at arrival ``rate`` (1 when overloaded)."""
        if rate >= self.capacity:
            return 1.0
        mu = self.rate_per_server
        wait_prob, theta = self._wait(rate)
        service_only = math.exp(-mu * t)
        if abs(theta - mu) < 1e-9 * mu:
            both = (1 + mu * t) * math.exp(-mu * t)
        else:
            both = (mu * math.exp(-theta * t) - theta * math.exp(-mu * t)) / (mu - theta)
        return (1 - wait_prob) * service_only + wait_prob * both

    def sample(self, rate: float, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` sojourn times (s) of requests arriving at ``rate`` (below capacity)."""
        mu = self.rate_per_server
        wait_prob, theta = self._wait(rate)
        service = rng.exponential(1 / mu, n)
        waits = np.where(rng.random(n) < wait_prob, rng.exponential(1 / max(theta, 1e-12), n), 0.0)
        return np.asarray(service + waits, dtype=np.float64)


@dataclass(frozen=True)
class PlanQuality:
    """True mean and p99 latency (s) of a split, and which DIPs it overloads."""

    mean_latency: float
    p99_latency: float
    overloaded: tuple[str, ...]
    max_utilisation: float


@dataclass(frozen=True)
class OracleResult:
    weights: dict[str, float]
    quality: PlanQuality


@dataclass
class FluidModel:
    """A VIP's DIPs under Poisson traffic; see the module docstring."""

    dips: Sequence[FluidDip]
    total_rate: float
    vip: str = "vip"
    drain_time: float = 0.0
    probe_requests: int = 100
    timeout: float = 1.0
    seed: int = 0
    _rng: np.random.Generator = field(init=False, repr=False)
    _by_name: dict[str, FluidDip] = field(init=False, repr=False)
    _old: dict[str, float] = field(init=False, repr=False)
    _new: dict[str, float] = field(init=False, repr=False)
    _changed_at: float = field(init=False, default=-math.inf, repr=False)

    def __post_init__(self) -> None:
        validate_name("vip", self.vip)
        self._by_name = {d.name: d for d in self.dips}
        if len(self._by_name) != len(self.dips):
            raise InvalidInputError("dips", [d.name for d in self.dips], "DIP names must be unique")
        if not self.total_rate > 0:
            raise InvalidInputError("total_rate", self.total_rate, "must be > 0")
        self._rng = np.random.default_rng(self.seed)
        equal = {d.name: 1 / len(self.dips) for d in self.dips}
        self._old = dict(equal)
        self._new = dict(equal)

    # --- run-time changes -----------------------------------------------------------------
    def dip(self, name: str) -> FluidDip:
        try:
            return self._by_name[name]
        except KeyError:
            raise InvalidInputError("dip", name, "no such DIP in the fluid model") from None

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.dips]

    def set_capacity_factor(self, name: str, factor: float) -> None:
        if not factor > 0:
            raise InvalidInputError("capacity_factor", factor, "must be > 0", dip=name)
        self.dip(name).capacity_factor = factor

    def fail(self, name: str) -> None:
        self.dip(name).failed = True

    def restore(self, name: str) -> None:
        self.dip(name).failed = False

    def set_total_rate(self, rate: float) -> None:
        if not rate > 0:
            raise InvalidInputError("total_rate", rate, "must be > 0")
        self.total_rate = rate

    def set_weights(self, weights: Mapping[str, float], now: float) -> None:
        """The LB starts using ``weights`` at ``now``; they take full effect after ``drain_time``."""
        self._old = self.effective_weights(now)
        total = sum(max(0.0, weights.get(n, 0.0)) for n in self.names)
        if total <= 0:
            raise InvalidInputError("weights", dict(weights), "at least one DIP needs a positive weight")
        self._new = {n: max(0.0, weights.get(n, 0.0)) / total for n in self.names}
        self._changed_at = now

    def effective_weights(self, now: float) -> dict[str, float]:
        if self.drain_time <= 0 or now >= self._changed_at + self.drain_time:
            return dict(self._new)
        progress = max(0.0, (now - self._changed_at) / self.drain_time)
        return {n: self._old[n] + (self._new[n] - self._old[n]) * progress for n in self.names}

    # --- truth ------------------------------------------------------------------------------
    def capacity_share(self, name: str) -> float:
        """The weight at which DIP ``name`` saturates at the current total rate."""
        return self.dip(name).capacity / self.total_rate

    def utilisation(self, weights: Mapping[str, float]) -> dict[str, float]:
        out = {}
        for d in self.dips:
            rate = weights.get(d.name, 0.0) * self.total_rate
            out[d.name] = math.inf if d.capacity <= 0 and rate > 0 else (rate / d.capacity if d.capacity else 0.0)
        return out

    def true_latency(self, name: str, weight: float) -> float:
        return self.dip(name).mean_latency(weight * self.total_rate)

    def quality(self, weights: Mapping[str, float]) -> PlanQuality:
        """Mean and p99 request latency of a split (overloaded DIPs' requests counted at the timeout)."""
        total = sum(weights.get(n, 0.0) for n in self.names)
        shares = {n: weights.get(n, 0.0) / total for n in self.names}
        overloaded = []
        mean = 0.0
        for d in self.dips:
            w = shares[d.name]
            if w <= 0:
                continue
            latency = d.mean_latency(w * self.total_rate)
            if not math.isfinite(latency) or latency > self.timeout:
                overloaded.append(d.name)
                latency = self.timeout
            mean += w * latency

        def exceed(t: float) -> float:
            p = 0.0
            for d in self.dips:
                w = shares[d.name]
                if w > 0:
                    p += w * (1.0 if d.name in overloaded else d.exceed(w * self.total_rate, t))
            return p

        lo, hi = 0.0, self.timeout
        if exceed(hi) > 0.01:
            p99 = self.timeout
        else:
            for _ in range(60):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if exceed(mid) > 0.01 else (lo, mid)
            p99 = hi
        util = self.utilisation(shares)
        return PlanQuality(mean, p99, tuple(overloaded), max(util.values()) if util else 0.0)

    def oracle(self) -> OracleResult:
        """The split minimising the true mean latency (convex: equal marginal cost, by bisection).

        DIP cost ``f_d(w) = w * T_d(w * Lambda)`` is convex for M/M/c; its derivative is the
        marginal latency. For a multiplier ``nu`` each DIP takes the weight where ``f_d' = nu``;
        ``nu`` is bisected until the weights sum to 1.
        """
        live = [d for d in self.dips if not d.failed]
        if sum(d.capacity for d in live) <= self.total_rate:
            raise InvalidInputError("total_rate", self.total_rate, "exceeds the pool's total capacity")

        def marginal(d: FluidDip, w: float) -> float:
            h = 1e-7
            lo = max(0.0, w - h)
            f_hi = (w + h) * d.mean_latency((w + h) * self.total_rate)
            f_lo = lo * d.mean_latency(lo * self.total_rate)
            return (f_hi - f_lo) / (w + h - lo)

        def weight_at(d: FluidDip, nu: float) -> float:
            cap = d.capacity / self.total_rate
            if marginal(d, 0.0) >= nu:
                return 0.0
            lo, hi = 0.0, cap * (1 - 1e-9)
            for _ in range(80):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if marginal(d, mid) < nu else (lo, mid)
            return lo

        nu_lo, nu_hi = 0.0, 1.0
        while sum(weight_at(d, nu_hi) for d in live) < 1:
            nu_hi *= 2
        for _ in range(80):
            nu = (nu_lo + nu_hi) / 2
            if sum(weight_at(d, nu) for d in live) < 1:
                nu_lo = nu
            else:
                nu_hi = nu
        raw = {d.name: weight_at(d, nu_hi) for d in live}
        total = sum(raw.values())
        weights = {n: raw.get(n, 0.0) / total for n in self.names}
        return OracleResult(weights, self.quality(weights))

    # --- what probes see -------------------------------------------------------------------------
    def measure(self, now: float, worker: str = "fluid") -> dict[str, Measurement]:
        """One probe round at ``now`` against every DIP, at the weights in effect then."""
        weights = self.effective_weights(now)
        return {d.name: self._probe(d, weights[d.name], now, worker) for d in self.dips}

    def _probe(self, d: FluidDip, weight: float, now: float, worker: str) -> Measurement:
        """One round of ``probe_requests`` requests at ``weight``, summarised like the live probes'."""
        n = self.probe_requests
        round_ = RoundSamples()
        if d.failed:
            for _ in range(n):
                round_.add_error("refused", d.failure_latency)
            return summarise(round_, vip=self.vip, dip=d.name, time=now, weight=weight, worker=worker)
        rate = weight * self.total_rate
        errors = int(self._rng.binomial(n, d.error_rate)) if d.error_rate > 0 else 0
        if rate >= d.capacity:
            timeouts = max(1, round((n - errors) * (1 - d.capacity / rate)))
            ok = n - errors - timeouts
            samples = self.timeout * (0.5 + 0.5 * self._rng.random(max(ok, 0)))
        else:
            timeouts = 0
            ok = n - errors
            samples = d.sample(rate, ok, self._rng)
            late = samples > self.timeout
            timeouts = int(late.sum())
            samples = samples[~late]
        round_.success_latencies = samples.tolist()
        for _ in range(errors):
            round_.add_error("error", d.failure_latency)
        for _ in range(timeouts):
            round_.add_timeout(self.timeout)
        return summarise(round_, vip=self.vip, dip=d.name, time=now, weight=weight, worker=worker)


@dataclass
class FluidLab:
    """The fluid model as the control loop's source and sink, in virtual time.

    The source is one probe round per tick at the weights in effect (:meth:`FluidModel.measure`);
    the sink is an LB that carries a plan's fractions exactly (the fluid model has no integer
    weights) and can be told to fail (``sink.fail_next``). ``config`` is the VIP as the operator
    set it (pins, drains, pause, dry run); ``remeasure`` requests are taken once, as from the store.
    """

    model: FluidModel
    config: VipConfig
    now: float = 0.0
    remeasure: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.sink = ExactSink(lambda weights: self.model.set_weights(weights, self.now))

    def loop(self, controller: VipController) -> ControlLoop:
        source = FunctionSource(lambda now: self.model.measure(now), lambda: self.config, self._take_remeasure)
        return ControlLoop(controller, source, fixed(self.sink), lambda: self.now)

    def tick(self, loop: ControlLoop, interval: float) -> TickOutcome:
        """Advance virtual time by ``interval`` and tick the loop once."""
        self.now += interval
        return run_now(loop.tick(self.now))

    def _take_remeasure(self) -> frozenset[str]:
        taken, self.remeasure = frozenset(self.remeasure), set()
        return taken


def vip_config(name: str, dips: Sequence[str], **overrides: Any) -> VipConfig:
    """A VIP configuration for lab DIPs (their addresses only need the right shape)."""
    return VipConfig(name=name, dips=tuple(DipConfig(name=d, address=f"127.0.0.1:{10000 + i}")
                                           for i, d in enumerate(dips)), **overrides)
