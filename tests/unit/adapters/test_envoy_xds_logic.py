"""The xDS EDS server's protocol handling, driven by a real gRPC client (no Envoy):
versions, nonces, ACK, NACK, stale nonces, subscriptions, and the adapter's rollback."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.endpoint.v3 import eds_pb2_grpc
from google.rpc import status_pb2

from adapters.envoy import EnvoyAdapter, build_assignment, validate_assignment
from adapters.envoy_xds import CLA_TYPE_URL, EdsServer
from knapsack_lb.lab.procs import free_port
from knapsack_lb.model import WeightPlan

ENDPOINTS = {"b1": ("127.0.0.1", 8001), "b2": ("127.0.0.1", 8002)}


def cla(cluster: str, weights: dict[str, int]) -> Any:
    return validate_assignment(build_assignment(cluster, ENDPOINTS, weights), cluster)


def wait_until(condition: Any, timeout: float = 3.0) -> None:
    """Poll ``condition`` (the server handles requests on its own threads)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


class FakeEnvoy:
    """A gRPC client speaking the EDS stream the way Envoy does (requests queued by the test)."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.requests: queue.Queue[discovery_pb2.DiscoveryRequest | None] = queue.Queue()
        self.responses: queue.Queue[discovery_pb2.DiscoveryResponse] = queue.Queue()
        stub = eds_pb2_grpc.EndpointDiscoveryServiceStub(self.channel)
        self.call = stub.StreamEndpoints(self._iterate())
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _iterate(self) -> Iterator[discovery_pb2.DiscoveryRequest]:
        while True:
            item = self.requests.get()
            if item is None:
                return
            yield item

    def _read(self) -> None:
        try:
            for response in self.call:
                self.responses.put(response)
        except grpc.RpcError:
            pass

    def request(self, names: list[str], version: str = "", nonce: str = "", error: str | None = None) -> None:
        request = discovery_pb2.DiscoveryRequest(
            version_info=version, resource_names=names, type_url=CLA_TYPE_URL, response_nonce=nonce
        )
        request.node.id = "fake-envoy"
        if error is not None:
            request.error_detail.CopyFrom(status_pb2.Status(code=3, message=error))
        self.requests.put(request)

    def next(self, timeout: float = 3.0) -> discovery_pb2.DiscoveryResponse:
        return self.responses.get(timeout=timeout)

    def weights(self, response: discovery_pb2.DiscoveryResponse) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for resource in response.resources:
            message = endpoint_pb2.ClusterLoadAssignment()
            resource.Unpack(message)
            out[message.cluster_name] = {
                e.endpoint.hostname: e.load_balancing_weight.value for e in message.endpoints[0].lb_endpoints
            }
        return out

    def close(self) -> None:
        self.requests.put(None)
        self.call.cancel()
        self.channel.close()


@pytest.fixture
def server() -> Iterator[EdsServer]:
    with EdsServer("127.0.0.1", 0) as eds:
        yield eds


def test_subscribe_ack_push_and_nack(server: EdsServer) -> None:
    server.push("vip", cla("vip", {"b1": 1, "b2": 3}), timeout=0)
    envoy = FakeEnvoy(server.address)
    try:
        envoy.request(["vip"])
        first = envoy.next()
        assert first.type_url == CLA_TYPE_URL and first.nonce
        assert envoy.weights(first) == {"vip": {"b1": 1, "b2": 3}}
        envoy.request(["vip"], version=first.version_info, nonce=first.nonce)  # ACK

        outcome_box: list[Any] = []
        pusher = threading.Thread(
            target=lambda: outcome_box.append(server.push("vip", cla("vip", {"b1": 9, "b2": 1}), timeout=3.0))
        )
        pusher.start()
        second = envoy.next()
        assert envoy.weights(second) == {"vip": {"b1": 9, "b2": 1}}
        assert int(second.version_info) > int(first.version_info) and second.nonce != first.nonce
        envoy.request(["vip"], version=second.version_info, nonce=second.nonce)  # ACK
        pusher.join(5)
        assert outcome_box[0].acked == 1 and outcome_box[0].pending == 0 and not outcome_box[0].nacked

        pusher = threading.Thread(
            target=lambda: outcome_box.append(server.push("vip", cla("vip", {"b1": 2, "b2": 2}), timeout=3.0))
        )
        pusher.start()
        third = envoy.next()
        # NACK: version_info stays the last accepted one, the nonce names the rejected response
        envoy.request(["vip"], version=second.version_info, nonce=third.nonce, error="weights look wrong")
        pusher.join(5)
        assert outcome_box[1].nacked == ("fake-envoy: weights look wrong",)
        assert outcome_box[1].acked == 0
    finally:
        envoy.close()


def test_stale_nonce_is_ignored_and_unsubscribed_clusters_are_not_sent(server: EdsServer) -> None:
    server.push("vip", cla("vip", {"b1": 1}), timeout=0)
    envoy = FakeEnvoy(server.address)
    try:
        envoy.request(["vip"])
        first = envoy.next()
        envoy.request(["vip"], version=first.version_info, nonce=first.nonce)
        # a push for a cluster this Envoy did not subscribe to is not sent, and does not wait
        outcome = server.push("other", cla("other", {"b2": 1}), timeout=1.0)
        assert (outcome.acked, outcome.pending, outcome.nacked) == (0, 0, ())
        # a stale NACK (old nonce) changes nothing
        envoy.request(["vip"], version="0", nonce="not-the-last", error="stale")
        # a new subscription is answered at once with everything subscribed
        envoy.request(["vip", "other"], version=first.version_info, nonce=first.nonce)
        both = envoy.next()
        assert envoy.weights(both) == {"other": {"b2": 1}, "vip": {"b1": 1}}
        with pytest.raises(queue.Empty):
            envoy.next(timeout=0.3)
    finally:
        envoy.close()


def test_push_without_subscribers_returns_at_once(server: EdsServer) -> None:
    outcome = server.push("vip", cla("vip", {"b1": 1}), timeout=5.0)
    assert (outcome.acked, outcome.pending, outcome.nacked) == (0, 0, ())
    current = server.current("vip")
    assert current is not None and current.cluster_name == "vip"
    with pytest.raises(ValueError, match="cluster"):
        server.push("vip", cla("other", {"b1": 1}))


def test_adapter_rolls_back_when_envoy_nacks() -> None:
    port = free_port()
    settings = {"mode": "xds", "cluster": "vip", "endpoints": {"b1": "127.0.0.1:8001", "b2": "127.0.0.1:8002"},
                "xds_listen": f"127.0.0.1:{port}", "verify_timeout": 3.0}  # fmt: skip
    with EnvoyAdapter.from_config(settings) as adapter:
        server = EdsServer.shared("127.0.0.1", port)
        try:
            assert adapter.apply(WeightPlan(vip="v", weights={"b1": 0.25, "b2": 0.75})).ok  # no Envoy yet
            envoy = FakeEnvoy(server.address)
            try:
                envoy.request(["vip"])
                first = envoy.next()
                envoy.request(["vip"], version=first.version_info, nonce=first.nonce)
                box: list[Any] = []
                applier = threading.Thread(
                    target=lambda: box.append(adapter.apply(WeightPlan(vip="v", weights={"b1": 0.5, "b2": 0.5})))
                )
                applier.start()
                rejected = envoy.next()
                envoy.request(["vip"], version=first.version_info, nonce=rejected.nonce, error="no thanks")
                restored = envoy.next()  # the adapter serves the last good assignment again
                envoy.request(["vip"], version=restored.version_info, nonce=restored.nonce)
                applier.join(10)
                assert not box[0].ok and "no thanks" in box[0].reason
                assert envoy.weights(restored) == {"vip": {"b1": 250, "b2": 750}}
                current = server.current("vip")
                assert current is not None
                assert current.endpoints[0].lb_endpoints[0].load_balancing_weight.value == 250
            finally:
                envoy.close()
        finally:
            server.release()
    assert ("127.0.0.1", port) not in EdsServer._registry  # the last user stopped it


class FakeDeltaEnvoy(FakeEnvoy):
    """The incremental protocol (``DeltaEndpoints``) the way Envoy speaks it."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.requests = queue.Queue()
        self.responses = queue.Queue()
        stub = eds_pb2_grpc.EndpointDiscoveryServiceStub(self.channel)
        self.call = stub.DeltaEndpoints(self._iterate())
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def delta(
        self,
        subscribe: list[str] = (),  # type: ignore[assignment]
        unsubscribe: list[str] = (),  # type: ignore[assignment]
        nonce: str = "",
        error: str | None = None,
        initial: dict[str, str] | None = None,
    ) -> None:
        request = discovery_pb2.DeltaDiscoveryRequest(
            type_url=CLA_TYPE_URL,
            resource_names_subscribe=list(subscribe),
            resource_names_unsubscribe=list(unsubscribe),
            response_nonce=nonce,
            initial_resource_versions=initial or {},
        )
        request.node.id = "fake-delta-envoy"
        if error is not None:
            request.error_detail.CopyFrom(status_pb2.Status(code=3, message=error))
        self.requests.put(request)

    def delta_weights(self, response: Any) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for resource in response.resources:
            message = endpoint_pb2.ClusterLoadAssignment()
            resource.resource.Unpack(message)
            assert resource.name == message.cluster_name and resource.version
            out[resource.name] = {
                e.endpoint.hostname: e.load_balancing_weight.value for e in message.endpoints[0].lb_endpoints
            }
        return out


def test_delta_sends_only_what_the_client_lacks_and_handles_ack_nack(server: EdsServer) -> None:
    server.push("vip", cla("vip", {"b1": 1, "b2": 3}), timeout=0)
    server.push("api", cla("api", {"b1": 5}), timeout=0)
    envoy = FakeDeltaEnvoy(server.address)
    try:
        envoy.delta(subscribe=["vip"])
        first = envoy.next()
        assert envoy.delta_weights(first) == {"vip": {"b1": 1, "b2": 3}}
        envoy.delta(nonce=first.nonce)  # ACK
        box: list[Any] = []
        pusher = threading.Thread(target=lambda: box.append(server.push("vip", cla("vip", {"b1": 4}), timeout=3.0)))
        pusher.start()
        second = envoy.next()
        assert envoy.delta_weights(second) == {"vip": {"b1": 4}}
        envoy.delta(nonce=second.nonce)
        pusher.join(5)
        assert (box[0].acked, box[0].pending, box[0].nacked) == (1, 0, ())
        # a push to a cluster it did not subscribe to is not sent; subscribing sends only that one
        assert server.push("api", cla("api", {"b2": 2}), timeout=1.0).acked == 0
        envoy.delta(subscribe=["api"])
        third = envoy.next()
        assert envoy.delta_weights(third) == {"api": {"b2": 2}}
        envoy.delta(nonce=third.nonce)
        # NACK
        pusher = threading.Thread(target=lambda: box.append(server.push("vip", cla("vip", {"b2": 9}), timeout=3.0)))
        pusher.start()
        fourth = envoy.next()
        envoy.delta(nonce=fourth.nonce, error="rejected")
        pusher.join(5)
        assert box[1].nacked == ("fake-delta-envoy: rejected",)
        # after unsubscribing, pushes to vip are not sent
        envoy.delta(unsubscribe=["vip"])
        wait_until(lambda: not any(s.wants("vip") for s in server._streams.values()))
        assert server.push("vip", cla("vip", {"b1": 7}), timeout=1.0).acked == 0
        with pytest.raises(queue.Empty):
            envoy.next(timeout=0.3)
    finally:
        envoy.close()


def test_delta_reconnect_with_current_versions_gets_nothing_new(server: EdsServer) -> None:
    version = server.push("vip", cla("vip", {"b1": 1}), timeout=0).version
    envoy = FakeDeltaEnvoy(server.address)
    try:
        envoy.delta(subscribe=["vip"], initial={"vip": str(version)})
        with pytest.raises(queue.Empty):
            envoy.next(timeout=0.3)
        envoy.delta(subscribe=["vip"], initial={"vip": "0"})  # later requests do not reset versions
        server.push("vip", cla("vip", {"b2": 1}), timeout=0)
        assert envoy.delta_weights(envoy.next()) == {"vip": {"b2": 1}}
    finally:
        envoy.close()


def test_a_busy_xds_port_is_a_failed_apply_until_it_frees() -> None:
    import socket

    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    port = blocker.getsockname()[1]
    settings = {"mode": "xds", "cluster": "vip", "endpoints": {"b1": "127.0.0.1:8001"},
                "xds_listen": f"127.0.0.1:{port}"}  # fmt: skip
    with EnvoyAdapter.from_config(settings) as adapter:
        result = adapter.apply(WeightPlan(vip="v", weights={"b1": 1.0}))
        assert not result.ok and "could not listen" in result.reason
        assert not adapter.check().ok
        blocker.close()
        result = adapter.apply(WeightPlan(vip="v", weights={"b1": 1.0}))
        assert result.ok, result.reason


def test_an_adapter_outlives_a_shut_down_server() -> None:
    port = free_port()
    owner = EdsServer.shared("127.0.0.1", port)
    settings = {"mode": "xds", "cluster": "vip", "endpoints": {"b1": "127.0.0.1:8001"},
                "xds_listen": f"127.0.0.1:{port}"}  # fmt: skip
    with EnvoyAdapter.from_config(settings) as adapter:
        assert adapter.apply(WeightPlan(vip="v", weights={"b1": 1.0})).ok
        owner.shutdown()
        assert not owner.running and ("127.0.0.1", port) not in EdsServer._registry
        assert adapter.apply(WeightPlan(vip="v", weights={"b1": 1.0})).ok  # joined a fresh server
        fresh = EdsServer._registry[("127.0.0.1", port)]
        assert fresh is not owner and fresh.running
    assert ("127.0.0.1", port) not in EdsServer._registry
