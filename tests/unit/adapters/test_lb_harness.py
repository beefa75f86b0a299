"""The shared LB harness as pure logic: split error, plan sequences, follow times, and the
churn driver's bookkeeping over a test double of a load balancer (a seeded weighted draw
from the weights a RecordingAdapter holds). Real LBs are in tests/integration."""

from __future__ import annotations

import random
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from adapters.base import ApplyResult
from adapters.recording import RecordingAdapter
from knapsack_lb.lab.testbed.lb_harness import (
    TESTBEDS,
    AppliedPlan,
    LbTestbed,
    RequestFailed,
    Served,
    bench_lb,
    churn,
    churn_plans,
    follow_times,
    load_testbed_class,
    measure_split,
    split_error,
)
from knapsack_lb.model import WeightPlan


class DrawSender:
    """Picks a backend by the adapter's current weights; fails every ``fail_every``-th call."""

    def __init__(self, adapter: RecordingAdapter, rng: random.Random, fail_every: int, lock: threading.Lock) -> None:
        self.adapter, self.rng, self.fail_every, self.lock = adapter, rng, fail_every, lock
        self.calls = 0

    def send(self) -> str:
        with self.lock:
            self.calls += 1
            if self.fail_every and self.calls % self.fail_every == 0:
                raise RequestFailed("injected")
            weights = self.adapter.read()
            names = sorted(weights)
            return self.rng.choices(names, [weights[n] for n in names])[0]

    def close(self) -> None:
        pass


class DrawTestbed:
    lb_name = "draw"
    adapter_name = "recording"
    retries = 0

    def __init__(self, adapter: RecordingAdapter, fail_every: int = 0) -> None:
        self.adapter = adapter
        self.fail_every = fail_every
        self._rng = random.Random(3)
        self._lock = threading.Lock()

    @property
    def adapter_settings(self) -> dict[str, Any]:
        return {}

    def traffic_target(self) -> str:
        return "draw://"

    def open_sender(self) -> DrawSender:
        return DrawSender(self.adapter, self._rng, self.fail_every, self._lock)

    def __enter__(self) -> DrawTestbed:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        pass


def test_draw_testbed_satisfies_the_protocol() -> None:
    assert isinstance(DrawTestbed(RecordingAdapter()), LbTestbed)


def test_measure_split_counts_backends_and_failures() -> None:
    adapter = RecordingAdapter()
    adapter.apply(WeightPlan(vip="v", weights={"a": 0.2, "b": 0.8}))
    counts = measure_split(DrawTestbed(adapter, fail_every=10), 1000, concurrency=2)
    assert sum(counts.values()) == 1000
    assert counts["<failed>"] == pytest.approx(100, abs=2)
    assert counts["b"] > 3 * counts["a"] > 0


def test_split_error_is_the_largest_share_difference() -> None:
    assert split_error({"a": 10, "b": 30, "c": 60}, {"a": 0.1, "b": 0.3, "c": 0.6}) == pytest.approx(0.0)
    assert split_error({"a": 13, "b": 27, "c": 60}, {"a": 0.1, "b": 0.3, "c": 0.6}) == pytest.approx(0.03)
    assert split_error({"a": 50, "<failed>": 50}, {"a": 1.0}) == pytest.approx(0.5)
    assert split_error({"x": 10}, {"a": 1.0}) == pytest.approx(1.0)
    assert split_error({}, {"a": 1.0}) == 1.0


def test_churn_plans_are_seeded_valid_and_include_one_hot_plans() -> None:
    plans = churn_plans("v", ["a", "b", "c"], 20, random.Random(5))
    again = churn_plans("v", ["a", "b", "c"], 20, random.Random(5))
    assert [p.weights for p in plans] == [p.weights for p in again]
    assert [p.version for p in plans] == list(range(1, 21))
    one_hot = [p for p in plans if sorted(p.weights.values()) == [0.0, 0.0, 1.0]]
    assert len(one_hot) == 4
    assert {max(p.weights, key=lambda d: p.weights[d]) for p in one_hot} == {"a", "b", "c"}
    for plan in plans:
        if plan not in one_hot:
            assert min(plan.weights.values()) > 0.03


def _applied(weights: dict[str, float], started: float, finished: float, ok: bool = True) -> AppliedPlan:
    return AppliedPlan(WeightPlan(vip="v", weights=weights), started, finished, ApplyResult(ok=ok, adapter="t"))


def test_follow_time_is_last_straggler_after_apply() -> None:
    applied = [_applied({"a": 1.0, "b": 0.0}, 10.0, 10.01), _applied({"a": 0.5, "b": 0.5}, 11.0, 11.01)]
    served = [
        Served(9.9, 10.05, "b"),  # started before the plan: not held against it
        Served(10.02, 10.03, "b"),
        Served(10.10, 10.11, "b"),  # the last straggler started 0.10 s after apply
        *[Served(10.2 + i * 0.01, 10.2 + i * 0.01, "a") for i in range(5)],
        Served(11.05, 11.06, "b"),  # belongs to the next plan
    ]
    times, not_followed = follow_times(applied, served)
    assert times == [pytest.approx(0.10)]
    assert not_followed == 0


def test_follow_time_without_stragglers_is_the_apply_time_and_needs_confirmations() -> None:
    applied = [_applied({"a": 1.0, "b": 0.0}, 0.0, 0.004)]
    assert follow_times(applied, [Served(0.01 * i, 0.01 * i, "a") for i in range(1, 6)]) == (
        [pytest.approx(0.004)],
        0,
    )
    assert follow_times(applied, [Served(0.01, 0.01, "a"), Served(0.02, 0.02, "b")]) == ([], 1)
    failed = [_applied({"a": 1.0, "b": 0.0}, 0.0, 0.004, ok=False)]
    assert follow_times(failed, []) == ([], 0)


def test_churn_reports_plans_failures_and_follow_times() -> None:
    adapter = RecordingAdapter()
    adapter.apply(WeightPlan(vip="v", weights={"a": 0.5, "b": 0.5}))
    plans = churn_plans("v", ["a", "b"], 10, random.Random(1))
    report = churn(DrawTestbed(adapter, fail_every=50), adapter, plans, 1.0, settle_seconds=0.1, max_requests=5000)
    assert len(report.apply_seconds) == 10
    assert report.apply_failures == ()
    assert adapter.applied[-10:] == plans
    assert 0 < report.requests <= 5000
    assert report.failed > 0 and report.failure_samples == ("injected",)
    assert report.retried == 0
    assert len(report.follow_seconds) + report.not_followed == 2
    summary = report.summary()
    assert summary["plans"] == 10 and summary["failed_requests"] == report.failed
    assert summary["apply_seconds_median"] is not None


def test_churn_records_failed_applies() -> None:
    adapter = RecordingAdapter()
    adapter.apply(WeightPlan(vip="v", weights={"a": 0.5, "b": 0.5}))
    adapter.fail_next = "LB unreachable"
    plans = churn_plans("v", ["a", "b"], 3, random.Random(1))
    report = churn(DrawTestbed(adapter), adapter, plans, 0.3, settle_seconds=0.05, max_requests=500)
    assert report.apply_failures == ("LB unreachable",)


def test_registry_names_every_lb_and_refuses_unknown() -> None:
    assert {"haproxy", "nginx", "envoy", "dns"} <= set(TESTBEDS)
    assert load_testbed_class("haproxy").__name__ == "HAProxyTestbed"
    with pytest.raises(KeyError, match="unknown LB"):
        load_testbed_class("f5")


def test_bench_reports_an_unknown_lb_instead_of_raising(tmp_path: Path) -> None:
    result = bench_lb("f5", tmp_path)
    assert result["lb"] == "f5" and "unknown LB" in result["error"]


@pytest.mark.parametrize("lb", ["haproxy", "nginx"])
def test_real_lb_testbeds_satisfy_the_protocol(lb: str, tmp_path: Path) -> None:
    testbed = load_testbed_class(lb)({"b1": "127.0.0.1:8081"}, tmp_path)  # not entered: nothing starts
    assert isinstance(testbed, LbTestbed)
    assert testbed.lb_name == lb and testbed.adapter_name == lb


def test_requests_in_flight_across_the_next_plan_are_left_out() -> None:
    applied = [_applied({"a": 1.0, "b": 0.0}, 10.0, 10.01), _applied({"a": 0.0, "b": 1.0}, 11.0, 11.01)]
    served = [
        *[Served(10.2 + i * 0.01, 10.2 + i * 0.01, "a") for i in range(5)],
        Served(10.99, 11.02, "b"),  # started under the first plan, routed under the next one
        *[Served(11.2 + i * 0.01, 11.2 + i * 0.01, "b") for i in range(5)],
    ]
    times, not_followed = follow_times(applied, served)
    assert times == [pytest.approx(0.01), pytest.approx(0.01)]
    assert not_followed == 0
