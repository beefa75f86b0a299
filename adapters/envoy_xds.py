"""A minimal xDS control plane: a gRPC Endpoint Discovery Service for Envoy (state of the world).

This is the "real control-plane deployment" way of handing weights to Envoy
(KnapsackLB paper, section 3.2: KnapsackLB programs the LB through the interface it
already has; the controller stays off the data path). Envoy's cluster points its
``eds_cluster_config.eds_config`` at this server (``api_config_source: {api_type: GRPC,
transport_api_version: V3, grpc_services: [{envoy_grpc: {cluster_name: xds}}]}``) and opens a
``StreamEndpoints`` stream on which it subscribes to cluster names.

Protocol handling (xDS REST/gRPC protocol, "ACK and NACK semantics"):

* every response carries a ``version_info`` (one global counter, bumped on every push) and
  a fresh ``nonce``; a request whose ``response_nonce`` is not the last nonce sent on that
  stream is stale and ignored;
* a request with the last nonce and no ``error_detail`` ACKs that version; with
  ``error_detail`` it NACKs it (Envoy keeps its previous assignment);
* a change of ``resource_names`` (or the first request) is answered with the current
  assignments of the subscribed clusters, if the server has any yet (otherwise Envoy waits
  for the first push, bounded by its ``initial_fetch_timeout``);
* ``push`` stores a new assignment, sends it on every stream subscribed to that cluster and
  waits (bounded) for each to ACK or NACK.
* ``DeltaEndpoints`` (incremental xDS, Envoy's ``api_type: DELTA_GRPC``) is served too: the
  client subscribes and unsubscribes by name (``*`` or an empty first request: wildcard),
  reports the versions it has on reconnect (``initial_resource_versions``), and gets only the
  resources whose version it lacks; ACK/NACK by nonce as above. ``FetchEndpoints`` (REST) is
  not implemented (gRPC UNIMPLEMENTED), nor is removing a resource from delta clients.

The server runs on gRPC's own thread pool in the background; one server per listen
address is shared by all adapters (VIPs) that name it (``EdsServer.shared``), and stops
when the last of them releases it. Only assignments already validated against the
protobuf schema reach it (``adapters.envoy.validate_assignment``).
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, ClassVar

import grpc
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.endpoint.v3 import eds_pb2_grpc

from knapsack_lb.names import format_address, validate_host, validate_port

CLA_TYPE_URL = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
MAX_IN_FLIGHT = 64  # delta responses remembered per stream until ACKed or NACKed


def grpc_server(host: str, port: int, workers: int, what: str, add: Callable[[grpc.Server], None]
                ) -> tuple[grpc.Server, int]:
    """A started gRPC server on ``host:port`` (0: any free port) with the services ``add`` puts on
    it, and the port it is bound to; ``OSError`` when it cannot listen. Without SO_REUSEPORT
    (gRPC's default is on): a second server on the same port must fail, not share its clients."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=what.replace(" ", "-")),
                         options=[("grpc.so_reuseport", 0)])
    add(server)
    detail = ""
    try:
        bound = server.add_insecure_port(format_address(host, port))
    except RuntimeError as exc:
        bound = 0
        detail = str(exc)
    if bound == 0:
        server.stop(0)
        raise OSError(f"{what} could not listen on {format_address(host, port)} (in use?) {detail}".rstrip())
    server.start()
    return server, bound


@dataclass(frozen=True)
class PushOutcome:
    """What the subscribed Envoys said about one pushed version."""

    version: int
    acked: int
    nacked: tuple[str, ...]
    pending: int


@dataclass
class _Stream:
    """Server-side state of one ``StreamEndpoints`` stream (one Envoy, one gRPC mux)."""

    id: int
    events: queue.Queue[tuple[str, Any]] = field(default_factory=queue.Queue)
    subscribed: frozenset[str] | None = None  # None: no request yet; empty: wildcard
    last_nonce: str = ""
    sent_version: int = 0
    acked_version: int = 0
    nacked_version: int = 0
    nack_message: str = ""
    node: str = ""
    delta: bool = False
    sent_resource_versions: dict[str, str] = field(default_factory=dict)  # delta: what the client has
    acked_resource_versions: dict[str, str] = field(default_factory=dict)
    in_flight: dict[str, dict[str, str]] = field(default_factory=dict)  # delta: nonce -> resources sent

    def wildcard(self) -> bool:
        if self.subscribed is None:
            return False
        return "*" in self.subscribed if self.delta else not self.subscribed

    def wants(self, cluster: str) -> bool:
        return self.subscribed is not None and (self.wildcard() or cluster in self.subscribed)


class EdsServer:
    """State-of-the-world EDS server for ``ClusterLoadAssignment`` resources."""

    _registry: ClassVar[dict[tuple[str, int], EdsServer]] = {}
    _registry_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, host: str = "127.0.0.1", port: int = 0, max_streams: int = 16) -> None:
        self.host = validate_host("xds_listen", host)
        self.port = port if port == 0 else validate_port("xds_listen", port)
        self._max_streams = max_streams
        self._cond = threading.Condition()
        self._resources: dict[str, Any] = {}
        self._resource_versions: dict[str, int] = {}
        self._version = 0
        self._streams: dict[int, _Stream] = {}
        self._ids = itertools.count(1)
        self._nonces = itertools.count(1)
        self._server: grpc.Server | None = None
        self._users = 0

    # -- lifecycle -------------------------------------------------------------------------

    @classmethod
    def shared(cls, host: str, port: int) -> EdsServer:
        """The running server for ``host:port`` (started on first use); call ``release()``."""
        with cls._registry_lock:
            server = cls._registry.get((host, port))
            if server is None:
                server = cls(host, port).start()
                cls._registry[(host, port)] = server
            server._users += 1
            return server

    def release(self) -> None:
        with self._registry_lock:
            self._users -= 1
            if self._users > 0:
                return
            if self._registry.get((self.host, self.port)) is self:
                self._registry.pop((self.host, self.port))
        self.stop()

    def start(self) -> EdsServer:
        # Each stream holds one pool thread for its response generator.
        server, self.port = grpc_server(
            self.host, self.port, self._max_streams + 2, "xDS server",
            lambda server: eds_pb2_grpc.add_EndpointDiscoveryServiceServicer_to_server(_Servicer(self), server))
        self._server = server
        return self

    def shutdown(self) -> None:
        """Stop now whoever still uses it (the owner of the port is going away); adapters that
        held it start or join a fresh server on their next apply."""
        with self._registry_lock:
            if self._registry.get((self.host, self.port)) is self:
                self._registry.pop((self.host, self.port))
            self._users = 0
        self.stop()

    @property
    def running(self) -> bool:
        return self._server is not None

    def stop(self, grace: float = 0.5) -> None:
        with self._cond:
            for stream in self._streams.values():
                stream.events.put(("end", None))
        if self._server is not None:
            self._server.stop(grace).wait(grace + 1.0)
            self._server = None

    def __enter__(self) -> EdsServer:
        return self if self._server is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def address(self) -> str:
        return format_address(self.host, self.port)

    # -- what the adapter calls ------------------------------------------------------------

    def stream_count(self) -> int:
        with self._cond:
            return len(self._streams)

    def current(self, cluster: str) -> Any | None:
        """The assignment served now for ``cluster`` (a ``ClusterLoadAssignment``) or None."""
        with self._cond:
            return self._resources.get(cluster)

    def push(self, cluster: str, assignment: Any, timeout: float = 2.0) -> PushOutcome:
        """Serve ``assignment`` for ``cluster`` from now on, send it to every subscribed
        stream and wait up to ``timeout`` s until each has ACKed or NACKed it."""
        if not isinstance(assignment, endpoint_pb2.ClusterLoadAssignment) or assignment.cluster_name != cluster:
            raise ValueError(f"push needs a ClusterLoadAssignment for cluster {cluster!r}")
        with self._cond:
            self._version += 1
            version = self._version
            self._resources[cluster] = assignment
            self._resource_versions[cluster] = version
            targets = [s for s in self._streams.values() if s.wants(cluster)]
            for stream in targets:
                stream.events.put(("changed", cluster))

            def settled() -> bool:
                return all(
                    s.id not in self._streams or s.acked_version >= version or s.nacked_version >= version
                    for s in targets
                )

            self._cond.wait_for(settled, timeout)
            live = [s for s in targets if s.id in self._streams]
            nacked = tuple(
                f"{s.node or f'stream {s.id}'}: {s.nack_message}" for s in live if s.nacked_version >= version
            )
            acked = sum(1 for s in live if s.acked_version >= version)
            return PushOutcome(version, acked, nacked, len(live) - acked - len(nacked))

    def withdraw(self, cluster: str) -> None:
        """Stop serving ``cluster`` to new subscribers (Envoys keep what they have)."""
        with self._cond:
            self._resources.pop(cluster, None)
            self._resource_versions.pop(cluster, None)

    # -- the stream ------------------------------------------------------------------------

    def stream_endpoints(
        self, requests: Iterator[Any], context: grpc.ServicerContext, *, delta: bool = False
    ) -> Iterator[Any]:
        """Serve one stream: ``StreamEndpoints`` (state of the world) or, with ``delta``,
        ``DeltaEndpoints`` (incremental: only resources whose version the client lacks)."""
        with self._cond:
            if len(self._streams) >= self._max_streams:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"at most {self._max_streams} EDS streams")
            stream = _Stream(next(self._ids), delta=delta)
            self._streams[stream.id] = stream

        def read_requests() -> None:
            try:
                for request in requests:
                    stream.events.put(("request", request))
            except grpc.RpcError:
                pass
            finally:
                stream.events.put(("end", None))

        reader = threading.Thread(target=read_requests, name=f"eds-stream-{stream.id}", daemon=True)
        reader.start()
        context.add_callback(lambda: stream.events.put(("end", None)))
        try:
            while True:
                kind, item = stream.events.get()
                if kind == "end":
                    return
                if kind == "request":
                    response = self._on_delta_request(stream, item) if delta else self._on_request(stream, item)
                else:
                    response = self._on_change(stream)
                if response is not None:
                    yield response
        finally:
            with self._cond:
                self._streams.pop(stream.id, None)
                self._cond.notify_all()

    def _on_request(self, stream: _Stream, request: discovery_pb2.DiscoveryRequest) -> Any:
        with self._cond:
            if request.type_url and request.type_url != CLA_TYPE_URL:
                return None
            if request.node.id:
                stream.node = request.node.id
            if request.response_nonce:
                error = request.error_detail if request.HasField("error_detail") else None
                if not self._ack_or_nack(stream, request.response_nonce, error):
                    return None  # stale: an answer to a response we have since replaced
            names = frozenset(request.resource_names)
            if stream.subscribed == names:
                return None
            stream.subscribed = names
            return self._response(stream)

    def _on_change(self, stream: _Stream) -> Any:
        with self._cond:
            return self._delta_response(stream) if stream.delta else self._response(stream)

    def _ack_or_nack(self, stream: _Stream, nonce: str, error: Any) -> bool:
        """Record an ACK/NACK of the last response; False for a stale nonce (caller holds the lock)."""
        if nonce != stream.last_nonce:
            return False
        if error is not None:
            stream.nacked_version = stream.sent_version
            stream.nack_message = error.message
        else:
            stream.acked_version = stream.sent_version
        self._cond.notify_all()
        return True

    def _on_delta_request(self, stream: _Stream, request: discovery_pb2.DeltaDiscoveryRequest) -> Any:
        with self._cond:
            if request.type_url and request.type_url != CLA_TYPE_URL:
                return None
            if request.node.id:
                stream.node = request.node.id
            first = stream.subscribed is None
            names = set(stream.subscribed or ())
            if first:
                # on (re)connect the client says which versions it already has
                stream.sent_resource_versions = dict(request.initial_resource_versions)
                if not request.resource_names_subscribe:
                    names.add("*")  # legacy wildcard: an empty first subscription
            if request.response_nonce:
                error = request.error_detail if request.HasField("error_detail") else None
                # per response: what it carried is now held by the client (ACK), or not (NACK)
                carried = stream.in_flight.pop(request.response_nonce, {})
                for name, version in carried.items():
                    if error is None:
                        stream.acked_resource_versions[name] = version
                    elif name in stream.acked_resource_versions:
                        stream.sent_resource_versions[name] = stream.acked_resource_versions[name]
                    else:
                        stream.sent_resource_versions.pop(name, None)
                self._ack_or_nack(stream, request.response_nonce, error)
            names |= set(request.resource_names_subscribe)
            for name in request.resource_names_unsubscribe:
                names.discard(name)
                stream.sent_resource_versions.pop(name, None)
            stream.subscribed = frozenset(names)
            if request.HasField("error_detail"):
                return None  # do not resend what was just rejected; the next push will
            return self._delta_response(stream)

    def _delta_response(self, stream: _Stream) -> Any:
        """The subscribed resources whose version the client does not have (lock held)."""
        assert stream.subscribed is not None
        names = sorted(self._resources) if stream.wildcard() else sorted(n for n in stream.subscribed if n != "*")
        response = discovery_pb2.DeltaDiscoveryResponse(system_version_info=str(self._version), type_url=CLA_TYPE_URL)
        for name in names:
            if name not in self._resources:
                continue
            version = str(self._resource_versions[name])
            if stream.sent_resource_versions.get(name) == version:
                continue
            resource = response.resources.add(name=name, version=version)
            resource.resource.Pack(self._resources[name])
            stream.sent_resource_versions[name] = version
        if not response.resources:
            return None
        response.nonce = str(next(self._nonces))
        stream.in_flight[response.nonce] = {r.name: r.version for r in response.resources}
        while len(stream.in_flight) > MAX_IN_FLIGHT:  # a client that never answers
            stream.in_flight.pop(next(iter(stream.in_flight)))
        stream.last_nonce = response.nonce
        stream.sent_version = self._version
        return response

    def _response(self, stream: _Stream) -> Any:
        """A response with every subscribed assignment the server has (caller holds the lock)."""
        assert stream.subscribed is not None
        names = sorted(stream.subscribed) if stream.subscribed else sorted(self._resources)
        resources = [self._resources[n] for n in names if n in self._resources]
        if not resources:
            return None
        response = discovery_pb2.DiscoveryResponse(
            version_info=str(self._version), type_url=CLA_TYPE_URL, nonce=str(next(self._nonces))
        )
        for resource in resources:
            response.resources.add().Pack(resource)
        stream.last_nonce = response.nonce
        stream.sent_version = self._version
        return response


class _Servicer(eds_pb2_grpc.EndpointDiscoveryServiceServicer):
    def __init__(self, server: EdsServer) -> None:
        self._server = server

    def StreamEndpoints(  # the gRPC method name
        self, request_iterator: Iterator[discovery_pb2.DiscoveryRequest], context: grpc.ServicerContext
    ) -> Iterator[discovery_pb2.DiscoveryResponse]:
        return self._server.stream_endpoints(request_iterator, context)

    def DeltaEndpoints(  # the gRPC method name
        self, request_iterator: Iterator[discovery_pb2.DeltaDiscoveryRequest], context: grpc.ServicerContext
    ) -> Iterator[discovery_pb2.DeltaDiscoveryResponse]:
        return self._server.stream_endpoints(request_iterator, context, delta=True)
