"""Failures, restarts, capacity changes, error injection, timeouts, health-check failover."""

from __future__ import annotations

import numpy as np
import pytest

from knapsack_lb.sim.simulation import Simulation, run
from knapsack_lb.sim.spec import parse_scenario


def base(**changes: object) -> dict:
    sc = {
        "duration": 30.0,
        "service": {"kind": "exponential", "mean": 0.01},
        "dips": [{"name": "d", "count": 3, "workers": 4, "discipline": "fcfs"}],
        "clients": {"kind": "open", "rate": 300.0, "count": 50},
    }
    sc.update(changes)
    return sc


def error_times(result) -> np.ndarray:  # type: ignore[no-untyped-def]
    s = result.series
    return s["start"][s["status"] == 1]


def test_fail_fast_errors_until_restart() -> None:
    sc = parse_scenario(
        base(events=[{"at": 10, "kind": "fail", "dips": ["d-2"]}, {"at": 20, "kind": "restart", "dips": ["d-2"]}])
    )
    result = run(sc, "round_robin", seed=1)
    errs = error_times(result)
    assert errs.size == pytest.approx(300 * 10 / 3, rel=0.15)  # a third of 10 s of traffic
    assert errs.min() >= 10.0 - 0.02 and errs.max() < 20.0
    assert result.dip_utilization[1] < result.dip_utilization[0]


def test_hang_failure_ends_in_timeouts() -> None:
    sc = parse_scenario(base(lb={"timeout": 0.5}, events=[{"at": 10, "kind": "fail", "dips": [0], "mode": "hang"}]))
    result = run(sc, "round_robin", seed=1)
    assert result.timeouts == pytest.approx(300 * 20 / 3, rel=0.1)
    assert result.errors == 0


def test_retries_on_another_dip_hide_a_failed_dip() -> None:
    events = [{"at": 5, "kind": "fail", "dips": [0]}]
    without = run(parse_scenario(base(events=events)), "round_robin", seed=1)
    with_retry = run(parse_scenario(base(events=events, lb={"retries": {"max_attempts": 2}})), "round_robin", seed=1)
    assert without.error_rate > 0.25
    assert with_retry.error_rate == 0.0


def test_hang_without_timeout_is_rejected_with_the_field_named() -> None:
    from knapsack_lb.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="timeout"):
        parse_scenario(base(events=[{"at": 1, "kind": "fail", "dips": [0], "mode": "hang"}]))


def test_capacity_drop_raises_utilisation_and_latency() -> None:
    sc = parse_scenario(base(events=[{"at": 15, "kind": "capacity", "dips": [0], "speed": 0.5}], window=1.0))
    sim = Simulation(sc, "round_robin", seed=2)
    result = sim.run()
    util = np.array(result.series["utilization"])
    before, after = util[5:14, 0].mean(), util[17:29, 0].mean()
    assert after == pytest.approx(2 * before, rel=0.15)


def test_error_probability_slow_and_fast() -> None:
    for latency in ("fast", "slow"):
        sc = parse_scenario(
            base(
                dips=[
                    {"name": "d", "count": 2, "workers": 4, "discipline": "fcfs"},
                    {
                        "name": "bad",
                        "workers": 4,
                        "discipline": "fcfs",
                        "error_probability": 0.5,
                        "error_latency": latency,
                    },
                ]
            )
        )
        result = run(sc, "round_robin", seed=3)
        assert result.error_rate == pytest.approx(1 / 6, abs=0.02)


def test_traffic_event_scales_the_rate() -> None:
    sc = parse_scenario(base(events=[{"at": 15, "kind": "traffic", "factor": 2.0}]))
    result = run(sc, "round_robin", seed=4)
    starts = result.series["start"]
    first, second = ((starts >= 5) & (starts < 15)).sum(), ((starts >= 15) & (starts < 25)).sum()
    assert second / first == pytest.approx(2.0, rel=0.1)


def test_health_checks_fail_over_within_one_interval() -> None:
    sc = parse_scenario(base(events=[{"at": 10.2, "kind": "fail", "dips": [1]}]))
    spec = {"name": "round_robin", "health_check": {"interval": 1.0, "timeout": 0.5}}
    from knapsack_lb.sim.spec import PolicySpec

    result = run(sc, PolicySpec.model_validate(spec), seed=5)
    errs = error_times(result)
    assert errs.size > 0
    assert errs.max() - 10.2 <= 1.0  # the next check (t = 11) removes the DIP


def test_restart_brings_a_dip_back_after_health_checks() -> None:
    from knapsack_lb.sim.spec import PolicySpec

    sc = parse_scenario(
        base(events=[{"at": 5, "kind": "fail", "dips": [1]}, {"at": 15, "kind": "restart", "dips": [1]}], window=1.0)
    )
    spec = PolicySpec.model_validate({"name": "round_robin", "health_check": {"interval": 1.0, "timeout": 0.5}})
    result = run(sc, spec, seed=6)
    util = np.array(result.series["utilization"])
    assert util[8:14, 1].max() == 0.0
    assert util[18:28, 1].mean() > 0.5 * util[18:28, 0].mean()


def test_a_weights_event_moves_every_lb_to_the_new_plan() -> None:
    sc = parse_scenario({
        "duration": 40.0, "service": {"kind": "exponential", "mean": 0.01},
        "dips": [{"name": "a", "workers": 2}, {"name": "b", "workers": 2}],
        "clients": {"kind": "open", "rate": 100.0}, "lb": {"instances": 2},
        "events": [{"at": 20.0, "kind": "weights", "weights": [1.0, 0.0]}],
    })
    result = run(sc, "weighted_round_robin", seed=3)
    assert result.ok > 3000
    before, after = result.series["weights"][1], result.series["weights"][-1]  # LB 0's weights per window
    assert before == [1.0, 1.0] and after == [1.0, 0.0]
    with pytest.raises(Exception, match="needs 2 weights"):
        parse_scenario({**sc.model_dump(), "events": [{"at": 1.0, "kind": "weights", "weights": [1.0]}]})
