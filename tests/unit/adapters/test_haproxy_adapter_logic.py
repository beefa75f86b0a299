"""Pure logic of the HAProxy adapter: parsing, integer weights, settings validation, and the
refusal of every name that could inject a runtime command (no HAProxy needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.haproxy import (
    MAX_WEIGHT,
    HAProxyAdapter,
    HAProxyError,
    RuntimeApi,
    parse_backend_algo,
    parse_backup_servers,
    parse_server_errors,
    parse_servers_state,
)
from knapsack_lb.errors import InvalidInputError
from knapsack_lb.model import WeightPlan
from knapsack_lb.quantise import haproxy_weights

ADVERSARIAL = [
    "be;shutdown sessions",
    "be\nset server x/y state maint",
    "be name",
    "be'x",
    'be"x',
    "be/s1",
    "be\\s1",
    "$(reboot)",
    "`id`",
    "x" * 64,
    "",
    "-leading-dash",
]

STATE = """1
# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_time_since_last_change
3 klb 1 b1 127.0.0.1 2 0 43 100 4 1 0 2 0 0 0 0 - 18081 - 0 0 - - 0
3 klb 2 b2 127.0.0.1 2 0 128 100 4 1 0 2 0 0 0 0 - 18082 - 0 0 - - 0
4 other 1 b1 127.0.0.1 2 0 7 100 4 1 0 2 0 0 0 0 - 18081 - 0 0 - - 0
"""


def test_parse_servers_state_reads_runtime_weight_column_8() -> None:
    rows = parse_servers_state(STATE)
    assert [(r.backend, r.server, r.runtime_weight, r.config_weight) for r in rows] == [
        ("klb", "b1", 43, 100),
        ("klb", "b2", 128, 100),
        ("other", "b1", 7, 100),
    ]


def test_parse_servers_state_rejects_garbage() -> None:
    with pytest.raises(HAProxyError, match="unexpected line"):
        parse_servers_state("1\nNo such backend.\n")


def test_parse_backend_algo_finds_the_backend_row() -> None:
    text = "# pxname,svname,status,algo,\nklb,BACKEND,UP,static-rr,\nklb,b1,UP,,\nfe,FRONTEND,OPEN,,\n"
    assert parse_backend_algo(text, "klb") == "static-rr"
    assert parse_backend_algo(text, "fe") is None
    assert parse_backend_algo("Can't find backend.\n", "klb") is None


def test_parse_backup_servers_finds_the_bck_column() -> None:
    text = ("# pxname,svname,status,bck,algo\nklb,b1,UP,0,\nklb,spare,UP,1,\nklb,BACKEND,UP,0,roundrobin\n"
            "other,x,UP,1,\n")
    assert parse_backup_servers(text, "klb") == {"spare"}
    assert parse_backup_servers("No such backend.\n", "klb") == frozenset()


def test_parse_server_errors_reads_the_error_columns_of_each_server() -> None:
    text = ("# pxname,svname,econ,eresp,wretr,wredis,hrsp_5xx\nklb,b1,0,0,0,0,0\nklb,b2,3,1,2,1,4\n"
            "klb,BACKEND,3,1,2,1,4\nother,x,9,9,9,9,9\n")
    assert parse_server_errors(text, "klb") == {
        "b1": {"econ": 0, "eresp": 0, "wretr": 0, "wredis": 0, "hrsp_5xx": 0},
        "b2": {"econ": 3, "eresp": 1, "wretr": 2, "wredis": 1, "hrsp_5xx": 4}}
    assert parse_server_errors("# pxname,svname,econ\nklb,b1,\n", "klb") == {"b1": {}}  # empty cell: no counter


@pytest.mark.parametrize(
    "weights",
    [
        {"a": 0.1, "b": 0.3, "c": 0.6},
        {"a": 1 / 3, "b": 1 / 3, "c": 1 / 3},
        {"a": 0.999, "b": 0.001},
        {"a": 0.0, "b": 0.25, "c": 0.75},
        {f"d{i}": 1 / 40 for i in range(40)},
    ],
)
def test_integer_weights_stay_in_range_and_close_to_plan(weights: dict[str, float]) -> None:
    q = haproxy_weights(weights)
    ints, error = q.weights, q.error
    assert set(ints) == set(weights)
    assert all(0 <= w <= MAX_WEIGHT for w in ints.values())
    assert max(ints.values()) >= MAX_WEIGHT - 1  # the finest resolution HAProxy offers
    for dip, w in weights.items():
        assert (ints[dip] == 0) == (w == 0)  # zero stays zero, positive stays positive
    total = sum(ints.values())
    observed = 0.5 * sum(abs(ints[d] / total - weights[d]) for d in weights)
    assert error == pytest.approx(observed)
    assert error < 0.01


def test_integer_weights_one_hot() -> None:
    q = haproxy_weights({"a": 1.0, "b": 0.0})
    ints, error = q.weights, q.error
    assert ints == {"a": MAX_WEIGHT, "b": 0}
    assert error == 0.0


def test_integer_weights_do_not_depend_on_the_scale_of_the_input() -> None:
    """Raw weights (vCPU counts) quantise as their fractions do: the finest resolution either way."""
    vcpus = {"a": 16.0, "b": 8.0, "c": 1.0}
    q = haproxy_weights(vcpus)
    assert q.weights == haproxy_weights({d: w / 25 for d, w in vcpus.items()}).weights == {"a": 256, "b": 128, "c": 16}


def _settings(**extra: object) -> dict[str, object]:
    return {"socket": "/run/haproxy/admin.sock", "backend": "klb", **extra}


def test_from_config_defaults_and_tcp_socket() -> None:
    adapter = HAProxyAdapter.from_config(_settings())
    assert adapter.socket_endpoint == "/run/haproxy/admin.sock"
    assert adapter.timeout == 2.0 and adapter.state_file is None
    tcp = HAProxyAdapter.from_config(_settings(socket="127.0.0.1:9999", state_file="/var/lib/haproxy/state"))
    assert tcp.socket_endpoint == ("127.0.0.1", 9999)
    assert tcp.state_file == Path("/var/lib/haproxy/state")


@pytest.mark.parametrize("bad", ADVERSARIAL)
def test_from_config_refuses_adversarial_backend(bad: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        HAProxyAdapter.from_config(_settings(backend=bad))
    assert info.value.field == "adapter.settings.backend"


@pytest.mark.parametrize("bad", ADVERSARIAL)
def test_from_config_refuses_adversarial_server_names(bad: str) -> None:
    with pytest.raises(InvalidInputError, match="servers"):
        HAProxyAdapter.from_config(_settings(servers={"dip1": bad}))
    with pytest.raises(InvalidInputError, match="servers"):
        HAProxyAdapter.from_config(_settings(servers={bad: "s1"}))


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("socket", "relative/admin.sock"),
        ("socket", "127.0.0.1:99999"),
        ("socket", ""),
        ("state_file", "state"),
        ("timeout", 0),
        ("timeout", True),
        ("unknown_key", 1),
    ],
)
def test_from_config_names_the_bad_field(key: str, value: object) -> None:
    with pytest.raises(InvalidInputError) as info:
        HAProxyAdapter.from_config(_settings(**{key: value}))
    assert key in info.value.field or key in str(info.value)


@pytest.mark.parametrize("bad", ["x;y", "x\ny", "x\ry"])
def test_runtime_api_never_sends_a_command_separator(bad: str) -> None:
    class Unused:
        def settimeout(self, timeout: float) -> None:
            pass

    api = RuntimeApi(Unused(), 1.0)  # type: ignore[arg-type]
    with pytest.raises(HAProxyError, match="refusing"):
        api.command(f"set server {bad} weight 1")
    assert api.sent == []


def test_unreachable_socket_is_a_failed_result_not_an_exception(tmp_path: Path) -> None:
    adapter = HAProxyAdapter.from_config(_settings(socket=str(tmp_path / "missing.sock")))
    result = adapter.apply(WeightPlan(vip="v", weights={"b1": 0.5, "b2": 0.5}))
    assert not result.ok
    assert "cannot reach" in result.reason and "missing.sock" in result.reason
    assert adapter.read() == {}
    assert "cannot reach" in adapter.last_error
    assert not adapter.check().ok


def test_server_mapping_round_trip() -> None:
    adapter = HAProxyAdapter.from_config(_settings(servers={"dip-1": "web1"}))
    assert adapter.server_of("dip-1") == "web1"
    assert adapter.server_of("dip-2") == "dip-2"
    assert adapter.dip_of("web1") == "dip-1"
