"""A simulated DIP: a multi-worker queue (FCFS) or processor sharing over c cores.

FCFS: ``workers`` servers take requests in arrival order; a request's service time is its size
divided by the DIP's speed at the moment it starts (a capacity change applies to requests that
start afterwards). Processor sharing: the ``n`` requests present share ``workers`` cores, each
served at ``speed * min(1, workers / n)``; implemented with virtual time (each request finishes
when the attained service ``V`` reaches its tag), so an event costs O(log n), and a capacity
change applies at once.

Server-side features (switched per scenario or per policy, see ``ServerFeatures``): AQM rejection with 429 when
one more request would push the queue (requests waiting, not in service) above ``capacity``
(BLOC section IV-C), confidence chips granted unless ``r < q / (0.8 cap)`` (BLOC section IV-A,
``q`` = requests waiting when answering); the rules are BLOC's own functions in
``knapsack_lb.sim.policies.bloc``; ``capacity: dynamic`` uses its 30 s running average (IV-D) of the
active requests (in service included) sampled at each arrival,
in-flight count piggybacked on every response (DL3 section III), utilisation and qps over the
last window (ORCA). Failures: ``fail(fast)`` answers every request present and every new one with
an error at once; ``fail(hang)`` silently loses them (only the caller's timeout ends them);
``restart`` brings the DIP back empty. ``error_probability`` fails single requests, either at
once (fast) or after full service (slow).
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable
from heapq import heappop, heappush
from typing import Literal

from knapsack_lb.sim.engine import Engine
from knapsack_lb.sim.policies.bloc import DynamicCapacity, aqm_admits, issue_chip

Answer = Literal["ok", "error", "rejected"]


class Job:
    """One attempt of a request (or a probe) at a DIP."""

    __slots__ = ("arrived", "dead", "fail_after", "on_answer", "payload", "size", "tag")

    def __init__(self, size: float, on_answer: Callable[[Job, Answer, int, bool], None], payload: object) -> None:
        self.size = size
        self.on_answer = on_answer  # (job, status, inflight after answering, chip)
        self.dead = False
        self.fail_after = False
        self.tag = 0.0
        self.payload = payload
        self.arrived = 0.0


class SimDip:
    """State and queueing of one DIP; answers go to ``job.on_answer`` at the DIP's side."""

    def __init__(
        self,
        engine: Engine,
        index: int,
        name: str,
        *,
        workers: int,
        discipline: str,
        speed: float,
        capacity: int | str,
        error_probability: float,
        error_latency: str,
        rng: random.Random,
        aqm: bool = False,
        chips: bool = False,
    ) -> None:
        self.engine = engine
        self.index = index
        self.name = name
        self.workers = workers
        self.discipline = discipline
        self._ps = discipline == "ps"
        self.base_speed = speed
        self.speed = speed
        # BLOC's Cap: a number, or "dynamic" (section IV.D: the average active requests of the last 30 s window)
        self.dynamic_capacity = DynamicCapacity(window=30.0, start=engine.now) if capacity == "dynamic" else None
        self.capacity: float | None = None if capacity == "dynamic" else float(capacity)
        self.error_probability = error_probability
        self.error_latency = error_latency
        self.rng = rng
        self.aqm = aqm
        self.chips = chips
        self.up = True
        self.fail_mode = "fast"
        self.inflight = 0
        self.served = 0
        self.rejected = 0
        # FCFS
        self._busy = 0
        self._queue: deque[Job] = deque()
        self._running: dict[Job, None] = {}  # in service, in start order (a set's order is its objects' addresses)
        # PS
        self._heap: list[tuple[float, int, Job]] = []
        self._seq = 0
        self._virtual = 0.0
        self._version = 0
        self._event_time = math.inf
        self._ps_done_event = self._ps_done  # bound once: the completion callback of every push
        # utilisation accounting
        self._area = 0.0
        self._last = engine.now
        self._window_area_start = 0.0
        self._window_served_start = 0
        self.last_utilization = 0.0
        self.last_qps = 0.0
        self.last_eps = 0.0
        self.ok_count = 0
        self.error_count = 0
        self._window_ok_start = 0
        self._window_error_start = 0
        self.latency_estimate = 0.0  # EWMA (alpha 0.1) of the time requests spend at this DIP

    # ----- accounting ---------------------------------------------------------------------
    def _busy_fraction(self) -> float:
        if self.discipline == "ps":
            return min(len(self._heap), self.workers) / self.workers
        return self._busy / self.workers

    def _touch(self) -> None:
        now = self.engine.now
        dt = now - self._last
        if dt > 0:
            if self.discipline == "ps":
                n = len(self._heap)
                if n:
                    c = self.workers
                    if n <= c:
                        self._area += n / c * dt
                        self._virtual += self.speed * dt
                    else:
                        self._area += dt
                        self._virtual += self.speed * c / n * dt
            else:
                self._area += self._busy / self.workers * dt
        self._last = now

    def roll_window(self, window: float) -> float:
        """Close a utilisation window of ``window`` seconds; returns its utilisation in [0, 1]."""
        self._touch()
        util = (self._area - self._window_area_start) / window
        self.last_utilization = util
        self.last_qps = (self.ok_count - self._window_ok_start) / window
        self.last_eps = (self.error_count - self._window_error_start) / window
        self._window_area_start = self._area
        self._window_ok_start = self.ok_count
        self._window_error_start = self.error_count
        return util

    @property
    def queued(self) -> int:
        """Requests waiting (not in service): BLOC's q (section IV.A, IV.D)."""
        return max(0, self.inflight - self.workers)

    def current_capacity(self) -> float | None:
        if self.dynamic_capacity is not None:
            return self.dynamic_capacity.capacity(self.engine.now)
        return self.capacity

    # ----- requests -----------------------------------------------------------------------
    def arrive(self, job: Job) -> None:
        """A request reaches the DIP."""
        if not self.up:
            if self.fail_mode == "fast":
                self.error_count += 1
                job.on_answer(job, "error", self.inflight, False)
            return  # hang: lost
        if self.aqm:
            if self.dynamic_capacity is not None:
                # IV.D averages "the number of active requests in its queue": those in service count too
                # (sampling only the waiting ones freezes the uneven queues of the first window)
                self.dynamic_capacity.sample(self.engine.now, self.inflight)
            if not aqm_admits(self.queued, self.current_capacity()):
                self.rejected += 1
                job.on_answer(job, "rejected", self.inflight, False)
                return
        if self.error_probability > 0 and self.rng.random() < self.error_probability:
            if self.error_latency == "fast":
                self.error_count += 1
                job.on_answer(job, "error", self.inflight, False)
                return
            job.fail_after = True
        engine = self.engine
        now = engine.now
        job.arrived = now
        self.inflight += 1
        if not self._ps:
            if self._busy < self.workers:
                self._fcfs_start(job)
            else:
                self._queue.append(job)
            return
        # processor sharing: join at virtual tag V + size. _touch(), the rate and the lazy
        # _ps_reschedule() are written out here and in _ps_done with the same arithmetic, because a
        # Python call per step was most of a request's cost (``klb bench sim``)
        heap = self._heap
        speed = self.speed
        c = self.workers
        dt = now - self._last
        if dt > 0:
            n = len(heap)
            if n:
                if n <= c:
                    self._area += n / c * dt
                    self._virtual += speed * dt
                else:
                    self._area += dt
                    self._virtual += speed * c / n * dt
        self._last = now
        virtual = self._virtual
        tag = job.tag = virtual + job.size
        self._seq += 1
        heappush(heap, (tag, self._seq, job))
        # lazy: an arrival only slows service down, so a pending completion event that fires no
        # later than needed is kept (it re-checks when it fires)
        n = len(heap)
        wait = (heap[0][0] - virtual) / (speed if n <= c else speed * c / n)
        when = now + (wait if wait > 0.0 else 0.0)
        if when >= self._event_time:
            return
        self._version += 1
        self._event_time = when
        heappush(engine.queue, (when, next(engine.sequence), self._ps_done_event, self._version))

    def probe(self, job: Job) -> None:
        """A lightweight probe (health check, load query): answered at once without service."""
        if not self.up:
            if self.fail_mode == "fast":
                job.on_answer(job, "error", self.inflight, False)
            return
        job.on_answer(job, "ok", self.inflight, self._chip())

    def _chip(self) -> bool:
        if not self.chips:
            return False
        cap = self.current_capacity()
        if cap is None:  # dynamic capacity not known yet (first window): admit all, grant chips
            return True
        return issue_chip(self.queued, cap, self.rng)

    def _finish(self, job: Job) -> None:
        self.inflight -= 1
        self.served += 1
        self.latency_estimate += 0.1 * (self.engine.now - job.arrived - self.latency_estimate)
        if job.fail_after:
            self.error_count += 1
            job.on_answer(job, "error", self.inflight, False)
        else:
            self.ok_count += 1
            job.on_answer(job, "ok", self.inflight, self._chip() if self.chips else False)

    # FCFS
    def _fcfs_start(self, job: Job) -> None:
        self._touch()
        self._busy += 1
        self._running[job] = None
        self.engine.after(job.size / self.speed, self._fcfs_done, job)

    def _fcfs_done(self, job: Job) -> None:
        if job.dead:
            return
        self._touch()
        self._busy -= 1
        self._running.pop(job, None)
        if self._queue:
            self._fcfs_start(self._queue.popleft())
        self._finish(job)

    # processor sharing (arrivals join in ``arrive``)
    def _ps_rate(self) -> float:
        n = len(self._heap)
        return self.speed if n <= self.workers else self.speed * self.workers / n

    def _ps_reschedule(self) -> None:
        """Schedule the next completion (after a capacity change, or an event that fired early);
        ``arrive`` and ``_ps_done`` have their own copies inline (``arrive``'s is lazy: it keeps a
        pending event that fires no later than needed, since an arrival only slows service down)."""
        heap = self._heap
        if not heap:
            self._version += 1
            self._event_time = math.inf
            return
        when = self.engine.now + max(0.0, (heap[0][0] - self._virtual) / self._ps_rate())
        self._version += 1
        self._event_time = when
        self.engine.at(when, self._ps_done, self._version)

    def _ps_done(self, version: int) -> None:
        if version != self._version:
            return  # superseded by an earlier completion event
        self._event_time = math.inf
        engine = self.engine
        now = engine.now
        heap = self._heap
        speed = self.speed
        c = self.workers
        # _touch()
        dt = now - self._last
        if dt > 0:
            n = len(heap)
            if n:
                if n <= c:
                    self._area += n / c * dt
                    self._virtual += speed * dt
                else:
                    self._area += dt
                    self._virtual += speed * c / n * dt
        self._last = now
        virtual = self._virtual
        limit = virtual + 1e-12
        top = heap[0]  # a live completion event implies a non-empty heap (fail() retires it)
        finished: list[Job] | None
        if top[0] <= limit:
            heappop(heap)
            if heap and heap[0][0] <= limit:  # several finish at once (same tag within 1e-12)
                finished = [top[2]]
                while heap and heap[0][0] <= limit:
                    finished.append(heappop(heap)[2])
            else:
                finished = None
        else:
            n = len(heap)
            if (top[0] - virtual) / (speed if n <= c else speed * c / n) > 1e-9:
                self._ps_reschedule()  # fired early: arrivals slowed service since it was scheduled
                return
            heappop(heap)  # rounding: a hair short; finish it
            finished = None
        last = top[2] if finished is None else finished[-1]
        tag = last.tag
        if tag > virtual:
            self._virtual = virtual = tag
        # _ps_reschedule()
        if heap:
            n = len(heap)
            wait = (heap[0][0] - virtual) / (speed if n <= c else speed * c / n)
            when = now + (wait if wait > 0.0 else 0.0)
            self._version += 1
            self._event_time = when
            heappush(engine.queue, (when, next(engine.sequence), self._ps_done_event, self._version))
        else:
            self._version += 1
        if finished is None:
            self._finish(top[2])
        else:
            for job in finished:
                self._finish(job)

    # ----- scheduled changes --------------------------------------------------------------
    def set_speed(self, factor: float) -> None:
        """Capacity change: speed becomes ``factor`` x the configured speed."""
        self._touch()
        self.speed = self.base_speed * factor
        if self.discipline == "ps":
            self._ps_reschedule()

    def fail(self, mode: str) -> None:
        """Crash: requests present are answered with an error (fast) or lost (hang)."""
        self._touch()
        self.up = False
        self.fail_mode = mode
        present = list(self._running) + list(self._queue) + [entry[2] for entry in self._heap]
        self._running.clear()
        self._queue.clear()
        self._heap.clear()
        self._busy = 0
        self._version += 1
        self._event_time = math.inf
        self.inflight = 0
        for job in present:
            job.dead = True
            if mode == "fast":
                job.on_answer(job, "error", 0, False)

    def restart(self) -> None:
        self._touch()
        self.up = True
