"""The service model behind an emulated backend: FCFS worker pools and processor sharing.

A test and demo instrument, not part of the control path: the backend emulator
(:mod:`knapsack_lb.lab.testbed.emulator`) hands each request's *work* (seconds of service at
capacity factor 1) to a :class:`ServiceModel` and waits for it to finish.

Both disciplines run on one event-driven engine on the asyncio loop. Every job in the
system has remaining work and a current service rate; the engine advances all jobs by
the elapsed time whenever something changes (an arrival, a departure, a capacity change)
and sets one timer for the next departure:

* ``fcfs``: ``workers`` servers, first come first served. The ``workers`` oldest jobs are
  served at rate ``capacity``; the rest wait at rate 0 (an M/G/c queue for Poisson input).
* ``ps``: a CPU-bound server with ``workers`` cores shared by everything in it. Each of the
  ``n`` jobs is served at rate ``capacity * min(1, workers / n)`` (egalitarian processor
  sharing; M/G/1-PS for ``workers == 1``).

A capacity change (``set_capacity``, a noisy neighbour) applies at once to the jobs in
service.

Timer precision. An operating-system timer fires late: on the shared development VM a
2 ms ``select`` timeout returned 0.1-0.15 ms late (median), a 20 ms one 0.15-0.24 ms late,
with or without other load, so a plain ``call_at`` made a 2 ms service time last about
2.15 ms (7% too long). With ``spin_limit`` > 0 the model therefore asks the loop to wake it ``lead`` seconds
before the next departure and busy-waits (``time.monotonic``) for the rest. ``lead``
adapts to the wake-ups it sees: it tracks the 95th percentile of their lateness (a
stochastic quantile estimate: up by 0.95 x ``_LEAD_STEP`` after a wake-up that came too
late, down by 0.05 x ``_LEAD_STEP`` after one in time), bounded by ``spin_limit``
(:data:`PUNCTUAL_SPIN_LIMIT`, 0.5 ms, is what the probe benchmark uses). It is opt-in (the
default ``spin_limit`` is 0, plain timers) because it costs CPU: each departure spins for the lead
minus the actual lateness, some tens of microseconds. While it spins the loop runs nothing
else, so other emulators on the same loop may start a request that much later (their own
departures are still exact: a wake-up that comes late does not spin). An injected
``time_fn`` (a fake clock) turns the busy-wait off.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Mode = Literal["fcfs", "ps"]
Distribution = Literal["fixed", "exponential", "lognormal"]

_DONE_EPSILON = 1e-9
PUNCTUAL_SPIN_LIMIT = 0.0005  # seconds: a busy-wait bound that covers this VM's usual timer lateness
_LEAD_INITIAL = 0.0002  # seconds: the first wake-up lead, before any lateness was seen
_LEAD_STEP = 0.00002  # seconds: quantile-tracking step of the lead
_LEAD_QUANTILE = 0.95  # the lead tracks this quantile of the wake-up lateness


@dataclass(frozen=True)
class ServiceTimes:
    """Service-time distribution: ``mean`` seconds of work per request at capacity 1.

    ``lognormal`` uses shape ``sigma`` (of the underlying normal) and is scaled so that
    its mean is ``mean``. Draws come from the injected ``random.Random``.
    """

    mean: float
    distribution: Distribution = "exponential"
    sigma: float = 1.0

    def __post_init__(self) -> None:
        if not math.isfinite(self.mean) or self.mean < 0:
            raise ValueError(f"service-time mean must be a finite number >= 0, got {self.mean!r}")
        if self.distribution not in ("fixed", "exponential", "lognormal"):
            raise ValueError(f"distribution must be fixed, exponential or lognormal, got {self.distribution!r}")
        if not math.isfinite(self.sigma) or self.sigma <= 0:
            raise ValueError(f"lognormal sigma must be > 0, got {self.sigma!r}")

    def draw(self, rng: random.Random) -> float:
        if self.mean == 0 or self.distribution == "fixed":
            return self.mean
        if self.distribution == "exponential":
            return rng.expovariate(1.0 / self.mean)
        mu = math.log(self.mean) - self.sigma**2 / 2.0
        return rng.lognormvariate(mu, self.sigma)


@dataclass
class _Job:
    remaining: float
    work: float
    on_done: Callable[[], None]


class ServiceModel:
    """FCFS pool or processor-sharing server (see the module docstring) on one asyncio loop.

    Not thread-safe: call every method on the loop that runs it. ``busy_seconds`` is the
    integral of ``min(n, workers)`` over time (worker-seconds spent serving) and
    ``work_done`` the work of the jobs that completed. ``spin_limit`` bounds the busy-wait
    that makes departures punctual (module docstring; 0 = plain timers); ``spins`` and
    ``spin_seconds`` count it, ``late_wakeups`` counts departures whose wake-up came after
    the departure time anyway.
    """

    def __init__(
        self, mode: Mode, workers: int = 1, capacity: float = 1.0, time_fn: Callable[[], float] | None = None,
        spin_limit: float = 0.0,
    ) -> None:
        if mode not in ("fcfs", "ps"):
            raise ValueError(f"mode must be 'fcfs' or 'ps', got {mode!r}")
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
        self._check_capacity(capacity)
        if not isinstance(spin_limit, (int, float)) or not 0.0 <= spin_limit <= 0.01:
            raise ValueError(f"spin limit must be in [0, 0.01] seconds, got {spin_limit!r}")
        self.mode: Mode = mode
        self.workers = workers
        self._capacity = capacity
        self._time_fn = time_fn
        self._jobs: dict[int, _Job] = {}
        self._ids = itertools.count()
        self._last = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0  # when the timer's departure is due (the timer itself fires ``_lead`` earlier)
        self._timed = False  # the timer was set for a future time (its lateness says something)
        self._spin_limit = 0.0 if time_fn is not None else float(spin_limit)
        self._lead = min(_LEAD_INITIAL, self._spin_limit)
        self.spins = 0
        self.spin_seconds = 0.0
        self.late_wakeups = 0
        self.busy_seconds = 0.0
        self.work_done = 0.0
        self.completed = 0

    @staticmethod
    def _check_capacity(capacity: float) -> None:
        if not isinstance(capacity, (int, float)) or not math.isfinite(capacity) or capacity <= 0:
            raise ValueError(f"capacity factor must be a finite number > 0, got {capacity!r}")

    @property
    def capacity(self) -> float:
        return self._capacity

    @property
    def in_system(self) -> int:
        return len(self._jobs)

    def _now(self) -> float:
        return self._time_fn() if self._time_fn is not None else asyncio.get_running_loop().time()

    def _rates(self) -> list[tuple[int, float]]:
        n = len(self._jobs)
        if n == 0:
            return []
        if self.mode == "ps":
            rate = self._capacity * min(1.0, self.workers / n)
            return [(job_id, rate) for job_id in self._jobs]
        return [(job_id, self._capacity if i < self.workers else 0.0) for i, job_id in enumerate(self._jobs)]

    def _advance(self, now: float | None = None) -> None:
        if now is None:
            now = self._now()
        elapsed = now - self._last
        self._last = now
        if elapsed <= 0 or not self._jobs:
            return
        self.busy_seconds += elapsed * min(len(self._jobs), self.workers)
        for job_id, rate in self._rates():
            if rate > 0:
                job = self._jobs[job_id]
                job.remaining = max(0.0, job.remaining - elapsed * rate)

    def _finish_done(self) -> None:
        for job_id in [j for j, job in self._jobs.items() if job.remaining <= _DONE_EPSILON]:
            job = self._jobs.pop(job_id)
            self.completed += 1
            job.on_done()

    def _reschedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        next_in = min((self._jobs[j].remaining / r for j, r in self._rates() if r > 0), default=None)
        if next_in is not None:
            loop = asyncio.get_running_loop()
            self._due = self._last + next_in
            # A departure already due (a back-dated job, see submit) is not a timer to learn from.
            self._timed = next_in > self._lead
            self._timer = loop.call_at(self._due - self._lead, self._on_timer)

    @property
    def lead(self) -> float:
        """Seconds before a departure the loop is asked to wake the model (0 without busy-wait)."""
        return self._lead

    def _on_timer(self) -> None:
        self._timer = None
        if self._spin_limit > 0:
            self._wait_until_due()
        self._advance()
        self._finish_done()
        self._reschedule()

    def _wait_until_due(self) -> None:
        """Busy-wait from an early wake-up to the departure time, and adapt the lead."""
        due = self._due
        now = self._now()
        if now >= due:  # the wake-up came too late even with the lead: lead it more
            if self._timed:
                self.late_wakeups += 1
                self._lead = min(self._spin_limit, self._lead + _LEAD_QUANTILE * _LEAD_STEP)
            return
        self._lead = max(0.0, self._lead - (1.0 - _LEAD_QUANTILE) * _LEAD_STEP)
        if due - now > self._spin_limit:  # the loop woke us far too early: _reschedule sets a new timer
            return
        started = now
        while now < due:
            now = self._now()
        self.spins += 1
        self.spin_seconds += now - started

    def submit(self, work: float, on_done: Callable[[], None], age: float = 0.0) -> int | None:
        """Start a job of ``work`` seconds (at capacity 1); ``on_done()`` runs on the loop when it completes.

        ``age``: the job arrived that many seconds ago (the emulator passes how long the
        request waited in the kernel and the parser before the model saw it), so it is
        entered at ``now - age``, but never before the last event the model already
        processed (the model's past is not rewritten): from then on it counts for the
        other jobs' rates (processor sharing) and is served as if it had been there.
        Returns the job id for :meth:`cancel`, or None when ``work <= 0`` (then ``on_done``
        has already run).
        """
        if work <= 0:
            on_done()
            return None
        now = self._now()
        entered = max(self._last, now - age) if age > 0 else now
        self._advance(entered)
        job_id = next(self._ids)
        self._jobs[job_id] = _Job(work, work, on_done)
        self.work_done += work
        if entered < now:
            self._advance(now)  # the new job was in the system since ``entered``
        self._reschedule()
        return job_id

    def cancel(self, job_id: int | None) -> None:
        """Take a job out of the system (its client went away); its work does not count."""
        if job_id is None or job_id not in self._jobs:
            return
        self._advance()
        self.work_done -= self._jobs.pop(job_id).work
        self._reschedule()

    async def serve(self, work: float) -> None:
        """Wait until ``work`` seconds of service (at capacity 1) have been given to this job."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def done() -> None:
            if not future.done():
                future.set_result(None)

        job_id = self.submit(work, done)
        try:
            await future
        finally:
            self.cancel(job_id)

    def set_capacity(self, factor: float) -> None:
        """Change the service rate from now on (1 = nominal; 0.6 = a noisy neighbour took 40%)."""
        self._check_capacity(factor)
        self._advance()
        self._capacity = float(factor)
        self._reschedule()
