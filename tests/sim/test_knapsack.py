"""KnapsackLB in the simulator: the real controller is driven by simulated probe rounds."""

from __future__ import annotations

from typing import Any

import pytest

from knapsack_lb.controller.waiting import erlang_c
from knapsack_lb.model import Measurement
from knapsack_lb.sim.knapsack import KnapsackDriver
from knapsack_lb.sim.simulation import Simulation
from knapsack_lb.sim.spec import parse_scenario
from tests.unit.controller.loop import record_steps


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
    seen = record_steps(driver.controller)
    driver.start()
    sim.run()
    assert len(seen) == 12  # every 5 s for 60 s
    first = seen[0]
    assert set(first) == {"fast", "slow"}
    for m in first.values():
        # 10 probes, and the client requests the layer-7 LB timed over the same window
        assert m.sent - m.lb_timed == 10 and m.successes == m.sent and m.lb_timed > 10 and m.latency_mean is not None
        assert m.weight == pytest.approx(0.5)  # the equal start
    assert seen[0]["slow"].latency_mean > seen[0]["fast"].latency_mean  # type: ignore[operator]
    assert driver.plans, "the controller produced plans"
    last = driver.plans[-1]["weights"]
    assert sum(last.values()) == pytest.approx(1.0)
    for lb in sim.lbs:
        assert lb.weights == pytest.approx([last["fast"], last["slow"]])


def test_the_layer7_lb_times_the_client_requests_and_the_probes_fall_to_their_floor() -> None:
    sc = parse_scenario(scenario(knapsack={"probe_interval": 5.0, "probe_requests": 30}))
    sim = Simulation(sc, "knapsack", seed=3)
    driver = KnapsackDriver(sim, vip="klb-test")
    seen = record_steps(driver.controller)
    driver.start()
    sim.run()
    floor = driver.settings.probe_budget.floor
    later = [m for rounds in seen[1:] for m in rounds.values()]
    # the LB timed more requests a round than the VIP's whole probe budget: every later round's probes are the floor
    assert later and all(m.lb_timed > 30 and m.sent - m.lb_timed == floor for m in later)
    assert driver.klm.sent == 2 * 30 + 11 * 2 * floor
    # at equal weights the pooled rounds rank the DIPs as their clients see them
    assert seen[0]["slow"].latency_mean > seen[0]["fast"].latency_mean  # type: ignore[operator]


def test_a_layer4_lb_times_nothing() -> None:
    sc = parse_scenario(scenario(clients={"kind": "sessions", "load": 0.5, "requests_per_session": 5, "count": 200,
                                          "think_time": 0.1}, lb={"layer": 4}))
    sim = Simulation(sc, "knapsack", seed=3)
    driver = KnapsackDriver(sim, vip="klb-test")
    driver.start()
    sim.run()
    assert driver.timer is None and sim.on_attempt is None
    assert driver.klm.sent == 10 * 2 * 12


def test_the_loop_starts_from_the_configured_weights_as_the_lb_rounds_them() -> None:
    """The simulated LB carries the scenario's weights; the loop reads them before its first step,
    as the live one does, so the first rounds are taken, and stamped, at those weights."""
    dips = [{"name": "fast", "speed": 1.0, "weight": 3}, {"name": "slow", "speed": 0.5, "weight": 1}]
    sim = Simulation(parse_scenario(scenario(dips=dips, duration=10.0)), "knapsack", seed=1)
    driver = KnapsackDriver(sim, vip="klb-test")
    assert driver.sink.carried == pytest.approx({"fast": 0.75, "slow": 0.25}, abs=0.005)  # HAProxy integers
    assert all(lb.weights == pytest.approx([0.75, 0.25], abs=0.005) for lb in sim.lbs)
    first: dict[str, Measurement] = {}
    real = driver.klm.take

    def keep(now: float) -> dict[str, Measurement]:
        taken = real(now)
        if not first:
            first.update(taken)
        return taken

    driver.klm.take = keep  # type: ignore[method-assign]
    driver.start()
    sim.run()
    assert {n: m.weight for n, m in first.items()} == pytest.approx({"fast": 0.75, "slow": 0.25}, abs=0.005)
    assert driver.controller.in_force and driver.plans


def test_probes_of_a_failed_dip_count_as_errors() -> None:
    sc = parse_scenario(scenario(events=[{"at": 20.0, "kind": "fail", "dips": ["slow"]}]))
    sim = Simulation(sc, "knapsack", seed=2)
    driver = KnapsackDriver(sim, vip="klb-test")
    driver.start()
    rounds: list[Measurement] = []
    real = driver.klm.take

    def keep(now: float) -> dict[str, Measurement]:
        taken = real(now)
        rounds.extend(taken.values())
        return taken

    driver.klm.take = keep  # type: ignore[method-assign]
    sim.run()
    after = [m for m in rounds if m.dip == "slow" and m.time > 25.0]
    assert after and all(m.successes == 0 and m.errors == m.sent for m in after)
    assert driver.plans[-1]["weights"]["slow"] == 0.0  # the controller removed the failed DIP


def test_operator_paths_run_through_the_live_loop_in_the_simulator() -> None:
    """The shipped knapsack-operator scenario: a pin holds, a drain takes the DIP to 0 at once, three
    refused applies leave the simulated LB on the last confirmed split, the undrained DIP returns."""
    from knapsack_lb.sim.simulation import run
    from knapsack_lb.sim.spec import load_scenario

    result = run(load_scenario("knapsack-operator"), "knapsack", seed=1)
    plans, applies, actions = result.series["plans"], result.series["applies"], result.series["operator"]
    assert [a["kind"] for a in actions] == ["pin", "drain", "apply_fail", "undrain", "unpin"]
    pinned = [p for p in plans if 185 <= p["time"] < 350]
    assert pinned and all(abs(p["weights"]["dip-2"] - 0.15) < 0.005 for p in pinned)  # HAProxy integers
    drained = [p for p in plans if 220 <= p["time"] < 300]
    assert drained and all(p["weights"]["dip-3"] == 0.0 for p in drained)
    refused = [a for a in applies if not a["ok"]]
    assert len(refused) == 3 and all(260 <= a["time"] < 300 for a in refused)
    carried_before = [p for p in plans if p["time"] < refused[0]["time"]][-1]["weights"]
    assert not [p for p in plans if refused[0]["time"] <= p["time"] <= refused[-1]["time"]]  # nothing carried anew
    names = result.dip_names
    for t, weights in zip(result.series["window_times"], result.series["weights"], strict=True):
        if refused[0]["time"] < t <= refused[-1]["time"]:  # every MUX kept the last confirmed split
            assert dict(zip(names, weights, strict=True)) == pytest.approx(carried_before)
    assert next(p for p in plans if p["time"] >= 305)["weights"]["dip-3"] > 0  # back in service
    summary = result.summary()["controller"]
    assert len(summary["applies_refused"]) == 3 and summary["operator"][1]["next_weights"]["dip-3"] == 0.0


def test_a_rounds_probes_are_spread_to_a_timeout_before_the_interval_ends_never_bunched() -> None:
    """A 2.5 s window with a 1 s timeout: every probe goes out between 2.5 s and 4 s into its interval,
    one at a random time in each equal slot, no two at one instant."""
    sc = parse_scenario(scenario(duration=20.0, knapsack={"probe_interval": 5.0, "probe_requests": 20,
                                                          "probe_timeout": 1.0, "probe_window": 0.5}))
    sim = Simulation(sc, "knapsack", seed=1)
    driver = KnapsackDriver(sim, vip="klb-test")
    sent: list[float] = []
    send = driver.klm._send
    driver.klm._send = lambda item: (sent.append(sim.engine.now), send(item))[1]  # type: ignore[method-assign]
    driver.start()
    sim.run()
    offsets = sorted(t % 5.0 for t in sent)
    assert len(sent) > 4 * 2 * 3 and offsets[0] >= 2.5 and offsets[-1] <= 4.0
    assert len(set(sent)) == len(sent)
    first = [t for t in sent if t < 5.0]  # 20 to each DIP before the controller's budget says otherwise
    per_slot = [sum(2.5 + 1.5 * i / 20 <= t < 2.5 + 1.5 * (i + 1) / 20 for t in first) for i in range(20)]
    assert per_slot == [2] * 20


@pytest.mark.parametrize("discipline", ["ps", "fcfs"])
def test_light_requests_wait_as_often_as_erlangs_formula_says(discipline: str) -> None:
    """A DIP of four workers at 70 % load (M/M/4, or processor sharing over four cores): a light
    request of fixed work finds every worker busy with probability C(4, 2.8) = 0.43 (PASTA), and
    any time it takes above its own work is that wait; the waits' mean is S / (c - a) behind FCFS
    workers and w / (c - a) under processor sharing (the module docstring of
    ``knapsack_lb.controller.waiting``)."""
    sc = parse_scenario(scenario(duration=300.0, dips=[{"name": "d", "workers": 4, "discipline": discipline}],
                                 clients={"kind": "open", "load": 0.7},
                                 knapsack={"probe_interval": 5.0, "probe_requests": 5, "light_requests": 50}))
    sim = Simulation(sc, "knapsack", seed=2)
    driver = KnapsackDriver(sim, vip="klb-test")
    seen = record_steps(driver.controller)
    driver.start()
    sim.run()
    assert driver.config.probe.light_path == "/light"
    light = [x for rounds in seen for m in rounds.values() for x in m.light_latencies]
    assert len(light) == 60 * 50 and all(m.light_failures == 0 for r in seen for m in r.values())
    work = 0.01 * 0.01  # 1 % of the mean service, no network time in this scenario
    waits = [x - work for x in light if x > work * (1 + 1e-6)]
    assert min(light) == pytest.approx(work)
    offered = 0.7 * 4 + 5 / 5.0 * 0.01  # the clients' and the probes' erlangs
    assert len(waits) / len(light) == pytest.approx(erlang_c(4, offered), abs=0.04)
    unit = 0.01 if discipline == "fcfs" else work
    assert sum(waits) / len(waits) == pytest.approx(unit / (4 - offered), rel=0.15)


def _light_pool(events: list[dict[str, Any]]) -> tuple[Simulation, KnapsackDriver]:
    """Processor sharing over 16 and 4 cores at 70 % of their 2,000 requests/s, with light requests."""
    sc = parse_scenario(scenario(duration=200.0, dips=[{"name": "big", "workers": 16}, {"name": "small", "workers": 4}],
                                 clients={"kind": "open", "load": 0.7}, events=events,
                                 knapsack={"probe_interval": 5.0, "probe_requests": 10, "light_requests": 50}))
    sim = Simulation(sc, "knapsack", seed=4)
    return sim, KnapsackDriver(sim, vip="klb-test")


def _saturation_shares(sim: Simulation, driver: KnapsackDriver, dip: str) -> list[tuple[float, float | None]]:
    """The DIP's saturation share after every step, checking that no plan gives it more."""
    ctl = driver.controller
    shares: list[tuple[float, float | None]] = []
    step = ctl.step

    def recording(now: float, observations: dict[str, Measurement], **kwargs: Any) -> Any:
        plan = step(now, observations, **kwargs)
        bound = ctl.dips[dip].saturation_share
        shares.append((now, bound))
        if plan is not None and bound is not None and dip not in driver.config.pins:
            assert plan.weights[dip] <= bound + 1e-9
        return plan

    ctl.step = recording  # type: ignore[method-assign]
    driver.start()
    sim.run()
    return shares


def test_light_requests_read_where_a_dip_saturates() -> None:
    """The 4-core DIP held at 0.2 of the VIP runs 70 % busy (280 of its 400 requests/s): it saturates
    at 400 / 1,400 = 0.286 of the VIP, which its light requests read to within a fifth."""
    sim, driver = _light_pool([{"at": 1.0, "kind": "pin", "dips": ["small"], "weight": 0.2}])
    read = [b for t, b in _saturation_shares(sim, driver, "small") if t >= 60]
    assert all(b is not None for b in read)
    assert sorted(read)[len(read) // 2] == pytest.approx(400 / 1400, rel=0.2)  # type: ignore[type-var]


def test_no_plan_gives_a_dip_more_than_its_light_requests_allow() -> None:
    """Unpinned, the 4-core DIP starts overloaded (half of 1,400 requests/s on 400 of capacity): its light
    requests all wait and hold it at the share it carried; later, carrying little, too few wait to read a
    load and the cap is the trust region above its share."""
    sim, driver = _light_pool([])
    shares = _saturation_shares(sim, driver, "small")
    assert shares[0][1] is not None and shares[0][1] < 0.5  # overloaded at the equal split: held below it
    later = [b for t, b in shares if t >= 60]
    assert later and all(b is not None for b in later)
    assert driver.controller.dips["big"].saturation_share is not None


def test_the_probe_budget_counts_the_light_requests_work() -> None:
    """A light request is 1 % of a request's work: 50 a round cost each DIP half a probe, which the
    budget takes off the VIP's 2 x 10 probes a round."""
    sim, driver = _light_pool([])
    driver.start()
    sim.run()
    ctl = driver.controller
    assert ctl.light_costs["big"] == pytest.approx(0.01, rel=0.3)
    assert ctl.light_costs["small"] == pytest.approx(0.01, rel=0.3)
    light = ctl.probe_uncertainty(driver.config, 1400.0)
    assert [d.light for d in light] == [50 * ctl.light_costs["big"], 50 * ctl.light_costs["small"]]
    budget = ctl.probe_budget(driver.config)
    assert sum(budget.values()) + sum(d.light for d in light) <= 2 * 10
