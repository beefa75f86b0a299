"""Layer 4: connections are placed once, carry many requests, and MUXes count connections."""

from __future__ import annotations

import random
from collections import defaultdict

from knapsack_lb.sim.policies.base import LbView, Outcome, Request
from knapsack_lb.sim.policies.registry import PolicyContext
from knapsack_lb.sim.simulation import Simulation
from knapsack_lb.sim.spec import parse_scenario


class RecordingPolicy:
    """Round robin that records every placement and outcome it sees."""

    name = "recording"

    def __init__(self) -> None:
        self.placements: list[tuple[int | None, int]] = []  # (connection, dip)
        self.seen_outstanding: list[int] = []
        self.outcomes: list[Outcome] = []
        self._next = 0

    def pick(self, request: Request, view: LbView, rng: random.Random) -> int | None:
        dip = self._next % len(view.dip_names)
        self._next += 1
        self.seen_outstanding.append(sum(view.outstanding(d) for d in range(len(view.dip_names))))
        self.placements.append((request.connection, dip))
        return dip

    def observe(self, outcome: Outcome, view: LbView) -> None:
        self.outcomes.append(outcome)

    def probe_targets(self, view: LbView, rng: random.Random) -> tuple[int, ...]:
        return ()


def l4_scenario(**changes: object) -> dict:
    base = {
        "duration": 20.0,
        "service": {"kind": "exponential", "mean": 0.01},
        "dips": [{"name": "d", "count": 3, "workers": 2}],
        "clients": {"kind": "sessions", "concurrency": 12, "requests_per_session": 10, "think_time": 0.05},
        "lb": {"instances": 2, "layer": 4},
    }
    base.update(changes)
    return base


def test_connections_are_placed_once_and_carry_all_their_requests() -> None:
    policies: list[RecordingPolicy] = []

    def factory(ctx: PolicyContext) -> RecordingPolicy:
        policies.append(RecordingPolicy())
        return policies[-1]

    sim = Simulation(parse_scenario(l4_scenario()), "recording", seed=1, policy_factory=factory)
    result = sim.run()
    placements = [p for pol in policies for p in pol.placements]
    assert all(conn is not None for conn, _ in placements)  # pick only for connections
    assert len({conn for conn, _ in placements}) == len(placements)  # each connection placed once
    # each connection carries up to 10 requests: far fewer placements than requests
    assert result.ok > 8 * len(placements)
    # every request of a connection went to the DIP its connection was placed on
    dip_of = {conn: dip for conn, dip in placements}
    by_conn: dict[int, set[int]] = defaultdict(set)
    for pol in policies:
        for o in pol.outcomes:
            by_conn[o.request_id].add(o.dip)
    assert all(len(dips) == 1 for dips in by_conn.values())
    assert len(dip_of) == len(placements)
    # a MUX's view counts its open connections: never more than the population
    assert max(max(p.seen_outstanding) for p in policies) <= 12
    assert sum(len(p.placements) for p in policies if p.placements) == len(placements)
    assert all(p.placements for p in policies)  # both MUXes placed connections


def test_layer4_least_connections_counts_connections_not_requests() -> None:
    sc = parse_scenario(l4_scenario(lb={"instances": 1, "layer": 4}))
    sim = Simulation(sc, "least_connections", seed=2)
    samples: list[list[int]] = []
    sim.on_window.append(lambda now: samples.append(list(sim.lbs[0].counts)))
    sim.run()
    # 12 connections spread over 3 DIPs by least connections: at most one apart at window edges
    assert samples and all(sum(s) <= 12 for s in samples)
    assert all(max(s) - min(s) <= 2 for s in samples[2:])


def test_pushed_weights_apply_to_new_connections_only() -> None:
    sc = parse_scenario(
        l4_scenario(
            lb={"instances": 1, "layer": 4},
            duration=30.0,
            clients={"kind": "sessions", "concurrency": 30, "requests_per_session": 40, "think_time": 0.05},
        )
    )
    sim = Simulation(sc, "weighted_round_robin", seed=3)
    shares: list[list[int]] = []
    sim.on_window.append(lambda now: shares.append(list(sim.lbs[0].counts)))
    sim.engine.at(10.0, lambda _: sim.set_weights([1.0, 0.0, 0.0]))
    sim.run()
    at_push = shares[9]
    just_after = shares[10]
    later = shares[25]
    assert at_push[1] > 0 and at_push[2] > 0
    assert just_after[1] + just_after[2] > 0  # existing connections stay where they were
    assert later[1] == 0 and later[2] == 0  # once they ended, all connections are on DIP 0
