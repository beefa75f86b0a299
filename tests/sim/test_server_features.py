"""Server-side features: AQM (429), chips, piggybacked in-flight, ORCA reports, path spikes, probes."""

from __future__ import annotations

import random
import statistics

import pytest

from knapsack_lb.sim.engine import Engine
from knapsack_lb.sim.policies.base import LbView, Outcome, Request
from knapsack_lb.sim.policies.registry import PolicyContext
from knapsack_lb.sim.server import Job, SimDip
from knapsack_lb.sim.simulation import Simulation
from knapsack_lb.sim.spec import PolicySpec, load_scenario, parse_scenario


class Collecting:
    """Random placement; keeps every outcome; probes every DIP each ``probe_interval`` if set."""

    name = "collecting"

    def __init__(self, probe_interval: float | None = None) -> None:
        self.outcomes: list[Outcome] = []
        self.rtts: list[tuple[float, float | None]] = []
        if probe_interval:
            self.probe_interval = probe_interval

    def pick(self, request: Request, view: LbView, rng: random.Random) -> int | None:
        self.rtts.append((view.now, view.path_rtt(0)))  # type: ignore[attr-defined]
        allowed = [d for d in range(len(view.dip_names)) if d not in request.excluded]
        return rng.choice(allowed) if allowed else None

    def observe(self, outcome: Outcome, view: LbView) -> None:
        self.outcomes.append(outcome)

    def probe_targets(self, view: LbView, rng: random.Random) -> range:
        return range(len(view.dip_names))


def simulate(
    spec: dict, probe_interval: float | None = None, policy: PolicySpec | str = "collecting"
) -> tuple[Collecting, Simulation]:
    holder: list[Collecting] = []

    def factory(ctx: PolicyContext) -> Collecting:
        holder.append(Collecting(probe_interval))
        return holder[-1]

    sim = Simulation(parse_scenario(spec), policy, seed=1, policy_factory=factory)
    sim.result = sim.run()  # type: ignore[attr-defined]
    return holder[0], sim


def overloaded(**server: object) -> dict:
    return {
        "duration": 20.0,
        "service": {"kind": "fixed", "mean": 0.1},
        "dips": [{"name": "b", "count": 2, "workers": 1, "discipline": "fcfs", "capacity": 3}],
        "clients": {"kind": "closed", "concurrency": 20, "count": 20},
        "server": server,
    }


def test_aqm_rejects_when_the_queue_would_exceed_capacity() -> None:
    pol, sim = simulate(overloaded(aqm=True, piggyback_inflight=True))
    rejected = [o for o in pol.outcomes if o.status == "rejected"]
    served = [o for o in pol.outcomes if o.status == "ok"]
    assert rejected and served
    # 1 in service + 3 waiting = at most 4 present: a served request waited at most 3 others
    assert max(o.latency for o in served) <= 4 * 0.1 + 1e-6
    assert max(o.server_inflight for o in served if o.server_inflight is not None) <= 3
    assert all(o.latency < 1e-9 for o in rejected)  # a 429 comes back at once (rtt 0)
    assert sim.result.rejected > 0  # type: ignore[attr-defined]


def test_chips_follow_p_no_chip_q_over_08_cap() -> None:
    pol, _ = simulate(overloaded(chips=True, piggyback_inflight=True))
    # queue q (waiting) = inflight after answering - 1 worker busy; P(chip) = 1 - q / (0.8 * 3)
    by_q: dict[int, list[bool]] = {}
    for o in pol.outcomes:
        if o.status == "ok" and o.server_inflight is not None:
            q = max(0, o.server_inflight - 1)
            by_q.setdefault(q, []).append(o.chip)
    assert all(not any(chips) for q, chips in by_q.items() if q >= 3)  # q >= 0.8 cap: never
    if 1 in by_q and len(by_q[1]) > 200:
        assert sum(by_q[1]) / len(by_q[1]) == pytest.approx(1 - 1 / 2.4, abs=0.07)
    assert sum(by_q.get(0, [])) == len(by_q.get(0, []))  # empty queue: always a chip


def test_inflight_is_piggybacked_only_when_switched_on() -> None:
    pol, _ = simulate(overloaded())
    assert all(o.server_inflight is None for o in pol.outcomes)
    pol, _ = simulate(overloaded(piggyback_inflight=True))
    assert max(o.server_inflight or 0 for o in pol.outcomes) >= 5


def test_orca_report_utilisation_qps_and_eps() -> None:
    spec = overloaded(report_utilization=True)
    spec["dips"] = [
        {"name": "b", "count": 2, "workers": 1, "discipline": "fcfs", "error_probability": 0.2, "error_latency": "slow"}
    ]
    pol, _ = simulate(spec)
    late = [o for o in pol.outcomes if o.sent_at > 5]
    # 20 closed-loop clients over 2 queues with random routing: every split 0..20 is equally likely
    # (product form), so a DIP is idle now and then; mostly it is busy all the window
    assert statistics.median(o.extra["utilization"] for o in late) == pytest.approx(1.0, abs=0.01)
    assert statistics.mean(o.extra["utilization"] for o in late) > 0.85
    assert statistics.mean(o.extra["qps"] for o in late) == pytest.approx(8.0 * 0.93, rel=0.15)  # 80% of 10/s ok
    assert statistics.mean(o.extra["eps"] for o in late) == pytest.approx(2.0 * 0.93, rel=0.3)


def test_spikes_delay_one_path_and_show_in_rtt() -> None:
    spec = {
        "duration": 60.0,
        "service": {"kind": "fixed", "mean": 0.001},
        "dips": [{"name": "s", "count": 2, "workers": 8}],
        "network": {"rtt": 0.002, "spikes": [{"dips": ["s-1"], "extra": 0.08, "duration": 0.2, "per_minute": 12}]},
        "clients": {"kind": "open", "rate": 100.0},
    }
    pol, sim = simulate(spec)
    rtt0 = [o.extra["rtt"] for o in pol.outcomes if o.dip == 0]
    rtt1 = [o.extra["rtt"] for o in pol.outcomes if o.dip == 1]
    assert max(rtt1) == pytest.approx(0.002)  # the other path never spikes
    spiked = [r for r in rtt0 if r > 0.01]
    assert spiked and max(rtt0) == pytest.approx(0.162, abs=1e-6)  # 80 ms each way
    # about 12 spikes of 0.2 s per minute: ~4% of the time
    assert len(spiked) / len(rtt0) == pytest.approx(12 * 0.2 / 60, abs=0.03)
    path = [r for _, r in pol.rtts if r is not None]
    assert min(path) == pytest.approx(0.002) and max(path) == pytest.approx(0.162)
    starts = [s for s, _ in sim.network.spike_intervals(0)]
    assert len([s for s in starts if s < 60]) == pytest.approx(12, abs=8)


def test_probes_are_answered_without_service_and_carry_load() -> None:
    spec = overloaded(piggyback_inflight=False)
    pol, _ = simulate(spec, probe_interval=0.5)
    probes = [o for o in pol.outcomes if o.probe]
    assert len(probes) == pytest.approx(2 * 20 / 0.5, abs=4)
    assert all(o.status == "ok" and o.latency < 1e-9 for o in probes)  # no queueing, rtt 0
    assert all(o.server_inflight is not None for o in probes)  # load always on probe answers
    assert all("latency_estimate" in o.extra for o in probes)
    assert max(o.extra["latency_estimate"] for o in probes) > 0.3  # 20 clients, 2 x 10/s: ~1 s at the DIP


def test_a_policy_server_override_runs_without_aqm_and_chips() -> None:
    spec = overloaded(aqm=True, chips=True, piggyback_inflight=True)
    override = PolicySpec(name="collecting", server={"aqm": False, "chips": False})
    pol, sim = simulate(spec, policy=override)
    answers = [o for o in pol.outcomes if not o.probe]
    assert len(answers) > 100
    assert not any(o.status == "rejected" for o in answers)  # no AQM: the queues grow past capacity 3
    assert not any(o.chip for o in answers)
    assert max(o.server_inflight or 0 for o in answers) > 4  # piggyback_inflight not named: the scenario's
    assert sim.result.rejected == 0  # type: ignore[attr-defined]
    assert not any(d.aqm or d.chips for d in sim.dips)
    # the same scenario without the override keeps BLOC's server side
    pol, sim = simulate(spec)
    assert any(o.status == "rejected" for o in pol.outcomes) and any(o.chip for o in pol.outcomes)


def test_bloc_scenario_gives_only_its_lc_baseline_no_aqm_or_chips() -> None:
    scenario = load_scenario("bloc-40x10")
    lc = scenario.policy("least_connections_p2c").server_features(scenario.server)
    bloc = scenario.policy("bloc").server_features(scenario.server)
    assert (lc.aqm, lc.chips) == (False, False)
    assert (bloc.aqm, bloc.chips) == (True, True)
    # the override survives with_changes (the claims shorten the scenario this way)
    shorter = scenario.with_changes(duration=30.0, warmup=5.0)
    assert shorter.policy("least_connections_p2c").server_features(shorter.server).aqm is False


def test_dynamic_capacity_samples_the_requests_in_service_too() -> None:
    """BLOC IV.D: the 30 s average is of the active requests, those in service included."""
    engine = Engine()
    dip = SimDip(
        engine,
        0,
        "d",
        workers=4,
        discipline="fcfs",
        speed=1.0,
        capacity="dynamic",
        error_probability=0.0,
        error_latency="fast",
        rng=random.Random(1),
        aqm=True,
    )
    answers: list[str] = []
    for _ in range(8):  # at inflight 0..7: 4 go into service, 4 wait (queued 0,0,0,0,0,1,2,3)
        dip.arrive(Job(1000.0, lambda job, status, inflight, chip: answers.append(status), None))
    assert dip.inflight == 8 and dip.queued == 4 and not answers  # first window: all admitted
    engine.run(until=31.0)
    # mean of 0..7 = 3.5 -> 4; sampling only the waiting requests would give max(1, ceil(0.75)) = 1
    assert dip.current_capacity() == 4
    dip.arrive(Job(1000.0, lambda job, status, inflight, chip: answers.append(status), None))
    assert answers == ["rejected"]  # the queue (4 waiting) is compared with the capacity
