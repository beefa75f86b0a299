"""Backend emulator: an HTTP/1.1 server whose capacity and latency are known.

A **test and demo instrument** (not part of the control path). Tests, benchmarks and the
demo need DIPs that behave like real backends under load but whose service model is
known, so that what the probes (KnapsackLB section 5, KLM) and the controller learn can
be checked against the truth.

One emulator is one backend (DIP). Requests to any path other than the reserved ones
below get work drawn from a service-time distribution and served by a
:class:`~knapsack_lb.lab.testbed.queueing.ServiceModel` (an FCFS pool of ``workers`` or a
processor-sharing CPU-bound server). With probability ``failure_probability`` a request
fails instead: a *fast* failure answers 503 at once, a *slow* one after ``failure_delay``
seconds without using capacity (ELS blog: a fast failure is not fast service).

Every response carries ``X-Backend: <name>``, ``X-Inflight: <n>`` (requests in the
service model when the response left, this one included) and ``X-Server-Latency:
<seconds>`` (from the arrival of the request's last byte at the emulator's socket to the
response).

Known latency means punctual: the emulated service of a request starts when the request
reached the socket (the kernel's receive timestamp, Linux ``SO_TIMESTAMPNS``; sockets are
read with ``recvmsg`` by :class:`_SocketTransport` because asyncio's transports drop it),
not when this process got round to reading it, and ends on time thanks to the service
model's busy-wait timers when asked for (:mod:`knapsack_lb.lab.testbed.queueing`, ``--spin-limit``); on a
busy machine the process must also be woken on time: ``--realtime-priority`` (``SCHED_FIFO``,
:mod:`knapsack_lb.lab.testbed.realtime`) sees to that. What is left between a client and the
injected time is the loopback round trip and the HTTP handling on both sides.

Reserved paths: ``GET /health`` (200, no work), ``GET /light?work=S`` (a light probe: ``S``
seconds of fixed work, default 1 % of the mean, through the same service model, so it queues as a
request would; never fails; counted apart), ``GET /stats`` (JSON counters),
``POST /admin/capacity?factor=F`` (noisy neighbour: service rate times ``F``),
``POST /admin/failure?probability=P&mode=fast|slow&delay=S``, ``POST /admin/reset``
(zero the counters).

HTTP/1.1 with keep-alive (``Connection: close`` honoured), requests on one connection
answered in order. Written on the event loop with no dependency (an ``asyncio.Protocol``
parser over non-blocking sockets, :class:`_SocketTransport`): one process serves thousands of
requests per second, far more than the probe benchmark needs.

Run as a subprocess::

    python -m knapsack_lb.lab.testbed.emulator --name dip-1 --port 8081 --mode ps \\
        --service-time 0.01 --distribution exponential --workers 1 --seed 1

(``--port`` may be repeated: several backends in one process, named ``NAME-0``, ``NAME-1`` ...),
or in-process with :class:`EmulatorFleet` (a background thread with its own loop).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import selectors
import signal
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

from knapsack_lb.lab.testbed.queueing import Distribution, Mode, ServiceModel, ServiceTimes
from knapsack_lb.lab.testbed.realtime import request_realtime, scheduler_name, validate_priority
from knapsack_lb.names import format_address, validate_host, validate_name
from knapsack_lb.socket_timestamps import enable_timestamps, receive_with_timestamp, seconds_since

FailureMode = Literal["fast", "slow"]

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}
_MAX_HEADER_BYTES = 64 * 1024
_READ_BYTES = 65536
_MAX_KERNEL_WAIT = 10.0  # seconds: a longer wait in the socket is taken for a clock step and ignored


@dataclass(frozen=True)
class EmulatorConfig:
    """What one emulated backend is. Defaults: one FCFS worker, 10 ms exponential work."""

    name: str
    mode: Mode = "fcfs"
    workers: int = 1
    service_time: float = 0.010
    distribution: Distribution = "exponential"
    sigma: float = 1.0
    capacity: float = 1.0
    failure_probability: float = 0.0
    failure_mode: FailureMode = "fast"
    failure_delay: float = 0.5
    seed: int = 0
    body: bytes = b"ok\n"
    spin_limit: float = 0.0  # busy-wait bound for punctual departures (queueing module); 0 = plain timers

    def __post_init__(self) -> None:
        validate_name("name", self.name)
        ServiceTimes(self.service_time, self.distribution, self.sigma)  # validates
        ServiceModel(self.mode, self.workers, self.capacity, spin_limit=self.spin_limit)  # validates
        _check_failure(self.failure_probability, self.failure_mode, self.failure_delay)


def _check_failure(probability: float, mode: str, delay: float) -> None:
    if not isinstance(probability, (int, float)) or not 0.0 <= probability <= 1.0:
        raise ValueError(f"failure probability must be in [0, 1], got {probability!r}")
    if mode not in ("fast", "slow"):
        raise ValueError(f"failure mode must be 'fast' or 'slow', got {mode!r}")
    if not isinstance(delay, (int, float)) or not math.isfinite(delay) or delay < 0:
        raise ValueError(f"failure delay must be a number >= 0, got {delay!r}")


@dataclass
class EmulatorStats:
    """Counters since start (or the last reset). Latencies in seconds."""

    requests: int = 0
    successes: int = 0
    fast_failures: int = 0
    slow_failures: int = 0
    health_checks: int = 0
    light_probes: int = 0
    light_work_seconds: float = 0.0
    busy_seconds: float = 0.0
    work_seconds: float = 0.0
    server_latency_sum: float = 0.0
    connections: int = 0

    @property
    def mean_server_latency(self) -> float | None:
        return self.server_latency_sum / self.successes if self.successes else None


@dataclass
class _Request:
    method: str
    target: str
    close: bool
    arrived: float


class Emulator:
    """One emulated backend; ``await start(host, port)`` then serve until ``await stop()``.

    Everything runs on the loop that called ``start``; :class:`EmulatorFleet` gives
    thread-safe access from other threads.
    """

    def __init__(self, config: EmulatorConfig) -> None:
        self.config = config
        self._rng = random.Random(config.seed)
        self._times = ServiceTimes(config.service_time, config.distribution, config.sigma)
        self._model = ServiceModel(config.mode, config.workers, config.capacity, spin_limit=config.spin_limit)
        self._failure_probability = config.failure_probability
        self._failure_mode: FailureMode = config.failure_mode
        self._failure_delay = config.failure_delay
        self._stats = EmulatorStats()
        self._busy_offset = 0.0
        self._listeners: list[_Listener] = []
        self._protocols: set[_HttpProtocol] = set()
        self.host = ""
        self.port = 0

    # --- lifecycle --------------------------------------------------------------------
    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen on ``host:port`` (0 = any free port); returns the port."""
        validate_host("host", host)
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        if not infos:
            raise OSError(f"cannot listen on {host!r}: no address")
        for family, kind, proto, _, address in infos[:1] if port == 0 else infos:
            listening = socket.socket(family, kind, proto)
            try:
                listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    listening.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                listening.bind(address)
                enable_timestamps(listening)  # stamps what arrives before accept() too; inherited
                listening.listen(1024)
                listening.setblocking(False)
            except BaseException:
                listening.close()
                await self.stop()
                raise
            self._listeners.append(_Listener(self, listening))
        self.host = host
        self.port = int(self._listeners[0].sock.getsockname()[1])
        return self.port

    @property
    def address(self) -> str:
        return format_address(self.host, self.port)

    async def stop(self) -> None:
        for listener in self._listeners:
            listener.close()
        self._listeners = []
        for protocol in list(self._protocols):
            protocol.abort()

    # --- run-time control ---------------------------------------------------------------
    @property
    def capacity(self) -> float:
        return self._model.capacity

    def set_capacity(self, factor: float) -> None:
        """Scale the service rate (1 = nominal); applies at once to the requests in service."""
        self._model.set_capacity(factor)

    def set_failure(self, probability: float, mode: FailureMode | None = None, delay: float | None = None) -> None:
        mode = mode or self._failure_mode
        delay = self._failure_delay if delay is None else delay
        _check_failure(probability, mode, delay)
        self._failure_probability, self._failure_mode, self._failure_delay = probability, mode, delay

    def reset_stats(self) -> None:
        self._stats = EmulatorStats()
        self._busy_offset = self._model.busy_seconds

    def stats(self) -> EmulatorStats:
        stats = replace(self._stats)
        stats.busy_seconds = self._model.busy_seconds - self._busy_offset
        return stats

    def stats_dict(self) -> dict[str, Any]:
        stats = self.stats()
        data: dict[str, Any] = asdict(stats)
        data.update(
            name=self.config.name, mode=self.config.mode, workers=self.config.workers,
            service_time=self.config.service_time, distribution=self.config.distribution,
            capacity=self.capacity, in_flight=self._model.in_system,
            failure_probability=self._failure_probability, failure_mode=self._failure_mode,
            mean_server_latency=stats.mean_server_latency,
            timer_lead=self._model.lead, timer_spins=self._model.spins,
            timer_spin_seconds=self._model.spin_seconds, timer_late_wakeups=self._model.late_wakeups,
            scheduler=scheduler_name(),
        )
        return data

    # --- request handling ----------------------------------------------------------------
    def dispatch(self, request: _Request, respond: Callable[[int, bytes, float], None]) -> Callable[[], None] | None:
        """Start serving ``request``; ``respond(status, body, server_latency)`` runs when it is done.

        Callbacks, not a task per request: the emulator spends its CPU on HTTP, not on
        coroutine machinery. Returns a function that abandons the request (client gone),
        or None when it was answered at once.
        """
        arrived = request.arrived
        path, _, query = request.target.partition("?")
        if path == "/health":
            self._stats.health_checks += 1
            respond(200, b"ok\n", time.perf_counter() - arrived)
            return None
        if path == "/stats":
            respond(200, json.dumps(self.stats_dict()).encode(), time.perf_counter() - arrived)
            return None
        if path.startswith("/admin/"):
            respond(*self._admin(request.method, path, query, arrived))
            return None
        if path == "/light":
            return self._light(query, arrived, respond)
        self._stats.requests += 1
        if self._failure_probability > 0 and self._rng.random() < self._failure_probability:
            if self._failure_mode == "slow":
                self._stats.slow_failures += 1
                handle = asyncio.get_running_loop().call_later(
                    self._failure_delay, lambda: respond(503, b"failed\n", time.perf_counter() - arrived))
                return handle.cancel
            self._stats.fast_failures += 1
            respond(503, b"failed\n", time.perf_counter() - arrived)
            return None
        work = self._times.draw(self._rng)

        def served() -> None:
            latency = time.perf_counter() - arrived
            stats = self._stats
            stats.successes += 1
            stats.work_seconds += work
            stats.server_latency_sum += latency
            respond(200, self.config.body, latency)

        job = self._model.submit(work, served, age=time.perf_counter() - arrived)
        return None if job is None else (lambda: self._model.cancel(job))

    def _light(self, query: str, arrived: float,
               respond: Callable[[int, bytes, float], None]) -> Callable[[], None] | None:
        raw = parse_qs(query).get("work", [repr(self.config.service_time / 100)])[-1]
        try:
            work = float(raw)
        except ValueError:
            work = math.nan
        if not 0 <= work <= 1.0:  # also refuses nan
            respond(400, f"field 'work': {raw[:40]!r} must be seconds in [0, 1]\n".encode(),
                    time.perf_counter() - arrived)
            return None

        def served() -> None:
            self._stats.light_probes += 1
            self._stats.light_work_seconds += work
            respond(200, self.config.body, time.perf_counter() - arrived)

        job = self._model.submit(work, served, age=time.perf_counter() - arrived)
        return None if job is None else (lambda: self._model.cancel(job))

    async def handle(self, request: _Request) -> tuple[int, bytes, float]:
        """Status, body and server-side latency of one request (coroutine form of :meth:`dispatch`)."""
        future: asyncio.Future[tuple[int, bytes, float]] = asyncio.get_running_loop().create_future()

        def respond(status: int, body: bytes, latency: float) -> None:
            if not future.done():
                future.set_result((status, body, latency))

        abandon = self.dispatch(request, respond)
        try:
            return await future
        finally:
            if abandon is not None and not future.done():
                abandon()

    def _admin(self, method: str, path: str, query: str, arrived: float) -> tuple[int, bytes, float]:
        if method != "POST":
            return 405, b"admin endpoints need POST\n", time.perf_counter() - arrived
        params = {k: v[-1] for k, v in parse_qs(query).items()}
        try:
            if path == "/admin/capacity":
                self.set_capacity(float(params["factor"]))
            elif path == "/admin/failure":
                mode = params.get("mode")
                if mode is not None and mode not in ("fast", "slow"):
                    raise ValueError(f"failure mode must be 'fast' or 'slow', got {mode!r}")
                self.set_failure(
                    float(params["probability"]), mode,  # type: ignore[arg-type]
                    float(params["delay"]) if "delay" in params else None,
                )
            elif path == "/admin/reset":
                self.reset_stats()
            else:
                return 404, f"no admin endpoint {path}\n".encode(), time.perf_counter() - arrived
        except KeyError as missing:
            return 400, f"missing query parameter {missing}\n".encode(), time.perf_counter() - arrived
        except ValueError as bad:
            return 400, f"{bad}\n".encode(), time.perf_counter() - arrived
        return 200, json.dumps(self.stats_dict()).encode(), time.perf_counter() - arrived

    def response_bytes(self, status: int, body: bytes, latency: float, close: bool) -> bytes:
        head = (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\n"
            f"Content-Length: {len(body)}\r\nContent-Type: text/plain\r\n"
            f"X-Backend: {self.config.name}\r\nX-Inflight: {self._model.in_system + (status == 200)}\r\n"
            f"X-Server-Latency: {latency:.6f}\r\n" + ("Connection: close\r\n" if close else "") + "\r\n"
        )
        return head.encode("ascii") + body


class _HttpProtocol(asyncio.Protocol):
    """HTTP/1.1 server side of one connection: parse, queue, answer in order, one at a time."""

    def __init__(self, emulator: Emulator) -> None:
        self._emulator = emulator
        self._buffer = bytearray()
        self._queue: deque[_Request] = deque()
        self._transport: _SocketTransport | None = None
        self._current: _Request | None = None
        self._abandon: Callable[[], None] | None = None
        self._dispatching = False
        self._closing = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, _SocketTransport)
        self._transport = transport
        self._emulator._protocols.add(self)
        self._emulator._stats.connections += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._transport = None
        self._emulator._protocols.discard(self)
        self._queue.clear()
        if self._abandon is not None:
            self._abandon()
            self._abandon = None

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while not self._closing:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > _MAX_HEADER_BYTES:
                    self._fail(400, b"headers too long\n")
                break
            head = bytes(self._buffer[:end]).decode("latin-1")
            line_end = head.find("\r\n")
            parts = (head if line_end < 0 else head[:line_end]).split(" ")
            if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
                self._fail(400, b"bad request line\n")
                return
            length = 0
            close = parts[2] == "HTTP/1.0"
            if line_end >= 0:
                lowered = head[line_end:].lower()
                if "\r\ntransfer-encoding:" in lowered:
                    self._fail(400, b"chunked request bodies are not supported\n")
                    return
                at = lowered.find("\r\ncontent-length:")
                if at >= 0:
                    stop = lowered.find("\r\n", at + 2)
                    text = lowered[at + 17 : stop if stop >= 0 else len(lowered)].strip()
                    if not text.isdigit():
                        self._fail(400, b"bad content-length\n")
                        return
                    length = int(text)
                at = lowered.find("\r\nconnection:")
                if at >= 0:
                    stop = lowered.find("\r\n", at + 2)
                    token = lowered[at + 13 : stop if stop >= 0 else len(lowered)].strip()
                    close = token == "close" or (close and token != "keep-alive")
            if len(self._buffer) < end + 4 + length:
                break
            del self._buffer[: end + 4 + length]
            target = parts[1]
            if not target.startswith("/"):  # absolute form: keep path and query only
                split = urlsplit(target)
                target = (split.path or "/") + ("?" + split.query if split.query else "")
            arrived = self._transport.arrival if self._transport is not None else time.perf_counter()
            self._queue.append(_Request(parts[0], target, close, arrived))
            if close:
                self._closing = True
        if self._current is None:
            self._next()

    def _fail(self, status: int, body: bytes) -> None:
        self._closing = True
        self._queue.clear()
        if self._transport is not None:
            self._transport.write(self._emulator.response_bytes(status, body, 0.0, close=True))
            self._transport.close()

    def _next(self) -> None:
        # A loop, not recursion: requests answered at once (pipelined /health ...) come back here.
        while self._queue and self._transport is not None and self._current is None:
            request = self._current = self._queue.popleft()
            self._dispatching = True
            try:
                abandon = self._emulator.dispatch(request, self._respond)
            finally:
                self._dispatching = False
            if self._current is request:  # still being served: _respond continues the queue
                self._abandon = abandon
                return

    def _respond(self, status: int, body: bytes, latency: float) -> None:
        request, self._current, self._abandon = self._current, None, None
        transport = self._transport
        if request is None or transport is None or transport.is_closing():
            return
        transport.write(self._emulator.response_bytes(status, body, latency, request.close))
        if request.close:
            transport.close()
            return
        if not self._dispatching:
            self._next()


class _SocketTransport(asyncio.Transport):
    """One accepted connection on a non-blocking socket, read with ``recvmsg`` for the kernel's
    receive timestamp (``SO_TIMESTAMPNS``).

    asyncio's own transports read with ``recv``, which drops that timestamp. With it, a
    request's arrival (``arrival``, on ``time.perf_counter``'s clock) is when its last bytes
    reached the socket, not when this process got round to reading them: the emulated
    service starts then, so the emulator's own wake-up delay is not added to the injected
    latency (and is counted in ``X-Server-Latency``). Writes go straight to ``send``; what
    the socket does not take at once is buffered and written when it is writable.
    """

    def __init__(self, sock: socket.socket, protocol: _HttpProtocol) -> None:
        super().__init__()
        self._sock = sock
        self._fd = sock.fileno()
        self._loop = asyncio.get_running_loop()
        self._protocol = protocol
        self._out = bytearray()
        self._closing = False
        self._closed = False
        self._timestamps = enable_timestamps(sock)
        self.arrival = 0.0
        protocol.connection_made(self)
        self._loop.add_reader(self._fd, self._on_readable)

    def _on_readable(self) -> None:
        try:
            data, kernel_ns = receive_with_timestamp(self._sock, _READ_BYTES, self._timestamps)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as error:
            self._finish(error)
            return
        if not data:
            self._finish(None)
            return
        now = time.perf_counter()
        waited = seconds_since(kernel_ns)
        self.arrival = now - waited if 0.0 < waited < _MAX_KERNEL_WAIT else now
        self._protocol.data_received(data)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or self._closed:
            return
        if not self._out:
            try:
                sent = self._sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as error:
                self._finish(error)
                return
            if sent == len(data):
                return
            data = memoryview(data)[sent:]
            self._loop.add_writer(self._fd, self._on_writable)
        self._out += data

    def _on_writable(self) -> None:
        try:
            sent = self._sock.send(self._out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as error:
            self._finish(error)
            return
        del self._out[:sent]
        if not self._out:
            self._loop.remove_writer(self._fd)
            if self._closing:
                self._finish(None)

    def is_closing(self) -> bool:
        return self._closing or self._closed

    def close(self) -> None:
        """Close once everything written so far has been sent."""
        if self._closing or self._closed:
            return
        self._closing = True
        self._loop.remove_reader(self._fd)
        if not self._out:
            self._finish(None)

    def abort(self) -> None:
        self._finish(None)

    def _finish(self, exc: Exception | None) -> None:
        if self._closed:
            return
        self._closed = self._closing = True
        self._loop.remove_reader(self._fd)
        self._loop.remove_writer(self._fd)
        self._out.clear()
        self._sock.close()
        self._protocol.connection_lost(exc)


class _Listener:
    """A listening socket; each accepted connection gets a :class:`_SocketTransport`."""

    def __init__(self, emulator: Emulator, sock: socket.socket) -> None:
        self.sock = sock
        self._emulator = emulator
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(sock.fileno(), self._accept)

    def _accept(self) -> None:
        for _ in range(64):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors, aborted connection: the next accept may work
                return
            conn.setblocking(False)
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _SocketTransport(conn, _HttpProtocol(self._emulator))

    def close(self) -> None:
        self._loop.remove_reader(self.sock.fileno())
        self.sock.close()


# --- in-process fleet -------------------------------------------------------------------
def precise_event_loop() -> asyncio.AbstractEventLoop:
    """An event loop on ``select()``, whose timeouts have microsecond resolution.

    The default epoll selector rounds every wait up to whole milliseconds, which makes a
    2 ms service time last up to 3 ms; an emulator has few sockets, so ``select`` costs
    nothing and keeps injected latencies close to the truth. Its limit: file descriptors
    below 1024 (FD_SETSIZE), i.e. some hundreds of connections; ``--loop epoll`` (or
    ``EmulatorFleet(..., precise=False)``) lifts it at millisecond timer resolution.
    """
    return asyncio.SelectorEventLoop(selectors.SelectSelector())


class EmulatorFleet:
    """Several emulators on a background thread with their own event loop (for tests).

    ``with EmulatorFleet([EmulatorConfig("a"), EmulatorConfig("b")]) as fleet:`` then
    ``fleet.addresses`` (name -> ``host:port``), ``fleet.set_capacity("a", 0.6)``,
    ``fleet.stats("a")``, ``fleet.stop_backend("a")`` (stop listening: connection refused).
    """

    def __init__(self, configs: Sequence[EmulatorConfig], host: str = "127.0.0.1", precise: bool = True) -> None:
        names = [c.name for c in configs]
        if len(set(names)) != len(names):
            raise ValueError(f"emulator names must be unique, got {names}")
        self._configs = list(configs)
        self._host = validate_host("host", host)
        self._loop = precise_event_loop() if precise else asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="emulator-fleet", daemon=True)
        self.emulators: dict[str, Emulator] = {}

    def _call(self, fn: Callable[[], Any]) -> Any:
        async def wrapper() -> Any:
            return fn()

        return self._run(wrapper())

    def _run(self, coro: Coroutine[Any, Any, Any], timeout: float = 10.0) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout)

    def start(self) -> EmulatorFleet:
        self._thread.start()

        async def start_all() -> None:
            for config in self._configs:
                emulator = Emulator(config)
                await emulator.start(self._host, 0)
                self.emulators[config.name] = emulator

        self._run(start_all())
        return self

    @property
    def addresses(self) -> dict[str, str]:
        return {name: emulator.address for name, emulator in self.emulators.items()}

    def set_capacity(self, name: str, factor: float) -> None:
        self._call(lambda: self.emulators[name].set_capacity(factor))

    def set_failure(self, name: str, probability: float, mode: FailureMode | None = None,
                    delay: float | None = None) -> None:
        self._call(lambda: self.emulators[name].set_failure(probability, mode, delay))

    def stats(self, name: str) -> EmulatorStats:
        result: EmulatorStats = self._call(lambda: self.emulators[name].stats())
        return result

    def reset_stats(self) -> None:
        def reset_all() -> None:
            for emulator in self.emulators.values():
                emulator.reset_stats()

        self._call(reset_all)

    def stop_backend(self, name: str) -> None:
        self._run(self.emulators[name].stop())

    def stop(self) -> None:
        if not self._thread.is_alive():
            return

        async def stop_all() -> None:
            for emulator in self.emulators.values():
                await emulator.stop()

        with contextlib.suppress(Exception):
            self._run(stop_all())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    def __enter__(self) -> EmulatorFleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def emulator_fleet(configs: Sequence[EmulatorConfig], host: str = "127.0.0.1") -> Iterator[EmulatorFleet]:
    """Function form of ``with EmulatorFleet(configs) as fleet``."""
    with EmulatorFleet(configs, host) as fleet:
        yield fleet


# --- subprocess entry point ---------------------------------------------------------------
def _realtime_priority(text: str) -> int:
    try:
        return validate_priority(int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--realtime-priority must be an integer in 1-99, got {text!r}") from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m knapsack_lb.lab.testbed.emulator", description=__doc__.split("\n")[0])
    p.add_argument("--name", required=True, help="backend name (X-Backend); NAME-i when several ports")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, action="append", help="port to listen on (repeatable; 0 = free port)")
    p.add_argument("--mode", choices=["fcfs", "ps"], default="fcfs")
    p.add_argument("--workers", type=int, default=1, help="FCFS workers / PS cores")
    p.add_argument("--service-time", type=float, default=0.010, help="mean work per request, seconds")
    p.add_argument("--distribution", choices=["fixed", "exponential", "lognormal"], default="exponential")
    p.add_argument("--sigma", type=float, default=1.0, help="lognormal shape")
    p.add_argument("--capacity", type=float, default=1.0, help="initial capacity factor")
    p.add_argument("--failure-probability", type=float, default=0.0)
    p.add_argument("--failure-mode", choices=["fast", "slow"], default="fast")
    p.add_argument("--failure-delay", type=float, default=0.5, help="seconds before a slow failure answers")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--duration", type=float, default=None, help="stop by itself after this many seconds")
    p.add_argument("--spin-limit", type=float, default=0.0,
                   help="seconds of busy-wait allowed before a departure to make it punctual, e.g. 0.0005 "
                        "(costs CPU; default 0 = plain timers, a few tenths of a ms late)")
    p.add_argument("--realtime-priority", type=_realtime_priority, default=None, metavar="1-99",
                   help="run this process under SCHED_FIFO at this priority so that a busy machine does not "
                        "delay its departures (needs CAP_SYS_NICE; refused: a warning, ordinary scheduling; "
                        "see knapsack_lb.lab.testbed.realtime); default: ordinary scheduling")
    p.add_argument("--loop", choices=["select", "epoll"], default="select",
                   help="select: microsecond timers, fds < 1024; epoll: millisecond timers, no fd limit")
    return p


async def _serve(args: argparse.Namespace) -> None:
    ports = args.port or [0]
    emulators: list[Emulator] = []
    for i, port in enumerate(ports):
        name = args.name if len(ports) == 1 else f"{args.name}-{i}"
        config = EmulatorConfig(
            name=name, mode=args.mode, workers=args.workers, service_time=args.service_time,
            distribution=args.distribution, sigma=args.sigma, capacity=args.capacity,
            failure_probability=args.failure_probability, failure_mode=args.failure_mode,
            failure_delay=args.failure_delay, seed=args.seed + i, spin_limit=args.spin_limit,
        )
        emulator = Emulator(config)
        await emulator.start(args.host, port)
        emulators.append(emulator)
        print(f"listening {name} {emulator.address}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=args.duration)
    for emulator in emulators:
        await emulator.stop()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.realtime_priority is not None:
        refused = request_realtime(args.realtime_priority)
        if refused:
            print(f"emulator: warning: --realtime-priority {args.realtime_priority} not applied ({refused}); "
                  "running with ordinary scheduling", file=sys.stderr, flush=True)
    try:
        factory = precise_event_loop if args.loop == "select" else asyncio.new_event_loop
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(_serve(args))
    except ValueError as bad:
        print(f"emulator: {bad}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
