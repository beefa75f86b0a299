"""The probe worker: the paper's KLM (KnapsackLB sections 3.2, 5 "KLM" and 6.7).

Every probe interval of a VIP (``ProbeSpec.interval``, default 5 s) each of its DIPs gets
``requests_per_round`` requests (default 100), or the number the VIP's probe budget gives it (the
controller's allocation, :mod:`knapsack_lb.controller.budget`; see "The probe budget" below), sent
straight to the DIP's address,
bypassing the load balancer, sequentially per DIP on one kept-alive connection and
concurrently across DIPs (at most ``max_concurrency`` requests in flight at once). A DIP's
requests are spread over the round (``ProbeSpec.spread`` of the interval, default 0.8; 0
sends them back to back): that share of the interval is cut into as many
equal slots as there are requests and each goes out at a uniformly random time in its slot
(stratified sampling, :func:`send_times`), or as soon as the one before it has answered.
Requests sent back to back see one state of the DIP's queue, so their mean varies from round
to round far more than their own spread says; requests at random times
see the DIP's time average (random sampling, "Framework for IP Performance Metrics",
RFC 2330 section 11.1), and one per slot leaves no long gap unmeasured. Each request is timed from
just before it is written to the arrival of the last byte of the body at the probe's
socket (the kernel's receive timestamp where there is one, so the worker's own wake-up
delay is not counted: :mod:`probes.http_client`).
Timeouts (``ProbeSpec.timeout``, default 1 s), connection errors and unexpected statuses
are counted and timed as failures. A DIP's round stops sending when the interval is over
(so a DIP that times out every request costs at most one interval, and ``sent`` says how
many went out). One :class:`~knapsack_lb.model.Measurement` per DIP per round, stamped
with the wall-clock time the round started and the weight the VIP's load balancer confirmed
it carries for the DIP (the store's in-force record, written by the controller after the LB
confirmed a plan; read at every refresh, so a slow store never delays a round; an equal split
before anything was confirmed), is written to the store in one pipeline.

Light requests: where the VIP names a fixed-work URL on its DIPs (``ProbeSpec.light_path``), each
DIP also gets ``light_requests_per_round`` requests to it every round, spread over the same part of
the interval at their own random times, on a second kept-alive connection (so one never waits
behind a probe of this worker), timed the same way; the round carries what they answered whole
(``Measurement.light_latencies``, ``light_failures``). Their time above their own unloaded latency is
queueing, which shows how busy a many-worker DIP is long before its mean latency rises
(:mod:`knapsack_lb.controller.waiting`).

Sharing DIPs among workers: every worker heartbeats, per VIP it serves, into the group
``probes.<vip>`` (so a worker started with ``--vip a`` is never handed DIPs of VIP ``b``)
and, each ``refresh_interval``, computes which DIPs it should own by rendezvous hashing
over that VIP's live members (:mod:`probes.assignment`); it probes a DIP only while it holds the DIP's
lease (``acquire_lease`` renews it; TTL ``lease_ttl``). A killed worker's heartbeat and
leases expire after ``lease_ttl``; the survivors then win its DIPs by hashing and lease
them at their next refresh, and probe them from their next round. With the defaults
(``lease_ttl`` = 0.5 x the shortest interval, refresh = ``lease_ttl`` / 3) a dead
worker's DIPs are measured again within two intervals. A new worker takes DIPs over as
their current owners release them at their next refresh (rebalancing within about two
refreshes).

The probe budget: the controller stores, per VIP, how many requests each DIP gets per round
(more where its latency is least known, the VIP's total kept, at most a few percent of a DIP's
capacity) with a TTL of a few intervals. The worker reads it with the in-force weights at a
refresh, at most once per VIP per probe interval, and keeps it between reads; a DIP with no valid
entry gets ``requests_per_round``, and so does every DIP when no budget is stored (expired: no
live controller, or the ``uniform`` allocation), when it is unreadable, or when the last read is
older than ``BUDGET_STALE_INTERVALS`` intervals (the store is down). A value that is not an
integer from 1 to the VIP's total (``requests_per_round`` x DIPs) is ignored with a warning that
names the field and the value (:func:`valid_budget`).

Redis outages: the worker keeps probing the DIPs it had, holds finished rounds in a
bounded buffer (``max_buffered_rounds``, oldest dropped beyond it, counted and logged),
retries with exponential backoff (``backoff_initial`` doubling to ``backoff_max``) and
writes everything buffered in one pipeline when Redis answers again. Store errors never
end the worker. While Redis is down, leases cannot be renewed; two workers may then probe
one DIP for a round or two after it returns, until leases settle. A stop never waits on a store
that hangs: a refresh in flight is cancelled, the buffered rounds get ``STOP_FLUSH_SECONDS`` to be
written and the leases ``STOP_RELEASE_SECONDS`` to be handed back (else they expire), well
within the service's stop grace (a hung Redis holds each store call for its socket timeout, once per
attempt).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from knapsack_lb.clock import Clock, SystemClock, unless_stopped, wait_unless_stopped, within
from knapsack_lb.errors import InvalidInputError
from knapsack_lb.model import Measurement, VipConfig
from knapsack_lb.names import validate_name
from knapsack_lb.rounds import RoundSamples, summarise
from knapsack_lb.store import PROBE_STATUS, LatencyStore, is_request_count
from probes.assignment import assigned_to
from probes.buffer import RoundBuffer
from probes.http_client import KeepAliveClient, ProbeConnectionError, ProbeTimeout
from probes.targets import ProbeTarget, build_targets

log = logging.getLogger(__name__)

PROBE_GROUP = "probes"
STATUS_COMPONENT = PROBE_STATUS
BUDGET_STALE_INTERVALS = 3  # a budget read longer ago than this many intervals is not used (store down)
STOP_FLUSH_SECONDS = 5.0  # on a stop, the buffered rounds' last write may take this long
STOP_RELEASE_SECONDS = 2.0  # on a stop, handing the leases back may take this long (the TTL frees them else)


def vip_group(group: str, vip: str) -> str:
    """The membership group of the workers probing ``vip``: ``<group>.<vip>`` (hashed if too long)."""
    name = f"{group}.{vip}"
    if len(name) > 63:
        name = f"{group}.{hashlib.blake2b(vip.encode(), digest_size=10).hexdigest()}"
    return validate_name("group", name)


@dataclass(frozen=True)
class ProbeWorkerOptions:
    """A worker's own settings (per-VIP probe settings live in each VIP's ``ProbeSpec``)."""

    worker_id: str
    group: str = PROBE_GROUP
    vips: tuple[str, ...] = ()  # only these VIPs; empty = every VIP in the store
    max_buffered_rounds: int = 1000
    lease_ttl: float | None = None  # None: 0.5 x the shortest probe interval (at least 0.2 s)
    refresh_interval: float | None = None  # None: lease_ttl / 3
    max_concurrency: int = 256
    backoff_initial: float = 0.1
    backoff_max: float = 5.0
    resolve_hosts: bool = True

    def __post_init__(self) -> None:
        validate_name("worker_id", self.worker_id)
        validate_name("group", self.group)
        for vip in self.vips:
            validate_name("vip", vip)
        if self.max_buffered_rounds < 1:
            raise InvalidInputError("max_buffered_rounds", self.max_buffered_rounds, "must be >= 1")
        if self.max_concurrency < 1:
            raise InvalidInputError("max_concurrency", self.max_concurrency, "must be >= 1")
        for name in ("lease_ttl", "refresh_interval"):
            value = getattr(self, name)
            if value is not None and (not math.isfinite(value) or value <= 0):
                raise InvalidInputError(name, value, "must be a number of seconds > 0")
        if not 0 < self.backoff_initial <= self.backoff_max:
            raise InvalidInputError("backoff_initial", self.backoff_initial, "must be > 0 and <= backoff_max")


@dataclass
class WorkerStats:
    """Counters of one worker since it started (published as its status)."""

    rounds: int = 0
    requests: int = 0
    successes: int = 0
    failures: int = 0
    measurements_written: int = 0
    rounds_buffered: int = 0
    dropped_rounds: int = 0
    dropped_measurements: int = 0
    store_errors: int = 0
    owned_dips: int = 0
    live_members: int = 0
    cpu_seconds: float = 0.0
    started_at: float = 0.0
    kernel_timestamped: int = 0  # responses timed by the kernel's receive timestamp (probes.http_client)
    read_delay_seconds: float = 0.0  # the probe's own wake-up delay, left out of those latencies


@dataclass
class _VipState:
    config: VipConfig
    targets: dict[str, ProbeTarget]
    weights: dict[str, float] = field(default_factory=dict)
    next_round: float = 0.0
    running: asyncio.Task[None] | None = None
    budget: dict[str, int] = field(default_factory=dict)  # requests per DIP per round; {}: uniform
    budget_read_at: float = -math.inf  # when the budget was read (the worker's clock)


def valid_budget(config: VipConfig, raw: object, warned: set[tuple[str, str, str]] | None = None) -> dict[str, int]:
    """The entries of a stored probe budget that can be used for ``config``'s DIPs: integers from 1 to
    the VIP's total (``requests_per_round`` x DIPs). Any other value is ignored with a warning naming
    the field (``budget.<dip>``) and the value (once per value when ``warned`` collects them); a budget
    that is not a JSON object is ignored whole. Entries of DIPs not in the VIP are dropped."""
    warned = set() if warned is None else warned

    def warn(field_name: str, value: object) -> None:
        key = (config.name, field_name, repr(value)[:100])
        if key not in warned:
            warned.add(key)
            log.warning("probe budget value ignored: %s = %s (want an integer from 1 to %d); "
                        "requests_per_round is used", field_name, repr(value)[:100], total,
                        extra={"vip": config.name, "field": field_name, "value": repr(value)[:100]})

    total = config.probe.requests_per_round * len(config.dips)
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        warn("budget", raw)
        return {}
    dips = {d.name for d in config.dips}
    budget = {}
    for dip, count in raw.items():
        if dip not in dips:
            continue
        if not is_request_count(count, total):
            warn(f"budget.{dip}", count)
            continue
        budget[dip] = count
    return budget


def send_times(start: float, span: float, count: int, rng: random.Random) -> list[float]:
    """When each of ``count`` requests of a round goes out: ``span`` seconds from ``start`` cut into
    ``count`` equal slots, one uniformly random time in each (sorted; all at ``start`` when
    ``span`` is 0)."""
    slot = span / count if count > 0 else 0.0
    return [start + (i + rng.random()) * slot for i in range(count)]


async def probe_target(client: KeepAliveClient, target: ProbeTarget, deadline: float,
                       requests: int | None = None, *, send_at: Sequence[float] = (),
                       in_flight: asyncio.Semaphore | None = None) -> RoundSamples:
    """Send up to ``requests`` (default ``requests_per_round``) requests one after another until
    ``deadline`` (perf_counter), each no sooner than its time in ``send_at`` (perf_counter; none:
    back to back), holding ``in_flight`` while a request is out."""
    samples = RoundSamples()
    expected = target.spec.expected_status
    for index in range(target.spec.requests_per_round if requests is None else requests):
        if index < len(send_at) and (wait := send_at[index] - time.perf_counter()) > 0:
            await asyncio.sleep(min(wait, max(deadline - time.perf_counter(), 0.0)))
        async with in_flight or contextlib.nullcontext():
            started = time.perf_counter()  # a wait for an in-flight slot is not the DIP's time
            if started >= deadline:
                break
            try:
                response = await client.request()
            except ProbeTimeout:
                samples.add_timeout(time.perf_counter() - started)
            except ProbeConnectionError:
                samples.add_error("connection", time.perf_counter() - started)
            else:
                if response.status == expected:
                    samples.success_latencies.append(response.latency)
                else:
                    samples.add_error(f"status_{response.status}", response.latency)
    return samples


class ProbeWorker:
    """One KLM worker (see the module docstring). ``await run(stop)`` until ``stop`` is set."""

    def __init__(
        self,
        store: LatencyStore,
        options: ProbeWorkerOptions,
        *,
        clock: Clock | None = None,
        wall: Callable[[], float] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self.rng = rng or random.Random()  # the requests' send times within a round
        self.options = options
        self.clock: Clock = clock or SystemClock()
        self.wall: Callable[[], float] = wall or SystemClock().wall
        self.stats = WorkerStats()
        self.buffer = RoundBuffer(options.max_buffered_rounds)
        self.owned: set[str] = set()  # resources ("vip:dip") whose lease this worker holds
        self._vips: dict[str, _VipState] = {}
        self._clients: dict[str, tuple[ProbeTarget, KeepAliveClient]] = {}
        self._semaphore = asyncio.Semaphore(options.max_concurrency)
        self._flush_wanted = asyncio.Event()
        self._store_ok = True
        self._cpu_start = time.process_time()
        self._budget_warned: set[tuple[str, str, str]] = set()

    # --- timing knobs ------------------------------------------------------------------------
    def _shortest_interval(self) -> float:
        return min((s.config.probe.interval for s in self._vips.values()), default=5.0)

    @property
    def lease_ttl(self) -> float:
        if self.options.lease_ttl is not None:
            return self.options.lease_ttl
        return max(0.2, 0.5 * self._shortest_interval())

    @property
    def refresh_interval(self) -> float:
        return self.options.refresh_interval or self.lease_ttl / 3.0

    # --- store access that never raises ----------------------------------------------------
    def _store_failed(self, what: str, error: BaseException) -> None:
        self.stats.store_errors += 1
        if self._store_ok:
            log.warning("latency store unreachable; probing goes on, rounds are buffered",
                        extra={"worker": self.options.worker_id, "operation": what, "error": repr(error)})
        self._store_ok = False

    def _store_recovered(self) -> None:
        if not self._store_ok:
            log.info("latency store reachable again", extra={"worker": self.options.worker_id})
        self._store_ok = True

    # --- configuration and leases ---------------------------------------------------------------
    async def load_configs(self) -> None:
        """Read VIP configs from the store and rebuild targets; a bad VIP is logged and skipped."""
        names = list(self.options.vips) or await self.store.list_vips()
        seen = set()
        for name in names:
            try:
                config = await self.store.get_vip(name)
            except ValueError as bad:  # a stored config that no longer validates: skip that VIP only
                log.error("stored VIP config refused: %s", bad, extra={"vip": name, "worker": self.options.worker_id})
                continue
            if config is None:
                continue
            seen.add(name)
            state = self._vips.get(name)
            if state is not None and state.config == config:
                continue
            try:
                targets = build_targets(config, resolve=self.options.resolve_hosts)
            except InvalidInputError as bad:
                log.error("VIP refused: %s", bad, extra={"vip": name, "worker": self.options.worker_id})
                continue
            new_state = _VipState(config, {t.dip: t for t in targets})
            if state is not None:
                new_state.next_round, new_state.running, new_state.weights = (
                    state.next_round, state.running, state.weights)
                new_state.budget, new_state.budget_read_at = state.budget, state.budget_read_at
            self._vips[name] = new_state
        for gone in set(self._vips) - seen:
            del self._vips[gone]

    def _all_resources(self) -> dict[str, ProbeTarget]:
        return {t.resource: t for s in self._vips.values() for t in s.targets.values()}

    async def refresh(self) -> None:
        """One membership tick: configs, heartbeat, rendezvous assignment, lease renew/release."""
        opts = self.options
        await self.load_configs()
        resources = self._all_resources()
        wanted: set[str] = set()
        members: set[str] = set()
        for vip, state in self._vips.items():
            group = vip_group(opts.group, vip)
            await self.store.heartbeat(group, opts.worker_id, ttl=self.lease_ttl)
            live = await self.store.live_members(group)
            members.update(live)
            wanted |= assigned_to(opts.worker_id, [t.resource for t in state.targets.values()], live)
        for resource in sorted(self.owned - wanted):
            await self.store.release_lease(opts.group, resource, opts.worker_id)
            self.owned.discard(resource)
        for resource in sorted(wanted):
            if await self.store.acquire_lease(opts.group, resource, opts.worker_id, ttl=self.lease_ttl):
                if resource not in self.owned:
                    log.info("lease taken", extra={"worker": opts.worker_id, "resource": resource})
                self.owned.add(resource)
            else:
                self.owned.discard(resource)
        self.owned &= set(resources)
        for key, (target, _) in list(self._clients.items()):
            if target.resource not in self.owned or target != resources.get(target.resource):
                self._clients.pop(key)[1].close()
        await self.refresh_weights()
        await self.refresh_budgets()
        self.stats.owned_dips = len(self.owned)
        self.stats.live_members = len(members | {opts.worker_id})
        self._store_recovered()

    async def publish_status(self) -> None:
        self.stats.cpu_seconds = time.process_time() - self._cpu_start
        self.stats.rounds_buffered = len(self.buffer)
        status = asdict(self.stats) | {"owned": sorted(self.owned)}
        await self.store.put_status(STATUS_COMPONENT, self.options.worker_id, status, ttl=max(2 * self.lease_ttl, 1.0))

    # --- rounds ----------------------------------------------------------------------------------------
    def _client(self, target: ProbeTarget, *, light: bool = False) -> KeepAliveClient:
        """The kept-alive connection of ``target``'s probes, or of its light requests (a connection of
        their own, so a light request never waits behind a probe of this worker)."""
        key = f"{target.resource}:light" if light else target.resource
        held = self._clients.get(key)
        if held is None or held[0] != target:
            if held is not None:
                held[1].close()
            spec = target.spec
            path = spec.light_path if light and spec.light_path is not None else spec.path
            client = KeepAliveClient(target.host, target.port, method=spec.method, path=path,
                                     headers=dict(spec.headers), timeout=spec.timeout)
            self._clients[key] = (target, client)
            return client
        return held[1]

    async def refresh_weights(self) -> None:
        """Read the weights each VIP's LB confirmed it carries: what rounds record (kept on store errors)."""
        for state in list(self._vips.values()):
            try:
                in_force = await self.store.in_force(state.config.name)
            except (ValueError, KeyError) as bad:
                log.error("stored in-force weights refused: %s", bad, extra={"vip": state.config.name})
                continue
            if in_force is not None:
                state.weights = {dip: float(in_force.weights.get(dip, 0.0)) for dip in state.targets}
            else:
                state.weights = {}

    async def refresh_budgets(self) -> None:
        """Read each VIP's probe budget when the last read is one probe interval old (at most one read
        per VIP per round); unreadable, it is dropped (uniform) with a warning. Store outages raise,
        and the last budget read is kept until it is stale (:meth:`requests_for`)."""
        now = self.clock.now()
        for state in list(self._vips.values()):
            if now - state.budget_read_at < state.config.probe.interval:
                continue
            try:
                raw = await self.store.probe_budget(state.config.name)
            except ValueError as bad:  # not JSON: a writer that is not the controller
                log.warning("stored probe budget unreadable; requests_per_round is used: %s", bad,
                            extra={"vip": state.config.name, "field": "budget"})
                raw = None
            state.budget = valid_budget(state.config, raw, self._budget_warned)
            state.budget_read_at = now

    def requests_for(self, vip: str, dip: str) -> int:
        """How many requests ``dip`` of ``vip`` gets this round: its budget entry, else (none, or a
        budget older than ``BUDGET_STALE_INTERVALS`` intervals) ``requests_per_round``."""
        state = self._vips[vip]
        uniform = state.config.probe.requests_per_round
        if self.clock.now() - state.budget_read_at > BUDGET_STALE_INTERVALS * state.config.probe.interval:
            return uniform
        return state.budget.get(dip, uniform)

    @staticmethod
    def _weights(state: _VipState) -> dict[str, float]:
        """The confirmed weights, or an equal split (the LB's default) before any was confirmed."""
        if state.weights:
            return state.weights
        equal = 1.0 / len(state.targets) if state.targets else 0.0
        return {dip: equal for dip in state.targets}

    async def probe_round(self, vip: str) -> list[Measurement]:
        """Probe every owned DIP of ``vip`` once (one round) and buffer the measurements for writing."""
        state = self._vips[vip]
        targets = [t for t in state.targets.values() if t.resource in self.owned]
        if not targets:
            return []
        started_wall = self.wall()
        spec = state.config.probe
        started = time.perf_counter()
        deadline = started + spec.interval
        weights = self._weights(state)

        async def one(target: ProbeTarget, light: bool = False) -> RoundSamples:
            client = self._client(target, light=light)
            timestamped, read_delay = client.timestamped, client.read_delay_sum
            requests = spec.light_requests_per_round if light else self.requests_for(vip, target.dip)
            try:
                send_at = send_times(started, spec.spread * spec.interval, requests, self.rng) if spec.spread else ()
                return await probe_target(client, target, deadline, requests, in_flight=self._semaphore,
                                          send_at=send_at)
            finally:
                self.stats.kernel_timestamped += client.timestamped - timestamped
                self.stats.read_delay_seconds += client.read_delay_sum - read_delay

        async def both(target: ProbeTarget) -> tuple[RoundSamples, RoundSamples | None]:
            if spec.light_path is None:
                return await one(target), None
            probes, light = await asyncio.gather(one(target), one(target, light=True))
            return probes, light

        results = await asyncio.gather(*(both(t) for t in targets))
        measurements = [
            summarise(samples, vip=vip, dip=t.dip, time=started_wall, weight=weights.get(t.dip, 0.0),
                      worker=self.options.worker_id, light=light)
            for t, (samples, light) in zip(targets, results, strict=True)
        ]
        for m in measurements:
            self.stats.requests += m.sent
            self.stats.successes += m.successes
            self.stats.failures += m.failures
        self.stats.rounds += 1
        if self.buffer.push(measurements):
            self.stats.dropped_rounds = self.buffer.dropped_rounds
            self.stats.dropped_measurements = self.buffer.dropped_measurements
            log.warning("round buffer full; oldest round dropped",
                        extra={"worker": self.options.worker_id, "dropped_rounds": self.buffer.dropped_rounds,
                               "max_buffered_rounds": self.buffer.max_rounds})
        self._flush_wanted.set()
        return measurements

    async def flush(self) -> bool:
        """Write every buffered round in one pipeline; False (and nothing lost) if the store is down."""
        try:
            written = await self.buffer.write(self.store.put_measurements)
        except Exception as error:
            self._store_failed("put_measurements", error)
            return False
        if written:
            self.stats.measurements_written += len(written)
            self._store_recovered()
        return True

    # --- loops --------------------------------------------------------------------------------------------
    async def _refresh_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await unless_stopped(stop, self._refresh_and_publish())
            except Exception as error:
                self._store_failed("refresh", error)
            await wait_unless_stopped(stop, self.refresh_interval)

    async def _refresh_and_publish(self) -> None:
        await self.refresh()
        await self.publish_status()

    async def _round_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            now = self.clock.now()
            for name, state in list(self._vips.items()):
                interval = state.config.probe.interval
                if state.next_round <= 0:
                    state.next_round = math.ceil(now / interval) * interval  # aligned across workers
                if now >= state.next_round and (state.running is None or state.running.done()):
                    state.next_round = math.floor(now / interval) * interval + interval
                    state.running = asyncio.ensure_future(self._guarded_round(name))
            due = min((s.next_round for s in self._vips.values()), default=now + 0.05)
            await wait_unless_stopped(stop, min(max(due - self.clock.now(), 0.001), 0.05))
        running = [s.running for s in self._vips.values() if s.running is not None and not s.running.done()]
        if running:
            await asyncio.wait(running, timeout=max(s.config.probe.interval for s in self._vips.values()))

    async def _guarded_round(self, vip: str) -> None:
        try:
            await self.probe_round(vip)
        except Exception:
            log.exception("probe round failed", extra={"vip": vip, "worker": self.options.worker_id})

    async def _writer_loop(self, stop: asyncio.Event) -> None:
        backoff = self.options.backoff_initial
        while True:
            if not len(self.buffer):
                if stop.is_set():
                    return
                self._flush_wanted.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._flush_wanted.wait(), timeout=0.2)
                continue
            if await self.flush():
                backoff = self.options.backoff_initial
                continue
            if stop.is_set():
                log.warning("stopping with unwritten rounds", extra={"worker": self.options.worker_id,
                                                                     "rounds": len(self.buffer)})
                return
            await wait_unless_stopped(stop, backoff)
            backoff = min(backoff * 2, self.options.backoff_max)

    async def run(self, stop: asyncio.Event | None = None, duration: float | None = None) -> WorkerStats:
        """Probe until ``stop`` is set (or ``duration`` seconds passed); returns the counters."""
        stop = stop or asyncio.Event()
        self.stats.started_at = self.wall()
        log.info("probe worker started", extra={"worker": self.options.worker_id, "group": self.options.group})
        timer = asyncio.get_running_loop().call_later(duration, stop.set) if duration is not None else None
        writer_stop = asyncio.Event()
        tasks = [asyncio.ensure_future(self._refresh_loop(stop)), asyncio.ensure_future(self._round_loop(stop))]
        writer = asyncio.ensure_future(self._writer_loop(writer_stop))
        try:
            await asyncio.gather(*tasks)
        finally:
            if timer is not None:
                timer.cancel()
            writer_stop.set()
            self._flush_wanted.set()
            # the round loop waited for its rounds: what is buffered now is what a cut-short write loses
            await within(STOP_FLUSH_SECONDS, writer, log=log, step="writing the buffered rounds (lost)",
                         worker=self.options.worker_id, rounds=len(self.buffer))
            for task in tasks:
                task.cancel()
            if not await within(STOP_RELEASE_SECONDS, self._release_all(), log=log, worker=self.options.worker_id,
                                step="handing the leases back (they expire by their TTL)"):
                self.owned.clear()
            for _, client in self._clients.values():
                client.close()
            log.info("probe worker stopped", extra={"worker": self.options.worker_id, **asdict(self.stats)})
        return self.stats

    async def _release_all(self) -> None:
        """Hand DIPs back at once on a clean stop, so others need not wait for the TTL."""
        try:
            for resource in sorted(self.owned):
                await self.store.release_lease(self.options.group, resource, self.options.worker_id)
            with contextlib.suppress(Exception):
                await self.publish_status()
        except Exception as error:
            self._store_failed("release", error)
        self.owned.clear()
