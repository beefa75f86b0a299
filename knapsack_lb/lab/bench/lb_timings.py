"""``klb bench lb-timings``: what an LB's own timings change for the learner, live at layer 7.

The demo's testbed (:class:`knapsack_lb.lab.demo.testbed.DemoTestbed`: six emulated DIPs of
capacities 1, 1, 0.8, 0.8, 0.6 and 0.6, 20 ms of work at capacity 1, clients at 70 % of the pool's
capacity) behind HAProxy in ``mode http`` with ``balance roundrobin`` (or Nginx round robin, or
Envoy ``ROUND_ROBIN`` with EDS from a file), and klb (probe worker and controller, every learning
knob at its default) learning from the first second. Each seed runs twice on the same arrivals:
once with the adapter's ``log_listen`` (the LB sends what it timed of each request there and the
controller pools it into the DIPs' rounds: :mod:`adapters.access_log`), once without. Per run: the
clients' mean and p99 latency over the counted window (from ``count_after`` seconds to the end,
learning included), failed requests, the probe requests the worker sent, the probe budget and the
plan at the end.

How it fails: a run whose service or load generator fails raises; the numbers of one seed are one
live run each (the machine's other load shows in them), so compare pairs, not single numbers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from knapsack_lb.lab.demo.runner import run_loadgen
from knapsack_lb.lab.demo.settings import DemoSettings
from knapsack_lb.lab.demo.testbed import VIP, DemoLb, DemoTestbed
from knapsack_lb.lab.procs import free_port
from knapsack_lb.lab.testbed.lb_harness import load_testbed_class
from knapsack_lb.service.runner import ServiceRunner, controller_component, open_store, probe_component

LOAD_SEED_OFFSET = 500  # the load generator's seed is the run's seed plus this, the same with and without logs


@dataclass(frozen=True)
class TimingsRun:
    """One live run: with or without the LB's own timings."""

    lb: str
    seed: int
    logs: bool
    mean_ms: float | None  # None: no request succeeded in the counted window
    p99_ms: float | None
    requests: int
    failed: int
    probe_requests: int
    budget: dict[str, int] = field(default_factory=dict)
    plan_method: str | None = None
    plan: dict[str, float] = field(default_factory=dict)


async def run_once(seed: int, logs: bool, seconds: float, count_after: float, workdir: Path,
                   lb: DemoLb = "haproxy") -> TimingsRun:
    """One run of ``seconds`` of load (see the module docstring); counted from ``count_after``."""
    from probes.worker import STATUS_COMPONENT

    settings = DemoSettings.quick_preset(seed=seed)
    log_to = f"127.0.0.1:{free_port(kind=load_testbed_class(lb).log_socket)}" if logs else None
    with DemoTestbed(settings, workdir, max_seconds=seconds + 120.0, log_to=log_to, lb=lb) as tb:
        if lb == "haproxy":
            tb.lb.reconfigure(balance="roundrobin", mode="http")
        config = tb.klb_config()
        config = config.model_copy(update={"vips": [v.model_copy(update={"paused": False}) for v in config.vips]})
        runner = ServiceRunner(config, [probe_component(config), controller_component(config)])
        service = asyncio.create_task(runner.run(), name="klb-service")
        store = open_store(config.redis)
        try:
            samples = await run_loadgen(tb, settings, seconds, count_after, seed + LOAD_SEED_OFFSET,
                                        workdir / "load.json", lambda line: None)
            if service.done():
                raise RuntimeError(f"the klb service stopped during the run: {service.exception()!r}")
            workers = await store.statuses(STATUS_COMPONENT)
            budget = await store.probe_budget(VIP) or {}
            plan = await store.current_plan(VIP)
        finally:
            runner.request_stop("bench finished")
            await asyncio.wait_for(service, timeout=20.0)
            await store.close()
    assert samples is not None  # no stop_when: the load ran its whole time
    status = np.asarray(samples["status"], dtype=int)
    latency = np.asarray(samples["latency"], dtype=float)[status == 200]
    return TimingsRun(
        lb=lb, seed=seed, logs=logs,
        mean_ms=float(latency.mean() * 1000) if latency.size else None,
        p99_ms=float(np.percentile(latency, 99) * 1000) if latency.size else None,
        requests=int(status.size) + int(samples.get("errors", 0)),
        failed=int((status != 200).sum()) + int(samples.get("errors", 0)),
        probe_requests=sum(int(w.get("requests", 0)) for w in workers.values()),
        budget={str(k): int(v) for k, v in budget.items()},
        plan_method=None if plan is None else str(plan.method),
        plan={} if plan is None else {k: round(v, 4) for k, v in sorted(plan.weights.items())},
    )


def run_pairs(seeds: Sequence[int], seconds: float, count_after: float, workdir: Path,
              on_done: Callable[[TimingsRun], None] | None = None, lb: DemoLb = "haproxy") -> list[TimingsRun]:
    """For each seed, a run with the LB's timings and one without, one after the other."""
    runs = []
    for seed in seeds:
        for logs in (True, False):
            run = asyncio.run(run_once(seed, logs, seconds, count_after,
                                       workdir / f"seed{seed}-{'logs' if logs else 'probes'}", lb))
            runs.append(run)
            if on_done is not None:
                on_done(run)
    return runs


def summarise(runs: Sequence[TimingsRun]) -> dict[str, Any]:
    """Per variant the mean of the runs' mean latency; per seed the ratio with logs over without (a run
    in which nothing was answered has no mean and its seed no ratio)."""
    means = {(r.seed, r.logs): r.mean_ms for r in runs}
    ratios = {}
    for seed in sorted({r.seed for r in runs}):
        with_logs, without = means.get((seed, True)), means.get((seed, False))
        if with_logs is not None and without:
            ratios[seed] = with_logs / without
    variants = {}
    for logs in (True, False):
        chosen = [r for r in runs if r.logs == logs]
        answered = [r.mean_ms for r in chosen if r.mean_ms is not None]
        variants["logs" if logs else "probes only"] = {
            "runs": len(chosen),
            "mean_ms": float(np.mean(answered)) if answered else None,
            "failed": sum(r.failed for r in chosen),
            "probe_requests": sum(r.probe_requests for r in chosen),
        }
    return {"variants": variants, "mean_ratio_logs_over_probes": ratios,
            "pairs_lower_with_logs": sum(v < 1 for v in ratios.values()), "pairs": len(ratios)}


def report(runs: Sequence[TimingsRun]) -> dict[str, Any]:
    return {"runs": [asdict(r) for r in runs], "summary": summarise(runs)}
