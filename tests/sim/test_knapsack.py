"""KnapsackLB in the simulator: the real controller is driven by simulated probe rounds."""

from __future__ import annotations

from typing import Any

import pytest

from knapsack_lb.model import Measurement
from knapsack_lb.sim.knapsack import KnapsackDriver
from knapsack_lb.sim.simulation import Simulation
from knapsack_lb.sim.spec import parse_scenario


def scenario(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "klb-test",
        "duration": 60.0,
        "service": {"kind": "exponential", "mean": 0.01},
        "dips": [{"name": "fast", "speed": 1.0}, {"name": "slow", "speed": 0.5}],
        "clients": {"kind": "open", "load": 0.5},
        "knapsack": {"probe_interval": 5.0, "probe_requests": 10},
    }
    base.update(changes)
    return base


def test_probe_rounds_become_measurements_and_plans_reach_every_lb() -> None:
    sc = parse_scenario(scenario(lb={"instances": 3}))
    sim = Simulation(sc, "knapsack", seed=1)
    driver = KnapsackDriver(sim, vip="klb-test")
    seen: list[dict[str, Measurement]] = []
    real_step = driver.controller.step

    def spy(now: float, observations: dict[str, Measurement], **kw: Any) -> Any:
        seen.append(dict(observations))
        return real_step(now, observations, **kw)

    driver.controller.step = spy  # type: ignore[method-assign, assignment]
    driver.start()
    sim.run()
    assert len(seen) == 12  # every 5 s for 60 s
    first = seen[0]
    assert set(first) == {"fast", "slow"}
    for m in first.values():
        assert m.sent == 10 and m.successes == 10 and m.latency_mean is not None
        assert m.weight == pytest.approx(0.5)  # the equal start
    assert seen[0]["slow"].latency_mean > seen[0]["fast"].latency_mean  # type: ignore[operator]
    assert driver.plans, "the controller produced plans"
    last = driver.plans[-1]["weights"]
    assert sum(last.values()) == pytest.approx(1.0)
    for lb in sim.lbs:
        assert lb.weights == pytest.approx([last["fast"], last["slow"]])


def test_probes_of_a_failed_dip_count_as_errors() -> None:
    sc = parse_scenario(scenario(events=[{"at": 20.0, "kind": "fail", "dips": ["slow"]}]))
    sim = Simulation(sc, "knapsack", seed=2)
    driver = KnapsackDriver(sim, vip="klb-test")
    driver.start()
    rounds: list[Measurement] = []
    real = driver._measurement

    def keep(dip: int, now: float) -> Measurement:
        m = real(dip, now)
        rounds.append(m)
        return m

    driver._measurement = keep  # type: ignore[method-assign]
    sim.run()
    after = [m for m in rounds if m.dip == "slow" and m.time > 25.0]
    assert after and all(m.successes == 0 and m.errors == m.sent for m in after)
    assert driver.plans[-1]["weights"]["slow"] == 0.0  # the controller removed the failed DIP
