"""``klb bench probes``: probe throughput per CPU-second and probe accuracy (KnapsackLB section 6.7).

The paper's KLM sends 4,500 probe requests per second on one core. This benchmark starts
its own ``redis-server`` and emulated DIPs (:mod:`knapsack_lb.lab.testbed.emulator`, in child
processes, fixed service times so the injected latency is known) on free loopback ports,
runs one probe worker in this process against them, and reports

* ``probe_requests_per_cpu_second``: probe requests completed / CPU seconds of this
  process (``time.process_time``) while the worker ran: HTTP, summaries, Redis writes,
  leases and status included; the emulators and Redis run in other processes;
* ``latency_error_pct``: per service time, ``100 * |probe mean - injected| / injected``,
  the issue's target, split into its two causes:
  ``emulator_error_pct`` (the emulators' own server-side mean, from each request's arrival
  at the emulator's socket to its response, vs the injected time: the instrument's
  imprecision, mostly timers that fire late on a busy machine) and
  ``latency_error_vs_server_pct`` (probe mean vs that server-side mean: the probe's
  error, i.e. loopback round trip, HTTP handling on both sides and timing);
* ``latency_error_userspace_pct``: what the probe mean would be had each response been
  timed when the worker read it instead of at the kernel's receive timestamp (probe mean
  + the mean ``read_delay`` it left out): the worker's own wake-up delay, shown so that
  the effect of the kernel timestamps is visible, not hidden.

The accuracy phases run ``accuracy_dips`` DIPs per service time, each in its own emulator
process with punctual (busy-wait, ``--spin-limit 0.0005``) timers
(:mod:`knapsack_lb.lab.testbed.queueing`) under real-time scheduling (``--realtime-priority``,
:mod:`knapsack_lb.lab.testbed.realtime`: on a busy machine an ordinary process is woken too late
for a 2 ms yardstick). The probe worker, the thing measured, keeps ordinary scheduling. Where
real-time priority is refused (no ``CAP_SYS_NICE``) the emulators run without it and
``emulator_realtime`` says false. The throughput phase's emulators (ten DIPs per process) use
plain timers and ordinary scheduling, because there latency does not matter and ten
busy-waiting DIPs would take a CPU from a 2-core machine.

Every run is bounded: ``seconds`` per service time, then everything is stopped.

``run_probe_sizing`` (``klb bench probes --sizing``) answers the sizing question of section
6.7 (the paper's KLM sends 100 requests per DIP every 5 s, 4,500 requests/s on one core, so
225 DIPs per KLM): how many DIPs can one probe worker process serve at that cadence? It runs
one worker against ``n`` emulated DIPs for a few rounds of the paper's cadence, for ``n``
doubling from ``start_dips`` and then bisected between the last ``n`` that kept the cadence
and the first that did not, bounded by ``max_dips`` and ``max_seconds``. A step *keeps the
cadence* when every round started one interval after the previous one (within
``CADENCE_TOLERANCE``), every DIP got all its requests answered in every round, and the
slowest round ended before the next was due. The emulators and Redis run on the same
machine as the worker, so on a small machine the answer is the machine's, not the worker's
alone: each step also reports the worker's CPU share and requests per CPU-second, and
``projected_dips_per_worker_core`` scales that to a worker with a whole core to itself
(labelled as a projection).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from knapsack_lb.lab.procs import ManagedProcess, RedisServer, free_listening_port, wait_for_port
from knapsack_lb.lab.testbed.neighbours import NoisyNeighbours
from knapsack_lb.lab.testbed.queueing import PUNCTUAL_SPIN_LIMIT
from knapsack_lb.model import DipConfig, Measurement, ProbeSpec, VipConfig
from knapsack_lb.store.redis import RedisLatencyStore
from probes.worker import ProbeWorker, ProbeWorkerOptions

DIPS_PER_EMULATOR_PROCESS = 10
SIZING_DIPS_PER_EMULATOR_PROCESS = 50  # a sizing step starts up to max_dips DIPs: fewer, fuller processes
CADENCE_TOLERANCE = 0.5  # seconds a round may start late (relative to the previous one) and still be on cadence
PAPER_KLM_REQUESTS_PER_SECOND = 4500  # section 6.7: one KLM on one core (DS1 v2)
PAPER_KLM_DIPS = 225  # section 6.7: DIPs per KLM at 100 requests per 5 s
INSTRUMENT_REALTIME_PRIORITY = 10  # SCHED_FIFO priority of the accuracy phases' emulators: above every ordinary task


def _start_emulators(count: int, service_time: float, workdir: Path, per_process: int = DIPS_PER_EMULATOR_PROCESS,
                     spin_limit: float | None = None,
                     realtime_priority: int | None = None) -> tuple[list[ManagedProcess], list[int]]:
    ports: list[int] = []
    while len(ports) < count:
        ports.append(free_listening_port(taken=ports))
    procs: list[ManagedProcess] = []
    try:
        _launch_emulators(procs, ports, service_time, workdir, per_process, spin_limit, realtime_priority)
    except BaseException:
        for proc in procs:
            proc.stop()
        raise
    return procs, ports


def _launch_emulators(procs: list[ManagedProcess], ports: list[int], service_time: float, workdir: Path,
                      per_process: int, spin_limit: float | None, realtime_priority: int | None) -> None:
    count = len(ports)
    for first in range(0, count, per_process):
        chunk = ports[first : first + per_process]
        argv = [sys.executable, "-m", "knapsack_lb.lab.testbed.emulator", "--name", f"dip{first}", "--mode", "fcfs",
                "--service-time", repr(service_time), "--distribution", "fixed", "--duration", "600"]
        if spin_limit is not None:
            argv += ["--spin-limit", repr(spin_limit)]
        if realtime_priority is not None:
            argv += ["--realtime-priority", str(realtime_priority)]
        for port in chunk:
            argv += ["--port", str(port)]
        procs.append(ManagedProcess(argv, log_path=workdir / f"emulator-{first}.log").start())
    for port in ports:
        wait_for_port("127.0.0.1", port, timeout=30.0)


def emulator_stats(port: int) -> dict[str, Any]:
    """One emulated DIP's ``GET /stats`` counters."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5) as response:
        stats: dict[str, Any] = json.loads(response.read())
    return stats


async def _run_phase(url: str, namespace: str, ports: Sequence[int], service_time: float,
                     seconds: float, requests_per_round: int) -> dict[str, Any]:
    interval = max(1.0, 1.5 * requests_per_round * service_time)
    config = VipConfig(
        name="bench",
        dips=tuple(DipConfig(name=f"d{i}", address=f"127.0.0.1:{p}") for i, p in enumerate(ports)),
        probe=ProbeSpec(path="/probe", interval=interval, requests_per_round=requests_per_round, timeout=1.0),
    )
    store = RedisLatencyStore.from_url(url, namespace=namespace)
    try:
        await store.put_vip(config)
        worker = ProbeWorker(store, ProbeWorkerOptions(worker_id="bench", vips=("bench",)))
        cpu0, wall0 = time.process_time(), time.perf_counter()
        stats = await worker.run(duration=seconds)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        rounds = await store.measurements("bench")
    finally:
        await store.close()
    successes = sum(m.successes for m in rounds)
    probe_mean = (
        math.fsum(m.latency_mean * m.successes for m in rounds if m.latency_mean is not None) / successes
        if successes else math.nan
    )
    server = [emulator_stats(p) for p in ports]
    server_n = sum(int(s["successes"]) for s in server)
    server_mean = math.fsum(float(s["server_latency_sum"]) for s in server) / server_n if server_n else math.nan
    departures = sum(int(s["timer_spins"]) + int(s["timer_late_wakeups"]) for s in server)
    read_delay_mean = stats.read_delay_seconds / successes if successes else math.nan
    userspace_mean = probe_mean + read_delay_mean
    return {
        "service_time": service_time,
        "interval": interval,
        "requests": stats.requests,
        "successes": stats.successes,
        "failures": stats.failures,
        "measurements_written": stats.measurements_written,
        "cpu_seconds": round(cpu, 4),
        "wall_seconds": round(wall, 3),
        "probe_requests_per_cpu_second": round(stats.requests / cpu, 1) if cpu > 0 else None,
        "probe_requests_per_second": round(stats.requests / wall, 1),
        "probe_mean_latency": probe_mean,
        "server_mean_latency": server_mean,
        "latency_error_pct": round(100 * abs(probe_mean - service_time) / service_time, 3),
        "latency_error_vs_server_pct": round(100 * abs(probe_mean - server_mean) / server_mean, 3),
        "emulator_error_pct": round(100 * abs(server_mean - service_time) / service_time, 3),
        "kernel_timestamped_share": round(stats.kernel_timestamped / successes, 4) if successes else None,
        "probe_read_delay_mean": read_delay_mean,
        "latency_error_userspace_pct": round(100 * abs(userspace_mean - service_time) / service_time, 3),
        "emulator_late_wakeup_share": round(sum(int(s["timer_late_wakeups"]) for s in server) / departures, 4)
        if departures else None,
        "emulator_spin_seconds": round(math.fsum(float(s["timer_spin_seconds"]) for s in server), 4),
        "emulator_schedulers": sorted({str(s["scheduler"]) for s in server}),
    }


def run_probe_benchmark(dips: int = 20, seconds: float = 10.0, requests_per_round: int = 100,
                        service_times: Sequence[float] = (0.002, 0.020), accuracy_dips: int = 2,
                        realtime: bool = True, noisy_neighbours: int = 0,
                        on_phase: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the benchmark (see the module docstring) and return its JSON-ready result.

    ``on_phase(description)`` is called as each phase starts (progress display).
    Throughput: ``dips`` DIPs at the first service time. Accuracy: ``accuracy_dips`` DIPs per
    service time, each in its own emulator process, so that a starved emulator process
    (the machine has two cores) does not pass for probe error; with ``realtime`` they ask
    for ``SCHED_FIFO`` (module docstring). ``noisy_neighbours`` background processes
    (:class:`~knapsack_lb.lab.testbed.neighbours.NoisyNeighbours`) keep the machine busy during
    every phase, so the figures can be taken on a busy machine on purpose, not by accident.
    """
    if not 1 <= dips <= 1000:
        raise ValueError(f"--dips must be in 1-1000, got {dips}")
    if not 1 <= seconds <= 3600:
        raise ValueError(f"--seconds must be in 1-3600, got {seconds}")
    accuracy: list[dict[str, Any]] = []
    neighbours = NoisyNeighbours(noisy_neighbours, seconds=(1 + len(service_times)) * (seconds + 30))  # validates
    with tempfile.TemporaryDirectory(prefix="klb-bench-probes-") as tmp, neighbours:
        workdir = Path(tmp)
        with RedisServer(workdir / "redis") as redis:
            if on_phase:
                on_phase(f"throughput: {dips} DIPs at {service_times[0] * 1000:g} ms")
            procs, ports = _start_emulators(dips, service_times[0], workdir, spin_limit=0.0)
            try:
                throughput = asyncio.run(_run_phase(redis.url, "throughput", ports, service_times[0], seconds,
                                                    requests_per_round))
            finally:
                for proc in procs:
                    proc.stop()
            for i, service_time in enumerate(service_times):
                if on_phase:
                    on_phase(f"accuracy: {accuracy_dips} DIPs at {service_time * 1000:g} ms")
                procs, ports = _start_emulators(accuracy_dips, service_time, workdir, per_process=1,
                                                spin_limit=PUNCTUAL_SPIN_LIMIT,
                                                realtime_priority=INSTRUMENT_REALTIME_PRIORITY if realtime else None)
                try:
                    accuracy.append(asyncio.run(_run_phase(redis.url, f"accuracy{i}", ports, service_time, seconds,
                                                           requests_per_round)))
                finally:
                    for proc in procs:
                        proc.stop()
    return {
        "benchmark": "probes",
        "dips": dips,
        "seconds_per_phase": seconds,
        "requests_per_round": requests_per_round,
        "probe_requests_per_cpu_second": throughput["probe_requests_per_cpu_second"],
        "latency_error_pct": {f"{p['service_time'] * 1000:g}ms": p["latency_error_pct"] for p in accuracy},
        "latency_error_vs_server_pct": {
            f"{p['service_time'] * 1000:g}ms": p["latency_error_vs_server_pct"] for p in accuracy
        },
        "emulator_error_pct": {f"{p['service_time'] * 1000:g}ms": p["emulator_error_pct"] for p in accuracy},
        "latency_error_userspace_pct": {
            f"{p['service_time'] * 1000:g}ms": p["latency_error_userspace_pct"] for p in accuracy
        },
        "emulator_realtime": all(p["emulator_schedulers"] == ["fifo"] for p in accuracy),
        "noisy_neighbours": noisy_neighbours,
        "paper_klm_requests_per_second_per_core": 4500,
        "throughput_phase": throughput,
        "accuracy_phases": accuracy,
        "note": "one probe worker in the benchmark process (CPU = time.process_time of that process); "
                "Redis and the emulated DIPs run in other processes on loopback; probe latencies end at the "
                "kernel's receive timestamp (latency_error_userspace_pct: ended when the worker read them); the "
                "accuracy phases' emulators run under SCHED_FIFO when allowed (emulator_realtime)",
    }


class _RoundTimedWorker(ProbeWorker):
    """A probe worker that also records how long each of its rounds took (the sizing benchmark's instrument)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.round_seconds: list[float] = []

    async def probe_round(self, vip: str) -> list[Measurement]:
        started = time.perf_counter()
        try:
            return await super().probe_round(vip)
        finally:
            self.round_seconds.append(time.perf_counter() - started)


async def _sizing_step(url: str, namespace: str, ports: Sequence[int], interval: float, requests_per_round: int,
                       rounds: int, max_concurrency: int) -> dict[str, Any]:
    """One worker against ``ports`` for about ``rounds`` rounds at the given cadence; did it keep it?"""
    config = VipConfig(
        name="sizing",
        dips=tuple(DipConfig(name=f"d{i}", address=f"127.0.0.1:{p}") for i, p in enumerate(ports)),
        probe=ProbeSpec(path="/probe", interval=interval, requests_per_round=requests_per_round, timeout=1.0),
    )
    store = RedisLatencyStore.from_url(url, namespace=namespace)
    try:
        await store.put_vip(config)
        worker = _RoundTimedWorker(store, ProbeWorkerOptions(worker_id="sizing", vips=("sizing",),
                                                             max_concurrency=max_concurrency))
        cpu0, wall0 = time.process_time(), time.perf_counter()
        # the first round waits for the next multiple of the interval (rounds align across workers)
        stats = await worker.run(duration=(rounds + 1) * interval + 0.5)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        measured = await store.measurements("sizing")
    finally:
        await store.close()
    by_round: dict[float, list[Measurement]] = {}
    for m in measured:
        by_round.setdefault(m.time, []).append(m)
    starts = sorted(by_round)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    drift = max((abs(g - interval) for g in gaps), default=0.0)
    short = sum(1 for ms in by_round.values() for m in ms if m.sent < requests_per_round)
    failed = sum(1 for ms in by_round.values() for m in ms if m.successes < m.sent)
    missing = sum(len(ports) - len(ms) for ms in by_round.values())
    longest = max(worker.round_seconds, default=math.nan)
    answered = sum(m.successes for m in measured)
    probe_mean = (math.fsum(m.latency_mean * m.successes for m in measured if m.latency_mean is not None) / answered
                  if answered else math.nan)
    reasons = []
    if len(starts) < rounds:
        reasons.append(f"{len(starts)} rounds ran, {rounds} wanted")
    if drift > CADENCE_TOLERANCE:
        reasons.append(f"a round started {drift:.2f} s off the {interval:g} s cadence")
    if short or missing:
        reasons.append(f"{short + missing} DIP-rounds did not send all {requests_per_round} requests")
    if failed:
        reasons.append(f"{failed} DIP-rounds had failed requests")
    if not longest < interval:
        reasons.append(f"the slowest round took {longest:.2f} s, the interval is {interval:g} s")
    return {
        "dips": len(ports),
        "kept_cadence": not reasons,
        "why_not": "; ".join(reasons) or None,
        "rounds": len(starts),
        "longest_round_seconds": round(longest, 3),
        "largest_start_drift_seconds": round(drift, 3),
        "probe_mean_latency_ms": round(probe_mean * 1000, 3),
        "requests": stats.requests,
        "failures": stats.failures,
        "worker_cpu_seconds": round(cpu, 3),
        "wall_seconds": round(wall, 3),
        "worker_cpu_share": round(cpu / wall, 3) if wall > 0 else None,
        "probe_requests_per_cpu_second": round(stats.requests / cpu, 1) if cpu > 0 else None,
    }


def next_sizing_step(n: int, good: int | None, bad: int | None, max_dips: int, refinements_left: int) -> int | None:
    """The DIP count of the sizing's next step, or None to stop.

    Doubling (capped at ``max_dips``) while no step has failed; then bisection between the
    largest count that kept the cadence (``good``) and the smallest that did not (``bad``), at
    most ``refinements_left`` more times and never below a gap of one DIP.
    """
    if bad is None:
        return min(2 * n, max_dips) if n < max_dips else None
    if good is None or bad - good <= 1 or refinements_left <= 0:
        return None
    return (good + bad) // 2


def run_probe_sizing(start_dips: int = 25, max_dips: int = 800, interval: float = 5.0,
                     requests_per_round: int = 100, rounds: int = 3, service_time: float = 0.002,
                     max_seconds: float = 600.0, refine: int = 2, max_concurrency: int = 256,
                     on_step: Callable[[int, float], None] | None = None) -> dict[str, Any]:
    """How many DIPs one worker serves at ``requests_per_round`` per ``interval`` (module docstring).

    Doubles ``n`` from ``start_dips`` while every step keeps the cadence (at most ``max_dips``),
    then bisects ``refine`` times between the last good and the first bad ``n``. No step starts
    once ``max_seconds`` have passed. ``max_concurrency`` is the worker's (``ProbeWorkerOptions``;
    256 by default): DIPs beyond it wait for a free slot, so a round of more DIPs than that takes
    at least two DIP-rounds' time. ``on_step(n, elapsed)`` is called as each step starts.
    """
    if not 1 <= start_dips <= max_dips <= 5000:
        raise ValueError(f"need 1 <= --start-dips <= --max-dips <= 5000, got {start_dips} and {max_dips}")
    if not 0.5 <= interval <= 60 or not 1 <= rounds <= 20 or not 1 <= requests_per_round <= 10_000:
        raise ValueError("need --interval in 0.5-60 s, --rounds in 1-20, --requests-per-round in 1-10000")
    if not 10 <= max_seconds <= 3600:
        raise ValueError(f"--max-seconds must be in 10-3600, got {max_seconds}")
    began = time.perf_counter()
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    steps: list[dict[str, Any]] = []
    good: int | None = None
    bad: int | None = None
    with tempfile.TemporaryDirectory(prefix="klb-bench-sizing-") as tmp, RedisServer(Path(tmp) / "redis") as redis:
        workdir = Path(tmp)
        n: int | None = start_dips
        refined = 0
        while n is not None and time.perf_counter() - began < max_seconds:
            if on_step:
                on_step(n, time.perf_counter() - began)
            procs, ports = _start_emulators(n, service_time, workdir, per_process=SIZING_DIPS_PER_EMULATOR_PROCESS,
                                            spin_limit=0.0)
            try:
                step = asyncio.run(_sizing_step(redis.url, f"sizing{len(steps)}", ports, interval,
                                                requests_per_round, rounds, max_concurrency))
            finally:
                for proc in procs:
                    proc.stop()
            steps.append(step)
            if step["kept_cadence"]:
                good = max(good or 0, n)
            else:
                bad = n if bad is None else min(bad, n)
            n = next_sizing_step(n, good, bad, max_dips, refine - refined)
            refined += bad is not None and n is not None
    best = next((s for s in steps if s["dips"] == good), None)
    per_core = None
    if best is not None and best["probe_requests_per_cpu_second"]:
        per_core = int(best["probe_requests_per_cpu_second"] * interval / requests_per_round)
    return {
        "benchmark": "probes-sizing",
        "cadence": {"requests_per_round": requests_per_round, "interval_seconds": interval,
                    "requests_per_second_per_dip": requests_per_round / interval, "rounds_per_step": rounds},
        "service_time": service_time,
        "worker_max_concurrency": max_concurrency,
        "dips_per_worker": good,
        "first_dips_not_kept": bad,
        "bounded_by_max_dips": bad is None and good == max_dips,
        "projected_dips_per_worker_core": per_core,
        "paper_klm": {"requests_per_second_per_core": PAPER_KLM_REQUESTS_PER_SECOND, "dips_per_klm": PAPER_KLM_DIPS,
                      "what": "KnapsackLB paper, section 6.7: one KLM on a 1-core DS1 v2 VM"},
        "machine": {"cpus": os.cpu_count(), "load_average_before": load_before},
        "seconds": round(time.perf_counter() - began, 1),
        "steps": steps,
        "note": "one probe worker (asyncio, one process) in the benchmark process; emulated DIPs "
                f"({SIZING_DIPS_PER_EMULATOR_PROCESS} per process) and Redis in child processes on the same "
                "machine, loopback only; dips_per_worker is the largest step that kept the cadence here; "
                "projected_dips_per_worker_core = that step's probe requests per worker CPU-second x interval / "
                "requests per round, i.e. a worker with a whole core to itself (a projection, not a measurement)",
    }
