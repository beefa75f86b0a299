"""Drives the demo: testbed up, service (probes + controller + API) in-process, the phases, the report.

The service is the project's own runner (:class:`knapsack_lb.service.runner.ServiceRunner`) with the
configuration :meth:`DemoTestbed.klb_config` generates. The VIP starts *paused* (the controller
computes and pushes nothing) so the two baseline phases run HAProxy's own algorithms with equal
weights while the probes already measure (the same probe load in every phase). For KnapsackLB
the runner unpauses the VIP: the controller learns during a learning period whose traffic is
not counted (solved plans from the first rounds on, until they stop moving for the settle window),
and keeps running during the counted phase. For the HTTP phase the VIP
is paused again so the weights stay at the learned plan.

Every phase starts a fresh load-generator process (fresh connections placed by that phase's
algorithm), counts only after ``warmup_seconds``, and reads the emulators' busy time over the
counted window. Bounded: every phase, the learning period and the load generator have a
duration; the emulators stop by themselves after the run's total budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from adapters.base import make_adapter
from knapsack_lb.lab.demo.live import LiveView
from knapsack_lb.lab.demo.phases import PHASES, Phase
from knapsack_lb.lab.demo.report import (
    build_report,
    comparison_table,
    listed,
    phase_metrics,
    plot_report,
    summary_lines,
    write_report,
)
from knapsack_lb.lab.demo.settings import DemoSettings
from knapsack_lb.lab.demo.settle import SettleWatch
from knapsack_lb.lab.demo.testbed import VIP, DemoTestbed
from knapsack_lb.model import WeightPlan
from knapsack_lb.service.runner import ServiceRunner, api_component, controller_component, open_store, probe_component
from knapsack_lb.store import LatencyStore

log = logging.getLogger(__name__)

ProgressFn = Callable[[dict[str, Any]], None]


class DemoAborted(RuntimeError):
    """The service stopped (a signal or a crash) before the demo finished."""


def total_budget(settings: DemoSettings) -> float:
    """Upper bound of a run's length in seconds (the emulators' own stop time)."""
    per_phase = settings.phase_seconds + settings.warmup_seconds + 15.0
    return 4 * per_phase + settings.learn_max_seconds + 120.0


async def run_loadgen(tb: DemoTestbed, settings: DemoSettings, duration: float, count_after: float, seed: int,
                      out: Path, on_progress: ProgressFn, stop_when: Callable[[], bool] | None = None,
                      ) -> dict[str, Any] | None:
    """One load-generator process; returns its samples, or None when ``stop_when`` ended it early."""
    argv = [sys.executable, "-m", "knapsack_lb.lab.demo.loadgen", "--port", str(tb.vip_port),
            "--rate", f"{settings.request_rate:.6f}", "--connections", str(settings.connections),
            "--lifetime", str(settings.connection_lifetime), "--duration", str(duration),
            "--count-after", str(count_after), "--seed", str(seed), "--timeout", str(settings.client_timeout),
            "--progress", "1.0", "--out", str(out)]
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    stopped = False
    try:
        assert proc.stdout is not None
        async for raw in proc.stdout:
            with contextlib.suppress(ValueError):
                line = json.loads(raw)
                if "t" in line:
                    on_progress(line)
            if stop_when is not None and stop_when():
                stopped = True
                break
    finally:
        if proc.returncode is None and stopped:
            proc.terminate()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(proc.wait(), timeout=duration + 30.0)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    if stopped:
        return None
    if proc.returncode != 0:
        err = b"" if proc.stderr is None else await proc.stderr.read()
        raise RuntimeError(f"load generator failed ({proc.returncode}): {err.decode(errors='replace')[-2000:]}")
    data: dict[str, Any] = json.loads(out.read_text())
    return data


async def controller_snapshot(store: LatencyStore, vip: str, plans: int) -> dict[str, Any]:
    """What the controller did and holds: its last ``plans`` plans (oldest first, with their reasons),
    its stored state and its curves."""
    history = await store.plan_history(vip, limit=plans)
    return {
        "plans": [{"version": p.version, "computed_at": p.computed_at, "weights": dict(p.weights),
                   "flags": list(p.flags), "method": p.method, "reasons": list(p.reasons)} for p in history],
        "state": await store.controller_state(vip),
        "curves": {name: repr(record) for name, record in (await store.curves(vip)).items()},
    }


async def set_paused(store: LatencyStore, paused: bool) -> None:
    vip = await store.get_vip(VIP)
    if vip is None:
        raise DemoAborted(f"VIP {VIP!r} is not in the store")
    await store.put_vip(vip.model_copy(update={"paused": paused}))


class DemoRun:
    """One demo run (see the module docstring); ``await run()`` returns the report."""

    def __init__(self, settings: DemoSettings, out_dir: Path, console: Console | None = None) -> None:
        self.settings = settings
        self.out_dir = out_dir
        self.console = console or Console()
        self.phases: dict[str, dict[str, Any]] = {}
        self.latencies: dict[str, list[float]] = {}
        self.learned: dict[str, float] = {}
        self.learning: dict[str, Any] = {}
        self.api_url = ""
        self.final_weights: dict[str, dict[str, float]] = {}

    async def run(self, phases: tuple[Phase, ...] = PHASES) -> dict[str, Any]:
        s = self.settings
        workdir = self.out_dir / "run"
        with DemoTestbed(s, workdir, max_seconds=total_budget(s)) as tb:
            config = tb.klb_config()
            ports: list[int] = []
            runner = ServiceRunner(config, [probe_component(config), controller_component(config),
                                            api_component(config, None, ports)])
            service = asyncio.create_task(runner.run(), name="klb-service")
            store = open_store(config.redis)
            adapter = make_adapter("haproxy", tb.lb.adapter_settings)
            try:
                for _ in range(100):
                    if ports or service.done():
                        break
                    await asyncio.sleep(0.05)
                self.api_url = f"http://127.0.0.1:{ports[0]}/" if ports else ""
                self.console.print(
                    f"testbed up: {len(tb.backends)} DIPs (capacities {', '.join(f'{c:g}' for c in s.capacities)}), "
                    f"HAProxy mode tcp on 127.0.0.1:{tb.lb.port}, Redis {tb.redis.url}, "
                    f"admin API {self.api_url or '(not up)'} (dashboard {self.api_url}dashboard)", highlight=False)
                self.console.print(
                    f"load: {s.request_rate:.0f} req/s Poisson ({s.load:.0%} of capacity) over {s.connections} "
                    f"keep-alive connections (lifetime ~{s.connection_lifetime:g} s, "
                    f"{s.connections / s.connection_lifetime:.0f} new connections/s); probes: {s.probe_requests} "
                    f"requests per DIP every {s.probe_interval:g} s ({s.probe_load_share:.1%} extra load)",
                    highlight=False)
                with LiveView(self.console, s.names) as view:
                    for index, phase in enumerate(phases):
                        if service.done() or runner.stop.is_set():
                            raise DemoAborted("the service stopped")
                        await self._phase(index, phase, tb, store, adapter, view, service, runner)
            finally:
                with contextlib.suppress(Exception):
                    await self._dump_controller(store, workdir / "controller.json")
                runner.request_stop("demo finished")
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(service, timeout=20.0)
                await store.close()
        report = build_report(s.to_dict(), self.phases, self.learned, self.learning)
        report["phase_descriptions"] = {p.key: p.description for p in phases}
        report["api_url"] = self.api_url
        return report

    async def _dump_controller(self, store: LatencyStore, path: Path) -> None:
        """Plan history, controller state and curves, for a look at what the controller did."""
        path.write_text(json.dumps(await controller_snapshot(store, VIP, 500), indent=1, default=str))

    async def _phase(self, index: int, phase: Phase, tb: DemoTestbed, store: LatencyStore, adapter: Any,
                     view: LiveView, service: asyncio.Task[int], runner: ServiceRunner) -> None:
        s = self.settings
        await asyncio.to_thread(tb.switch, phase.balance, phase.mode)
        if phase.weights == "equal":
            await asyncio.to_thread(tb.set_weights, {n: 100 for n in s.names})
        elif phase.weights == "controller":
            await set_paused(store, False)
            await self._learn(tb, store, adapter, view, runner)
        else:
            await set_paused(store, True)
            plan = await store.current_plan(VIP)
            if plan is not None:
                result = await asyncio.to_thread(adapter.apply, plan)
                if not result.ok:
                    view.message(f"[yellow]could not apply the learned weights: {result}[/yellow]")
        view.message(f"[bold]phase {index + 1}: {phase.title}[/bold] - {phase.description}")
        weights: dict[str, float] = {}
        weight_sum: dict[str, float] = {}
        weight_reads: list[int] = [0]
        reset_at: list[float] = []
        duration = s.warmup_seconds + s.phase_seconds

        def progress(line: dict[str, Any]) -> None:
            t = float(line["t"])
            if not reset_at and t >= s.warmup_seconds:
                tb.reset_stats()
                reset_at.append(time.monotonic())
            read = adapter.read()
            weights.update(read or {})
            if read and t >= s.warmup_seconds:  # the weights HAProxy ran during the counted window
                weight_reads[0] += 1
                for name, weight in read.items():
                    weight_sum[name] = weight_sum.get(name, 0.0) + weight
            latency = {b: (int(v[0]), float(v[1])) for b, v in line["per_backend"].items()}
            note = "(warm-up, not counted)" if t < s.warmup_seconds else ""
            view.update(phase.title, max(0.0, duration - t), weights, latency, note)

        samples = await run_loadgen(tb, s, duration, s.warmup_seconds, s.seed * 1000 + index,
                                    self.out_dir / "run" / f"load-{phase.key}.json", progress)
        assert samples is not None
        stats = await asyncio.to_thread(tb.stats)
        seconds = time.monotonic() - reset_at[0] if reset_at else s.phase_seconds
        final = adapter.read() or weights
        self.final_weights[phase.key] = final
        metrics = phase_metrics(samples, stats, seconds, final, s.names)
        metrics.update(balance=phase.balance, mode=phase.mode, weights_from=phase.weights,
                       mean_weights={n: w / weight_reads[0] for n, w in weight_sum.items()} if weight_reads[0] else {})
        self.phases[phase.key] = metrics
        self.latencies[phase.key] = list(samples["latency"])
        mean = metrics["mean"]
        view.message(f"  {phase.key}: mean {mean * 1000 if mean else float('nan'):.1f} ms, p50 "
                     f"{(metrics['p50'] or 0) * 1000:.1f} ms, p99 {(metrics['p99'] or 0) * 1000:.1f} ms over "
                     f"{metrics['requests']} requests ({metrics['failed']} failed)")
        if phase.weights == "controller":
            plan = await store.current_plan(VIP)
            if plan is not None:
                self.learned = dict(plan.weights)
                metrics["plan_at_end"] = {"version": plan.version, "weights": dict(plan.weights),
                                          "flags": list(plan.flags), "method": plan.method}

    async def _learn(self, tb: DemoTestbed, store: LatencyStore, adapter: Any, view: LiveView,
                     runner: ServiceRunner) -> None:
        """Traffic while the controller learns; ends once a solved plan has moved no weight for the
        settle window (:mod:`knapsack_lb.lab.demo.settle`; at least ``learn_min_seconds`` in all, at most
        ``learn_max_seconds``). Not counted."""
        s = self.settings
        how = {"algorithm1": "Algorithm 1's measurement rounds", "estimate": "learning from every round"}
        method = runner.config.controller.learning.method
        view.message(f"[bold]learning[/bold]: KnapsackLB controller unpaused ({how.get(method, method)}); traffic "
                     f"not counted, {s.learn_min_seconds:g}-{s.learn_max_seconds:g} s")
        started = time.monotonic()
        watch = SettleWatch(s.settle_window)
        state: dict[str, Any] = {"plans": 0, "last_version": None}
        weights: dict[str, float] = {}
        loop = asyncio.get_running_loop()
        pending_plan: list[asyncio.Future[WeightPlan | None]] = []

        def count(plan: WeightPlan | None) -> None:
            if plan is not None and plan.version != state["last_version"]:
                state["last_version"] = plan.version
                state["plans"] += 1

        def progress(line: dict[str, Any]) -> None:
            if not pending_plan or pending_plan[0].done():
                if pending_plan:
                    plan = pending_plan[0].result()
                    count(plan)
                    if watch.observe(plan, time.monotonic()) and plan is not None:
                        view.message(f"  solved plan after {time.monotonic() - started:.0f} s: {listed(plan.weights)}")
                    pending_plan.clear()
                pending_plan.append(asyncio.ensure_future(store.current_plan(VIP), loop=loop))
            weights.update(adapter.read() or {})
            latency = {b: (int(v[0]), float(v[1])) for b, v in line["per_backend"].items()}
            elapsed = time.monotonic() - started
            status = "measuring" if watch.solved_at is None else "solved, settling"
            view.update("learning (not counted)", max(0.0, s.learn_max_seconds - elapsed), weights, latency, status)

        def done() -> bool:
            if runner.stop.is_set():
                return True
            now = time.monotonic()
            return now - started >= s.learn_min_seconds and watch.settled(now)

        while True:
            left = s.learn_max_seconds - (time.monotonic() - started)
            samples = await run_loadgen(tb, s, max(1.0, left), 0.0, s.seed * 1000 + 99,
                                        self.out_dir / "run" / "load-learning.json", progress, stop_when=done)
            for future in pending_plan:
                with contextlib.suppress(Exception):
                    await future
            pending_plan.clear()
            if runner.stop.is_set() or samples is not None:
                break  # stopped, or the learning time is up
            # the decision was made on a poll up to a second or two old: a plan stored since then is in force
            plan = await store.current_plan(VIP)
            count(plan)
            if watch.confirm(plan, time.monotonic()):
                break
            view.message("  a plan moved the weights as learning ended: learning goes on")
        self.learning = {
            "seconds": time.monotonic() - started,
            "converged": watch.solved_at is not None,
            "settled": watch.settled(time.monotonic()),
            "solved_after_seconds": None if watch.solved_at is None else watch.solved_at - started,
            "plans": state["plans"],
            "counted": False,
        }
        if runner.stop.is_set():
            raise DemoAborted("the service stopped while learning")


def finish(report: dict[str, Any], latencies: dict[str, list[float]], out_dir: Path, console: Console) -> None:
    """Table, summary, report.json and the plot."""
    console.print(comparison_table(report))
    for line in summary_lines(report):
        console.print(line, highlight=False)
    path = write_report(report, out_dir)
    plot = plot_report(report, latencies, out_dir / "demo.png")
    console.print(f"wrote {path} and {plot}", highlight=False)


def run(settings: DemoSettings, out_dir: Path, console: Console | None = None,
        phases: tuple[Phase, ...] = PHASES) -> dict[str, Any]:
    """Run the whole demo and write its outputs; returns the report."""
    console = console or Console()
    demo = DemoRun(settings, out_dir, console)
    report = asyncio.run(demo.run(phases))
    report["final_weights"] = demo.final_weights
    finish(report, demo.latencies, out_dir, console)
    return report


