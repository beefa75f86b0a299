"""The Nginx adapter against a real, unprivileged Nginx 1.22 on free loopback ports, in front
of real emulated backends, through the shared LB harness."""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.base import make_adapter
from adapters.nginx import NginxAdapter, worker_pids
from knapsack_lb.lab.procs import free_port
from knapsack_lb.lab.testbed import lb_harness
from knapsack_lb.lab.testbed.lb_nginx import NginxTestbed
from knapsack_lb.model import WeightPlan
from tests.integration.timings_check import assert_timed_as_served

NAMES = ("b1", "b2", "b3")
TARGET = {"b1": 0.1, "b2": 0.3, "b3": 0.6}


@pytest.fixture(scope="module")
def backends(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    with lb_harness.emulated_backends(NAMES, tmp_path_factory.mktemp("nginx-backends")) as addresses:
        yield addresses


@pytest.fixture
def nginx(backends: dict[str, str], tmp_path: Path) -> Iterator[NginxTestbed]:
    with NginxTestbed(backends, tmp_path / "nginx") as testbed:
        yield testbed


def _adapter(testbed: NginxTestbed) -> NginxAdapter:
    adapter = make_adapter("nginx", testbed.adapter_settings)
    assert isinstance(adapter, NginxAdapter)
    return adapter


def _master(testbed: NginxTestbed) -> int:
    return int(testbed.pid_path.read_text())


def test_split_follows_10_30_60_within_3_points(nginx: NginxTestbed) -> None:
    adapter = _adapter(nginx)
    old_workers = worker_pids(_master(nginx))
    result = adapter.apply(WeightPlan(vip="web", weights=TARGET))
    assert result.ok, result.reason
    assert result.lb_weights == {"b1": 100, "b2": 300, "b3": 600}
    assert result.quantisation_error == pytest.approx(0.0, abs=1e-12)
    assert worker_pids(_master(nginx)) - old_workers  # the master really reloaded
    assert adapter.read() == pytest.approx(TARGET)
    counts = lb_harness.measure_split(nginx, 3000)
    assert "<failed>" not in counts
    assert lb_harness.split_error(counts, TARGET) <= 0.03, counts


def test_fifty_weight_changes_under_traffic_fail_under_half_a_percent(nginx: NginxTestbed) -> None:
    adapter = _adapter(nginx)
    plans = lb_harness.churn_plans("web", list(NAMES), 50, random.Random(11))
    report = lb_harness.churn(nginx, adapter, plans, traffic_seconds=12.0)
    assert report.apply_failures == ()
    assert report.requests > 500
    assert report.failed_fraction < 0.005, (report.failed, report.requests, report.failure_samples)
    assert len(report.follow_seconds) >= 5  # one-hot plans whose traffic was seen to follow
    assert adapter.read() == pytest.approx(plans[-1].weights, abs=0.002)


def test_timings_are_the_requests_nginx_logged_for_each_dip(tmp_path: Path) -> None:
    """Nginx's access log over syslog to the adapter's log_listen: every request counted under the DIP
    that served it, at the backends' 20 ms of work."""
    log_to = f"127.0.0.1:{free_port(kind=socket.SOCK_DGRAM)}"
    with lb_harness.emulated_backends(("s1", "s2"), tmp_path / "slow", service_time=0.02) as slow, \
            NginxTestbed(slow, tmp_path / "logged", log_to=log_to) as logged:
        adapter = _adapter(logged)
        try:
            assert_timed_as_served(logged, adapter, WeightPlan(vip="web", weights={"s1": 0.25, "s2": 0.75}))
        finally:
            adapter.close()


def test_weight_zero_becomes_down(nginx: NginxTestbed) -> None:
    adapter = _adapter(nginx)
    result = adapter.apply(WeightPlan(vip="web", weights={"b1": 0.0, "b2": 0.5, "b3": 0.5}))
    assert result.ok and result.lb_weights["b1"] == 0
    assert "weight=1 down;  # b1" in nginx.include_path.read_text()
    counts = lb_harness.measure_split(nginx, 300)
    assert "b1" not in counts and counts["b2"] == counts["b3"] == 150


def test_a_config_failing_nginx_t_is_never_loaded(nginx: NginxTestbed) -> None:
    adapter = _adapter(nginx)
    assert adapter.apply(WeightPlan(vip="web", weights={"b1": 0.0, "b2": 0.0, "b3": 1.0})).ok
    good_include = nginx.include_path.read_text()
    workers = worker_pids(_master(nginx))
    main_config = nginx.config_path.read_text()
    # an operator's broken edit elsewhere in the configuration
    nginx.config_path.write_text(main_config.replace("access_log off;", "access_log off; no_such_directive on;"))
    try:
        result = adapter.apply(WeightPlan(vip="web", weights={"b1": 1.0, "b2": 0.0, "b3": 0.0}))
    finally:
        nginx.config_path.write_text(main_config)
    assert not result.ok
    assert "nginx -t failed" in result.reason and "no_such_directive" in result.reason
    assert nginx.include_path.read_text() == good_include
    assert worker_pids(_master(nginx)) == workers  # not reloaded
    assert lb_harness.measure_split(nginx, 50) == {"b3": 50}  # old weights still serve


def test_a_dead_master_is_a_failed_result_and_the_file_is_restored(nginx: NginxTestbed, tmp_path: Path) -> None:
    adapter = _adapter(nginx)
    before = nginx.include_path.read_text()
    dead_pid = tmp_path / "dead.pid"
    dead_pid.write_text("999999999\n")
    adapter.pid_file = dead_pid
    result = adapter.apply(WeightPlan(vip="web", weights=TARGET))
    assert not result.ok and "not a running process" in result.reason
    assert nginx.include_path.read_text() == before
