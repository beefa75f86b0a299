"""Rules of the classic policies (L7 report, L7 load balancer report; Envoy least_request) on hand-made states."""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import Any

import pytest

from knapsack_lb.errors import InvalidInputError
from knapsack_lb.sim.policies.hash_ring import HashRing, ring_hash
from knapsack_lb.sim.policies.health_check import HealthChecked
from knapsack_lb.sim.policies.least_connections import LeastConnections, PowerOfTwo, WeightedLeastConnections
from knapsack_lb.sim.policies.least_response_time import LeastResponseTime
from knapsack_lb.sim.policies.random_choice import RandomChoice, WeightedRandom
from knapsack_lb.sim.policies.registry import PolicyContext, make_policy, policy_names
from knapsack_lb.sim.policies.round_robin import BlockWeightedRoundRobin, RoundRobin, SmoothWeightedRoundRobin
from knapsack_lb.sim.policies.shedding import LoadShedding, shed_probability
from knapsack_lb.sim.policies.sticky import StickySessions
from tests.sim.fakes import FakeView, outcome, request

RNG = random.Random(7)


def picks(policy: Any, view: FakeView, k: int, **kw: Any) -> list[int | None]:
    return [policy.pick(request(**kw), view, RNG) for _ in range(k)]


def test_round_robin_rotates_and_skips_excluded() -> None:
    view = FakeView(3)
    assert picks(RoundRobin(), view, 6) == [0, 1, 2, 0, 1, 2]
    rr = RoundRobin()
    assert picks(rr, view, 4, excluded=[1]) == [0, 2, 0, 2]
    assert RoundRobin().pick(request(excluded=[0, 1, 2]), view, RNG) is None


def test_smooth_wrr_is_nginx_interleaving() -> None:
    view = FakeView(3, weights={0: 5, 1: 1, 2: 1})
    assert picks(SmoothWeightedRoundRobin(), view, 7) == [0, 0, 1, 0, 2, 0, 0]


def test_smooth_wrr_shares_follow_weights_and_zero_is_never() -> None:
    view = FakeView(4, weights={0: 1, 1: 2, 2: 3, 3: 0})
    counts = Counter(picks(SmoothWeightedRoundRobin(), view, 600))
    assert counts == {0: 100, 1: 200, 2: 300}


def test_block_wrr_gives_turns_in_a_row() -> None:
    view = FakeView(3, weights={0: 1, 1: 2, 2: 3})
    assert picks(BlockWeightedRoundRobin(), view, 12) == [0, 1, 1, 2, 2, 2, 0, 1, 1, 2, 2, 2]


def test_random_respects_exclusion_and_weights() -> None:
    view = FakeView(3)
    assert set(picks(RandomChoice(), view, 200, excluded=[1])) == {0, 2}
    wview = FakeView(2, weights={0: 1, 1: 3})
    counts = Counter(picks(WeightedRandom(), wview, 4000))
    assert counts[1] / 4000 == pytest.approx(0.75, abs=0.03)


def test_least_connections_picks_fewest_and_breaks_ties_randomly() -> None:
    view = FakeView(3, counts={0: 4, 1: 2, 2: 7})
    assert LeastConnections().pick(request(), view, RNG) == 1
    tie = FakeView(3, counts={0: 1, 1: 1, 2: 5})
    assert set(picks(LeastConnections(), tie, 100)) == {0, 1}
    assert LeastConnections().pick(request(excluded=[1]), view, RNG) == 0


def test_weighted_least_connections_uses_n_plus_one_over_weight() -> None:
    # (3+1)/4 = 1.0 beats (1+1)/1 = 2.0: the heavy DIP wins although it has more connections
    view = FakeView(2, counts={0: 1, 1: 3}, weights={0: 1, 1: 4})
    assert WeightedLeastConnections().pick(request(), view, RNG) == 1
    view.counts[1] = 8  # (8+1)/4 = 2.25 > 2.0
    assert WeightedLeastConnections().pick(request(), view, RNG) == 0
    zero = FakeView(2, weights={0: 0, 1: 1}, counts={1: 50})
    assert WeightedLeastConnections().pick(request(), zero, RNG) == 1


def test_power_of_two_takes_less_loaded_of_two_distinct_draws() -> None:
    view = FakeView(2, counts={0: 9, 1: 1})
    # with two DIPs both are always drawn: always the less loaded one
    assert set(picks(PowerOfTwo(), view, 50)) == {1}
    # the most loaded of many DIPs can only win if drawn twice: never (draws are distinct)
    many = FakeView(5, counts={0: 0, 1: 1, 2: 2, 3: 3, 4: 100})
    assert 4 not in picks(PowerOfTwo(), many, 500)
    assert PowerOfTwo().pick(request(excluded=[0, 1, 2, 3]), many, RNG) == 4


def test_least_response_time_uses_ewma_over_weight() -> None:
    lrt = LeastResponseTime(alpha=0.5)
    view = FakeView(2)
    assert lrt.pick(request(), view, RNG) in (0, 1)  # nothing measured: both 0
    lrt.observe(outcome(0, 0.100), view)
    lrt.observe(outcome(1, 0.300), view)
    assert lrt.pick(request(), view, RNG) == 0
    lrt.observe(outcome(0, 0.700), view)  # EWMA 0.1 + 0.5 * 0.6 = 0.4 > 0.3
    assert lrt.average[0] == pytest.approx(0.4)
    assert lrt.pick(request(), view, RNG) == 1
    view.weights[0] = 2.0  # 0.4 / 2 = 0.2 < 0.3
    assert lrt.pick(request(), view, RNG) == 0
    lrt.observe(outcome(1, 5.0, "error"), view)  # failures do not enter the average
    assert lrt.average[1] == pytest.approx(0.3)


def test_hash_ring_has_100_points_per_server_and_picks_next_node() -> None:
    names = ("s1", "s2", "s3")
    ring = HashRing(names)
    assert len(ring.nodes) == 300
    assert Counter(ring.owner.values()) == {0: 100, 1: 100, 2: 100}
    client = "10.0.0.7"
    h = ring_hash(client)
    following = min((n for n in ring.nodes if n > h), default=ring.nodes[0])
    assert ring.lookup(client) == ring.owner[following]


def test_hash_ring_is_consistent_when_a_server_leaves() -> None:
    ring = HashRing(("s1", "s2", "s3", "s4"))
    clients = [f"10.0.{i // 250}.{i % 250 + 1}" for i in range(2000)]
    before = {c: ring.lookup(c) for c in clients}
    after = {c: ring.lookup(c, frozenset({2})) for c in clients}
    moved = [c for c in clients if before[c] != after[c]]
    assert moved and all(before[c] == 2 for c in moved)  # only s3's clients move
    assert 2 not in after.values()
    assert ring.lookup("x", frozenset({0, 1, 2, 3})) is None


def test_sticky_sessions_stick_refresh_and_expire() -> None:
    sticky = StickySessions(RoundRobin(), expiry=10.0)
    view = FakeView(3)
    first = sticky.pick(request("a"), view, RNG)
    view.now = 8.0
    assert sticky.pick(request("a"), view, RNG) == first  # refreshed at t = 8
    view.now = 17.0
    assert sticky.pick(request("a"), view, RNG) == first  # 9 s idle: still alive
    view.now = 27.5
    assert sticky.pick(request("a"), view, RNG) != first  # 10.5 s idle: expired, RR moves on
    # an excluded (unhealthy) DIP breaks the session
    view.now = 28.0
    current = sticky.sessions["a"][0]
    assert sticky.pick(request("a", excluded=[current]), view, RNG) != current


def test_shedding_probabilities_match_the_report() -> None:
    # 1 - e^(-K (simConn - threshold)) with K = 0.3
    assert shed_probability(5, 5, "exponential") == 0.0
    assert shed_probability(6, 5, "exponential") == pytest.approx(1 - math.exp(-0.3))  # 0.259
    assert shed_probability(10, 5, "exponential") == pytest.approx(1 - math.exp(-1.5))  # 0.777
    assert shed_probability(6, 5, "hard") == 1.0
    assert shed_probability(5, 5, "hard") == 0.0


def test_hard_shedding_counts_all_outstanding_at_the_lb() -> None:
    shed = LoadShedding(RoundRobin(), threshold=5, strategy="hard")
    view = FakeView(3, counts={0: 2, 1: 2, 2: 0})
    assert shed.pick(request(), view, RNG) is not None  # 4 + 1 = 5 <= 5
    view.counts[2] = 1
    assert shed.pick(request(), view, RNG) is None  # 5 + 1 = 6 > 5
    assert shed.pick(request(attempt=1), view, RNG) is not None  # retries are not shed again
    assert shed.shed == 1


def test_exponential_shedding_rate_follows_formula() -> None:
    shed = LoadShedding(RoundRobin(), threshold=5, strategy="exponential", k=0.3)
    view = FakeView(2, counts={0: 4, 1: 5})  # simConn = 10
    rng = random.Random(3)
    dropped = sum(shed.pick(request(), view, rng) is None for _ in range(4000))
    assert dropped / 4000 == pytest.approx(1 - math.exp(-1.5), abs=0.03)


def test_health_checks_fail_over_and_recover() -> None:
    hc = HealthChecked(RoundRobin(), interval=3.0, timeout=2.0)
    view = FakeView(3)
    assert hc.probe_interval == 3.0 and list(hc.probe_targets(view, RNG)) == [0, 1, 2]
    hc.observe(outcome(1, 2.0, "timeout", probe=True), view)
    assert set(picks(hc, view, 30)) == {0, 2}
    hc.observe(outcome(1, 0.001, "ok", probe=True), view)
    assert set(picks(hc, view, 30)) == {0, 1, 2}
    for d in range(3):
        hc.observe(outcome(d, 0.0, "error", probe=True), view)
    assert hc.pick(request(), view, RNG) is None  # all down: rejected until they recover


def test_registry_builds_every_classic_policy() -> None:
    ctx = PolicyContext(dip_names=("a", "b", "c"), weights=(1.0, 2.0, 3.0))
    view = FakeView(3)
    for name in (
        "round_robin",
        "weighted_round_robin",
        "block_weighted_round_robin",
        "random",
        "weighted_random",
        "least_connections",
        "weighted_least_connections",
        "power_of_two",
        "least_response_time",
        "hash_ring",
        "knapsack",
    ):
        assert name in policy_names()
        policy = make_policy(name, ctx)
        assert policy.pick(request(), view, RNG) in (0, 1, 2)
    with pytest.raises(InvalidInputError, match="unknown policy"):
        make_policy("nope", ctx)
    with pytest.raises(InvalidInputError, match="params"):
        make_policy("round_robin", PolicyContext(dip_names=("a",), weights=(1.0,), params={"bogus": 1}))
