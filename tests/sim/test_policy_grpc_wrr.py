"""gRPC weighted_round_robin (gRFC A58): ORCA weight, blackout, expiration, EDF scheduler."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from knapsack_lb.errors import InvalidInputError
from knapsack_lb.sim.policies.base import Outcome, Request
from knapsack_lb.sim.policies.grpc_wrr import EdfScheduler, EndpointWeight, GrpcWrrPolicy, orca_weight
from tests.sim.fakes import FakeView


def report(dip: int, t: float, qps: float, util: float, eps: float = 0.0) -> Outcome:
    return Outcome(request_id=0, dip=dip, sent_at=t - 0.01, finished_at=t, status="ok",
                   extra={"qps": qps, "utilization": util, "eps": eps})


def test_weight_formula() -> None:
    assert orca_weight(100.0, 0.5) == pytest.approx(200.0)
    # 10 errors/s at 100 qps with penalty 1.0: utilisation counts 0.5 + 0.1
    assert orca_weight(100.0, 0.5, eps=10.0, error_utilization_penalty=1.0) == pytest.approx(100 / 0.6)
    assert orca_weight(100.0, 0.5, eps=10.0, error_utilization_penalty=0.0) == pytest.approx(200.0)
    assert orca_weight(0.0, 0.5) == 0.0
    assert orca_weight(100.0, 0.0) == 0.0


def test_blackout_and_expiration() -> None:
    w = EndpointWeight()
    w.update(0.0, 100.0, 0.5, 0.0, 1.0)
    assert w.weight(5.0, expiration=180.0, blackout=10.0) == 0.0  # blacked out
    assert w.weight(10.0, expiration=180.0, blackout=10.0) == pytest.approx(200.0)
    w.update(20.0, 100.0, 0.25, 0.0, 1.0)
    assert w.non_empty_since == 0.0  # a later report does not restart the blackout
    assert w.weight(20.0, 180.0, 10.0) == pytest.approx(400.0)
    assert w.weight(200.0, 180.0, 10.0) == 0.0  # expired: last report 180 s ago
    assert w.non_empty_since is None
    w.update(201.0, 100.0, 0.5, 0.0, 1.0)
    assert w.weight(205.0, 180.0, 10.0) == 0.0  # a new blackout after expiry
    assert w.weight(211.0, 180.0, 10.0) == pytest.approx(200.0)
    empty = EndpointWeight()
    empty.update(0.0, 0.0, 0.5, 0.0, 1.0)  # ignored
    assert empty.weight(100.0, 180.0, 10.0) == 0.0


def test_edf_scheduler_follows_weights() -> None:
    scheduler = EdfScheduler([1.0, 2.0, 3.0], random.Random(1))
    counts = Counter(scheduler.next() for _ in range(600))
    assert [counts[i] for i in range(3)] == pytest.approx([100, 200, 300], abs=2)


def test_unknown_weights_take_the_mean_and_fewer_than_two_known_is_round_robin() -> None:
    scheduler = EdfScheduler([1.0, 0.0, 3.0], random.Random(2))
    assert scheduler.weights == [1.0, 2.0, 3.0]
    rr = EdfScheduler([0.0, 5.0, 0.0], random.Random(3))
    counts = Counter(rr.next() for _ in range(300))
    assert [counts[i] for i in range(3)] == [100, 100, 100]


def test_policy_uses_reported_weights_after_the_blackout() -> None:
    policy = GrpcWrrPolicy(blackout_period=10.0, weight_update_period=1.0)
    view = FakeView(n=2)
    rng = random.Random(4)
    policy.observe(report(0, 0.5, qps=100.0, util=0.25), view)  # weight 400
    policy.observe(report(1, 0.5, qps=100.0, util=1.0), view)  # weight 100
    view.now = 5.0
    early = Counter(policy.pick(Request(i, "c", 5.0), view, rng) for i in range(1000))
    assert abs(early[0] - early[1]) <= 2  # blacked out: round robin
    view.now = 11.0
    late = Counter(policy.pick(Request(i, "c", 11.0), view, rng) for i in range(1000))
    assert late[0] == pytest.approx(800, abs=2)
    assert policy.pick(Request(0, "c", 11.0, excluded=frozenset({0})), view, rng) == 1
    with pytest.raises(InvalidInputError, match="weight_update_period"):
        GrpcWrrPolicy(weight_update_period=0.01)


def test_in_the_simulator_orca_weights_move_traffic_to_the_faster_dips() -> None:
    from knapsack_lb.sim.simulation import run
    from knapsack_lb.sim.spec import PolicySpec, parse_scenario

    scenario = parse_scenario({
        "name": "orca", "duration": 30, "warmup": 15,
        "service": {"kind": "exponential", "mean": 0.01},
        "dips": [{"name": "fast", "count": 2, "workers": 2, "speed": 2.0},
                 {"name": "slow", "count": 2, "workers": 2, "speed": 0.5}],
        "clients": {"kind": "open", "load": 0.5},
        "server": {"report_utilization": True},
    })
    result = run(scenario, PolicySpec(name="grpc_wrr", params={"blackout_period": 2.0}), 1)
    fast, slow = sum(result.dip_share[:2]), sum(result.dip_share[2:])
    assert fast > 2.5 * slow  # capacities 4:1; round robin would split 1:1
