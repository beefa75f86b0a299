"""The client requests Envoy timed, from its gRPC access log service (ALS).

Envoy keeps no per-host latency outside its access log, and has no syslog logger to send one; its
own way out is the gRPC access log service: with an ``envoy.access_loggers.http_grpc`` logger on
the HTTP connection manager, Envoy streams an ``HTTPAccessLogEntry`` per request
(``envoy.service.accesslog.v3.AccessLogService/StreamAccessLogs``) to a static HTTP/2 cluster,
batched every ``buffer_flush_interval`` (1 s by default). :class:`AlsTimer` is that service: it
reads each entry as one request of the host Envoy sent it to (``upstream_remote_address``, in the
``upstream_cluster``) and tallies them per host like the syslog receivers
(:class:`adapters.access_log.TimingsReceiver`). The response time is from the first byte sent
upstream to the last byte received from upstream (``time_to_last_upstream_rx_byte`` less
``time_to_first_upstream_tx_byte``: the DIP's time, without the downstream request's own
arrival); an entry with no upstream response is a failure of its host, as is a 5xx.

What it does not see: a retried request's earlier tries (the entry names the last host);
intermediate entries of long streams are skipped (the final one counts). How it fails: a port that
cannot be bound raises ``OSError`` from :meth:`AlsTimer.start`; a stream that breaks is Envoy's to
reopen (its gRPC logger reconnects); anyone who can reach the port can send entries, so bind it
where only Envoy reaches it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import grpc
from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc

from adapters.access_log import LoggedRequest, TimingsReceiver
from adapters.envoy_xds import grpc_server
from knapsack_lb.names import format_address


def _seconds(duration: Any) -> float:
    return float(duration.seconds) + duration.nanos / 1e9


def entry_request(entry: accesslog_pb2.HTTPAccessLogEntry) -> LoggedRequest | None:
    """The request of one HTTP access log entry, or ``None`` when no host took it (no upstream
    address) or it is an intermediate entry of a stream still open."""
    common = entry.common_properties
    address = common.upstream_remote_address.socket_address
    if common.intermediate_log_entry or not address.address or not address.port_value:
        return None
    server = format_address(address.address, address.port_value)
    response_time = None
    if common.HasField("time_to_last_upstream_rx_byte"):
        sent = _seconds(common.time_to_first_upstream_tx_byte) if common.HasField("time_to_first_upstream_tx_byte") \
            else 0.0
        response_time = max(0.0, _seconds(common.time_to_last_upstream_rx_byte) - sent)
    status = entry.response.response_code.value if entry.response.HasField("response_code") else -1
    return LoggedRequest(common.upstream_cluster, server, response_time, status)


def message_requests(message: als_pb2.StreamAccessLogsMessage) -> Iterator[tuple[LoggedRequest, ...]]:
    """One tuple per HTTP entry of one stream message (TCP entries time no request)."""
    for entry in message.http_logs.log_entry:
        request = entry_request(entry)
        yield () if request is None else (request,)


class AlsTimer(TimingsReceiver):
    """A gRPC ``AccessLogService`` on ``host:port`` that times ``cluster``'s hosts."""

    def __init__(self, host: str, port: int, cluster: str, *, max_streams: int = 16) -> None:
        super().__init__(host, port, cluster, "Envoy")
        self.max_streams = max_streams
        self._server: grpc.Server | None = None

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> AlsTimer:
        if self._server is None:  # a stream holds a pool thread for as long as Envoy keeps it open
            self._server, self.port = grpc_server(
                self.host, self.port, self.max_streams, "access log service",
                lambda server: als_pb2_grpc.add_AccessLogServiceServicer_to_server(_Servicer(self), server))
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.stop(grace=0.5).wait(2.0)
            self._server = None

    def feed(self, message: als_pb2.StreamAccessLogsMessage) -> None:
        """Count one stream message's entries (what the service does with each)."""
        for requests in message_requests(message):
            self.times.add(requests)


class _Servicer(als_pb2_grpc.AccessLogServiceServicer):
    def __init__(self, timer: AlsTimer) -> None:
        self.timer = timer

    def StreamAccessLogs(  # the gRPC method name
        self, request_iterator: Iterator[als_pb2.StreamAccessLogsMessage], context: grpc.ServicerContext
    ) -> als_pb2.StreamAccessLogsResponse:
        for message in request_iterator:
            with contextlib.suppress(Exception):  # a malformed entry must never end the stream
                self.timer.feed(message)
        return als_pb2.StreamAccessLogsResponse()
