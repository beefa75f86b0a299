"""Envoy adapter logic without Envoy: rendering, schema validation, settings, file writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from adapters.base import load_adapter_class
from adapters.envoy import (
    CLA_TYPE_URL,
    EnvoyAdapter,
    EnvoyAdapterError,
    EnvoySettings,
    build_assignment,
    discovery_response,
    envoy_binary,
    parse_admin_clusters,
    parse_host_traffic,
    validate_assignment,
)
from knapsack_lb.errors import InvalidInputError
from knapsack_lb.lab.procs import free_port
from knapsack_lb.model import Traffic, WeightPlan

ENDPOINTS = {"b1": ("127.0.0.1", 8001), "b2": ("127.0.0.1", 8002), "b3": ("::1", 8003)}
ADVERSARIAL = [
    "a;b",
    "a\nb",
    "a b",
    'a"b',
    "a'b",
    "a/b",
    "a\\b",
    "'),os.execute('x",
    '"}]}, {"x": 1',
    "",
    "-leading-dash",
    "x" * 64,
]


def settings(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "cluster": "vip",
        "endpoints": {"b1": "127.0.0.1:8001", "b2": "127.0.0.1:8002", "b3": "[::1]:8003"},
        "eds_path": str(tmp_path / "eds" / "vip.json"),
    }
    raw.update(extra)
    return raw


def test_assignment_drops_zero_weights_and_names_each_endpoint() -> None:
    assignment = build_assignment("vip", ENDPOINTS, {"b1": 100, "b2": 0, "b3": 900})
    endpoints = assignment["endpoints"][0]["lb_endpoints"]
    assert [e["endpoint"]["hostname"] for e in endpoints] == ["b1", "b3"]
    assert [e["load_balancing_weight"] for e in endpoints] == [100, 900]
    assert endpoints[1]["endpoint"]["address"]["socket_address"] == {"address": "::1", "port_value": 8003}
    message = validate_assignment(assignment, "vip")
    assert message.cluster_name == "vip"
    assert [e.load_balancing_weight.value for e in message.endpoints[0].lb_endpoints] == [100, 900]


def test_all_zero_is_refused_rather_than_an_empty_assignment() -> None:
    with pytest.raises(InvalidInputError, match="empty assignment"):
        build_assignment("vip", ENDPOINTS, {"b1": 0, "b2": 0})


def test_a_dip_without_address_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="no address"):
        build_assignment("vip", ENDPOINTS, {"b9": 5})


def _endpoint(weight: Any, port: int = 80) -> dict[str, Any]:
    return {
        "endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}},
        "load_balancing_weight": weight,
    }


@pytest.mark.parametrize(
    ("assignment", "problem"),
    [
        ({"cluster_name": "vip", "endpoints": [{"lb_endpoints": [_endpoint(0)]}]}, "rejects 0"),
        ({"cluster_name": "vip", "endpoints": [{"lb_endpoints": [_endpoint("ten")]}]}, "schema"),
        ({"cluster_name": "vip", "endpoints": [{"lb_endpoints": [_endpoint(-1)]}]}, "schema"),
        ({"cluster_name": "vip", "endpoints": [{"lb_endpoints": [_endpoint(2**32)]}]}, "schema"),
        ({"cluster_name": "vip", "endpoints": [{"lb_endpoints": [_endpoint(2**31), _endpoint(2**31, 81)]}]}, "uint32"),
        ({"cluster_name": "vip", "endpoints": [{"lb_endpoints": [_endpoint(1, 0)]}]}, "address and port"),
        ({"cluster_name": "vip", "endpoints": []}, "empty assignment"),
        ({"cluster_name": "vip", "endpoints": [{"lb_endpoints": []}]}, "empty assignment"),
        ({"cluster_name": "vip", "endpointz": []}, "schema"),
        ({"cluster_name": "other", "endpoints": [{"lb_endpoints": [_endpoint(1)]}]}, "must be 'vip'"),
    ],
)
def test_schema_validation_rejects_what_envoy_would(assignment: dict[str, Any], problem: str) -> None:
    with pytest.raises(InvalidInputError, match=problem):
        validate_assignment(assignment, "vip")


def test_discovery_response_carries_the_type_and_validates() -> None:
    response = discovery_response(build_assignment("vip", ENDPOINTS, {"b1": 1}), "7-1")
    assert response["version_info"] == "7-1"
    assert response["resources"][0]["@type"] == CLA_TYPE_URL
    assert response["resources"][0]["cluster_name"] == "vip"


@pytest.mark.parametrize("bad", ADVERSARIAL)
def test_adversarial_cluster_names_are_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(InvalidInputError, match="cluster"):
        EnvoySettings.parse(settings(tmp_path, cluster=bad))


@pytest.mark.parametrize("bad", ADVERSARIAL)
def test_adversarial_dip_names_are_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(InvalidInputError, match="endpoints"):
        EnvoySettings.parse(settings(tmp_path, endpoints={bad: "127.0.0.1:80"}))


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "127.0.0.1:0", "127.0.0.1:80;rm -rf x", "host name:80", "[::1:80", "a'b:80", "x/y:80", ":80", 80],
)
def test_bad_endpoint_addresses_are_refused(tmp_path: Path, address: object) -> None:
    with pytest.raises(InvalidInputError, match="endpoints"):
        EnvoySettings.parse(settings(tmp_path, endpoints={"b1": address}))


@pytest.mark.parametrize(
    ("key", "value", "field"),
    [
        ("mode", "ads", "mode"),
        ("eds_path", "relative/vip.json", "eds_path"),
        ("eds_path", "/tmp/a b/vip;x.json", "eds_path"),
        ("eds_path", "/tmp/x/vip.json\n", "eds_path"),
        ("resolution", 0, "resolution"),
        ("resolution", True, "resolution"),
        ("verify_timeout", 0, "verify_timeout"),
        ("admin", "localhost", "admin"),
        ("xds_listen", "127.0.0.1:99999", "xds_listen"),
        ("surprise", 1, "adapter.settings"),
    ],
)
def test_bad_settings_name_the_field(tmp_path: Path, key: str, value: object, field: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        EnvoySettings.parse(settings(tmp_path, **{key: value}))
    assert field in info.value.field


def test_entry_point_finds_the_adapter() -> None:
    assert load_adapter_class("envoy") is EnvoyAdapter


def test_file_mode_writes_a_valid_discovery_response_atomically(tmp_path: Path) -> None:
    adapter = EnvoyAdapter.from_config(settings(tmp_path))
    (tmp_path / "eds").mkdir()
    result = adapter.apply(WeightPlan(vip="v", weights={"b1": 0.1, "b2": 0.3, "b3": 0.6}, version=4))
    assert result.ok, result.reason
    assert result.lb_weights == {"b1": 100, "b2": 300, "b3": 600}
    assert result.quantisation_error == pytest.approx(0.0)
    written = json.loads((tmp_path / "eds" / "vip.json").read_text())
    assert written["version_info"].startswith("4-")
    validate_assignment(written["resources"][0], "vip")
    assert sorted(p.name for p in (tmp_path / "eds").iterdir()) == ["vip.json"]  # no temp file left behind


def test_tiny_weights_stay_at_least_one_and_zero_drops_the_endpoint(tmp_path: Path) -> None:
    adapter = EnvoyAdapter.from_config(settings(tmp_path, resolution=100))
    (tmp_path / "eds").mkdir()
    result = adapter.apply(WeightPlan(vip="v", weights={"b1": 0.001, "b2": 0.0, "b3": 0.999}))
    assert result.ok, result.reason
    assert result.lb_weights["b1"] == 1 and result.lb_weights["b2"] == 0
    written = json.loads((tmp_path / "eds" / "vip.json").read_text())
    hosts = [e["endpoint"]["hostname"] for e in written["resources"][0]["endpoints"][0]["lb_endpoints"]]
    assert hosts == ["b1", "b3"]


def test_a_plan_naming_an_unknown_dip_fails_without_writing(tmp_path: Path) -> None:
    adapter = EnvoyAdapter.from_config(settings(tmp_path))
    (tmp_path / "eds").mkdir()
    result = adapter.apply(WeightPlan(vip="v", weights={"b1": 0.5, "zz": 0.5}))
    assert not result.ok and "zz" in result.reason
    assert not (tmp_path / "eds" / "vip.json").exists()


def test_unreachable_admin_fails_and_restores_the_previous_file(tmp_path: Path) -> None:
    adapter = EnvoyAdapter.from_config(settings(tmp_path))
    (tmp_path / "eds").mkdir()
    assert adapter.apply(WeightPlan(vip="v", weights={"b1": 0.5, "b2": 0.5})).ok
    before = (tmp_path / "eds" / "vip.json").read_text()
    dead = EnvoyAdapter.from_config(settings(tmp_path, admin=f"127.0.0.1:{free_port()}", verify_timeout=0.2))
    result = dead.apply(WeightPlan(vip="v", weights={"b3": 1.0}))
    assert not result.ok
    assert "unreachable" in result.reason and "previous file restored" in result.reason
    assert (tmp_path / "eds" / "vip.json").read_text() == before
    assert dead.read() == {}
    assert "unreachable" in dead.last_error
    assert not dead.check().ok


def test_admin_clusters_are_mapped_to_dips_by_hostname_or_address() -> None:
    payload = {
        "cluster_statuses": [
            {"name": "other", "host_statuses": []},
            {
                "name": "vip",
                "host_statuses": [
                    {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 8001}}, "weight": 3},
                    {
                        "address": {"socket_address": {"address": "::1", "port_value": 8003}},
                        "weight": 7,
                        "hostname": "b3",
                    },
                ],
            },
        ]
    }
    assert parse_admin_clusters(payload, "vip", ENDPOINTS) == {"b1": 3, "b3": 7}
    with pytest.raises(EnvoyAdapterError, match="no cluster"):
        parse_admin_clusters(payload, "missing", ENDPOINTS)
    stranger = {"cluster_statuses": [{"name": "vip", "host_statuses": [{"address": {"socket_address": {
        "address": "10.9.9.9", "port_value": 1}}, "weight": 1}]}]}  # fmt: skip
    with pytest.raises(EnvoyAdapterError, match="no DIP names"):
        parse_admin_clusters(stranger, "vip", ENDPOINTS)


def _host(port: int, stats: list[dict[str, Any]]) -> dict[str, Any]:
    return {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}, "stats": stats}


def test_host_traffic_reads_rq_total_with_a_counter_at_0_left_out() -> None:
    """Proto3 JSON, as Envoy writes it: 64-bit counters as strings, a counter at 0 not written at all."""
    payload = {"cluster_statuses": [{"name": "vip", "host_statuses": [
        _host(8001, [{"name": "cx_total", "value": "4"}, {"name": "rq_total", "value": "1234"},
                     {"name": "rq_active", "type": "GAUGE"}]),
        _host(8002, [{"name": "cx_total"}, {"name": "rq_total"}]),
    ]}]}  # fmt: skip
    assert parse_host_traffic(payload, "vip", ENDPOINTS) == Traffic("requests", {"b1": 1234.0, "b2": 0.0})
    payload["cluster_statuses"][0]["host_statuses"][0]["stats"][1]["value"] = "12;rm"
    with pytest.raises(EnvoyAdapterError, match=r"'b1': rq_total '12;rm'"):
        parse_host_traffic(payload, "vip", ENDPOINTS)


def test_a_connection_counted_as_a_request_says_nothing_of_the_load() -> None:
    """Behind tcp_proxy Envoy 1.40 counts each connection as a request (the stats of a real one after five
    connections), and before any traffic every counter is 0: no share can be taken from either."""
    tcp_proxy = [{"name": "cx_connect_fail"}, {"value": "5", "name": "cx_total"}, {"name": "rq_error"},
                 {"name": "rq_success"}, {"name": "rq_timeout"}, {"value": "5", "name": "rq_total"},
                 {"type": "GAUGE", "name": "cx_active"}, {"type": "GAUGE", "name": "rq_active"}]
    payload = {"cluster_statuses": [{"name": "vip", "host_statuses": [_host(8001, tcp_proxy), _host(8002, [])]}]}
    assert parse_host_traffic(payload, "vip", ENDPOINTS) is None


def test_envoy_binary_honours_the_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "envoy"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("KLB_ENVOY_BIN", str(fake))
    assert envoy_binary() == str(fake)
    monkeypatch.setenv("KLB_ENVOY_BIN", str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="KLB_ENVOY_BIN"):
        envoy_binary()
