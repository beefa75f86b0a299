"""Noisy neighbours: background processes that keep a machine busy the way other services do.

A benchmark that claims a latency accuracy should say how it holds up when the machine is
not idle. A plain busy loop is the wrong model of "other work": the scheduler lets it run
out its slice and a waking process preempts it at once. Services wake and sleep: each
neighbour here alternates a burst of CPU (uniform in ``burst``) with a sleep (uniform in
``pause``), so wake-ups compete with the measured processes' wake-ups all the time. Four
neighbours with the defaults keep a 2-core machine at a load average of about 2.

Each neighbour is a child process with its own seeded RNG (``seed + i``), stops by itself
after ``seconds``, and is terminated (then killed) when the context exits, so nothing
outlives the benchmark. How it fails: on a machine with many more cores than neighbours it
barely disturbs anything; the burst and pause ranges say what it is, not a load average.
"""

from __future__ import annotations

import multiprocessing
import random
import time
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from types import TracebackType

MAX_NEIGHBOURS = 64
MAX_SECONDS = 3600.0


def _neighbour(seed: int, seconds: float, burst: tuple[float, float], pause: tuple[float, float]) -> None:
    rng = random.Random(seed)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        busy_until = time.perf_counter() + rng.uniform(*burst)
        while time.perf_counter() < busy_until:
            pass
        time.sleep(rng.uniform(*pause))


@dataclass
class NoisyNeighbours:
    """``count`` background processes alternating CPU bursts and sleeps for at most ``seconds``.

    Defaults: bursts of 0.2-3 ms, sleeps of 0.1-3 ms (about half the time busy each).
    """

    count: int
    seconds: float
    seed: int = 0
    burst: tuple[float, float] = (0.0002, 0.003)
    pause: tuple[float, float] = (0.0001, 0.003)
    _procs: list[BaseProcess] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int) or not 0 <= self.count <= MAX_NEIGHBOURS:
            raise ValueError(f"noisy neighbours: count must be an integer in 0-{MAX_NEIGHBOURS}, got {self.count!r}")
        if not 0 < self.seconds <= MAX_SECONDS:
            raise ValueError(f"noisy neighbours: seconds must be in (0, {MAX_SECONDS:g}], got {self.seconds!r}")
        for name, (lo, hi) in (("burst", self.burst), ("pause", self.pause)):
            if not 0 <= lo <= hi <= 1.0:
                raise ValueError(f"noisy neighbours: {name} must be 0 <= low <= high <= 1 s, got {(lo, hi)!r}")

    def start(self) -> NoisyNeighbours:
        context = multiprocessing.get_context("spawn")  # no copy of the caller's threads or event loop
        for i in range(self.count):
            proc = context.Process(target=_neighbour, args=(self.seed + i, self.seconds, self.burst, self.pause),
                                   name=f"noisy-neighbour-{i}", daemon=True)
            proc.start()
            self._procs.append(proc)
        return self

    def alive(self) -> int:
        return sum(1 for p in self._procs if p.is_alive())

    def stop(self, timeout: float = 5.0) -> None:
        for proc in self._procs:
            if proc.is_alive():
                proc.terminate()
        for proc in self._procs:
            proc.join(timeout)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout)
        self._procs.clear()

    def __enter__(self) -> NoisyNeighbours:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
