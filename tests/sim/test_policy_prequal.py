"""Prequal (NSDI'24): probe pool, reuse and age limits, hot-cold lexicographic selection."""

from __future__ import annotations

import random

import pytest

from knapsack_lb.errors import InvalidInputError
from knapsack_lb.sim.policies.base import Outcome, Request
from knapsack_lb.sim.policies.prequal import PrequalPolicy, ProbeEntry, hot_cold_select, rif_quantile
from tests.sim.fakes import FakeView


def probe_answer(dip: int, t: float, rif: int, latency: float) -> Outcome:
    return Outcome(request_id=0, dip=dip, sent_at=t - 0.001, finished_at=t, status="ok", server_inflight=rif,
                   probe=True, extra={"latency_estimate": latency})


def test_rif_quantile() -> None:
    assert rif_quantile([9, 1, 8, 2], 0.75) == 8
    assert rif_quantile([9, 1, 8, 2], 1.0) == 9
    assert rif_quantile([3], 0.5) == 3


def test_hot_cold_selection() -> None:
    entries = [ProbeEntry(0, 1, 0.5, 0.0), ProbeEntry(1, 2, 0.1, 0.0), ProbeEntry(2, 8, 0.01, 0.0),
               ProbeEntry(3, 9, 0.02, 0.0)]
    # threshold: the 0.75 quantile = 8; cold = RIF 1 and 2; lowest latency among cold wins,
    # not the globally fastest (hot) replica 2
    chosen = hot_cold_select(entries, 0.75)
    assert chosen is not None and chosen.dip == 1
    # all hot (no RIF below the threshold): the lowest RIF
    hot = [ProbeEntry(0, 5, 0.5, 0.0), ProbeEntry(1, 5, 0.1, 0.0), ProbeEntry(2, 7, 0.01, 0.0)]
    chosen = hot_cold_select(hot, 0.5)
    assert chosen is not None and chosen.dip == 1
    assert hot_cold_select([], 0.75) is None


def test_pool_age_reuse_and_size_limits() -> None:
    policy = PrequalPolicy(pool_size=2, max_age=1.0, reuse_limit=2, q_rif=0.75)
    view = FakeView(n=4)
    rng = random.Random(1)
    policy.observe(probe_answer(0, 0.0, 1, 0.1), view)
    policy.observe(probe_answer(1, 0.1, 3, 0.1), view)
    policy.observe(probe_answer(2, 0.2, 2, 0.1), view)
    assert sorted(policy.pool) == [1, 2]  # the oldest was evicted
    view.now = 0.3
    assert policy.pick(Request(0, "c", 0.3), view, rng) == 2  # cold (below the 0.75 quantile, 3)
    assert policy.pool[2].rif == 3  # the query just sent counts
    view.now = 1.15
    assert sorted(policy.pool) == [1, 2]
    policy.pick(Request(1, "c", 1.15), view, rng)  # prunes replica 1's probe (older than 1 s)
    assert 1 not in policy.pool
    assert 2 not in policy.pool or policy.pool[2].uses < 2


def test_probes_follow_queries_and_empty_pool_is_random() -> None:
    policy = PrequalPolicy(probes_per_query=3)
    view = FakeView(n=5)
    rng = random.Random(2)
    picks = {policy.pick(Request(i, "c", 0.0), view, rng) for i in range(40)}
    assert len(picks) > 1  # random while nothing is known
    targets = list(policy.probe_targets(view, rng))
    assert len(targets) == 120 and set(targets) <= set(range(5))
    assert list(policy.probe_targets(view, rng)) == []
    with pytest.raises(InvalidInputError, match="q_rif"):
        PrequalPolicy(q_rif=0)


def test_in_the_simulator_probes_steer_queries_to_idle_fast_replicas() -> None:
    from knapsack_lb.sim.simulation import run
    from knapsack_lb.sim.spec import parse_scenario

    scenario = parse_scenario({
        "name": "probes", "duration": 10, "warmup": 2,
        "service": {"kind": "exponential", "mean": 0.01},
        "dips": [{"name": "fast", "count": 2, "workers": 2, "speed": 2.0},
                 {"name": "slow", "count": 2, "workers": 2, "speed": 0.5}],
        "clients": {"kind": "open", "load": 0.6},
    })
    prequal, rr = run(scenario, "prequal", 1), run(scenario, "round_robin", 1)
    assert sum(prequal.dip_share[:2]) > 0.6
    assert prequal.p99 < rr.p99
