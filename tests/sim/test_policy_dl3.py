"""DL3 (DL3 paper, section III): T_load, RTT EWMA (alpha 0.125), healthy list, retraction, P2C."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from knapsack_lb.errors import InvalidInputError
from knapsack_lb.sim.policies.base import Outcome, Request
from knapsack_lb.sim.policies.dl3 import Dl3Policy, probe_wait, rtt_ewma


@dataclass
class FakeView:
    n: int
    now: float = 0.0
    counts: dict[int, int] = field(default_factory=dict)
    rtts: dict[int, float] = field(default_factory=dict)

    @property
    def dip_names(self) -> Sequence[str]:
        return tuple(f"s{i}" for i in range(self.n))

    def outstanding(self, dip: int) -> int:
        return self.counts.get(dip, 0)

    def weight(self, dip: int) -> float:
        return 1.0

    def path_rtt(self, dip: int) -> float | None:
        return self.rtts.get(dip)


def response(dip: int, sent: float, done: float, inflight: int | None, *, probe: bool = False,
             rtt: float | None = None) -> Outcome:
    extra = {} if rtt is None else {"rtt": rtt}
    return Outcome(request_id=0, dip=dip, sent_at=sent, finished_at=done, status="ok",
                   server_inflight=inflight, probe=probe, extra=extra)


def test_rtt_ewma_alpha_0125() -> None:
    assert rtt_ewma(None, 0.001) == 0.001
    assert rtt_ewma(0.010, 0.080) == pytest.approx(0.875 * 0.010 + 0.125 * 0.080)  # 18.75 ms
    # 1 ms paths, T_RTT 10 ms: one sample during an 80 ms spike crosses the threshold
    assert rtt_ewma(0.001, 0.081) == pytest.approx(0.011)
    # after the spike: samples back at 1 ms bring it under 10 ms in one step
    assert rtt_ewma(0.011, 0.001) < 0.010


def test_probe_waiting_rule() -> None:
    assert probe_wait(0.05, 13, 10) == pytest.approx(0.15)  # 3 requests above T_load
    assert probe_wait(0.05, 10, 10) == pytest.approx(0.05)  # at least one RCT


def test_piggybacked_load_moves_servers_between_lists() -> None:
    policy = Dl3Policy(t_load=10)
    view = FakeView(n=3)
    policy.observe(response(1, 0.0, 0.05, inflight=10), view)
    assert policy.healthy_list(view) == [0, 2]
    policy.observe(response(1, 0.1, 0.15, inflight=9), view)
    assert policy.healthy_list(view) == [0, 1, 2]


def test_load_retraction_probes_after_the_wait() -> None:
    policy = Dl3Policy(t_load=10)
    view = FakeView(n=2)
    policy.observe(response(0, 0.0, 0.05, inflight=3), view)  # RCT 50 ms
    policy.observe(response(0, 0.05, 0.10, inflight=14), view)  # 4 above T_load
    assert policy.healthy_list(view) == [1]
    view.now = 0.20
    assert list(policy.probe_targets(view, random.Random(0))) == []  # wait 4 x 50 ms after 0.10
    view.now = 0.31
    assert list(policy.probe_targets(view, random.Random(0))) == [0]
    policy.observe(response(0, 0.30, 0.301, inflight=4, probe=True), view)
    assert policy.healthy_list(view) == [0, 1]


def test_rtt_retraction_is_reactive_with_requests_in_flight_and_probes_without() -> None:
    policy = Dl3Policy(t_rtt=0.010)
    view = FakeView(n=2, counts={0: 1}, rtts={0: 0.001, 1: 0.001})
    rng = random.Random(0)
    policy.probe_targets(view, rng)  # the path at 1 ms
    view.rtts[0] = 0.081  # an 80 ms spike begins
    view.now = 0.002
    assert list(policy.probe_targets(view, rng)) == []  # samples in-flight RTTs, no probe needed
    assert policy.healthy_list(view) == [1]
    view.rtts[0] = 0.001
    view.now = 0.004
    policy.probe_targets(view, rng)  # the in-flight request still shows the path: recovered
    assert policy.healthy_list(view) == [0, 1]
    # a spike seen on a response, nothing in flight any more: TCP probes until below T_RTT
    view.counts = {}
    policy.observe(response(1, 0.00, 0.01, inflight=1, rtt=0.001), view)
    policy.observe(response(1, 0.01, 0.20, inflight=1, rtt=0.161), view)  # avg 21.1 ms
    assert policy.healthy_list(view) == [0]
    probes = 0
    while 1 not in policy.healthy_list(view):
        assert list(policy.probe_targets(view, rng)) == [1]
        probes += 1
        policy.observe(response(1, 0.3, 0.301, inflight=1, probe=True, rtt=0.001), view)
    assert probes == 6  # 21.1 ms * 0.875^6 < 10 ms
    assert list(policy.probe_targets(view, rng)) == []


def test_p2c_over_the_healthy_list_by_local_in_flight() -> None:
    policy = Dl3Policy(t_load=10)
    view = FakeView(n=4, counts={0: 0, 1: 5, 2: 1, 3: 0})
    policy.observe(response(0, 0.0, 0.05, inflight=12), view)
    policy.observe(response(3, 0.0, 0.05, inflight=20), view)
    rng = random.Random(5)
    picks = [policy.pick(Request(i, "c", 0.1), view, rng) for i in range(200)]
    assert set(picks) == {2}  # healthy: 1 and 2; 2 has fewer of this client's requests


def test_all_unhealthy_falls_back_to_every_server() -> None:
    policy = Dl3Policy(t_load=1)
    view = FakeView(n=2)
    for dip in (0, 1):
        policy.observe(response(dip, 0.0, 0.05, inflight=5), view)
    assert policy.healthy_list(view) == []
    assert policy.pick(Request(0, "c", 0.1), view, random.Random(1)) in {0, 1}
    assert policy.pick(Request(0, "c", 0.1, excluded=frozenset({0, 1})), view, random.Random(1)) is None
    with pytest.raises(InvalidInputError, match="t_rtt"):
        Dl3Policy(t_rtt=0)
