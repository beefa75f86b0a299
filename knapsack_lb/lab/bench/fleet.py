"""``klb bench fleet``: real controller processes sharing a seeded fleet of VIPs (KnapsackLB section 6.7).

The fleet is :func:`knapsack_lb.lab.fleet.make_fleet`'s ``lognormal`` shape (heavy-tailed VIP
sizes, Table-3 DIP mixes): by default a small one for CI, with ``full`` the 3,410 VIPs and 60,000
DIPs of the paper's section 6.7. Probing 60,000 real DIPs from one machine is not possible, so
probe rounds come from the fluid model (:class:`knapsack_lb.lab.fluid.FluidModel`, one per VIP,
each DIP an M/M/1 queue at its true capacity) at the weights the VIP's load balancer confirmed
(the store's in-force record, as the probe worker stamps its rounds), and are written by
``writers`` child processes with the probe worker's own write path: ``put_measurements`` of one
round at a time, a bounded :class:`probes.buffer.RoundBuffer` kept across store outages, the same
keys. The controllers are real ``klb controller`` processes (the real control loop, the
``recording`` adapter as their load balancer) sharing the VIPs through leases on the store: one
Redis, a local Redis Cluster (3 masters, 3 replicas: :class:`knapsack_lb.lab.procs.RedisClusterServers`)
or an existing store named by URL.

What is measured, from the controllers' own status records (each pass publishes, per VIP it
stepped, when and on which round) and from outside the processes:

* ``time_to_all_planned_seconds``: from the controllers' start until every VIP has a plan;
* lag: step time minus the time of the newest round the step saw, p50/p99 per interval and overall;
* ``steps_per_cpu_second`` per controller process: the VIP steps of its passes after its first status
  over the CPU seconds it spent in those passes (its status's ``step_cpu_seconds``: the start-up imports
  and the first pass are left out, and each pass's steps are paired with that pass's CPU); its
  ``/proc/<pid>/stat`` CPU over the same window is ``process_cpu_seconds``;
* store operations per second (``total_commands_processed`` of every master, and the mean of
  ``instantaneous_ops_per_sec``) and memory per DIP (``used_memory`` after minus before, / DIPs),
  plus the per-key sizes (``MEMORY USAGE``) of a sample of VIPs from which the memory at the
  configured retention is computed (:func:`memory_at_retention`);
* rebalancing: a controller joins at ``join_at`` (time until it steps its share), one is
  SIGKILLed at ``kill_at`` (time until every VIP it stepped is stepped by another);
* with ``failover`` (cluster only) a master is SIGKILLed at ``failover_at``: rounds lost (written
  and acknowledged, then missing from the store, or never written) and VIPs without a step for more
  than two intervals across the failover.

Everything is bounded (``seconds`` of run, timeouts on every start and stop), runs on loopback,
is seeded, and every child process is stopped on the way out (also on Ctrl-C).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import multiprocessing
import os
import queue
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from knapsack_lb.controller.settings import ControllerSettings
from knapsack_lb.errors import InvalidInputError, KnapsackLBError
from knapsack_lb.lab.fleet import PAPER_CONTROLLER_VMS, PAPER_FLEET_SOLVE_SECONDS, Fleet, make_fleet
from knapsack_lb.lab.fluid import FluidDip, FluidModel, vip_config
from knapsack_lb.lab.procs import ManagedProcess, RedisClusterServers, RedisServer
from knapsack_lb.model import AdapterSpec, Measurement, ProbeSpec
from knapsack_lb.store import (
    CONTROLLER_STATUS,
    DEFAULT_PLAN_HISTORY,
    DEFAULT_RETENTION_COUNT,
    DEFAULT_RETENTION_SECONDS,
)
from knapsack_lb.store.redis import RedisLatencyStore

SMALL_FLEET = (100, 1000)
"""The default fleet (VIPs, DIPs): small enough for CI on two cores."""
FULL_FLEET = (3410, 60_000)
"""``--full``: the paper's section 6.7 fleet size (3,410 VIPs, 60,000 DIPs)."""
LB_NAME = "rec"
WRITE_CHUNK = 2000
"""Measurements per ``put_measurements`` call: one probe worker's round at most (docs/results/probes.md)."""
MEMORY_SAMPLE_VIPS = 24
POLL_TIMEOUT = 5.0


# --- pure statistics (unit-tested) ----------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One VIP stepped by one controller: when (wall seconds), on the round of which time, plan version."""

    vip: str
    controller: str
    at: float
    round_time: float | None
    version: int

    @property
    def lag(self) -> float | None:
        return None if self.round_time is None else self.at - self.round_time


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100, linear interpolation), ``None`` for no values."""
    return None if not values else float(np.percentile(np.asarray(values, dtype=np.float64), q))


def lag_by_interval(steps: Iterable[Step], start: float, interval: float) -> list[dict[str, Any]]:
    """Per interval since ``start``: its start (s), steps, distinct VIPs stepped, lag p50/p99 (s)."""
    buckets: dict[int, list[Step]] = defaultdict(list)
    for step in steps:
        if step.at >= start:
            buckets[int((step.at - start) // interval)].append(step)
    rows = []
    for index in sorted(buckets):
        lags = [s.lag for s in buckets[index] if s.lag is not None]
        rows.append({"t": round(index * interval, 3), "steps": len(buckets[index]),
                     "vips": len({s.vip for s in buckets[index]}),
                     "lag_p50": _round(percentile(lags, 50)), "lag_p99": _round(percentile(lags, 99))})
    return rows


def all_planned_at(steps: Iterable[Step], vips: Iterable[str]) -> float | None:
    """When every VIP in ``vips`` had stepped with a plan (version >= 1); ``None`` if one never did."""
    first: dict[str, float] = {}
    for step in steps:
        if step.version >= 1 and step.at < first.get(step.vip, math.inf):
            first[step.vip] = step.at
    wanted = set(vips)
    return max(first[v] for v in wanted) if wanted and wanted <= set(first) else None


def takeover_seconds(steps: Sequence[Step], victim: str, at: float) -> tuple[float | None, int]:
    """After ``victim`` stopped at ``at``: seconds until every VIP it last stepped before ``at`` was
    stepped by another controller (``None`` if one never was), and how many VIPs that was."""
    last_owner: dict[str, str] = {}
    for step in sorted(steps, key=lambda s: s.at):
        if step.at <= at:
            last_owner[step.vip] = step.controller
    orphans = {vip for vip, owner in last_owner.items() if owner == victim}
    taken: dict[str, float] = {}
    for step in steps:
        if step.at > at and step.vip in orphans and step.controller != victim:
            taken[step.vip] = min(taken.get(step.vip, math.inf), step.at)
    if not orphans:
        return 0.0, 0
    return (max(taken.values()) - at if set(taken) == orphans else None), len(orphans)


def joined_seconds(steps: Sequence[Step], joiner: str, at: float, until: float) -> tuple[float | None, int]:
    """After ``joiner`` started at ``at``: seconds until it had stepped the last of the VIPs it took
    before ``until`` (its first step of each), and how many VIPs it took."""
    first: dict[str, float] = {}
    for step in steps:
        if step.controller == joiner and at <= step.at < until:
            first[step.vip] = min(first.get(step.vip, math.inf), step.at)
    return (max(first.values()) - at if first else None), len(first)


def vips_without_step(steps: Sequence[Step], vips: Iterable[str], at: float, limit: float, end: float) -> list[str]:
    """VIPs whose last step before ``at`` and first step after it are more than ``limit`` seconds apart
    (no step after it until ``end``: the gap runs to ``end``)."""
    before: dict[str, float] = {}
    after: dict[str, float] = {}
    for step in steps:
        if step.at <= at:
            before[step.vip] = max(before.get(step.vip, -math.inf), step.at)
        else:
            after[step.vip] = min(after.get(step.vip, math.inf), step.at)
    return sorted(v for v in vips if after.get(v, end) - before.get(v, at) > limit)


@dataclass(frozen=True)
class KeySizes:
    """Bytes the store holds for a sample of VIPs (``MEMORY USAGE`` of each of their keys), by kind."""

    vips: int
    dips: int  # DIPs of the sampled VIPs
    rounds: int  # probe rounds stored (ZCARD summed over the sampled DIPs' measurement keys)
    round_bytes: int  # the measurement keys
    plan_bytes: float  # summed over the sampled VIPs: the mean size of one entry of the VIP's plan history
    fixed_bytes: int  # configuration, DIP index, newest round per DIP, curves, state, current plan, in-force weights
    evidence_entries: int = 0  # the learner's rounds kept in the sampled controller states (part of fixed_bytes)
    evidence_bytes: int = 0  # their JSON


@dataclass(frozen=True)
class MemoryEstimate:
    """Store bytes once retention is full: per DIP, and for ``dips`` DIPs."""

    bytes_per_round: float
    bytes_per_plan_per_dip: float
    fixed_bytes_per_dip: float
    retention_count: int
    plan_history: int
    bytes_per_dip: float
    dips: int
    total_bytes: float
    evidence_bytes_per_dip: float = 0.0  # the learner's evidence still to come until its window is full

    def to_dict(self) -> dict[str, Any]:
        return {
            "bytes_per_round": round(self.bytes_per_round, 1),
            "bytes_per_plan_per_dip": round(self.bytes_per_plan_per_dip, 2),
            "fixed_bytes_per_dip": round(self.fixed_bytes_per_dip, 1),
            "evidence_bytes_per_dip_to_come": round(self.evidence_bytes_per_dip, 1),
            "retention_count": self.retention_count, "plan_history": self.plan_history,
            "bytes_per_dip": round(self.bytes_per_dip), "dips": self.dips,
            "total_gib": round(self.total_bytes / 2**30, 3),
            "formula": "per DIP: bytes_per_round x retention_count + bytes_per_plan_per_dip x plan_history "
                       "+ fixed_bytes_per_dip + evidence_bytes_per_dip_to_come",
        }


def memory_at_retention(sizes: KeySizes, *, retention_count: int, plan_history: int, dips: int,
                        evidence_per_dip: float = 0.0) -> MemoryEstimate:
    """What the store holds once retention is full: every DIP keeps ``retention_count`` rounds, every
    VIP ``plan_history`` plans, and the fixed keys as sampled. A plan's size grows with its VIP's DIPs,
    so plans are counted per DIP (the sample's plan bytes over its DIPs); so are the fixed keys. The
    controller state grows until the learner's window is full: ``evidence_per_dip`` rounds of evidence
    per DIP then, at the sample's bytes per evidence entry, minus those already in the sample."""
    if sizes.dips < 1 or sizes.rounds < 1:
        raise InvalidInputError("sizes", sizes, "need at least one sampled DIP with a stored round")
    per_round = sizes.round_bytes / sizes.rounds
    per_plan_per_dip = sizes.plan_bytes / sizes.dips
    fixed = sizes.fixed_bytes / sizes.dips
    evidence = 0.0
    if sizes.evidence_entries:
        still = max(0.0, evidence_per_dip - sizes.evidence_entries / sizes.dips)
        evidence = still * sizes.evidence_bytes / sizes.evidence_entries
    per_dip = per_round * retention_count + per_plan_per_dip * plan_history + fixed + evidence
    return MemoryEstimate(per_round, per_plan_per_dip, fixed, retention_count, plan_history, per_dip, dips,
                          per_dip * dips, evidence)


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)
# --- the store, seen from outside ------------------------------------------------------------------------


def _node_replies(reply: Any) -> list[dict[str, Any]]:
    """A per-node reply of the cluster client (``{node: reply}``) or a plain client's reply, as a list."""
    if isinstance(reply, dict) and reply and all(isinstance(v, dict) for v in reply.values()) \
            and not any(k in reply for k in ("used_memory", "total_commands_processed")):
        return list(reply.values())
    return [reply]


async def store_counters(store: RedisLatencyStore) -> dict[str, float]:
    """``used_memory``, ``total_commands_processed`` and ``instantaneous_ops_per_sec`` summed over every
    master (one Redis: itself)."""
    client: Any = store.client
    if store.is_cluster:
        await client.initialize()
        nodes = client.get_primaries()
        memory = [await client.info("memory", target_nodes=node) for node in nodes]
        stats = [await client.info("stats", target_nodes=node) for node in nodes]
        memory, stats = [r for m in memory for r in _node_replies(m)], [r for s in stats for r in _node_replies(s)]
    else:
        memory, stats = [await client.info("memory")], [await client.info("stats")]
    return {
        "used_memory": float(sum(int(m.get("used_memory", 0)) for m in memory)),
        "commands": float(sum(int(s.get("total_commands_processed", 0)) for s in stats)),
        "ops_per_sec": float(sum(int(s.get("instantaneous_ops_per_sec", 0)) for s in stats)),
        "masters": float(len(memory)),
    }


VIP_FIXED_KEYS = ("config", "mdips", "latest", "curves", "state", "plan", "lb")


async def sample_key_sizes(store: RedisLatencyStore, fleet: Fleet, count: int = MEMORY_SAMPLE_VIPS) -> KeySizes:
    """``MEMORY USAGE`` (exact, ``SAMPLES 0``) of every key of ``count`` VIPs spread evenly over the
    fleet's size order, by kind (:class:`KeySizes`); ZCARD / LLEN for the entries they hold."""
    picks = sorted({int(i) for i in np.linspace(0, len(fleet.vips) - 1, min(count, len(fleet.vips)))})
    client: Any = store.client
    rounds = round_bytes = fixed = dips = entries = entry_bytes = 0
    plan_bytes = 0.0
    for index in picks:
        vip = fleet.vips[index]
        names = [d.name for d in vip.dips]
        mkeys = [store._mkey(vip.name, d) for d in names]
        fixed_keys = [store._vk(vip.name, part) for part in VIP_FIXED_KEYS]
        plans_key = store._vk(vip.name, "plans")
        async with client.pipeline(transaction=False) as pipe:
            for key in [*mkeys, *fixed_keys, plans_key]:
                pipe.memory_usage(key, samples=0)
            for key in mkeys:
                pipe.zcard(key)
            pipe.llen(plans_key)
            pipe.get(store._vk(vip.name, "state"))
            replies = await pipe.execute()
        state = replies.pop()
        if state:
            found = _evidence(json.loads(state))
            entries += len(found)
            entry_bytes += sum(len(json.dumps(e, separators=(",", ":"))) + 1 for e in found)
        usage = [int(r or 0) for r in replies[:len(mkeys) + len(fixed_keys) + 1]]
        counts = [int(r or 0) for r in replies[len(usage):]]
        round_bytes += sum(usage[:len(mkeys)])
        fixed += sum(usage[len(mkeys):len(mkeys) + len(fixed_keys)])
        rounds += sum(counts[:-1])
        if counts[-1]:
            plan_bytes += usage[-1] / counts[-1]
        dips += len(names)
    return KeySizes(len(picks), dips, rounds, round_bytes, plan_bytes, fixed, entries, entry_bytes)


def _evidence(data: Any) -> list[Any]:
    """Every entry of every ``evidence`` list in a stored controller state."""
    if isinstance(data, dict):
        found = list(data["evidence"]) if isinstance(data.get("evidence"), list) else []
        return found + [e for key, value in data.items() if key != "evidence" for e in _evidence(value)]
    if isinstance(data, list):
        return [e for value in data for e in _evidence(value)]
    return []


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` (``/proc/<pid>/stat``); ``None`` once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- the writers: fluid rounds through the probe worker's write path ------------------------------------


@dataclass(frozen=True)
class StoreTarget:
    """Where the store is: what a child process needs to open it."""

    url: str
    namespace: str
    cluster: bool = False
    startup_nodes: tuple[tuple[str, int], ...] = ()

    def open(self, **options: Any) -> RedisLatencyStore:
        return RedisLatencyStore.from_url(self.url, self.namespace, cluster=self.cluster,
                                          startup_nodes=self.startup_nodes, **options)

    def redis_block(self) -> dict[str, Any]:
        """The configuration file's ``redis`` block."""
        block: dict[str, Any] = {"url": self.url, "namespace": self.namespace}
        if self.cluster:
            block |= {"cluster": True, "startup_nodes": [f"{h}:{p}" for h, p in self.startup_nodes]}
        return block


@dataclass(frozen=True)
class WriterJob:
    """One writer process's share of the fleet and its timing (wall clock)."""

    index: int
    writers: int
    target: StoreTarget
    seed: int
    vips: int
    dips: int
    interval: float
    first_round: float
    end: float
    probe_requests: int
    max_buffered_rounds: int
    record_acks: bool


def fluid_models(fleet: Fleet, index: int, writers: int, seed: int, probe_requests: int) -> list[FluidModel]:
    """The fluid model of every ``writers``-th VIP from ``index``: each DIP an M/M/1 queue at its true capacity
    (the fleet's ``QueueingCurve`` without its fixed 0.5 ms base latency)."""
    return [FluidModel([FluidDip(d.name, 1, capacity) for d, capacity in zip(vip.dips, vip.capacities, strict=True)],
                       total_rate=vip.traffic, vip=vip.name, probe_requests=probe_requests, seed=seed * 100_003 + i)
            for i, vip in enumerate(fleet.vips) if i % writers == index]


def writer_main(job: WriterJob, results: Any) -> None:
    """Child process entry point: write rounds until ``job.end``; put a summary on ``results``."""
    with contextlib.suppress(KeyboardInterrupt):
        results.put(asyncio.run(_write_rounds(job, results)))


async def _write_rounds(job: WriterJob, results: Any) -> dict[str, Any]:
    from probes.buffer import RoundBuffer

    fleet = make_fleet(job.seed, shape="lognormal", vips=job.vips, dips=job.dips)
    models = fluid_models(fleet, job.index, job.writers, job.seed, job.probe_requests)
    store = job.target.open(socket_timeout=2.0)
    buffer = RoundBuffer(job.max_buffered_rounds)
    versions: dict[str, int] = {}
    acked: dict[tuple[str, float], int] = defaultdict(int)
    stats: dict[str, Any] = {"writer": job.index, "rounds": 0, "measurements_written": 0, "write_failures": 0,
                             "late": [], "cpu_seconds": 0.0, "vips": len(models),
                             "dips": sum(len(m.dips) for m in models)}
    cpu0 = time.process_time()

    async def in_force(model: FluidModel) -> None:
        try:
            record = await store.in_force(model.vip)
        except Exception:  # as the probe worker: a store error never ends the writer (a failover can
            return  # surface as a client error, not only as StoreUnavailableError)
        if record is not None and record.version != versions.get(model.vip):
            versions[model.vip] = record.version
            with contextlib.suppress(KnapsackLBError):
                model.set_weights(record.weights, time.time())

    async def flush() -> None:
        """The probe worker's flush: everything buffered in one call; kept for the next one if the store fails."""
        try:
            written = await buffer.write(store.put_measurements)
        except Exception:  # the probe worker's flush: keep the rounds, write them with the next ones
            stats["write_failures"] += 1
            return
        stats["measurements_written"] += len(written)
        if job.record_acks:
            for m in written:
                acked[(m.vip, m.time)] += 1

    k = 0
    try:
        while True:
            due = job.first_round + k * job.interval
            if due >= job.end:
                break
            await asyncio.sleep(max(0.0, due - time.time()))
            for model in models:  # one after another, as the probe worker reads them (the cluster client
                await in_force(model)  # is not safe for concurrent commands on one connection)
            measurements: list[Measurement] = []
            for model in models:
                measurements += model.measure(due, worker=f"fluid-{job.index}").values()
                if len(measurements) >= WRITE_CHUNK:  # one probe worker's round at most per write
                    buffer.push(measurements)
                    measurements = []
                    await flush()
            if measurements:
                buffer.push(measurements)
            await flush()
            stats["rounds"] += 1
            stats["late"].append(round(time.time() - due, 3))
            results.put({"writer": job.index, "round": k, "at": due})
            k = max(k + 1, math.ceil((time.time() - job.first_round) / job.interval))  # skip rounds it is too late for
        await flush()
    finally:
        await store.close()
    stats["cpu_seconds"] = round(time.process_time() - cpu0, 3)
    stats["unwritten_measurements"] = sum(1 for _ in buffer.peek_all())
    stats["dropped_measurements"] = buffer.dropped_measurements
    stats["acked"] = [[vip, t, n] for (vip, t), n in acked.items()] if job.record_acks else []
    return stats


# --- the run ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FleetBenchOptions:
    """One run of the benchmark (module docstring); times in seconds, fractions of ``seconds`` for events."""

    vips: int = SMALL_FLEET[0]
    dips: int = SMALL_FLEET[1]
    controllers: int = 2
    seconds: float = 60.0
    interval: float = 5.0
    lease_ttl: float | None = None  # None: the controller's default (loop.lease_ttl)
    seed: int = 0
    cluster: bool = False
    failover: bool = False
    redis: str | None = None
    redis_cluster: bool = False  # ``redis`` names a node of a Redis Cluster
    writers: int = 1
    join: bool = True
    kill: bool = True
    join_at: float = 0.25
    kill_at: float = 0.55
    failover_at: float = 0.4
    probe_requests: int = 100
    max_buffered_rounds: int = 1000
    retention_count: int = DEFAULT_RETENTION_COUNT
    retention_seconds: float = DEFAULT_RETENTION_SECONDS
    plan_history: int = DEFAULT_PLAN_HISTORY

    def __post_init__(self) -> None:
        if not 1 <= self.controllers <= 16:
            raise InvalidInputError("controllers", self.controllers, "must be in [1, 16]")
        if not 1 <= self.writers <= 16:
            raise InvalidInputError("writers", self.writers, "must be in [1, 16]")
        if not 0 < self.seconds <= 3600:
            raise InvalidInputError("seconds", self.seconds, "must be in (0, 3600]")
        if not 0.1 <= self.interval <= 600:
            raise InvalidInputError("interval", self.interval, "must be in [0.1, 600]")
        if self.failover and not (self.cluster or self.redis_cluster):
            raise InvalidInputError("failover", self.failover, "needs --cluster (a cluster master is killed)")
        if self.failover and self.redis is not None:
            raise InvalidInputError("failover", self.failover, "kills a master: only with the bench's own --cluster")
        if self.redis is not None and self.cluster:
            raise InvalidInputError("cluster", self.cluster, "starts a cluster: give --cluster or --redis")
        for name in ("join_at", "kill_at", "failover_at"):
            if not 0 < getattr(self, name) < 1:
                raise InvalidInputError(name, getattr(self, name), "must be a fraction of the run in (0, 1)")
        if self.kill and self.controllers + int(self.join) < 2:
            raise InvalidInputError("controllers", self.controllers, "killing one needs another to take over: "
                                    "use --controllers 2, --join or --no-kill")


@dataclass
class _Controller:
    ident: str
    process: ManagedProcess
    started: float
    first_pass: float | None = None
    cpu_first: float | None = None
    cpu_last: float | None = None
    last_pass: int = 0
    missed_passes: int = 0
    steps: int = 0
    killed_at: float | None = None
    pass_cpu_first: float | None = None  # the process's own CPU seconds in passes, at its first and last status
    pass_cpu_last: float | None = None
    rated_steps: int = 0  # steps of the passes after the first status (those the CPU seconds above paid for)

    def sample_cpu(self) -> None:
        cpu = process_cpu_seconds(self.process.pid) if self.process.alive() else None
        if cpu is not None:
            self.cpu_last = cpu


@dataclass
class _Run:
    options: FleetBenchOptions
    out: Path
    target: StoreTarget
    fleet: Fleet
    cluster: RedisClusterServers | None
    progress: Callable[[str, float, float], None]
    controllers: list[_Controller] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    ops_samples: list[float] = field(default_factory=list)

    def start_controller(self, index: int) -> _Controller:
        ident = f"fleet-c{index}"
        config = {
            "redis": self.target.redis_block(),
            "load_balancers": {LB_NAME: {"adapter": "recording"}},
            "controller": {"loop": {"interval": self.options.interval,
                                    **({"lease_ttl": self.options.lease_ttl} if self.options.lease_ttl else {})}},
            "probes": {"enabled": False},
            "api": {"enabled": False},
            "logging": {"level": "WARNING"},
        }
        path = self.out / f"{ident}.yaml"
        path.write_text(yaml.safe_dump(config))
        process = ManagedProcess([sys.executable, "-m", "knapsack_lb.cli.main", "controller", "--config", str(path),
                                  "--controller-id", ident], log_path=self.out / f"{ident}.log").start()
        controller = _Controller(ident, process, time.time())
        self.controllers.append(controller)
        return controller

    async def poll(self, store: RedisLatencyStore) -> None:
        """Read the controllers' status records; keep each pass's steps once."""
        try:
            statuses = await asyncio.wait_for(store.statuses(CONTROLLER_STATUS), POLL_TIMEOUT)
        except Exception:  # a failover in progress: read again at the next poll
            return
        by_id = {c.ident: c for c in self.controllers}
        for ident, status in statuses.items():
            controller = by_id.get(ident)
            passes = int(status.get("rounds", 0))
            if controller is None or passes <= controller.last_pass:
                continue
            first = controller.first_pass is None
            if first:
                controller.first_pass = float(status.get("time", time.time()))
                controller.cpu_first = process_cpu_seconds(controller.process.pid)
                controller.pass_cpu_first = float(status.get("step_cpu_seconds", 0.0))
            else:
                if passes > controller.last_pass + 1:
                    controller.missed_passes += passes - controller.last_pass - 1
                controller.rated_steps += len(status.get("stepped") or {})
                controller.pass_cpu_last = float(status.get("step_cpu_seconds", 0.0))
            controller.last_pass = passes
            for vip, (at, round_time, version) in (status.get("stepped") or {}).items():
                self.steps.append(Step(vip, ident, float(at), None if round_time is None else float(round_time),
                                       int(version)))
                controller.steps += 1
        for controller in self.controllers:
            if controller.killed_at is None:
                controller.sample_cpu()

    def event(self, kind: str, **detail: Any) -> None:
        self.events.append({"kind": kind, "at": time.time(), **detail})


async def _put_fleet(store: RedisLatencyStore, fleet: Fleet, interval: float,
                     progress: Callable[[str, float, float], None]) -> None:
    for done, vip in enumerate(fleet.vips, 1):
        await store.put_vip(vip_config(vip.name, [d.name for d in vip.dips], adapter=AdapterSpec(lb=LB_NAME),
                                       probe=ProbeSpec(interval=interval)))
        if done % 50 == 0 or done == len(fleet.vips):
            progress("configure", done, len(fleet.vips))


def run_fleet_bench(options: FleetBenchOptions, out: Path | None = None,
                    progress: Callable[[str, float, float], None] | None = None) -> dict[str, Any]:
    """Run the benchmark (module docstring); the result as a JSON-able dict, also written to
    ``out/fleet.json`` with the lag plot ``out/fleet.png`` (when matplotlib is installed)."""
    report = progress or (lambda phase, done, total: None)
    with contextlib.ExitStack() as stack:
        stack.enter_context(_sigterm_as_exit())
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="klb-fleet-")))
        out_dir = out or workdir / "out"
        out_dir.mkdir(parents=True, exist_ok=True)
        cluster = None
        namespace = f"fleet{options.seed}-{uuid.uuid4().hex[:6]}"
        if options.redis is not None:
            target = StoreTarget(options.redis, namespace, cluster=options.redis_cluster)
        elif options.cluster:
            cluster = stack.enter_context(RedisClusterServers(workdir / "cluster"))
            target = StoreTarget(cluster.url, namespace, cluster=True,
                                 startup_nodes=tuple((cluster.host, p) for p in cluster.ports[1:]))
        else:
            server = stack.enter_context(RedisServer(workdir / "redis"))
            target = StoreTarget(server.url, namespace)
        fleet = make_fleet(options.seed, shape="lognormal", vips=options.vips, dips=options.dips,
                           progress=_counter(lambda n: report("build", n, options.dips)))
        run = _Run(options, out_dir, target, fleet, cluster, report)
        try:
            result = asyncio.run(_run(run))
        finally:
            for controller in run.controllers:
                controller.process.stop()
        result["files"] = _write_outputs(result, out_dir)
        return result


@contextlib.contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    """SIGTERM raises SystemExit while the run lasts, so that the cleanup stops every child process
    (they run in sessions of their own and would not see the signal); Ctrl-C does the same by itself."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def leave(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    before = signal.signal(signal.SIGTERM, leave)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _counter(report: Callable[[int], None]) -> Callable[[int], None]:
    total = 0

    def add(n: int) -> None:
        nonlocal total
        total += n
        report(total)

    return add


async def _run(run: _Run) -> dict[str, Any]:
    options, fleet = run.options, run.fleet
    store = run.target.open(socket_timeout=2.0)
    writers: list[Any] = []
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    try:
        before = await store_counters(store)
        await _put_fleet(store, fleet, options.interval, run.progress)
        start_at = time.time() + 0.5
        first_round = math.ceil(start_at / options.interval) * options.interval
        end = first_round + options.seconds + options.interval
        jobs = [WriterJob(i, options.writers, run.target, options.seed, options.vips, options.dips, options.interval,
                          first_round, end, options.probe_requests, options.max_buffered_rounds,
                          record_acks=options.failover) for i in range(options.writers)]
        for job in jobs:
            process = context.Process(target=writer_main, args=(job, results), daemon=True)
            process.start()
            writers.append(process)
        summaries: list[dict[str, Any]] = []
        written = await _wait_rounds(results, options.writers, first_round + 120 + options.interval, summaries)
        if written < options.writers:
            raise KnapsackLBError(f"the writers did not write a first round ({written} of {options.writers}); "
                                  "see the store and the machine's load")
        for i in range(options.controllers):
            run.start_controller(i)
        start = time.time()
        run.event("start", controllers=options.controllers)
        stop_at = start + options.seconds
        counters_start = await store_counters(store)
        planned = False
        pending = {"join": options.join, "kill": options.kill, "failover": options.failover}
        while time.time() < stop_at:
            await asyncio.sleep(min(options.interval / 4, 0.5))
            _drain(results, summaries)
            await run.poll(store)
            elapsed = time.time() - start
            run.progress("run", min(elapsed, options.seconds), options.seconds)
            if not planned and all_planned_at(run.steps, (v.name for v in fleet.vips)) is not None:
                planned = True
            if pending["join"] and elapsed >= options.join_at * options.seconds:
                pending["join"] = False
                joiner = run.start_controller(len(run.controllers))
                run.event("join", controller=joiner.ident)
            if pending["kill"] and elapsed >= options.kill_at * options.seconds:
                pending["kill"] = False
                victim = run.controllers[0]
                victim.sample_cpu()
                victim.process.signal(9)
                victim.killed_at = time.time()
                run.event("sigkill", controller=victim.ident)
            if pending["failover"] and elapsed >= options.failover_at * options.seconds and run.cluster is not None:
                pending["failover"] = False
                port = (await asyncio.to_thread(run.cluster.master_ports))[0]
                await asyncio.to_thread(run.cluster.kill, port)
                run.event("failover", master_port=port)
            with contextlib.suppress(Exception):
                sample = await asyncio.wait_for(store_counters(store), POLL_TIMEOUT)
                run.ops_samples.append(sample["ops_per_sec"])
        await run.poll(store)
        end_time = time.time()
        counters_end = await store_counters(store)
        for controller in run.controllers:
            if controller.killed_at is None:
                controller.sample_cpu()
                controller.process.stop()
        deadline = time.time() + options.interval + 60
        while len(summaries) < options.writers and time.time() < deadline:
            _drain(results, summaries)
            await asyncio.sleep(0.1)
        sizes = await sample_key_sizes(store, fleet)
        lost = await _rounds_lost(store, summaries) if options.failover else None
        return _result(run, start, end_time, before, counters_start, counters_end, summaries, sizes, lost)
    finally:
        for process in writers:
            process.join(timeout=1.0)
            if process.is_alive():
                process.terminate()
                process.join(timeout=5.0)
        if options.redis is not None:
            with contextlib.suppress(KnapsackLBError):
                for vip in fleet.vips:
                    await store.delete_vip(vip.name)
        await store.close()


def _drain(results: Any, summaries: list[dict[str, Any]]) -> int:
    """Take the writers' messages; keep their final summaries; the number of round messages taken."""
    rounds = 0
    while True:
        try:
            message = results.get_nowait()
        except queue.Empty:
            return rounds
        if "acked" in message:
            summaries.append(message)
        else:
            rounds += 1


async def _wait_rounds(results: Any, writers: int, deadline: float, summaries: list[dict[str, Any]]) -> int:
    """Wait until every writer wrote its first round (or ``deadline``); how many did."""
    seen: set[int] = set()
    while len(seen) < writers and time.time() < deadline:
        try:
            message = await asyncio.to_thread(results.get, True, 0.5)
        except queue.Empty:
            continue
        if "acked" in message:
            summaries.append(message)
        else:
            seen.add(int(message["writer"]))
    return len(seen)


async def _rounds_lost(store: RedisLatencyStore, summaries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Rounds the writers had acknowledged by the store and that are not (all) in it now, plus those
    never written (still buffered or dropped at the end)."""
    acked: dict[str, dict[float, int]] = defaultdict(dict)
    for summary in summaries:
        for vip, at, n in summary["acked"]:
            acked[vip][float(at)] = int(n)
    lost_rounds = lost_measurements = 0
    for vip, rounds in acked.items():
        stored: dict[float, int] = defaultdict(int)
        for m in await store.measurements(vip):
            stored[m.time] += 1
        for at, n in rounds.items():
            missing = max(0, n - stored.get(at, 0))
            lost_measurements += missing
            lost_rounds += missing > 0
    return {"acknowledged_then_missing_rounds": lost_rounds,
            "acknowledged_then_missing_measurements": lost_measurements,
            "never_written_measurements": sum(int(s["unwritten_measurements"]) + int(s["dropped_measurements"])
                                              for s in summaries),
            "acknowledged_rounds": sum(len(r) for r in acked.values())}


def _result(run: _Run, start: float, end: float, before: Mapping[str, float], counters_start: Mapping[str, float],
            counters_end: Mapping[str, float], summaries: Sequence[Mapping[str, Any]], sizes: KeySizes,
            lost: Mapping[str, Any] | None) -> dict[str, Any]:
    options, fleet = run.options, run.fleet
    interval = options.interval
    names = [v.name for v in fleet.vips]
    steps = [s for s in run.steps if s.at >= start]
    lags = [s.lag for s in steps if s.lag is not None]
    per_interval = lag_by_interval(steps, start, interval)
    planned = all_planned_at(steps, names)
    events = {e["kind"]: e for e in run.events}
    rebalance: dict[str, Any] = {}
    if "join" in events:
        until = events["sigkill"]["at"] if "sigkill" in events else end
        seconds, moved = joined_seconds(steps, events["join"]["controller"], events["join"]["at"], until)
        rebalance["join"] = {"seconds": _round(seconds, 2), "vips_moved": moved,
                             "intervals": _round(None if seconds is None else seconds / interval, 2)}
    if "sigkill" in events:
        seconds, orphans = takeover_seconds(steps, events["sigkill"]["controller"], events["sigkill"]["at"])
        rebalance["sigkill"] = {
            "seconds": _round(seconds, 2), "intervals": _round(None if seconds is None else seconds / interval, 2),
            "vips_of_killed_controller": orphans,
            "within_two_intervals": None if seconds is None else seconds <= 2 * interval,
            "lease_ttl": options.lease_ttl, "note": "a dead controller's VIPs are free once its leases expire "
            "(loop.lease_ttl) and are taken at the others' next pass: expected within lease_ttl + one interval",
        }
    failover = None
    if "failover" in events:
        at = events["failover"]["at"]
        late = vips_without_step(steps, names, at, 2 * interval, end)
        failover = {"killed_master_port": events["failover"]["master_port"],
                    "vips_without_step_over_two_intervals": len(late), "examples": late[:10],
                    "write_failures": sum(int(s["write_failures"]) for s in summaries), **(lost or {})}
    window = end - start
    per_controller: list[dict[str, Any]] = []
    for c in run.controllers:
        cpu = None if c.cpu_first is None or c.cpu_last is None else c.cpu_last - c.cpu_first
        in_passes = None if c.pass_cpu_first is None or c.pass_cpu_last is None else c.pass_cpu_last - c.pass_cpu_first
        mine = [s for s in steps if s.controller == c.ident]
        per_controller.append({
            "id": c.ident, "steps": len(mine), "vips": len({s.vip for s in mine}),
            "rated_steps": c.rated_steps, "cpu_seconds": _round(in_passes, 2), "process_cpu_seconds": _round(cpu, 2),
            "steps_per_cpu_second": _round(c.rated_steps / in_passes if in_passes else None, 1),
            "missed_passes": c.missed_passes, "killed": c.killed_at is not None,
        })
    cpu_total = sum(float(c["cpu_seconds"] or 0.0) for c in per_controller)
    rated_total = sum(int(c["rated_steps"]) for c in per_controller)
    coverage = [row["vips"] / len(names) for row in per_interval[1:-1]]  # whole intervals only
    used = counters_end["used_memory"] - before["used_memory"]
    rounds_per_dip = sizes.rounds / sizes.dips if sizes.dips else 0.0
    estimate = retention_estimate(sizes, options, fleet.dip_count)
    writers = {
        "processes": options.writers, "rounds": sum(int(s["rounds"]) for s in summaries),
        "measurements_written": sum(int(s["measurements_written"]) for s in summaries),
        "write_failures": sum(int(s["write_failures"]) for s in summaries),
        "cpu_seconds": round(sum(float(s["cpu_seconds"]) for s in summaries), 2),
        "lateness_p99_seconds": _round(percentile([x for s in summaries for x in s["late"]], 99), 3),
    }
    return {
        "benchmark": "fleet",
        "fleet": {"shape": "lognormal", "seed": options.seed, "vips": len(names), "dips": fleet.dip_count,
                  "largest_vip": fleet.largest_vip, "median_vip": float(np.median([len(v.dips) for v in fleet.vips]))},
        "store": "redis-cluster (3 masters, 3 replicas, local)" if options.cluster else
                 ("existing " + ("Redis Cluster" if options.redis_cluster else "Redis")) if options.redis else
                 "redis (one server, local)",
        "settings": {"controllers": options.controllers, "writers": options.writers, "seconds": options.seconds,
                     "interval": interval, "lease_ttl": options.lease_ttl, "probe_requests": options.probe_requests,
                     "join": options.join, "kill": options.kill, "failover": options.failover},
        "time_to_all_planned_seconds": _round(None if planned is None else planned - start, 2),
        "lag": {"steps": len(steps), "p50_seconds": _round(percentile(lags, 50)),
                "p99_seconds": _round(percentile(lags, 99)), "max_seconds": _round(max(lags, default=None)),
                "p99_under_one_interval": None if not lags else bool(float(np.percentile(lags, 99)) < interval),
                "per_interval": per_interval},
        "coverage": {"whole_intervals": len(coverage),
                     "intervals_every_vip_stepped": sum(1 for c in coverage if c >= 1.0),
                     "min_share_of_vips_stepped": _round(min(coverage, default=None), 3)},
        "controllers": per_controller,
        "steps_per_cpu_second": _round(rated_total / cpu_total if cpu_total else None, 1),
        "steps_per_cpu_second_note": "steps of every pass after a process's first status over the CPU seconds "
                                     "the process spent in those passes (its status's step_cpu_seconds); "
                                     "process_cpu_seconds is /proc user + system over the same window",
        "store_ops": {"ops_per_second": round((counters_end["commands"] - counters_start["commands"]) / window, 1),
                      "instantaneous_ops_per_sec_mean": _round(float(np.mean(run.ops_samples))
                                                               if run.ops_samples else None, 1),
                      "note": "every command the store ran in the run: writers, controllers and this benchmark's "
                              "polling; after a failover the killed master's count is gone"},
        "memory": {"used_memory_delta_bytes": int(used), "bytes_per_dip_measured": round(used / fleet.dip_count),
                   "rounds_per_dip_stored": round(rounds_per_dip, 1),
                   "sample": {"vips": sizes.vips, "dips": sizes.dips, "rounds": sizes.rounds},
                   "at_retention": estimate.to_dict()},
        "rebalance": rebalance,
        "failover": failover,
        "writers": writers,
        "events": [{**e, "t": round(e["at"] - start, 2)} for e in run.events],
        "paper": {"what": "KnapsackLB section 6.7: ILP for every VIP of a 60,000-DIP fleet on one 8-core VM",
                  "seconds_on_8_core_vm": PAPER_FLEET_SOLVE_SECONDS,
                  "controller_vms_to_resolve_every_5_s": PAPER_CONTROLLER_VMS},
    }


def retention_estimate(sizes: KeySizes, options: FleetBenchOptions, dips: int) -> MemoryEstimate:
    """The store's size once full at the controller's default interval: rounds kept per DIP are
    ``min(retention_count, retention_age / interval)``, the learner's evidence ``window / interval + 1``."""
    defaults = ControllerSettings()
    interval = defaults.loop.interval
    kept = min(options.retention_count, int(options.retention_seconds // interval))
    return memory_at_retention(sizes, retention_count=kept, plan_history=options.plan_history, dips=dips,
                               evidence_per_dip=defaults.learning.window // interval + 1)


def cores_needed(steps_per_cpu_second: float, vips: int, interval: float) -> float:
    """Cores of controller processes that step ``vips`` VIPs once per ``interval`` at this rate."""
    if steps_per_cpu_second <= 0 or interval <= 0:
        raise InvalidInputError("steps_per_cpu_second", steps_per_cpu_second, "must be > 0 (and interval > 0)")
    return vips / interval / steps_per_cpu_second


def _write_outputs(result: dict[str, Any], out: Path) -> dict[str, str]:
    files = {"json": str(out / "fleet.json")}
    (out / "fleet.json").write_text(json.dumps(result, indent=2) + "\n")
    with contextlib.suppress(ImportError):
        plot_lag(result, out / "fleet.png")
        files["png"] = str(out / "fleet.png")
    return files


def plot_lag(result: Mapping[str, Any], path: Path) -> None:
    """Lag p50/p99 per interval and the share of VIPs stepped, with the run's events marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["lag"]["per_interval"]
    interval = result["settings"]["interval"]
    t = [r["t"] for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True, height_ratios=(2, 1))
    top.plot(t, [r["lag_p50"] for r in rows], drawstyle="steps-post", label="lag p50")
    top.plot(t, [r["lag_p99"] for r in rows], drawstyle="steps-post", label="lag p99")
    top.axhline(interval, color="grey", linestyle=":", label=f"one interval ({interval:g} s)")
    top.set_ylabel("round -> step lag (s)")
    bottom.plot(t, [r["vips"] / result["fleet"]["vips"] for r in rows], drawstyle="steps-post", color="tab:green")
    bottom.set_ylabel("VIPs stepped\n(share, per interval)")
    bottom.set_xlabel("seconds since the controllers started")
    colours = {"join": "tab:blue", "sigkill": "tab:red", "failover": "tab:purple"}
    for event in result["events"]:
        if event["kind"] in colours:
            for axis in (top, bottom):
                axis.axvline(event["t"], color=colours[event["kind"]], linestyle="--")
            top.annotate(event["kind"], (event["t"], top.get_ylim()[1]), rotation=90, va="top", ha="right",
                         color=colours[event["kind"]], fontsize=8)
    fleet = result["fleet"]
    top.set_title(f"klb bench fleet: {fleet['vips']} VIPs / {fleet['dips']} DIPs, "
                  f"{result['settings']['controllers']} controllers, {result['store']}", fontsize=9)
    top.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

