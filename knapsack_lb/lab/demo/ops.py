"""`klb demo --ops`: day-2 operations on the live testbed, with what each one costs the clients.

An SRE does more than start the controller once: DIPs are added, drained, fail, come back and are
removed; the controller is put in dry run, stopped and restarted. This tour does each of these on
the demo's live testbed (real HAProxy in ``mode http`` with ``balance roundrobin`` and an admin
socket, emulated DIPs of capacities 1, 1, 0.6 and 0.4 doing 10 ms of work, a fifth DIP of capacity
0.6 declared in HAProxy at weight 0 but not yet in the VIP, an open-loop client at 120 req/s with a
3 s timeout) through the admin API, as an operator would, while the client keeps sending.

Each step starts a fresh load-generator process, runs its action ``lead`` seconds in, and records
the client's requests, failures, mean and p99 latency, the load offered to each DIP over every
2-second window as a share of its capacity (above 1: overloaded) and what HAProxy carries (read
through the adapter every 0.25 s). Its check says whether the step did what the operation promises:

* ``baseline`` - HAProxy's own round robin, equal weights (klb not running);
* ``learn-stop`` - klb starts and is stopped a few intervals later, in the middle of learning:
  HAProxy is left on the plan the stop names (``loop.on_stop``), never a measurement step;
* ``learn`` - klb starts again, resuming from Redis: the time to the first solved plan and until
  it settles, and what learning costs (not a step to pass or fail, a number to know);
* ``steady`` - the learned plan;
* ``add`` - the fifth DIP joins the VIP: no failed request, it never exceeds its capacity;
* ``drain`` / ``undrain`` - the drained DIP is at weight 0 in HAProxy within one interval; it
  comes back by slow start;
* ``fail`` / ``recover`` - a DIP's server is killed (its own requests may fail; it is at 0 within
  a few intervals); it is started again and comes back by slow start;
* ``remove`` - a DIP leaves the VIP: at weight 0 in HAProxy within one interval;
* ``dry-run`` / ``dry-run-off`` - plans are computed, never pushed: HAProxy and the curves do not
  move; then pushes resume;
* ``stop`` / ``restart`` - klb is stopped (its SIGTERM path): HAProxy is left on the last solved
  plan and serves on; klb starts again and resumes from Redis with a solved plan.

Bounded: every step has a duration, learning a maximum; the emulators stop by themselves after the
run's budget. The checks' target is zero failed requests outside the killed DIP's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from rich.console import Console
from rich.table import Table

from adapters.base import make_adapter
from adapters.haproxy import parse_server_errors
from knapsack_lb.config import KlbConfig, parse_config
from knapsack_lb.controller.core import is_solved
from knapsack_lb.lab.demo.runner import controller_snapshot, run_loadgen
from knapsack_lb.lab.demo.settings import DemoSettings, probe_spec
from knapsack_lb.lab.demo.settle import SettleWatch
from knapsack_lb.lab.demo.testbed import VIP, DemoTestbed
from knapsack_lb.lab.testbed.lb_haproxy import BACKEND
from knapsack_lb.loop import split_distance
from knapsack_lb.model import PlanMethod, WeightPlan
from knapsack_lb.service.runner import ServiceRunner, api_component, controller_component, open_store, probe_component
from knapsack_lb.store import CONTROLLER_STATUS, LatencyStore

STOP_AFTER_INTERVALS = 3  # klb is stopped this many controller intervals after it started, mid-learning
RECOVERY_SECONDS = 6.0  # a restarted server needs a probe round to be seen answering before it ramps
CHUNK_SECONDS = 10.0  # load-generator runs of a step that may end early (learning)
SLOW_START_FIRST = 0.05  # a returning DIP's first weight may be this small share of the VIP ...
SLOW_START_FIRST_SHARE = 0.5  # ... or at most this fraction of the share it carried before it left
PLAN_HISTORY = 1000  # plans the tour keeps in Redis and in its report (a quick tour stores a few hundred)
FAILED_DIP, DRAINED_DIP, REMOVED_DIP = "dip-3", "dip-2", "dip-4"


@dataclass(frozen=True)
class OpsSettings:
    """The tour's pool, load and timing (seconds, requests per second)."""

    capacities: tuple[float, ...] = (1.0, 1.0, 0.6, 0.4)
    added_capacity: float = 0.6
    service_time: float = 0.010
    request_rate: float = 120.0
    client_timeout: float = 3.0
    connections: int = 32
    step_seconds: float = 30.0
    lead: float = 4.0  # seconds into a step before its action
    learn_max_seconds: float = 240.0
    settle_seconds: float = 20.0
    probe_requests: int = 5  # the probe budget: a physical input (5 per 2 s is 6 % of the 0.4 DIP)
    probe_interval: float = 2.0
    light_requests: int = 0  # light requests per DIP per round to the emulators' GET /light (0: not sent)
    controller_interval: float = 2.0
    drain_time: float = 1.0  # mode http: HAProxy places each request, old connections do not hold the split
    seed: int = 1

    @classmethod
    def quick_preset(cls, **overrides: Any) -> OpsSettings:
        return replace(cls(step_seconds=12.0, learn_max_seconds=90.0, settle_seconds=8.0), **overrides)

    @property
    def added(self) -> str:
        return f"dip-{len(self.capacities) + 1}"

    def demo_settings(self) -> DemoSettings:
        capacities = (*self.capacities, self.added_capacity)
        total = sum(capacities) / self.service_time
        return DemoSettings(capacities=capacities, service_time=self.service_time,
                            load=self.request_rate / total, connections=self.connections,
                            connection_lifetime=5.0, client_timeout=self.client_timeout,
                            probe_requests=self.probe_requests, probe_interval=self.probe_interval,
                            light_requests=self.light_requests,
                            controller_interval=self.controller_interval, drain_time=self.drain_time,
                            settle_seconds=self.settle_seconds, seed=self.seed)


@dataclass
class StepRecord:
    """What one step did to the clients and to HAProxy, and whether its check held."""

    key: str
    action: str
    started: float  # seconds since the tour began
    requests: int = 0
    failed: int = 0
    mean: float | None = None
    p99: float | None = None
    max_utilisation: dict[str, float] = field(default_factory=dict)  # offered load / capacity, 2 s windows
    lb_shares: list[tuple[float, dict[str, float]]] = field(default_factory=list)  # (seconds into the step, split)
    check: str = ""
    passed: bool | None = None  # None: nothing to pass (baseline, learning)
    extra: dict[str, Any] = field(default_factory=dict)


class OpsTour:
    """One tour; ``await run()`` returns its records (see the module docstring)."""

    def __init__(self, settings: OpsSettings, out_dir: Path, console: Console | None = None) -> None:
        self.settings = settings
        self.out_dir = out_dir
        self.console = console or Console()
        self.token = secrets.token_hex(16)
        self.records: list[StepRecord] = []
        self.latency_trace: list[tuple[float, float, int]] = []  # (seconds since start, latency, status)
        self.controller: dict[str, Any] = {}  # what klb did and held at the end (runner.controller_snapshot)
        self.started_at = 0.0  # the tour's start on the wall clock (plans carry wall-clock times)
        self._t0 = 0.0

    # --- the service ------------------------------------------------------------------------
    def klb_config(self, tb: DemoTestbed) -> KlbConfig:
        s = self.settings
        raw: dict[str, Any] = {
            "redis": {"url": tb.redis.url, "namespace": "ops", "plan_history": PLAN_HISTORY},
            "load_balancers": {"haproxy": {"adapter": "haproxy", "settings": tb.lb.adapter_settings}},
            "vips": [{
                "name": VIP, "objective": "mean", "adapter": {"lb": "haproxy"},
                "probe": probe_spec(s.demo_settings(), timeout=2.0),
                "dips": [{"name": n, "address": a} for n, a in tb.backends.items() if n != s.added],
            }],
            "controller": {"loop": {"interval": s.controller_interval, "measurement_max_age": 4 * s.probe_interval},
                           "drain": {"time": s.drain_time}},
            "probes": {"worker_id": "ops-probes"},
            "api": {"host": "127.0.0.1", "port": 0},
            "logging": {"level": "WARNING"},
        }
        return parse_config(raw, source="demo --ops")

    async def _start(self, config: KlbConfig) -> tuple[ServiceRunner, asyncio.Task[int], str]:
        ports: list[int] = []
        runner = ServiceRunner(config, [probe_component(config), controller_component(config),
                                        api_component(config, self.token, ports)])
        task = asyncio.create_task(runner.run(), name="klb-service")
        for _ in range(200):
            if ports or task.done():
                break
            await asyncio.sleep(0.05)
        if not ports:
            raise RuntimeError("the admin API did not come up")
        return runner, task, f"http://127.0.0.1:{ports[0]}"

    # --- the tour ---------------------------------------------------------------------------
    async def run(self) -> list[StepRecord]:
        s = self.settings
        demo = s.demo_settings()
        budget = s.learn_max_seconds + 15 * (s.step_seconds + 10.0) + 120.0
        workdir = self.out_dir / "run"
        with DemoTestbed(demo, workdir, max_seconds=budget) as tb:
            await asyncio.to_thread(tb.switch, "roundrobin", "http")
            await asyncio.to_thread(tb.set_weights, {n: (0 if n == s.added else 100) for n in tb.backends})
            config = self.klb_config(tb)
            store = open_store(config.redis)
            reader = make_adapter("haproxy", tb.lb.adapter_settings)
            self._t0, self.started_at = time.monotonic(), time.time()
            service: dict[str, Any] = {}
            try:
                await self._steps(tb, config, store, reader, service)
            finally:
                if "runner" in service:
                    service["runner"].request_stop("tour finished")
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(service["task"], timeout=20.0)
                with contextlib.suppress(Exception):
                    self.controller = await controller_snapshot(store, VIP, PLAN_HISTORY)
                await store.close()
        return self.records

    async def _steps(self, tb: DemoTestbed, config: KlbConfig, store: LatencyStore, reader: Any,
                     service: dict[str, Any]) -> None:
        s = self.settings
        interval = s.controller_interval

        def api(method: str, path: str, **kwargs: Any) -> Callable[[], Awaitable[None]]:
            async def call() -> None:
                async with httpx.AsyncClient(base_url=service["url"], timeout=10.0,
                                             headers={"Authorization": f"Bearer {self.token}"}) as client:
                    response = await client.request(method, f"/api/v1/vips/{VIP}{path}", **kwargs)
                    response.raise_for_status()
            return call

        async def start() -> None:
            service["runner"], service["task"], service["url"] = await self._start(config)

        async def stop() -> None:
            service["runner"].request_stop("operator stops klb")
            await asyncio.wait_for(service["task"], timeout=30.0)

        await self._step(tb, store, reader, "baseline", "HAProxy roundrobin, equal weights; klb not running", None)

        async def start_then_stop() -> None:
            await start()
            await asyncio.sleep(STOP_AFTER_INTERVALS * interval)
            await stop()

        stopped_after = STOP_AFTER_INTERVALS * interval
        record = await self._step(tb, store, reader, "learn-stop", f"klb starts and is stopped {stopped_after:g} s in",
                                  start_then_stop)
        self._judge_stop(record, await store.current_plan(VIP))
        await self._learn(tb, store, reader, start)
        await self._step(tb, store, reader, "steady", "the learned plan", None)

        record = await self._step(tb, store, reader, "add", f"POST /dips {s.added} (capacity {s.added_capacity:g})",
                                  api("POST", "/dips", json={"name": s.added, "address": tb.backends[s.added]}))
        peak = record.max_utilisation.get(s.added, 0.0)
        self._judge(record, record.failed == 0 and peak < 1.0 and self._share_after(record, s.added) > 0,
                    f"{record.failed} failed; {s.added} offered at most {peak:.0%} of its capacity, carries traffic")

        before_drain = self._share_after(record, DRAINED_DIP)
        record = await self._step(tb, store, reader, "drain", f"PUT /dips/{DRAINED_DIP}/drain",
                                  api("PUT", f"/dips/{DRAINED_DIP}/drain"))
        took = self._time_to_zero(record, DRAINED_DIP)
        self._judge(record, record.failed == 0 and took is not None and took <= interval + 1.0,
                    f"{DRAINED_DIP} at weight 0 in HAProxy after {_seconds(took)} (one interval: {interval:g} s); "
                    f"{record.failed} failed")

        record = await self._step(tb, store, reader, "undrain", f"DELETE /dips/{DRAINED_DIP}/drain",
                                  api("DELETE", f"/dips/{DRAINED_DIP}/drain"))
        first = self._first_nonzero(record, DRAINED_DIP)
        # slow start: it comes back at a fraction of its share, not at it (when the first new plan lands
        # depends on the push cadence, so the ramp may be a few intervals in)
        ramped = first is not None and first <= max(SLOW_START_FIRST, SLOW_START_FIRST_SHARE * before_drain)
        self._judge(record, record.failed == 0 and ramped,
                    f"{DRAINED_DIP} back from {first if first is None else round(first, 3)} (slow start; it carried "
                    f"{before_drain:.3f} before the drain), ends at {self._share_after(record, DRAINED_DIP):.3f}; "
                    f"{record.failed} failed")

        async def kill() -> None:
            await asyncio.to_thread(tb.kill_backend, FAILED_DIP)

        record = await self._step(tb, store, reader, "fail", f"kill {FAILED_DIP}'s server", kill)
        took = self._time_to_zero(record, FAILED_DIP)
        self._judge(record, took is not None, f"{FAILED_DIP} at weight 0 after {_seconds(took)}; {record.failed} "
                    f"failed (its own requests)")

        async def revive() -> None:
            await asyncio.to_thread(tb.restart_backend, FAILED_DIP)

        record = await self._step(tb, store, reader, "recover", f"start {FAILED_DIP}'s server again", revive,
                                  duration=s.step_seconds + RECOVERY_SECONDS)
        self._judge(record, record.failed == 0 and self._share_after(record, FAILED_DIP) > 0,
                    f"{FAILED_DIP} carries {self._share_after(record, FAILED_DIP):.3f} again; {record.failed} failed")

        record = await self._step(tb, store, reader, "remove", f"DELETE /dips/{REMOVED_DIP}",
                                  api("DELETE", f"/dips/{REMOVED_DIP}"))
        took = self._time_to_zero(record, REMOVED_DIP)
        self._judge(record, record.failed == 0 and took is not None and took <= interval + 1.0,
                    f"{REMOVED_DIP} at weight 0 in HAProxy after {_seconds(took)}; {record.failed} failed")

        dry_run_on = api("PUT", "/dry-run", json={"enabled": True})
        curves: dict[str, dict[str, Any]] = {}

        async def enter_dry_run() -> None:
            await dry_run_on()
            await asyncio.sleep(interval)  # a step already under way when the flag changed may still apply
            curves["before"] = _curve_params(await store.curves(VIP))

        record = await self._step(tb, store, reader, "dry-run", "PUT /dry-run on", enter_dry_run)
        curves_before, curves_after = curves.get("before"), _curve_params(await store.curves(VIP))
        since = record.extra.get("action_at", 0.0) + interval
        shares = [split for t, split in record.lb_shares if t >= since]
        moved = max((split_distance(shares[0], split) for split in shares), default=1.0)
        self._judge(record, record.failed == 0 and moved < 0.01 and curves_after == curves_before,
                    f"HAProxy moved {moved:.3f}; curves {'unchanged' if curves_after == curves_before else 'CHANGED'}; "
                    f"{record.failed} failed")

        record = await self._step(tb, store, reader, "dry-run-off", "PUT /dry-run off",
                                  api("PUT", "/dry-run", json={"enabled": False}))
        self._judge(record, record.failed == 0, f"{record.failed} failed")

        record = await self._step(tb, store, reader, "stop", "stop klb (SIGTERM path)", stop)
        plan = await store.current_plan(VIP)
        self._judge_stop(record, plan)
        version = plan.version if plan is not None else 0

        restarted_at = time.time()
        record = await self._step(tb, store, reader, "restart", "start klb again", start)
        plan = await store.current_plan(VIP)
        # the restarted klb steps the VIP from its stored state: a new plan only when the rounds since
        # change it, else the solved plan in force stays (nothing is re-learned either way)
        stepping = any(VIP in status.get("vips", ()) and float(status.get("time", 0.0)) >= restarted_at
                       for status in (await store.statuses(CONTROLLER_STATUS)).values())
        resumed = plan is not None and is_solved(plan) and (plan.version > version or stepping)
        self._judge(record, record.failed == 0 and resumed,
                    f"resumed from Redis: plan v{plan.version if plan else '-'} "
                    f"({'solved' if plan is not None and is_solved(plan) else 'not solved'}), klb "
                    f"{'stepping the VIP' if stepping else 'not seen stepping the VIP'}; {record.failed} failed")

    async def _learn(self, tb: DemoTestbed, store: LatencyStore, reader: Any,
                     start: Callable[[], Awaitable[None]]) -> None:
        """klb starts on the running pool; the step ends once a solved plan has moved no weight for the
        settle window (:mod:`knapsack_lb.lab.demo.settle`; at most ``learn_max_seconds``)."""
        s = self.settings
        watch = SettleWatch(s.demo_settings().settle_window)
        state: dict[str, Any] = {"started": None}

        async def watch_plans() -> None:
            await start()
            state["started"] = time.monotonic()
            while True:
                watch.observe(await store.current_plan(VIP), time.monotonic())
                await asyncio.sleep(0.5)

        async def settled() -> bool:
            # the watcher's last poll may be half a second old: a plan stored since then is in force
            return watch.settled(time.monotonic()) and watch.confirm(await store.current_plan(VIP), time.monotonic())

        record = await self._step(tb, store, reader, "learn", "klb starts on the running pool", watch_plans,
                                  duration=s.learn_max_seconds, stop_when=settled)
        started = state["started"]
        solved = None if watch.solved_at is None or started is None else watch.solved_at - started
        settled_after = None if watch.changed_at is None or started is None else watch.changed_at - started
        record.extra.update(solved_after=solved, settled_after=settled_after)
        record.check = (f"first solved plan after {_seconds(solved)}, settled after {_seconds(settled_after)}; "
                        f"learning cost {record.failed} failed, p99 {_ms(record.p99)}")

    async def _step(self, tb: DemoTestbed, store: LatencyStore, reader: Any, key: str, action: str,
                    do: Callable[[], Awaitable[None]] | None, *, duration: float | None = None,
                    stop_when: Callable[[], Awaitable[bool]] | None = None) -> StepRecord:
        s = self.settings
        duration = duration or s.step_seconds
        record = StepRecord(key, action, time.monotonic() - self._t0)
        names = list(tb.backends)
        busy: dict[str, float] = {}
        started = time.monotonic()

        async def monitor() -> None:
            last_stats = 0.0
            while True:
                now = time.monotonic()
                split = await asyncio.to_thread(reader.read)
                if split:
                    record.lb_shares.append((now - started, {n: split.get(n, 0.0) for n in names}))
                if now - last_stats >= 2.0:
                    stats = await asyncio.to_thread(_offered_work, tb, names)
                    if last_stats:
                        for name, seconds in stats.items():
                            if name in busy and seconds >= busy[name]:
                                utilisation = (seconds - busy[name]) / (now - last_stats)
                                record.max_utilisation[name] = max(record.max_utilisation.get(name, 0.0), utilisation)
                    busy.clear()
                    busy.update(stats)
                    last_stats = now
                await asyncio.sleep(0.25)

        async def act() -> None:
            if do is not None:
                await asyncio.sleep(s.lead)
                record.extra["action_at"] = time.monotonic() - started
                await do()

        watcher = asyncio.create_task(monitor())
        action_task = asyncio.create_task(act())
        out = self.out_dir / "run" / f"ops-{key}.json"
        self.console.print(f"[bold]{key}[/bold]: {action}", highlight=False)
        samples: dict[str, Any] = {"latency": [], "status": [], "arrival": [], "errors": 0, "timeouts": 0}
        errors_before = await asyncio.to_thread(_haproxy_errors, tb)
        try:
            while (elapsed := time.monotonic() - started) < duration - 0.5:
                # with stop_when, the load runs in chunks so that every chunk's samples are kept
                chunk = min(CHUNK_SECONDS, duration - elapsed) if stop_when is not None else duration - elapsed
                part = await run_loadgen(tb, s.demo_settings(), chunk, 0.0, s.seed * 1000 + len(self.records),
                                         out, lambda line: None)
                assert part is not None
                for key in ("latency", "status"):
                    samples[key] += part[key]
                samples["arrival"] += [elapsed + a for a in part["arrival"]]
                samples["errors"] += int(part.get("errors", 0))
                samples["timeouts"] += int(part.get("timeouts", 0))
                if stop_when is not None and await stop_when():
                    break
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        if not action_task.done() and stop_when is None:
            await action_task
        elif not action_task.done():
            action_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await action_task
        elif action_task.exception() is not None and not isinstance(action_task.exception(), asyncio.CancelledError):
            raise action_task.exception()  # type: ignore[misc]
        self._measure(record, samples)
        record.extra["haproxy_errors"] = _counter_growth(errors_before, await asyncio.to_thread(_haproxy_errors, tb))
        self.records.append(record)
        return record

    def _measure(self, record: StepRecord, samples: dict[str, Any]) -> None:
        latency = np.asarray(samples.get("latency", []), dtype=float)
        status = np.asarray(samples.get("status", []), dtype=int)
        ok = status == 200
        record.requests = len(latency) + int(samples.get("errors", 0))
        record.failed = int((~ok).sum()) + int(samples.get("errors", 0))
        codes = [int(c) for c in status[~ok]]
        record.extra["failures"] = {"timed out": int(samples.get("timeouts", 0)),
                                    "unanswered": int(samples.get("errors", 0)) - int(samples.get("timeouts", 0)),
                                    **{f"HTTP {c}": codes.count(c) for c in sorted(set(codes))}}
        if ok.any():
            record.mean = float(latency[ok].mean())
            record.p99 = float(np.percentile(latency[ok], 99))
        for arrival, value, code in zip(samples.get("arrival", []), latency, status, strict=False):
            self.latency_trace.append((record.started + float(arrival), float(value), int(code)))

    # --- checks -------------------------------------------------------------------------------
    @staticmethod
    def _judge(record: StepRecord, passed: bool, check: str) -> None:
        """The verdict, and what the clients and HAProxy saw go wrong when anything did."""
        record.passed, record.check = bool(passed), check + _what_failed(record)

    @staticmethod
    def _judge_stop(record: StepRecord, plan: WeightPlan | None) -> None:
        """After a stop, HAProxy carries the plan the controller left (a solved plan, or a spread of
        the traffic when nothing was solved yet: never a measurement step) and serves on."""
        left = record.lb_shares[-1][1] if record.lb_shares else {}
        distance = split_distance(left, plan.weights) if plan is not None else 1.0
        safe = plan is not None and distance < 0.01 and (
            is_solved(plan) or plan.method in (PlanMethod.EQUAL_SPLIT, PlanMethod.CAPACITY_PROPORTIONAL))
        OpsTour._judge(record, record.failed == 0 and safe,
                       f"HAProxy left on plan v{plan.version if plan else '-'} ({plan.method if plan else '-'}, "
                       f"{distance:.3f} from it); {record.failed} failed")

    @staticmethod
    def _time_to_zero(record: StepRecord, name: str) -> float | None:
        """Seconds from the step's action until HAProxy carried ``name`` at weight 0 for good."""
        at = record.extra.get("action_at", 0.0)
        zero_since = None
        for t, split in record.lb_shares:
            if t < at:
                continue
            at_zero = split.get(name, 0.0) == 0.0
            zero_since = (zero_since if zero_since is not None else t) if at_zero else None
        return None if zero_since is None else max(0.0, zero_since - at)

    @staticmethod
    def _first_nonzero(record: StepRecord, name: str) -> float | None:
        at = record.extra.get("action_at", 0.0)
        return next((split[name] for t, split in record.lb_shares if t >= at and split.get(name, 0.0) > 0), None)

    @staticmethod
    def _share_after(record: StepRecord, name: str) -> float:
        return record.lb_shares[-1][1].get(name, 0.0) if record.lb_shares else 0.0


def _haproxy_errors(tb: DemoTestbed) -> dict[str, dict[str, int]]:
    """HAProxy's error counters per server now (empty when the admin socket does not answer)."""
    with contextlib.suppress(OSError, ValueError):
        return parse_server_errors(tb.lb.admin_command(f"show stat {BACKEND} 4 -1"), BACKEND)
    return {}


def _counter_growth(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Counters that grew between two readings, per server (a reload restarts them: then the new value)."""
    grown: dict[str, dict[str, int]] = {}
    for server, counters in after.items():
        old = before.get(server, {})
        for name, value in counters.items():
            delta = value - old.get(name, 0) if value >= old.get(name, 0) else value
            if delta > 0:
                grown.setdefault(server, {})[name] = delta
    return grown


def _what_failed(record: StepRecord) -> str:
    """``; failures: 7 timed out; HAProxy dip-3: wretr 3, wredis 3`` - or nothing when all went well."""
    parts = [f"{n} {kind}" for kind, n in record.extra.get("failures", {}).items() if n]
    parts += [f"HAProxy {server}: " + ", ".join(f"{c} {n}" for c, n in counters.items())
              for server, counters in record.extra.get("haproxy_errors", {}).items()]
    return "; failures: " + "; ".join(parts) if parts else ""


def _offered_work(tb: DemoTestbed, names: list[str]) -> dict[str, float]:
    """Seconds of work offered to each live emulator so far: requests that arrived times the work
    of one at its capacity (a dead one is left out). Unlike busy time, which a server can never
    exceed, offered work per second is above 1 when a DIP is sent more than it can serve."""
    offered = {}
    for name in names:
        with contextlib.suppress(OSError, ValueError):
            stats = tb.stats_of(name)
            offered[name] = float(stats["requests"]) * float(stats["service_time"]) / float(stats["capacity"])
    return offered


def _curve_params(records: Any) -> dict[str, Any]:
    return {name: json.dumps(record.curve, sort_keys=True) for name, record in records.items()}


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms"


# --- report -------------------------------------------------------------------------------------


def ops_table(records: list[StepRecord]) -> Table:
    table = Table(title="klb demo --ops: day-2 operations under load")
    for column in ("step", "action", "requests", "failed", "mean", "p99", "check", "result"):
        table.add_column(column, justify="right" if column in ("requests", "failed", "mean", "p99") else "left")
    for r in records:
        result = "-" if r.passed is None else ("[green]ok[/green]" if r.passed else "[red]FAIL[/red]")
        table.add_row(r.key, r.action, str(r.requests), str(r.failed), _ms(r.mean), _ms(r.p99), r.check, result)
    return table


def plot_ops(records: list[StepRecord], trace: list[tuple[float, float, int]], path: Path) -> Path:
    """Client latency over the tour (1-second means and p99, failures marked) with the steps shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(13, 5))
    if trace:
        data = np.asarray(trace, dtype=float)
        seconds = np.floor(data[:, 0]).astype(int)
        ok = data[:, 2] == 200
        bins = np.unique(seconds)
        means = [data[(seconds == b) & ok, 1].mean() * 1000 if ((seconds == b) & ok).any() else np.nan for b in bins]
        p99 = [np.percentile(data[(seconds == b) & ok, 1], 99) * 1000 if ((seconds == b) & ok).any() else np.nan
               for b in bins]
        ax.plot(bins, means, lw=1.2, label="mean latency (1 s)")
        ax.plot(bins, p99, lw=0.8, alpha=0.6, label="p99 latency (1 s)")
        failed = data[~ok]
        if len(failed):
            ax.scatter(failed[:, 0], np.full(len(failed), 1.0), marker="x", color="red", s=12, label="failed request")
    last = max((t for t, _, _ in trace), default=0.0)
    for i, r in enumerate(records):
        end = records[i + 1].started if i + 1 < len(records) else max(last, r.started + 1)
        ax.axvspan(r.started, end, color="#eee" if i % 2 else "#f8f8f8", zorder=0)
        colour = "black" if r.passed is None else ("green" if r.passed else "red")
        ax.text(r.started + 0.5, 0.98, r.key, transform=ax.get_xaxis_transform(), va="top", fontsize=8, color=colour)
    ax.set_yscale("log")
    ax.set_xlabel("seconds since the tour began")
    ax.set_ylabel("client latency (ms)")
    ax.set_title("knapsack-lb day-2 operations under load (HAProxy mode http, 120 req/s)")
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_ops(settings: OpsSettings, out_dir: Path, console: Console | None = None) -> dict[str, Any]:
    """Run the tour; write OUT/ops-report.json and OUT/ops.png; return the report."""
    console = console or Console()
    out_dir.mkdir(parents=True, exist_ok=True)
    tour = OpsTour(settings, out_dir, console)
    records = asyncio.run(tour.run())
    console.print(ops_table(records))
    report = {"settings": asdict(settings), "steps": [asdict(r) for r in records],
              "passed": all(r.passed is not False for r in records), "started_at": tour.started_at, **tour.controller}
    (out_dir / "ops-report.json").write_text(json.dumps(report, indent=1, default=str))
    plot = plot_ops(records, tour.latency_trace, out_dir / "ops.png")
    console.print(f"wrote {out_dir / 'ops-report.json'} and {plot}", highlight=False)
    return report
