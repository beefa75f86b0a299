"""Open-loop Poisson load over long-lived keep-alive connections (the layer-4 client of the demo).

KnapsackLB balances *connections* (KnapsackLB paper sections 2.1, 4.7): a connection is placed
on a DIP once and carries many requests; weights pushed by the controller apply only to new
connections. This generator models that:

* ``connections`` client connections are open at any time (slots). Each slot opens a keep-alive
  connection to the VIP, keeps it for a lifetime drawn uniformly from [0.5, 1.5] x ``lifetime``
  (the first one a residual lifetime, so the population starts in steady state), then stops
  sending, waits for its answers and is replaced by a new connection at once. Connections
  are thus replaced at a steady rate of about ``connections / lifetime`` per second.
* Clients give up: when the oldest unanswered request of a connection is ``timeout`` seconds
  old, the client closes the connection (its unanswered requests count as failed; the DIP
  drops the work of a closed connection) and the slot reconnects. This bounds the backlog an
  overloaded DIP can build, as real clients do.
* Requests arrive open-loop: every slot is a Poisson stream of rate ``rate / connections``, so
  the total is a Poisson stream of ``rate``. A request is written when it arrives (HTTP/1.1
  pipelining); a connection answers in order, so a slow DIP delays every request queued on its
  connections, as on a real keep-alive connection. Latency = arrival to last byte of the answer
  (no coordinated omission: a late answer never delays later arrivals).

Bounded: the run stops after ``duration`` seconds (answers still in flight get ``grace``
seconds) and never sends more than ``max_requests``. Seeded: arrivals and lifetimes come from
``random.Random(seed)``.

Runs as a subprocess (``python -m knapsack_lb.lab.demo.loadgen ...``) so that its CPU use does not
disturb the in-process probes and controller; it prints one JSON progress line per
``progress`` seconds on stdout and writes every counted sample to ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from knapsack_lb.names import validate_host

REQUEST = b"GET /work HTTP/1.1\r\nHost: vip\r\n\r\n"


@dataclass(frozen=True)
class LoadSpec:
    """What the generator sends (see the module docstring)."""

    host: str
    port: int
    rate: float  # requests per second, all connections together
    connections: int
    lifetime: float  # mean connection lifetime, seconds
    duration: float  # seconds of load
    count_after: float = 0.0  # requests arriving before this (seconds from start) are not counted
    seed: int = 1
    grace: float = 10.0
    timeout: float = 3.0  # seconds a client waits for an answer before it closes the connection
    max_requests: int = 0  # 0 = 3 x rate x duration + 1000

    def __post_init__(self) -> None:
        validate_host("host", self.host)
        if not (0 < self.rate <= 100_000 and 1 <= self.connections <= 10_000 and self.lifetime > 0):
            raise ValueError(f"bad load spec: rate={self.rate} connections={self.connections} lifetime={self.lifetime}")
        if not (0 < self.duration <= 7200 and 0 <= self.count_after < self.duration):
            raise ValueError(f"bad load spec: duration={self.duration} count_after={self.count_after}")

    @property
    def request_budget(self) -> int:
        return self.max_requests or int(3 * self.rate * self.duration) + 1000


@dataclass
class Samples:
    """Counted answers: arrival time (s from start), latency (s), backend, status."""

    arrival: list[float] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)
    backend: list[str] = field(default_factory=list)
    status: list[int] = field(default_factory=list)
    connections: dict[str, int] = field(default_factory=dict)  # counted connections per first backend
    errors: int = 0  # requests never answered: timeouts and connection errors (counted window)
    timeouts: int = 0  # of which the client gave up after LoadSpec.timeout
    sent: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"arrival": self.arrival, "latency": self.latency, "backend": self.backend, "status": self.status,
                "connections": self.connections, "errors": self.errors, "timeouts": self.timeouts,
                "sent": self.sent}


class _Window:
    """Answers since the last progress line, per backend (for the live view)."""

    def __init__(self) -> None:
        self.count: dict[str, int] = {}
        self.total: dict[str, float] = {}

    def add(self, backend: str, latency: float) -> None:
        self.count[backend] = self.count.get(backend, 0) + 1
        self.total[backend] = self.total.get(backend, 0.0) + latency

    def take(self) -> dict[str, list[float]]:
        out = {b: [n, self.total[b] / n] for b, n in self.count.items()}
        self.count, self.total = {}, {}
        return out


class LoadGenerator:
    """Runs a :class:`LoadSpec` on the current event loop; ``await run()`` returns the samples."""

    def __init__(self, spec: LoadSpec, progress_every: float = 1.0, echo: bool = False) -> None:
        self.spec = spec
        self.samples = Samples()
        self._rng = random.Random(spec.seed)
        self._window = _Window()
        self._progress_every = progress_every
        self._echo = echo
        self._start = 0.0
        self._sent = 0
        self._closing: dict[int, bool] = {}
        self._finishing: set[asyncio.Task[None]] = set()

    async def run(self) -> Samples:
        loop = asyncio.get_running_loop()
        self._start = loop.time()
        end = self._start + self.spec.duration
        seeds = [self._rng.getrandbits(32) for _ in range(self.spec.connections)]
        slots = [asyncio.create_task(self._slot(random.Random(s), end)) for s in seeds]
        reporter = asyncio.create_task(self._report(end)) if self._echo else None
        await asyncio.gather(*slots, return_exceptions=True)
        while self._finishing:
            await asyncio.gather(*list(self._finishing), return_exceptions=True)
        if reporter is not None:
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter
        self.samples.sent = self._sent
        return self.samples

    async def _report(self, end: float) -> None:
        loop = asyncio.get_running_loop()
        while loop.time() < end + self.spec.grace:
            await asyncio.sleep(self._progress_every)
            line = {"t": round(loop.time() - self._start, 3), "sent": self._sent, "per_backend": self._window.take()}
            print(json.dumps(line), flush=True)

    async def _slot(self, rng: random.Random, end: float) -> None:
        loop = asyncio.get_running_loop()
        spec = self.spec
        per_slot = spec.rate / spec.connections
        first = True
        next_arrival = loop.time() + rng.expovariate(per_slot)
        while loop.time() < end:
            lifetime = rng.uniform(0.5, 1.5) * spec.lifetime
            if first:  # residual lifetime: the population starts in steady state
                lifetime *= rng.random()
                first = False
            close_at = min(loop.time() + lifetime, end)
            try:
                reader, writer = await asyncio.open_connection(spec.host, spec.port)
            except OSError:
                await asyncio.sleep(0.05)
                continue
            pending: deque[float] = deque()
            wake = asyncio.Event()
            counted_connection = [loop.time() - self._start >= spec.count_after]
            reading = asyncio.create_task(self._read(reader, pending, wake, counted_connection))
            while next_arrival < close_at and self._sent < spec.request_budget:
                delay = next_arrival - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                if reading.done():
                    break
                writer.write(REQUEST)
                pending.append(next_arrival)
                wake.set()
                self._sent += 1
                next_arrival += rng.expovariate(per_slot)
            self._closing[id(pending)] = True
            wake.set()
            # The old connection finishes in the background: the next one opens at once.
            task = asyncio.create_task(self._finish(reading, writer, pending, end))
            self._finishing.add(task)
            task.add_done_callback(self._finishing.discard)
            if self._sent >= spec.request_budget:
                return

    async def _finish(self, reading: asyncio.Task[None], writer: asyncio.StreamWriter, pending: deque[float],
                      end: float) -> None:
        loop = asyncio.get_running_loop()
        try:
            with contextlib.suppress(asyncio.TimeoutError, Exception):
                await asyncio.wait_for(asyncio.shield(reading), timeout=max(0.1, end + self.spec.grace - loop.time()))
        finally:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reading
            self._closing.pop(id(pending), None)
            for arrival in pending:  # never answered
                if arrival - self._start >= self.spec.count_after:
                    self.samples.errors += 1
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _read(self, reader: asyncio.StreamReader, pending: deque[float], wake: asyncio.Event,
                    counted_connection: list[bool]) -> None:
        """Answers in order; ``wake`` is set by the sender after each request and when it is done."""
        loop = asyncio.get_running_loop()
        first = True
        while True:
            if not pending:
                if self._closing.get(id(pending)):
                    return
                wake.clear()
                await wake.wait()
                continue
            wait = pending[0] + self.spec.timeout - loop.time()
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=max(0.001, wait))
            except TimeoutError:
                self.samples.timeouts += sum(1 for a in pending if a - self._start >= self.spec.count_after)
                return  # the sender stops, _finish counts the unanswered requests as failed and closes
            now = loop.time()
            status, backend, length = _parse_head(head)
            if length:
                await reader.readexactly(length)
                now = loop.time()
            arrival = pending.popleft()
            latency = now - arrival
            self._window.add(backend, latency)
            t = arrival - self._start
            if t >= self.spec.count_after:
                s = self.samples
                s.arrival.append(round(t, 6))
                s.latency.append(round(latency, 6))
                s.backend.append(backend)
                s.status.append(status)
            if first:
                first = False
                if counted_connection[0]:
                    self.samples.connections[backend] = self.samples.connections.get(backend, 0) + 1


def _parse_head(head: bytes) -> tuple[int, str, int]:
    text = head.decode("latin-1")
    lines = text.split("\r\n")
    parts = lines[0].split(" ", 2)
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    backend, length = "?", 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        key = name.strip().lower()
        if key == "x-backend":
            backend = value.strip()
        elif key == "content-length":
            length = int(value.strip() or 0)
    return status, backend, length


def run_load(spec: LoadSpec, progress_every: float = 1.0, echo: bool = False) -> Samples:
    """Run the generator to completion on a fresh event loop."""
    return asyncio.run(LoadGenerator(spec, progress_every, echo).run())


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m knapsack_lb.lab.demo.loadgen", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--rate", type=float, required=True, help="requests per second (all connections)")
    p.add_argument("--connections", type=int, required=True)
    p.add_argument("--lifetime", type=float, required=True, help="mean connection lifetime, seconds")
    p.add_argument("--duration", type=float, required=True, help="seconds of load")
    p.add_argument("--count-after", type=float, default=0.0, help="seconds before requests are counted")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=3.0, help="seconds before a client gives up on a connection")
    p.add_argument("--progress", type=float, default=1.0, help="seconds between JSON progress lines")
    p.add_argument("--out", type=Path, required=True, help="JSON file for the counted samples")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        spec = LoadSpec(args.host, args.port, args.rate, args.connections, args.lifetime, args.duration,
                        args.count_after, args.seed, timeout=args.timeout)
    except ValueError as bad:
        print(f"loadgen: {bad}", file=sys.stderr)
        return 2
    samples = run_load(spec, args.progress, echo=True)
    args.out.write_text(json.dumps(samples.to_dict()))
    print(json.dumps({"done": True, "sent": samples.sent, "counted": len(samples.latency),
                      "errors": samples.errors, "mean": math.fsum(samples.latency) / max(1, len(samples.latency))}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
