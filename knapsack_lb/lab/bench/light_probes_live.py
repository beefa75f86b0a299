"""``klb bench light-probes --live``: light probes against a real emulated DIP over loopback.

The simulated bench (:mod:`knapsack_lb.lab.bench.light_probes`) knows exactly whether a probe waited.
A live probe knows only its latency, which carries the loopback round trip, both sides' HTTP
handling and the machine's scheduling jitter. This bench measures what is left of the estimates
then. Per case it starts one emulated DIP (:mod:`knapsack_lb.lab.testbed.emulator`: ``workers``
FCFS workers or processor sharing over ``workers`` cores, exponential service of ``SERVICE_TIME``,
punctual timers under real-time priority where allowed, as ``klb bench probes`` runs its
instrument) on a free loopback port, and then:

1. *idle*: ``IDLE_PROBES`` light probes (``GET /light?work=W``, ``light_work``, the probe worker's own
   HTTP client, :class:`probes.http_client.KeepAliveClient`, with kernel receive timestamps) with
   nothing else running: their median is the probe's unloaded latency, their 99th percentile the
   line above which a loaded probe counts as *waited* (so about 1 % of probes that did not wait
   count as waited);
2. *loaded*: the demo's open-loop Poisson client (:mod:`knapsack_lb.lab.demo.loadgen`, a child
   process) at ``utilisation`` of the DIP's capacity; after ``WARMUP`` seconds, light probes at
   Poisson times (mean spacing ``PROBE_SPACING``) for ``seconds``, each on a free connection of a
   small pool so that a slow answer delays no later probe;
3. the truth from the emulator's counters over the probe phase: its utilisation (work done, the
   probes' included, over the time and the workers) and the rate it carried.

It reports the waited share against Erlang's C at the measured utilisation, the capacity read
with the carried rate (:func:`~knapsack_lb.controller.waiting.capacity_from_waited_share`) and the
utilisation read without it (:func:`~knapsack_lb.controller.waiting.load_from_light_probes`, the
excess over the idle median in units of the mean service behind FCFS workers, of the probe's own
work under processor sharing), each over the truth; then the utilisation read again with only the
probes ``JITTER_LINE`` above the idle median counted, and the waits below that line restored by
their exponential tail (``threshold``), the read a loaded machine's jitter does not inflate.

How it fails: the loaded machine's timing jitter makes some probes that did not wait count as
waited (reads of a busier DIP than the truth, the safe side); the censored read removes that
behind FCFS workers, whose waits are exponential and a service time long, but not under processor
sharing, where a probe is stretched in steps of ``1 / c`` of its own work, on a 1 ms probe as
small as the jitter itself (the censored read then fails, and the bench shows it). On many
processor-sharing cores those steps fall below the idle line, waits go unseen and the DIP reads
idler than it is (16 cores at 85 %: up to 1.40x its capacity), the unsafe side. Arrivals that
bunch (a load generator that falls behind on a busy machine and catches up) make waits longer than
Poisson arrivals would, which reads a busier DIP too (0.92 for 0.82 with one core taken by another
process), while the waited share, and so the capacity read with the rate, stays close. Each
case is one run on a shared machine (the load generator and the emulator take CPU from the
probes), bounded in time: about ``seconds + 15`` seconds. Bad arguments raise
:class:`~knapsack_lb.errors.InvalidInputError` naming the field.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from knapsack_lb.controller.waiting import capacity_from_waited_share, erlang_c, load_from_light_probes
from knapsack_lb.errors import InvalidInputError
from knapsack_lb.lab.bench.light_probes import plot_reads
from knapsack_lb.lab.bench.probes import INSTRUMENT_REALTIME_PRIORITY, emulator_stats
from knapsack_lb.lab.procs import ManagedProcess, free_listening_port
from knapsack_lb.lab.testbed.queueing import PUNCTUAL_SPIN_LIMIT
from probes.http_client import KeepAliveClient, ProbeConnectionError, ProbeTimeout

SERVICE_TIME = 0.020  # seconds, the application's mean request
LIGHT_WORK = 0.001  # seconds of fixed work per light probe (5 % of a mean request)
IDLE_PROBES = 300
IDLE_SPACING = 0.005  # seconds between idle probes
PROBE_SPACING = 0.025  # mean seconds between loaded probes (Poisson)
WARMUP = 3.0  # seconds of load before the first probe
CLIENTS = 16  # connections the loaded probes take turns on
ANSWER_GRACE = 10.0  # seconds after the last probe's time that answers are waited for
CONNECTIONS_PER_WORKER = 4  # load generator connections (open loop: enough that few requests share one)
IDLE_QUANTILE = 0.99
# seconds above the idle median a probe must be to count as waited in the censored read: above the
# loaded machine's timing jitter (on this 2-core machine most probes that could not have waited
# came back within 0.5 ms of the idle median)
JITTER_LINE = 0.0005
Mode = Literal["fcfs", "ps"]


@dataclass(frozen=True)
class LiveLightCase:
    """One emulated DIP: ``workers`` at ``utilisation`` of its capacity, probed with ``light_work``
    seconds of fixed work."""

    mode: Mode
    workers: int
    utilisation: float
    light_work: float = LIGHT_WORK


def default_live_cases(light_work: float = LIGHT_WORK) -> list[LiveLightCase]:
    """FCFS workers and processor sharing; 4 and 16 workers; 70 and 85 %."""
    return [LiveLightCase(m, w, u, light_work) for m in ("fcfs", "ps") for w in (4, 16) for u in (0.7, 0.85)]


async def _probe_at(times: Sequence[float], port: int, clients: int, light_work: float = LIGHT_WORK) -> list[float]:
    """One light probe at each of ``times`` (seconds from now) on a pool of ``clients`` connections;
    the latencies of those answered (a probe that failed or timed out is left out)."""
    path = f"/light?work={light_work!r}"
    pool: asyncio.Queue[KeepAliveClient] = asyncio.Queue()
    for _ in range(clients):
        pool.put_nowait(KeepAliveClient("127.0.0.1", port, path=path, timeout=5.0))
    latencies: list[float] = []

    async def one() -> None:
        client = await pool.get()
        try:
            latencies.append((await client.request()).latency)
        except (ProbeTimeout, ProbeConnectionError):
            pass
        finally:
            pool.put_nowait(client)

    loop = asyncio.get_running_loop()
    start = loop.time()
    deadline = start + (times[-1] if times else 0.0) + ANSWER_GRACE
    tasks = []
    for at in times:
        await asyncio.sleep(max(0.0, start + at - loop.time()))
        tasks.append(asyncio.create_task(one()))
    if tasks:
        _, late = await asyncio.wait(tasks, timeout=max(0.0, deadline - loop.time()))
        for task in late:  # a DIP that stopped answering: bounded, the rest are left out
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
    while not pool.empty():
        pool.get_nowait().close()
    return latencies


def run_live_case(case: LiveLightCase, *, seconds: float = 30.0, seed: int = 1,
                  workdir: Path | None = None) -> dict[str, Any]:
    """One case (see the module docstring); a JSON-ready dict."""
    if case.mode not in ("fcfs", "ps"):
        raise InvalidInputError("mode", case.mode, "must be 'fcfs' or 'ps'")
    if not isinstance(case.workers, int) or case.workers < 1:
        raise InvalidInputError("workers", case.workers, "must be an integer >= 1")
    if not 0 < case.utilisation < 1:
        raise InvalidInputError("utilisation", case.utilisation, "must be a share strictly between 0 and 1")
    if not 0 < case.light_work <= SERVICE_TIME:  # also refuses nan
        raise InvalidInputError("light_work", case.light_work, f"must be seconds in (0, {SERVICE_TIME}]")
    if not math.isfinite(seconds) or not 1 <= seconds <= 600:
        raise InvalidInputError("seconds", seconds, "must be from 1 to 600")
    with tempfile.TemporaryDirectory(prefix="klb-light-") as scratch:
        where = workdir or Path(scratch)
        return _run(case, seconds, seed, where)


def _run(case: LiveLightCase, seconds: float, seed: int, where: Path) -> dict[str, Any]:
    rng = random.Random(f"light-live/{seed}/{case}")
    port = free_listening_port()
    budget = seconds + WARMUP + 30.0
    emulator = ManagedProcess(
        [sys.executable, "-m", "knapsack_lb.lab.testbed.emulator", "--name", "dip", "--port", str(port),
         "--mode", case.mode, "--workers", str(case.workers), "--service-time", repr(SERVICE_TIME),
         "--distribution", "exponential", "--seed", str(seed), "--duration", str(budget),
         "--spin-limit", repr(PUNCTUAL_SPIN_LIMIT), "--realtime-priority", str(INSTRUMENT_REALTIME_PRIORITY)],
        log_path=where / "emulator.log")
    rate = case.utilisation * case.workers / SERVICE_TIME
    load = ManagedProcess(
        [sys.executable, "-m", "knapsack_lb.lab.demo.loadgen", "--port", str(port), "--rate", repr(rate),
         "--connections", str(CONNECTIONS_PER_WORKER * case.workers), "--lifetime", "600",
         "--duration", repr(WARMUP + seconds + 1.0), "--seed", str(seed), "--timeout", "5",
         "--progress", "5", "--out", str(where / "load.json")],
        log_path=where / "load.log")
    with emulator:
        emulator.wait_listening("127.0.0.1", port, timeout=30.0)
        idle_times = [IDLE_SPACING * i for i in range(IDLE_PROBES)]
        idle = sorted(asyncio.run(_probe_at(idle_times, port, 1, case.light_work)))
        if len(idle) < IDLE_PROBES // 2:
            raise RuntimeError(f"only {len(idle)} of {IDLE_PROBES} idle light probes answered; see {where}")
        base = statistics.median(idle)
        ceiling = idle[min(len(idle) - 1, int(IDLE_QUANTILE * len(idle)))]
        with load:
            time.sleep(WARMUP)
            before, t0 = emulator_stats(port), time.perf_counter()
            arrivals: list[float] = []
            at = rng.expovariate(1 / PROBE_SPACING)
            while at < seconds:
                arrivals.append(at)
                at += rng.expovariate(1 / PROBE_SPACING)
            loaded = asyncio.run(_probe_at(arrivals, port, CLIENTS, case.light_work))
            after, t1 = emulator_stats(port), time.perf_counter()
    return _report(case, seconds, base, ceiling, loaded, before, after, t1 - t0)


def _report(case: LiveLightCase, seconds: float, base: float, ceiling: float, loaded: list[float],
            before: dict[str, Any], after: dict[str, Any], elapsed: float) -> dict[str, Any]:
    def delta(key: str) -> float:
        return float(after[key]) - float(before[key])

    true_utilisation = (delta("work_seconds") + delta("light_work_seconds")) / (elapsed * case.workers)
    carried = delta("successes") / elapsed
    unit = case.light_work if case.mode == "ps" else SERVICE_TIME
    excess = [(t - base) / unit for t in loaded if t > ceiling]
    waited = len(excess)
    truth_capacity = case.workers / SERVICE_TIME
    with_rate = capacity_from_waited_share(waited, len(loaded), rate=carried, unloaded=SERVICE_TIME) \
        if loaded and carried > 0 else None
    without_rate = load_from_light_probes(waited, len(loaded), math.fsum(excess)) if loaded else None
    line = JITTER_LINE / unit
    past = [e - line for e in excess if e > line]
    censored = load_from_light_probes(len(past), len(loaded), math.fsum(past), threshold=line) if loaded else None

    def over(value: float | None, truth: float) -> float | None:
        return None if value is None else value / truth

    def capacity_without(utilisation: float | None) -> float | None:
        return None if not utilisation else true_utilisation / utilisation

    return {
        "case": asdict(case), "seconds": seconds, "service_time": SERVICE_TIME,
        "idle_median": base, "idle_ceiling": ceiling, "probes": len(loaded), "waited": waited,
        "waited_share": waited / len(loaded) if loaded else None,
        "erlang_c_at_true_utilisation": erlang_c(case.workers, case.workers * true_utilisation),
        "true_utilisation": true_utilisation, "carried_rate": carried,
        "capacity_with_rate_over_truth": over(with_rate.capacity if with_rate else None, truth_capacity),
        "utilisation_read": without_rate.utilisation if without_rate else None,
        "utilisation_low": without_rate.low if without_rate else None,
        "utilisation_high": without_rate.high if without_rate else None,
        "capacity_without_rate_over_truth": capacity_without(without_rate.utilisation if without_rate else None),
        "past_jitter_line": len(past),
        "utilisation_read_past_line": censored.utilisation if censored else None,
        "utilisation_low_past_line": censored.low if censored else None,
        "utilisation_high_past_line": censored.high if censored else None,
        "capacity_past_line_over_truth": capacity_without(censored.utilisation if censored else None),
        "emulator_scheduler": after.get("scheduler"),
    }


def run_live_light_probes(cases: Sequence[LiveLightCase] | None = None, *, seconds: float = 30.0, seed: int = 1,
                          on_case: Callable[[LiveLightCase], None] | None = None) -> dict[str, Any]:
    """Every case, then a JSON-ready report."""
    rows = []
    for case in cases if cases is not None else default_live_cases():
        rows.append(run_live_case(case, seconds=seconds, seed=seed))
        if on_case is not None:
            on_case(case)
    return {"benchmark": "light-probes-live", "seed": seed, "seconds": seconds, "service_time": SERVICE_TIME,
            "cases": rows}


def plot(report: dict[str, Any], path: Path) -> Path:
    """The live bench's reads per case: with the carried rate, without it, from the waits past the line."""
    cases = report["cases"]
    labels = [f"{c['case']['mode']} {c['case']['workers']}w {round(100 * c['case']['utilisation'])}% "
              f"{c['case']['light_work'] * 1e3:g} ms" for c in cases]
    reads = {"waited share, with the carried rate": [c["capacity_with_rate_over_truth"] for c in cases],
             "waits alone, without the rate": [c["capacity_without_rate_over_truth"] for c in cases],
             f"waits past {JITTER_LINE * 1e3:g} ms": [c["capacity_past_line_over_truth"] for c in cases]}
    work = {c["case"]["light_work"] for c in cases}
    return plot_reads(labels, reads, path, "light probes over loopback, probe work "
                      + ", ".join(f"{w * 1e3:g} ms" for w in sorted(work)))
