"""The client requests a layer-7 LB timed, read from its access log: a syslog receiver on UDP.

A layer-7 LB times every request it forwards to a server and can write one log line per request
to a syslog server over UDP (HAProxy: ``log <host:port>`` with ``option httplog``; Nginx:
``access_log syslog:server=<host:port>``). :class:`AccessLogTimer` receives those lines on
``log_listen``, reads each with the LB's own line parser (:mod:`adapters.haproxy_log`,
:mod:`adapters.nginx_log`), keeps for each server of one backend the requests' count, sum and
sum of squares of the response time and the failures (no response, or a 5xx the server
answered), and :meth:`TimingsReceiver.poll` hands them over by DIP as
:class:`~knapsack_lb.model.TimedRequests`, restarting the count. The controller pools them into
the DIP's probe round (KnapsackLB paper, section 4.3: a DIP's latency at the weight it carries;
the LB's own requests are samples of it that cost the DIP nothing). Envoy, which sends no syslog,
streams the same over gRPC to another :class:`TimingsReceiver` (:mod:`adapters.envoy_als`).

How it fails: a line the parser does not read as a request of the backend is ignored (counted in
``ignored``); a port that cannot be bound raises ``OSError`` from :meth:`TimingsReceiver.take`
(which binds it on first use; :meth:`TimingsReceiver.poll` returns ``None`` and says why), and the
next take tries again;
anyone who can send datagrams to ``log_listen`` can feed it lines, so bind it where only the LB
reaches it (loopback, or a private interface). UDP drops datagrams under load; the counts are
then a sample, which the pooled mean does not mind.
"""

from __future__ import annotations

import contextlib
import math
import socket
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from knapsack_lb.model import TimedRequests
from knapsack_lb.names import format_address, parse_address

MAX_DATAGRAM = 65535


@dataclass(frozen=True)
class LoggedRequest:
    """One request to one server as an access log line tells it: the backend (upstream) and the
    server the LB sent it to, the response time in seconds (``None``: no response came), and the
    status the server answered (-1 when it had none)."""

    backend: str
    server: str
    response_time: float | None
    status: int

    @property
    def failed(self) -> bool:
        return self.response_time is None or self.status >= 500


LineParser = Callable[[str], Iterable[LoggedRequest]]


@dataclass
class _Tally:
    successes: int = 0
    total: float = 0.0
    squares: float = 0.0
    failures: int = 0

    def add(self, request: LoggedRequest) -> None:
        if request.failed:
            self.failures += 1
            return
        assert request.response_time is not None
        self.successes += 1
        self.total += request.response_time
        self.squares += request.response_time**2

    def timed(self) -> TimedRequests:
        mean = self.total / self.successes if self.successes else None
        std = None
        if mean is not None and self.successes >= 2:
            std = math.sqrt(max(0.0, (self.squares - self.successes * mean**2) / (self.successes - 1)))
        return TimedRequests(self.successes, mean, std, self.failures)


def dips_by_address(servers: Mapping[str, str]) -> dict[str, str]:
    """DIP by the ``host:port`` an LB names the server it connected to (Nginx's ``$upstream_addr``,
    Envoy's ``upstream_remote_address``): its address as written and, for a hostname, every
    address it resolves to now (none when it does not resolve)."""
    dip_at: dict[str, str] = {}
    for dip, address in servers.items():
        host, port = parse_address(f"servers.{dip}", address)
        dip_at[format_address(host, port)] = dip
        with contextlib.suppress(OSError):
            for *_, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
                dip_at.setdefault(format_address(str(sockaddr[0]), port), dip)
    return dip_at


class ServerTimes:
    """Each server's tally of one backend's requests, fed by a receiver thread and taken by the
    adapter (thread-safe)."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.ignored = 0  # lines that held no request of the backend
        self._tallies: dict[str, _Tally] = {}
        self._lock = threading.Lock()

    def add(self, requests: Iterable[LoggedRequest]) -> None:
        """Count one line's requests (those of other backends are left out)."""
        mine = [request for request in requests if request.backend == self.backend]
        with self._lock:
            if not mine:
                self.ignored += 1
            for request in mine:
                self._tallies.setdefault(request.server, _Tally()).add(request)

    def take(self) -> dict[str, TimedRequests]:
        """Each server's requests since the last take (servers with none are left out)."""
        with self._lock:
            tallies, self._tallies = self._tallies, {}
        return {server: tally.timed() for server, tally in tallies.items()}


class TimingsReceiver(ABC):
    """Where an LB sends the requests it timed: started on first use, read by :meth:`poll`."""

    def __init__(self, host: str, port: int, backend: str, lb: str) -> None:
        self.host, self.port, self.lb = host, port, lb
        self.times = ServerTimes(backend)
        self.error = ""  # why the last poll() could not receive

    @property
    @abstractmethod
    def running(self) -> bool: ...

    @abstractmethod
    def start(self) -> TimingsReceiver:
        """Bind ``host:port`` and receive in the background (``OSError`` when it cannot be bound)."""

    @abstractmethod
    def close(self) -> None: ...

    @property
    def ignored(self) -> int:
        return self.times.ignored

    def take(self) -> dict[str, TimedRequests]:
        """Each server's requests timed since the last take. The first take after construction or
        :meth:`close` starts receiving (``OSError`` when the port cannot be bound) and has timed
        nothing yet."""
        if not self.running:
            self.start()
        return self.times.take()

    def poll(self, dip_of: Callable[[str], str | None]) -> dict[str, TimedRequests] | None:
        """:meth:`take` by DIP (``dip_of`` names a server's DIP; servers it does not know are left
        out), or ``None`` when the port cannot be bound (the reason in ``error``)."""
        try:
            taken = self.take()
        except OSError as exc:
            self.error = f"cannot receive {self.lb}'s logs on log_listen {format_address(self.host, self.port)}: {exc}"
            return None
        return {dip: timed for server, timed in taken.items() if (dip := dip_of(server)) is not None}


class AccessLogTimer(TimingsReceiver):
    """Receives an LB's access log lines on a UDP ``host:port`` and times ``backend``'s servers,
    each line read by ``parse`` (a line may hold several requests: an LB's retries)."""

    def __init__(self, host: str, port: int, backend: str, parse: LineParser, *, lb: str = "the LB") -> None:
        super().__init__(host, port, backend, lb)
        self.parse = parse
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> AccessLogTimer:
        """Bind the port and receive in a daemon thread (raises ``OSError`` if the port is taken)."""
        if self.running:
            return self
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            sock.bind((self.host, self.port))
        except OSError:
            sock.close()
            raise
        sock.settimeout(0.5)  # how soon close() is seen
        self.port = sock.getsockname()[1]
        self._sock, self._stop = sock, threading.Event()
        self._thread = threading.Thread(target=self._receive, name=f"access-log-{self.port}", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def feed(self, datagram: bytes) -> None:
        """Count one syslog datagram (one line; what the receiver does with each)."""
        self.times.add(self.parse(datagram.decode("utf-8", errors="replace")))

    def _receive(self) -> None:
        sock = self._sock
        assert sock is not None
        while not self._stop.is_set():
            try:
                datagram = sock.recv(MAX_DATAGRAM)
            except TimeoutError:
                continue
            except OSError:
                return  # closed under us
            with contextlib.suppress(Exception):  # a malformed line must never end the receiver
                self.feed(datagram)


ReceiverT = TypeVar("ReceiverT", bound=TimingsReceiver)
DipOf = Callable[[str], "str | None"]


class LbTimings(Generic[ReceiverT]):
    """An adapter's ``timings()`` and ``close()`` when its LB sends the requests it timed to
    ``log_listen``: :meth:`_timings_receiver` builds the receiver and the server -> DIP mapping at
    the first call (``None``: no ``log_listen``), and every call polls it by DIP; a port that cannot
    be bound is the adapter's ``last_error``."""

    last_error: str
    _log_timer: ReceiverT | None = None
    _timed_dip_of: DipOf

    def _timings_receiver(self) -> tuple[ReceiverT, DipOf] | None:
        raise NotImplementedError

    def timings(self) -> dict[str, TimedRequests] | None:
        """The client requests the LB timed per DIP since the last call; ``None`` without
        ``log_listen`` or when its port cannot be bound (the reason is in ``last_error``). The
        receiver starts at the first call, so that call has timed nothing yet."""
        if self._log_timer is None:
            built = self._timings_receiver()
            if built is None:
                return None
            self._log_timer, self._timed_dip_of = built
        timed = self._log_timer.poll(self._timed_dip_of)
        if timed is None:
            self.last_error = self._log_timer.error
        return timed

    def close(self) -> None:
        """Stop receiving what the LB timed."""
        if self._log_timer is not None:
            self._log_timer.close()
