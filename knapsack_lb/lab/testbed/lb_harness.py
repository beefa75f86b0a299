"""Shared harness for real load balancers: start one, push plans, send traffic, count the split.

KnapsackLB programs weights through the interface a load balancer already has and changes
nothing else (KnapsackLB paper, sections 3.2 and 6.5; Table 6 checks the observed split of
Nginx and DNS against the weights). This module is the one place that knows how to do that
measurement for every LB, so the integration tests and ``klb bench adapters`` use the same
code:

* :class:`LbTestbed` is what a real-LB fixture implements (one module per LB:
  ``lb_haproxy``, ``lb_nginx``, ``lb_envoy``, ``lb_pdns``). It is a context manager that
  starts the real LB on free loopback ports in front of the given backends and stops it on
  exit; it names the adapter and the adapter settings that drive it, and opens *senders*
  that put one request (HTTP) or one query (DNS) through the LB and return the name of the
  backend that served it.
* :func:`measure_split` sends ``n`` requests and counts backends.
* :func:`churn` applies a sequence of plans while bounded, continuous traffic runs, and
  reports failed requests, apply latencies and the time until traffic follows each plan.
* :data:`TESTBEDS` maps LB names to testbed classes (imported lazily, so a missing LB
  module or binary only breaks that LB).

Testbed constructor convention: ``cls(backends, workdir)`` where ``backends`` maps backend
(DIP) name to ``"host:port"`` and ``workdir`` is a private directory for config, pid and log
files. HTTP backends answer with an ``X-Backend: <name>`` header (the emulator in
``knapsack_lb.lab.testbed.emulator`` does).

How it fails: a request that fails after the sender's retries is counted as failed with its
error text; a testbed that cannot start raises from ``__enter__`` (the caller reports it);
every traffic loop stops by itself at its deadline or request cap.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

import httpx

from adapters.base import Adapter, ApplyResult
from knapsack_lb.model import PlanMethod, TimedRequests, WeightPlan
from knapsack_lb.names import validate_name

BACKEND_HEADER = "X-Backend"


class RequestFailed(Exception):
    """One request (or DNS query) through the LB failed after the sender's retries."""


@runtime_checkable
class Sender(Protocol):
    """Puts one request through the LB; returns the name of the backend that served it."""

    def send(self) -> str: ...

    def close(self) -> None: ...


@runtime_checkable
class LbTestbed(Protocol):
    """A real load balancer started in front of given backends (see the module docstring).

    ``lb_name`` is the short name used by ``klb bench adapters --lbs`` (``haproxy``, ``nginx``,
    ``envoy``, ``dns``); ``adapter_name`` the entry point of the adapter that drives it and
    ``adapter_settings`` the settings for that adapter's ``from_config`` (valid once entered).
    ``retries`` is how often a sender retries an idempotent request (0 where the LB must not
    drop any request, e.g. HAProxy; Nginx reloads reset a few keep-alive connections).
    """

    lb_name: str
    adapter_name: str
    retries: int

    @property
    def adapter_settings(self) -> dict[str, Any]: ...

    def traffic_target(self) -> str: ...

    def open_sender(self) -> Sender: ...

    def __enter__(self) -> LbTestbed: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


class HttpSender:
    """HTTP GETs through the LB with httpx; the backend is read from ``X-Backend``.

    ``keep_alive`` reuses one connection (each request is still balanced on its own by an
    L7 LB); otherwise every request opens a fresh connection. ``retries`` re-sends the
    idempotent GET after a transport error or a 5xx (counted in ``retried``).
    """

    def __init__(self, url: str, *, keep_alive: bool = True, retries: int = 0, timeout: float = 5.0) -> None:
        self.url = url
        self.retries = retries
        self.retried = 0
        limits = httpx.Limits(max_keepalive_connections=1 if keep_alive else 0, max_connections=1)
        headers = {} if keep_alive else {"Connection": "close"}
        self._client = httpx.Client(timeout=timeout, limits=limits, headers=headers, trust_env=False)

    def send(self) -> str:
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                self.retried += 1
            try:
                response = self._client.get(self.url)
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            if response.status_code >= 500:
                last = f"HTTP {response.status_code}"
                continue
            backend = response.headers.get(BACKEND_HEADER)
            if response.status_code != 200 or not backend:
                raise RequestFailed(f"HTTP {response.status_code}, {BACKEND_HEADER}={backend!r}")
            return str(backend)
        raise RequestFailed(last)

    def close(self) -> None:
        self._client.close()


@dataclass(frozen=True)
class Served:
    """One request through the LB: when it started and ended (monotonic s), who served it
    (None: failed, ``error`` says why) and how many attempts the sender made."""

    started: float
    finished: float
    backend: str | None
    error: str | None = None
    attempts: int = 1


def measure_split(testbed: LbTestbed, n: int, *, concurrency: int = 2, timeout: float = 60.0) -> dict[str, int]:
    """Send ``n`` requests through ``testbed`` and count which backend served each.

    Failed requests are counted under the key ``"<failed>"``. Bounded: stops after ``n``
    requests or ``timeout`` seconds, whichever first.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1 (got {n})")
    served = run_traffic(testbed, max_requests=n, seconds=timeout, concurrency=concurrency)
    counts: Counter[str] = Counter()
    for record in served:
        counts[record.backend if record.backend is not None else "<failed>"] += 1
    return dict(counts)


def timed_per_dip(
    timings: Callable[[], Mapping[str, TimedRequests] | None], requests: int, *, timeout: float = 10.0
) -> dict[str, TimedRequests]:
    """What an adapter's ``timings()`` reported, pooled per DIP (count, mean, failures; no spread),
    asked every 50 ms until ``requests`` were reported or ``timeout`` seconds passed: the LB's last
    log lines or entries may still be on their way."""
    counts: Counter[str] = Counter()
    totals: dict[str, float] = {}
    failures: Counter[str] = Counter()
    deadline = time.monotonic() + timeout
    while sum(counts.values()) + sum(failures.values()) < requests and time.monotonic() < deadline:
        for dip, timed in (timings() or {}).items():
            counts[dip] += timed.successes
            totals[dip] = totals.get(dip, 0.0) + timed.successes * (timed.latency_mean or 0.0)
            failures[dip] += timed.failures
        time.sleep(0.05)
    return {dip: TimedRequests(counts[dip], totals[dip] / counts[dip] if counts[dip] else None, None, failures[dip])
            for dip in counts | failures}


def split_error(counts: Mapping[str, int], weights: Mapping[str, float]) -> float:
    """Largest absolute difference, in fractions, between observed shares and ``weights``
    (over the backends of either; failures count against the total)."""
    total = sum(counts.values())
    if total == 0:
        return 1.0
    mass = sum(weights.values()) or 1.0
    names = set(weights) | {k for k in counts if k != "<failed>"}
    return max(abs(counts.get(d, 0) / total - weights.get(d, 0.0) / mass) for d in names)


def run_traffic(
    testbed: LbTestbed,
    *,
    max_requests: int,
    seconds: float,
    concurrency: int = 2,
    stop: threading.Event | None = None,
) -> list[Served]:
    """Closed-loop traffic: ``concurrency`` threads each send one request at a time until
    ``max_requests`` were sent in total, ``seconds`` passed or ``stop`` is set."""
    records: list[Served] = []
    lock = threading.Lock()
    budget = [max_requests]
    deadline = time.monotonic() + seconds
    stop = stop or threading.Event()

    def worker() -> None:
        sender = testbed.open_sender()
        try:
            while not stop.is_set() and time.monotonic() < deadline:
                with lock:
                    if budget[0] <= 0:
                        return
                    budget[0] -= 1
                started = time.monotonic()
                retried_before = int(getattr(sender, "retried", 0))
                try:
                    backend: str | None = sender.send()
                    error = None
                except RequestFailed as exc:
                    backend, error = None, str(exc) or "failed"
                attempts = 1 + int(getattr(sender, "retried", 0)) - retried_before
                record = Served(started, time.monotonic(), backend, error, attempts)
                with lock:
                    records.append(record)
        finally:
            sender.close()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, concurrency))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=seconds + 30.0)
    stop.set()
    with lock:
        return sorted(records, key=lambda r: r.started)


@dataclass(frozen=True)
class AppliedPlan:
    """One plan applied during churn: when (monotonic s), how long ``apply`` took, its result."""

    plan: WeightPlan
    started: float
    finished: float
    result: ApplyResult


@dataclass(frozen=True)
class ChurnReport:
    """What happened while plans changed under continuous traffic."""

    requests: int
    failed: int
    retried: int
    failure_samples: tuple[str, ...]
    apply_seconds: tuple[float, ...]
    apply_failures: tuple[str, ...]
    follow_seconds: tuple[float, ...]
    not_followed: int
    duration: float
    applied: tuple[AppliedPlan, ...] = field(default=(), repr=False)
    served: tuple[Served, ...] = field(default=(), repr=False)

    @property
    def failed_fraction(self) -> float:
        return self.failed / self.requests if self.requests else 0.0

    def summary(self) -> dict[str, Any]:
        """The numbers ``klb bench adapters`` prints (seconds)."""
        return {
            "plans": len(self.apply_seconds),
            "requests": self.requests,
            "failed_requests": self.failed,
            "failed_fraction": self.failed_fraction,
            "retried_requests": self.retried,
            "failure_samples": list(self.failure_samples),
            "apply_failures": list(self.apply_failures),
            "apply_seconds_median": _quantile(self.apply_seconds, 0.5),
            "apply_seconds_p99": _quantile(self.apply_seconds, 0.99),
            "follow_seconds_median": _quantile(self.follow_seconds, 0.5),
            "follow_seconds_max": max(self.follow_seconds) if self.follow_seconds else None,
            "one_hot_plans_not_followed": self.not_followed,
            "duration_seconds": self.duration,
        }


def _quantile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank quantile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[rank]


def churn_plans(
    vip: str, backends: Sequence[str], count: int, rng: random.Random, one_hot_every: int = 5
) -> list[WeightPlan]:
    """``count`` plans of random weights (at least 5% each); every ``one_hot_every``-th
    puts all traffic on one backend (in turn), so that the time until traffic follows a plan
    is observable: after such a plan only that backend may answer."""
    validate_name("vip", vip)
    plans: list[WeightPlan] = []
    for i in range(count):
        if one_hot_every and i % one_hot_every == one_hot_every - 1:
            target = backends[(i // one_hot_every) % len(backends)]
            weights = {b: (1.0 if b == target else 0.0) for b in backends}
        else:
            raw = {b: 0.05 + rng.random() for b in backends}
            mass = sum(raw.values())
            weights = {b: w / mass for b, w in raw.items()}
            # make the floats sum to exactly 1 within tolerance
            first = backends[0]
            weights[first] += 1.0 - sum(weights.values())
        plans.append(WeightPlan(vip=vip, weights=weights, version=i + 1, method=PlanMethod.MANUAL))
    return plans


def one_hot_target(plan: WeightPlan) -> str | None:
    """The only backend with a positive weight, if the plan has exactly one."""
    positive = [d for d, w in plan.weights.items() if w > 0]
    return positive[0] if len(positive) == 1 else None


def follow_times(
    applied: Sequence[AppliedPlan], served: Sequence[Served], *, min_confirmations: int = 3
) -> tuple[list[float], int]:
    """Time until traffic follows each one-hot plan (pure function over the records).

    For a plan applied at ``t0`` that sends everything to ``target``, and the next plan at
    ``t1``: the follow time is from ``t0`` until the start of the last request (started in
    ``[t0, t1)``) that another backend served, or until ``apply`` returned if there was none.
    Requests still in flight when the next plan started (``started < t1 <= finished``) are
    left out: the LB may already have routed them by the next plan. A plan counts as not
    followed if fewer than ``min_confirmations`` requests served by the target started after
    that point before ``t1``.
    """
    times: list[float] = []
    not_followed = 0
    for i, item in enumerate(applied):
        target = one_hot_target(item.plan)
        if target is None or not item.result.ok:
            continue
        t0 = item.started
        t1 = applied[i + 1].started if i + 1 < len(applied) else float("inf")
        window = [r for r in served if t0 <= r.started and r.finished < t1 and r.backend is not None]
        wrong = [r.started for r in window if r.backend != target]
        settled = max([item.finished, *wrong])
        confirmations = sum(1 for r in window if r.started > settled and r.backend == target)
        if confirmations < min_confirmations:
            not_followed += 1
            continue
        times.append(settled - t0)
    return times, not_followed


def churn(
    testbed: LbTestbed,
    adapter: Adapter,
    plans: Sequence[WeightPlan],
    traffic_seconds: float,
    *,
    concurrency: int = 2,
    max_requests: int = 200_000,
    settle_seconds: float = 0.3,
) -> ChurnReport:
    """Apply ``plans`` one after another, evenly spread over ``traffic_seconds``, while
    ``concurrency`` client threads send requests continuously through the LB.

    Traffic starts ``settle_seconds`` before the first plan and ends ``settle_seconds`` after
    the last; it is bounded by ``max_requests`` and time. Returns failed requests (after the
    sender's retries), apply latencies, apply failures and follow times (see
    :func:`follow_times`).
    """
    if not plans:
        raise ValueError("churn needs at least one plan")
    interval = traffic_seconds / len(plans)
    stop = threading.Event()
    served_box: list[list[Served]] = []
    total_seconds = traffic_seconds + 2 * settle_seconds + 30.0

    def traffic() -> None:
        served_box.append(
            run_traffic(testbed, max_requests=max_requests, seconds=total_seconds, concurrency=concurrency, stop=stop)
        )

    thread = threading.Thread(target=traffic, daemon=True)
    begin = time.monotonic()
    thread.start()
    applied: list[AppliedPlan] = []
    try:
        time.sleep(settle_seconds)
        for i, plan in enumerate(plans):
            slot = begin + settle_seconds + i * interval
            pause = slot - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            t0 = time.monotonic()
            result = adapter.apply(plan)
            applied.append(AppliedPlan(plan, t0, time.monotonic(), result))
        time.sleep(max(settle_seconds, interval))
    finally:
        stop.set()
        thread.join(timeout=total_seconds + 30.0)
    served = served_box[0] if served_box else []
    failures = [r for r in served if r.backend is None]
    follows, not_followed = follow_times(applied, served)
    return ChurnReport(
        requests=len(served),
        failed=len(failures),
        retried=sum(1 for r in served if r.attempts > 1),
        failure_samples=tuple(sorted({r.error or "failed" for r in failures})[:5]),
        apply_seconds=tuple(a.finished - a.started for a in applied),
        apply_failures=tuple(a.result.reason for a in applied if not a.result.ok),
        follow_seconds=tuple(follows),
        not_followed=not_followed,
        duration=time.monotonic() - begin,
        applied=tuple(applied),
        served=tuple(served),
    )


# --- registry -------------------------------------------------------------------------

#: LB name -> "module:Class" of its testbed; imported only when used.
TESTBEDS: dict[str, str] = {
    "haproxy": "knapsack_lb.lab.testbed.lb_haproxy:HAProxyTestbed",
    "nginx": "knapsack_lb.lab.testbed.lb_nginx:NginxTestbed",
    "envoy": "knapsack_lb.lab.testbed.lb_envoy:EnvoyTestbed",
    "envoy-xds": "knapsack_lb.lab.testbed.lb_envoy:EnvoyXdsTestbed",
    "dns": "knapsack_lb.lab.testbed.lb_pdns:PdnsTestbed",
}


def load_testbed_class(lb: str) -> type[Any]:
    """The testbed class registered for ``lb`` (ImportError/AttributeError if not available)."""
    if lb not in TESTBEDS:
        raise KeyError(f"unknown LB {lb!r}; known: {sorted(TESTBEDS)}")
    module_name, _, attr = TESTBEDS[lb].partition(":")
    module = importlib.import_module(module_name)
    cls: type[Any] = getattr(module, attr)
    return cls


# --- backends --------------------------------------------------------------------------


@contextlib.contextmanager
def emulated_backends(
    names: Sequence[str], workdir: Path, *, service_time: float = 0.0002, workers: int = 16
) -> Iterator[dict[str, str]]:
    """Start one emulator backend per name on free loopback ports (subprocesses, stopped on
    exit); yields name -> ``"127.0.0.1:port"``. Fast backends (``workers`` FCFS workers,
    fixed ``service_time``) so that the LB, not the backend, is what is measured."""
    from knapsack_lb.lab.procs import ManagedProcess, free_listening_port

    workdir.mkdir(parents=True, exist_ok=True)
    procs: list[ManagedProcess] = []
    ports: list[int] = []
    addresses: dict[str, str] = {}
    try:
        for name in names:
            validate_name("backend", name)
            port = free_listening_port(taken=ports)
            ports.append(port)
            argv = [
                sys.executable,
                "-m",
                "knapsack_lb.lab.testbed.emulator",
                "--name",
                name,
                "--port",
                str(port),
                "--mode",
                "fcfs",
                "--workers",
                str(workers),
                "--service-time",
                str(service_time),
                "--distribution",
                "fixed",
            ]
            procs.append(ManagedProcess(argv, log_path=workdir / f"backend-{name}.log").start())
            addresses[name] = f"127.0.0.1:{port}"
        for proc, port in zip(procs, ports, strict=True):
            proc.wait_listening("127.0.0.1", port, timeout=15.0)
        yield addresses
    finally:
        for proc in procs:
            proc.stop()


# --- the benchmark ------------------------------------------------------------------------


def _timed_apply(adapter: Adapter, plan: WeightPlan) -> float:
    """Seconds one ``apply`` takes with no traffic running (RuntimeError if it fails)."""
    started = time.monotonic()
    result = adapter.apply(plan)
    if not result.ok:
        raise RuntimeError(f"apply failed: {result.reason}")
    return time.monotonic() - started


def bench_lb(
    lb: str,
    workdir: Path,
    *,
    requests: int = 3000,
    plans: int = 50,
    churn_seconds: float = 15.0,
    seed: int = 7,
    target: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """One LB's numbers for ``klb bench adapters``: split error at 10/30/60 (default), apply
    latency without traffic (up to 20 plans) and during churn, follow time and failed requests
    during churn. Never raises: a failure is reported in the result under ``error``."""
    from adapters.base import make_adapter

    weights = dict(target or {"b1": 0.1, "b2": 0.3, "b3": 0.6})
    result: dict[str, Any] = {"lb": lb}
    try:
        cls = load_testbed_class(lb)
        with (
            emulated_backends(sorted(weights), workdir / "backends") as backends,
            cls(backends, workdir / lb) as testbed,
        ):
            adapter = make_adapter(testbed.adapter_name, testbed.adapter_settings)
            result["adapter"] = testbed.adapter_name
            plan = WeightPlan(vip="bench", weights=weights, method=PlanMethod.MANUAL)
            applied = adapter.apply(plan)
            if not applied.ok:
                raise RuntimeError(f"apply failed: {applied.reason}")
            result["quantisation_error"] = applied.quantisation_error
            result["lb_weights"] = dict(applied.lb_weights)
            time.sleep(0.2)
            counts = measure_split(testbed, requests)
            result["split_counts"] = counts
            result["split_error"] = split_error(counts, weights)
            sequence = churn_plans("bench", sorted(weights), plans, random.Random(seed))
            idle = [_timed_apply(adapter, plan) for plan in sequence[: min(20, plans)]]
            result["idle_apply_seconds_median"] = _quantile(idle, 0.5)
            result["idle_apply_seconds_p99"] = _quantile(idle, 0.99)
            report = churn(testbed, adapter, sequence, churn_seconds)
            result.update(report.summary())
            result["retries"] = testbed.retries
    except Exception as exc:  # a benchmark reports a broken LB instead of dying
        result["error"] = f"{type(exc).__name__}: {exc}"
    return result
