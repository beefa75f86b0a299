"""Same seed, same result; another seed, another result."""

from __future__ import annotations

from knapsack_lb.sim.policies.base import LbView, Outcome
from knapsack_lb.sim.policies.least_connections import LeastConnections
from knapsack_lb.sim.simulation import Simulation, run
from knapsack_lb.sim.spec import load_scenario


def small(name: str, duration: float = 8.0):  # type: ignore[no-untyped-def]
    sc = load_scenario(name)
    return sc.with_changes(duration=duration, warmup=1.0)


def test_same_seed_gives_identical_results() -> None:
    sc = small("knapsack-3dip")
    for policy in ("power_of_two", "least_connections"):
        a, b = run(sc, policy, seed=11), run(sc, policy, seed=11)
        sa, sb = a.summary(), b.summary()
        sa.pop("wall_seconds")
        sb.pop("wall_seconds")
        assert sa == sb
        assert (a.latencies == b.latencies).all()


def test_different_seeds_give_different_results() -> None:
    sc = small("knapsack-3dip")
    a, b = run(sc, "random", seed=1), run(sc, "random", seed=2)
    assert a.mean != b.mean and a.requests != b.requests


def test_l7_closed_loop_with_spikes_and_retries_is_deterministic() -> None:
    sc = small("l7-basics", duration=6.0).with_changes(
        network={"rtt": 0.001, "spikes": [{"dips": [0], "extra": 0.05, "duration": 0.2, "per_minute": 30}]},
        lb={"timeout": 0.5, "retries": {"max_attempts": 2}},
    )
    a, b = run(sc, "least_response_time", seed=5), run(sc, "least_response_time", seed=5)
    assert a.latencies.tolist() == b.latencies.tolist()


class _ObservingLeastConnections(LeastConnections):
    """Least connections that also looks at every outcome: the simulator then takes its general path
    (an ``Outcome`` per answer, ``_conclude``/``_final``) instead of the status-only path."""

    def __init__(self) -> None:
        self.seen = 0

    def observe(self, outcome: Outcome, view: LbView) -> None:
        self.seen += 1


def test_status_only_path_gives_the_same_run_as_the_outcome_path() -> None:
    """The fast path for policies that never observe (docs/simulator.md, "Speed") must not change a
    run: the same policy through the general path draws and records exactly the same."""
    layer4 = small("knapsack-paper30", duration=4.0)
    layer7 = small("l7-basics", duration=4.0).with_changes(
        network={"rtt": 0.001, "spikes": [{"dips": [0], "extra": 0.05, "duration": 0.2, "per_minute": 30}]},
        lb={"timeout": 0.5, "retries": {"max_attempts": 2}},
    )
    for sc in (layer4, layer7):
        fast = Simulation(sc, "least_connections", seed=3)
        general = Simulation(sc, "least_connections", seed=3, policy_factory=lambda ctx: _ObservingLeastConnections())
        assert not fast.lbs[0].observes and general.lbs[0].observes
        a, b = fast.run(), general.run()
        assert sum(lb.policy.seen for lb in general.lbs) >= b.ok > 0  # type: ignore[attr-defined]
        sa, sb = a.summary(), b.summary()
        sa.pop("wall_seconds")
        sb.pop("wall_seconds")
        assert sa == sb
        for key in ("start", "latency", "status"):
            assert (a.series[key] == b.series[key]).all(), key


def test_a_dip_that_fails_with_requests_in_service_answers_them_in_a_fixed_order() -> None:
    """A fast failure answers every request in service with an error, and each error is retried on
    another DIP: the order of those answers is the order of the retries' draws, so it must not depend
    on where the requests happen to sit in memory."""
    sc = small("l7-basics", duration=6.0).with_changes(
        dips=[{"name": "s", "count": 3, "workers": 4, "discipline": "fcfs", "speed": 1.0, "weight": 1}],
        clients={"kind": "closed", "concurrency": 40, "count": 40, "think_time": 0.0},
        lb={"timeout": 2.0, "retries": {"max_attempts": 2}},
        events=[{"at": 3.0, "kind": "fail", "dips": [0], "mode": "fast"}],
    )
    runs = [run(sc, "random", seed=7) for _ in range(4)]
    for other in runs[1:]:
        assert other.latencies.tolist() == runs[0].latencies.tolist()
