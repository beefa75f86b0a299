"""The HAProxy adapter against a real HAProxy 2.6 on free loopback ports, in front of real
emulated backends (knapsack_lb.lab.testbed.emulator), through the shared LB harness."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from adapters.base import make_adapter
from adapters.haproxy import HAProxyAdapter, HAProxyError, RuntimeApi, parse_server_errors
from knapsack_lb.cli.main import app
from knapsack_lb.lab.procs import free_port
from knapsack_lb.lab.testbed import lb_harness
from knapsack_lb.lab.testbed.lb_haproxy import BACKEND, HAProxyTestbed
from knapsack_lb.model import WeightPlan
from tests.integration.timings_check import assert_timed_as_served

NAMES = ("b1", "b2", "b3")
TARGET = {"b1": 0.1, "b2": 0.3, "b3": 0.6}


@pytest.fixture(scope="module")
def backends(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    with lb_harness.emulated_backends(NAMES, tmp_path_factory.mktemp("haproxy-backends")) as addresses:
        yield addresses


@pytest.fixture
def haproxy(backends: dict[str, str], tmp_path: Path) -> Iterator[HAProxyTestbed]:
    with HAProxyTestbed(backends, tmp_path / "haproxy") as testbed:
        yield testbed


def _adapter(testbed: HAProxyTestbed, **overrides: object) -> HAProxyAdapter:
    adapter = make_adapter("haproxy", {**testbed.adapter_settings, **overrides})
    assert isinstance(adapter, HAProxyAdapter)
    return adapter


def test_split_follows_10_30_60_within_3_points(haproxy: HAProxyTestbed) -> None:
    adapter = _adapter(haproxy)
    result = adapter.apply(WeightPlan(vip="web", weights=TARGET))
    assert result.ok, result.reason
    assert result.lb_weights == {"b1": 43, "b2": 128, "b3": 255}
    assert 0 < result.quantisation_error < 0.005
    assert adapter.read() == pytest.approx({"b1": 43 / 426, "b2": 128 / 426, "b3": 255 / 426})
    counts = lb_harness.measure_split(haproxy, 3000)
    assert "<failed>" not in counts
    assert sum(counts.values()) == 3000
    assert lb_harness.split_error(counts, TARGET) <= 0.03, counts


def test_fifty_weight_changes_under_traffic_fail_no_request(haproxy: HAProxyTestbed) -> None:
    adapter = _adapter(haproxy)
    plans = lb_harness.churn_plans("web", list(NAMES), 50, random.Random(11))
    report = lb_harness.churn(haproxy, adapter, plans, traffic_seconds=8.0)
    assert report.apply_failures == ()
    assert report.requests > 500
    assert report.failed == 0, report.failure_samples
    assert report.retried == 0
    # after a one-hot plan only its backend answered, soon after apply returned; on a loaded
    # machine a slot may end before three confirming requests were seen (then: not followed)
    assert len(report.follow_seconds) + report.not_followed == 10
    assert len(report.follow_seconds) >= 7
    assert max(report.follow_seconds) < 0.5
    assert adapter.read() == pytest.approx(plans[-1].weights, abs=0.01)


def test_a_server_no_dip_of_the_plan_maps_to_is_set_to_zero_and_reported(haproxy: HAProxyTestbed) -> None:
    adapter = _adapter(haproxy)
    assert adapter.apply(WeightPlan(vip="web", weights=TARGET)).ok
    result = adapter.apply(WeightPlan(vip="web", weights={"b1": 0.5, "b2": 0.5}))  # b3 removed from the VIP
    assert result.ok, result.reason
    assert adapter.read_integers()["b3"] == 0 and adapter.read()["b3"] == 0.0
    assert any("b3" in w and "weight 0" in w for w in result.warnings)
    counts = lb_harness.measure_split(haproxy, 600)
    assert "b3" not in counts and "<failed>" not in counts
    again = adapter.apply(WeightPlan(vip="web", weights={"b1": 0.4, "b2": 0.6}))
    assert again.ok and not again.warnings  # already at 0: nothing to report


def test_traffic_counts_what_each_server_served(haproxy: HAProxyTestbed, backends: dict[str, str],
                                               tmp_path: Path) -> None:
    adapter = _adapter(haproxy)
    assert adapter.apply(WeightPlan(vip="web", weights=TARGET)).ok
    before = adapter.traffic()
    assert before is not None and before.kind == "requests"  # mode http: HAProxy counts requests
    lb_harness.measure_split(haproxy, 1200)
    after = adapter.traffic()
    assert after is not None and set(after.counters) == set(NAMES)
    served = {n: after.counters[n] - before.counters[n] for n in NAMES}
    assert sum(served.values()) == 1200
    assert lb_harness.split_error({n: int(v) for n, v in served.items()}, TARGET) <= 0.03, served
    with HAProxyTestbed(backends, tmp_path / "tcp", mode="tcp", keep_alive=False) as tcp:  # a connection each
        reader = _adapter(tcp)
        assert reader.apply(WeightPlan(vip="web", weights=TARGET)).ok
        first = reader.traffic()
        lb_harness.measure_split(tcp, 600)
        then = reader.traffic()
        assert first is not None and then is not None and then.kind == "bytes"  # layer 4: bytes sent back
        grown = {n: then.counters[n] - first.counters[n] for n in NAMES}
        shares = {n: v / sum(grown.values()) for n, v in grown.items()}
        assert lb_harness.split_error({n: round(600 * v) for n, v in shares.items()}, TARGET) <= 0.05, shares
    gone = make_adapter("haproxy", {**haproxy.adapter_settings, "socket": str(tmp_path / "nowhere.sock")})
    assert gone.traffic() is None  # type: ignore[attr-defined]


def test_timings_are_the_requests_haproxy_logged_for_each_dip(tmp_path: Path) -> None:
    """HAProxy's HTTP logs over UDP to the adapter's log_listen: every request counted under the DIP
    that served it, at the backends' 20 ms of work."""
    with lb_harness.emulated_backends(("s1", "s2"), tmp_path / "slow", service_time=0.02) as slow, \
            HAProxyTestbed(slow, tmp_path / "logged", log_to=f"127.0.0.1:{free_port()}") as logged:
        adapter = _adapter(logged, servers={"web-1": "s1", "web-2": "s2"})
        try:
            assert_timed_as_served(logged, adapter, WeightPlan(vip="web", weights={"web-1": 0.25, "web-2": 0.75}),
                                   backend_of={"web-1": "s1", "web-2": "s2"})
        finally:
            adapter.close()


def test_weight_zero_takes_a_server_out_of_rotation(haproxy: HAProxyTestbed) -> None:
    adapter = _adapter(haproxy)
    assert adapter.apply(WeightPlan(vip="web", weights={"b1": 0.0, "b2": 0.5, "b3": 0.5})).ok
    assert adapter.read_integers()["b1"] == 0
    counts = lb_harness.measure_split(haproxy, 300)
    assert "b1" not in counts and counts["b2"] == counts["b3"] == 150


def test_runtime_weights_survive_a_reload_through_the_state_file(haproxy: HAProxyTestbed) -> None:
    adapter = _adapter(haproxy)
    assert adapter.apply(WeightPlan(vip="web", weights=TARGET)).ok
    assert haproxy.state_file.exists()
    before = adapter.read_integers()
    old_worker = haproxy.worker_pid()
    haproxy.reload()
    assert haproxy.worker_pid() != old_worker
    assert adapter.read_integers() == before


def test_without_the_state_file_a_reload_loses_runtime_weights(haproxy: HAProxyTestbed) -> None:
    """The pitfall the state file exists for: HAProxy reverts to the config weights (100)."""
    haproxy.state_file.unlink(missing_ok=True)
    adapter = _adapter(haproxy)
    adapter.state_file = None
    assert adapter.apply(WeightPlan(vip="web", weights=TARGET)).ok
    haproxy.reload()
    assert adapter.read_integers() == {"b1": 100, "b2": 100, "b3": 100}


def test_a_failing_command_restores_the_previous_weights(haproxy: HAProxyTestbed) -> None:
    adapter = _adapter(haproxy)
    assert adapter.apply(WeightPlan(vip="web", weights={"b1": 0.2, "b2": 0.3, "b3": 0.5})).ok
    before = adapter.read_integers()

    class FailsOnThirdServer(HAProxyAdapter):
        def _set_weight(self, api: RuntimeApi, server: str, weight: int) -> None:
            if server == "b3" and weight != before["b3"]:
                raise HAProxyError("injected: HAProxy refused b3")
            super()._set_weight(api, server, weight)

    faulty = FailsOnThirdServer.from_config(haproxy.adapter_settings)
    result = faulty.apply(WeightPlan(vip="web", weights={"b1": 0.6, "b2": 0.3, "b3": 0.1}))
    assert not result.ok
    assert "injected" in result.reason and "previous weights restored" in result.reason
    assert adapter.read_integers() == before


def test_unknown_server_is_refused_before_anything_changes(haproxy: HAProxyTestbed) -> None:
    adapter = _adapter(haproxy)
    before = adapter.read_integers()
    result = adapter.apply(WeightPlan(vip="web", weights={"b1": 0.5, "b9": 0.5}))
    assert not result.ok and "b9" in result.reason
    assert adapter.read_integers() == before


def test_static_rr_backend_is_refused_with_the_reason(backends: dict[str, str], tmp_path: Path) -> None:
    with HAProxyTestbed(backends, tmp_path / "static", balance="static-rr") as testbed:
        adapter = _adapter(testbed)
        result = adapter.apply(WeightPlan(vip="web", weights=TARGET))
        assert not result.ok
        assert "static-rr" in result.reason and "roundrobin" in result.reason
        assert not adapter.check().ok
        assert adapter.read_integers() == {"b1": 100, "b2": 100, "b3": 100}


def test_tcp_admin_socket_and_check(backends: dict[str, str], tmp_path: Path) -> None:
    with HAProxyTestbed(backends, tmp_path / "tcp", admin="tcp") as testbed:
        adapter = _adapter(testbed)
        assert isinstance(adapter.socket_endpoint, tuple)
        check = adapter.check()
        assert check.ok and "roundrobin" in check.detail
        assert adapter.apply(WeightPlan(vip="web", weights=TARGET)).ok
        assert adapter.read_integers() == {"b1": 43, "b2": 128, "b3": 255}
    # HAProxy gone: a failed result with the reason, never an exception
    result = adapter.apply(WeightPlan(vip="web", weights=TARGET))
    assert not result.ok and "cannot reach" in result.reason


def test_klb_bench_adapters_reports_haproxy_numbers() -> None:
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "bench",
            "adapters",
            "--json",
            "--lbs",
            "haproxy",
            "--requests",
            "300",
            "--plans",
            "10",
            "--churn-seconds",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)["lbs"]["haproxy"]
    assert "error" not in row, row["error"]
    assert row["split_error"] <= 0.05
    assert row["failed_requests"] == 0 and row["plans"] == 10
    assert 0 < row["apply_seconds_median"] <= row["apply_seconds_p99"]
    assert row["idle_apply_seconds_median"] > 0
    assert row["follow_seconds_median"] is not None


def test_klb_bench_adapters_refuses_unknown_lbs() -> None:
    result = CliRunner().invoke(app, ["bench", "adapters", "--lbs", "haproxy,f5"])
    assert result.exit_code != 0
    assert "f5" in result.output


def test_leastconn_ignores_weights_without_concurrency(backends: dict[str, str], tmp_path: Path) -> None:
    """The documented pitfall: with one request at a time every server has 0 connections, so
    ``leastconn`` cycles through them whatever their weights (it honours weights only under
    concurrency, as connections/weight)."""
    with HAProxyTestbed(backends, tmp_path / "leastconn", balance="leastconn") as testbed:
        adapter = _adapter(testbed)
        check = adapter.check()  # for `klb check`: a weight here scales connection counts
        assert check.ok and check.balancing == "least_connections", check
        assert adapter.apply(WeightPlan(vip="web", weights=TARGET)).ok
        assert adapter.read_integers() == {"b1": 43, "b2": 128, "b3": 255}
        counts = lb_harness.measure_split(testbed, 300, concurrency=1)
        assert counts == {"b1": 100, "b2": 100, "b3": 100}


def test_missing_backend_is_refused_with_the_reason(haproxy: HAProxyTestbed) -> None:
    adapter = _adapter(haproxy, backend="nope")
    result = adapter.apply(WeightPlan(vip="web", weights=TARGET))
    assert not result.ok and "no backend 'nope'" in result.reason
    check = adapter.check()
    assert not check.ok and "nope" in check.detail


def test_testbed_starts_from_a_relative_working_directory(
    backends: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `klb demo --out demo-out` passes a relative path; HAProxy reads a relative socket path as host:port
    monkeypatch.chdir(tmp_path)
    with HAProxyTestbed(backends, Path("relative-haproxy")) as testbed:
        assert _adapter(testbed).apply(WeightPlan(vip="web", weights=TARGET)).ok


def test_a_new_testbed_does_not_load_the_state_file_an_earlier_run_left(
        backends: dict[str, str], tmp_path: Path) -> None:
    """A second `make demo` in the same directory answered no request: HAProxy loaded the first
    run's server-state file, with that run's backend ports and runtime weights."""
    workdir = tmp_path / "again"
    with HAProxyTestbed(backends, workdir) as first:
        assert _adapter(first).apply(WeightPlan(vip="web", weights={"b1": 1.0, "b2": 0.0, "b3": 0.0})).ok
    assert (workdir / "server-state").exists()
    with HAProxyTestbed(backends, workdir) as second:
        counts = lb_harness.measure_split(second, 300)
        assert "<failed>" not in counts and set(counts) == set(NAMES), counts  # its own config, all three


def test_an_unwritable_state_file_is_a_warning_and_the_weights_still_apply(
        haproxy: HAProxyTestbed, tmp_path: Path) -> None:
    """Runtime weights are the product; the state file is best effort (read-only or full disk)."""
    readonly = tmp_path / "readonly"
    readonly.mkdir()
    adapter = _adapter(haproxy, state_file=str(readonly / "server-state"))
    readonly.chmod(0o500)
    try:
        result = adapter.apply(WeightPlan(vip="web", weights=TARGET))
        writable = os.access(readonly, os.W_OK)  # root ignores directory permissions
    finally:
        readonly.chmod(0o700)
    assert result.ok, result.reason
    assert adapter.read_integers() == {"b1": 43, "b2": 128, "b3": 255}
    if not writable:
        assert result.warnings and "server state file" in result.warnings[0]
    assert not list(readonly.glob(".klb-state-*"))  # no temp file left behind


def test_a_state_file_that_cannot_be_replaced_leaves_no_temp_file(haproxy: HAProxyTestbed, tmp_path: Path) -> None:
    target = tmp_path / "state-dir"
    target.mkdir()
    state = target / "server-state"
    state.mkdir()  # a directory where the file should be: os.replace fails, whatever the user
    adapter = _adapter(haproxy, state_file=str(state))
    result = adapter.apply(WeightPlan(vip="web", weights=TARGET))
    assert result.ok and result.warnings, result
    assert adapter.read_integers() == {"b1": 43, "b2": 128, "b3": 255}
    assert [p.name for p in target.iterdir()] == ["server-state"]


def test_a_file_that_is_not_a_server_state_file_is_never_replaced(haproxy: HAProxyTestbed, tmp_path: Path) -> None:
    precious = tmp_path / "precious.conf"
    precious.write_text("listen important\n")
    result = _adapter(haproxy, state_file=str(precious)).apply(WeightPlan(vip="web", weights=TARGET))
    assert result.ok and "not an HAProxy server state file" in result.warnings[0]
    assert precious.read_text() == "listen important\n"


def test_rollback_after_a_dropped_admin_connection_uses_a_new_connection(haproxy: HAProxyTestbed) -> None:
    adapter = _adapter(haproxy)
    assert adapter.apply(WeightPlan(vip="web", weights={"b1": 0.2, "b2": 0.3, "b3": 0.5})).ok
    before = adapter.read_integers()

    class DropsTheConnection(HAProxyAdapter):
        dropped = False

        def _set_weight(self, api: RuntimeApi, server: str, weight: int) -> None:
            if server == "b2" and not DropsTheConnection.dropped:
                DropsTheConnection.dropped = True
                api._sock.close()  # the connection dies mid-apply: b1 already has its new weight
            super()._set_weight(api, server, weight)

    faulty = DropsTheConnection.from_config(haproxy.adapter_settings)
    result = faulty.apply(WeightPlan(vip="web", weights={"b1": 0.6, "b2": 0.3, "b3": 0.1}))
    assert not result.ok
    assert "new admin connection" in result.reason, result.reason
    assert adapter.read_integers() == before  # no partial plan left in HAProxy


def test_requests_moved_off_a_dead_server_show_in_its_error_counters(backends: dict[str, str], tmp_path: Path) -> None:
    """HAProxy retries and redispatches a request whose server refuses the connection: the client
    sees a success, and only the dead server's ``show stat`` counters tell."""
    dead = {**backends, "gone": f"127.0.0.1:{free_port()}"}
    with HAProxyTestbed(dead, tmp_path / "haproxy") as testbed:
        counts = lb_harness.measure_split(testbed, 200)
        errors = parse_server_errors(testbed.admin_command(f"show stat {BACKEND} 4 -1"), BACKEND)
    assert "<failed>" not in counts and "gone" not in counts
    assert errors["gone"]["wredis"] > 0, errors  # counted on the server the request left
    assert all(errors[name]["wredis"] == 0 and errors[name]["econ"] == 0 for name in NAMES), errors
