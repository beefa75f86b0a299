"""The client requests HAProxy timed, read from its HTTP logs: a syslog receiver on UDP.

A layer-7 HAProxy times every request it forwards: ``Tr`` in its HTTP log line (``option
httplog``) is the time from sending the request to the server until the server's response
headers came back, in milliseconds. The runtime API has only ``rtime``, a mean over a server's
last 1024 requests that lags a weight change by thousands of requests; the log has each request.
With ``log <host:port> local0`` and ``option httplog`` in the operator's configuration,
:class:`HttpLogTimer` receives the lines on ``log_listen``, keeps for each server of one backend
the requests' count, sum and sum of squares of ``Tr`` and the failures (no response, or a 5xx the
server answered), and :meth:`HttpLogTimer.take` hands them over as
:class:`~knapsack_lb.model.TimedRequests`, restarting the count. The controller pools them into
the DIP's probe round (KnapsackLB paper, section 4.3: a DIP's latency at the weight it carries;
the LB's own requests are samples of it that cost the DIP nothing).

The line format is HAProxy's HTTP log (``option httplog``, HAProxy 1.9 and later): after the
date, ``frontend backend/server TR/Tw/Tc/Tr/Ta status ...``, in any syslog framing (RFC 3164 or
5424). A TCP log line (layer 4, ``option tcplog``) has three timers and no status and is not
counted: at layer 4 HAProxy times no request.

How it fails: a line that is not an HTTP log line of the backend is ignored (counted in
``ignored``); a port that cannot be bound raises ``OSError`` from :meth:`HttpLogTimer.start`;
anyone who can send datagrams to ``log_listen`` can feed it lines, so bind it where only HAProxy
reaches it (loopback, or a private interface). UDP drops datagrams under load; the counts are
then a sample, which the pooled mean does not mind.
"""

from __future__ import annotations

import contextlib
import math
import re
import socket
import threading
from dataclasses import dataclass

from knapsack_lb.model import TimedRequests

HTTP_LOG = re.compile(
    r" (?P<backend>[^\s/]+)/(?P<server>[^\s/]+)"
    r" (?P<TR>-?\d+)/(?P<Tw>-?\d+)/(?P<Tc>-?\d+)/(?P<Tr>-?\d+)/\+?(?P<Ta>-?\d+) (?P<status>-?\d+) "
)
MAX_DATAGRAM = 65535


@dataclass(frozen=True)
class LoggedRequest:
    """One request of an HTTP log line: where HAProxy sent it, ``Tr`` in seconds (``None``: no
    response came), and the status it answered (-1 when it had none)."""

    backend: str
    server: str
    response_time: float | None
    status: int

    @property
    def failed(self) -> bool:
        return self.response_time is None or self.status >= 500


def parse_http_log_line(line: str) -> LoggedRequest | None:
    """The request of one HTTP log line, or ``None`` when the line is not one (a TCP log line, a
    request no server took: ``<NOSRV>``)."""
    match = HTTP_LOG.search(line)
    if match is None or match["server"] == "<NOSRV>":
        return None
    tr = int(match["Tr"])
    return LoggedRequest(match["backend"], match["server"], None if tr < 0 else tr / 1000.0, int(match["status"]))


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


class HttpLogTimer:
    """Receives HAProxy's HTTP log lines on a UDP ``host:port`` and times ``backend``'s servers."""

    def __init__(self, host: str, port: int, backend: str) -> None:
        self.host, self.port, self.backend = host, port, backend
        self.ignored = 0  # datagrams that were not an HTTP log line of the backend
        self._tallies: dict[str, _Tally] = {}
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> HttpLogTimer:
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
        self._thread = threading.Thread(target=self._receive, name=f"haproxy-log-{self.port}", daemon=True)
        self._thread.start()
        return self

    def take(self) -> dict[str, TimedRequests]:
        """Each server's requests timed since the last take (servers with none are left out)."""
        with self._lock:
            tallies, self._tallies = self._tallies, {}
        return {server: tally.timed() for server, tally in tallies.items()}

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
        request = parse_http_log_line(datagram.decode("utf-8", errors="replace"))
        if request is None or request.backend != self.backend:
            self.ignored += 1
            return
        with self._lock:
            self._tallies.setdefault(request.server, _Tally()).add(request)

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
