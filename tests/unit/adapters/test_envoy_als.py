"""Envoy's gRPC access log entries as timed requests, over a real gRPC stream from a client of the
service's own protobuf stubs (the real Envoy: tests/integration/test_envoy_adapter.py)."""

from __future__ import annotations

import time

import grpc
import pytest
import yaml
from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc
from google.protobuf import duration_pb2

from adapters.base import make_adapter
from adapters.envoy import EnvoyAdapter
from adapters.envoy_als import AlsTimer, entry_request
from knapsack_lb.lab.procs import free_listening_port
from knapsack_lb.lab.testbed.lb_envoy import bootstrap
from tests.unit.adapters.test_dns_envoy_doc_examples import doc_example


def entry(host: str = "127.0.0.1", port: int = 8081, cluster: str = "web", sent_ms: int | None = 2,
          last_ms: int | None = 22, status: int | None = 200, intermediate: bool = False
          ) -> accesslog_pb2.HTTPAccessLogEntry:
    made = accesslog_pb2.HTTPAccessLogEntry()
    common = made.common_properties
    common.upstream_cluster = cluster
    common.intermediate_log_entry = intermediate
    if host:
        common.upstream_remote_address.socket_address.address = host
        common.upstream_remote_address.socket_address.port_value = port
    if sent_ms is not None:
        common.time_to_first_upstream_tx_byte.CopyFrom(duration_pb2.Duration(nanos=sent_ms * 1_000_000))
    if last_ms is not None:
        common.time_to_last_upstream_rx_byte.CopyFrom(duration_pb2.Duration(nanos=last_ms * 1_000_000))
    if status is not None:
        made.response.response_code.value = status
    return made


def message(*entries: accesslog_pb2.HTTPAccessLogEntry) -> als_pb2.StreamAccessLogsMessage:
    made = als_pb2.StreamAccessLogsMessage()
    made.identifier.log_name = "knapsack_lb"
    made.http_logs.log_entry.extend(entries)
    return made


def test_an_entry_is_its_hosts_request_timed_from_the_first_byte_sent_upstream() -> None:
    request = entry_request(entry())
    assert request is not None and request.response_time == pytest.approx(0.020)
    assert (request.backend, request.server, request.status) == ("web", "127.0.0.1:8081", 200)
    assert entry_request(entry(host="::1", port=8082)).server == "[::1]:8082"  # type: ignore[union-attr]
    assert entry_request(entry(last_ms=None, status=503)).failed  # type: ignore[union-attr]  # no response
    assert entry_request(entry(status=502)).failed  # type: ignore[union-attr]
    assert entry_request(entry(status=None)).status == -1  # type: ignore[union-attr]


def test_entries_no_host_took_or_of_open_streams_are_not_requests() -> None:
    assert entry_request(entry(host="")) is None  # no healthy upstream: Envoy answered 503 itself
    assert entry_request(entry(intermediate=True)) is None


def test_the_service_counts_a_streams_entries_for_its_cluster() -> None:
    timer = AlsTimer("127.0.0.1", free_listening_port(), "web")
    try:
        assert timer.take() == {}  # the first take starts the service
        with grpc.insecure_channel(f"127.0.0.1:{timer.port}") as channel:
            stub = als_pb2_grpc.AccessLogServiceStub(channel)
            stub.StreamAccessLogs(iter([message(entry(), entry(last_ms=32)),
                                        message(entry(port=8082, status=503), entry(cluster="api"))]), timeout=5.0)
        deadline, taken = time.monotonic() + 5.0, timer.take()
        while not taken and time.monotonic() < deadline:
            taken = timer.take()
            time.sleep(0.02)
        assert set(taken) == {"127.0.0.1:8081", "127.0.0.1:8082"}
        assert (taken["127.0.0.1:8081"].successes, taken["127.0.0.1:8081"].latency_mean) == (2, pytest.approx(0.025))
        assert (taken["127.0.0.1:8082"].successes, taken["127.0.0.1:8082"].failures) == (0, 1)
        assert timer.ignored == 1  # the other cluster's entry
    finally:
        timer.close()
    assert not timer.running


def test_the_adapter_times_its_dips_and_reports_a_port_it_cannot_bind() -> None:
    port = free_listening_port()
    settings = {"mode": "xds", "cluster": "web", "log_listen": f"127.0.0.1:{port}",
                "endpoints": {"web-1": "127.0.0.1:8081", "web-2": "127.0.0.1:8082"}}
    plain = make_adapter("envoy", {k: v for k, v in settings.items() if k != "log_listen"})
    assert isinstance(plain, EnvoyAdapter) and plain.timings() is None
    blocker = AlsTimer("127.0.0.1", port, "other").start()
    adapter = make_adapter("envoy", settings)
    assert isinstance(adapter, EnvoyAdapter)
    with adapter:
        assert adapter.timings() is None and f"log_listen 127.0.0.1:{port}" in adapter.last_error
        blocker.close()
        assert adapter.timings() == {}  # the port is free now: the service starts
        assert adapter._log_timer is not None
        adapter._log_timer.feed(message(entry(), entry(port=8099)))  # 8099 is no DIP
        timed = adapter.timings()
        assert timed is not None and set(timed) == {"web-1"} and timed["web-1"].successes == 1


def test_the_documented_logger_and_cluster_are_what_the_testbed_renders() -> None:
    rendered = bootstrap(node_id="n", cluster="web", listen=("127.0.0.1", 10000), admin=("127.0.0.1", 9901),
                         eds_config={}, log_server=("127.0.0.1", 18090))
    manager = rendered["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    assert manager["access_log"] == yaml.safe_load(doc_example("envoy-access-log"))["access_log"]
    assert rendered["static_resources"]["clusters"][-1] == yaml.safe_load(doc_example("envoy-access-log-cluster"))[0]
