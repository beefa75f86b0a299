"""The behaviours the trusted balancers test in their own suites (Envoy's and gRPC's weighted
round robin: ratio convergence, load inversion, membership churn, the outlier-ejection cap), as
tests of the one control loop on the fluid model in virtual time."""

from __future__ import annotations

import random

from knapsack_lb.controller.core import VipController
from knapsack_lb.lab.fluid import FluidDip, FluidModel
from knapsack_lb.model import PlanFlag

from .loop import FAST, Loop, vip_config


def _loop(dips: list[FluidDip], load: float = 0.6, names: list[str] | None = None) -> Loop:
    model = FluidModel(dips, total_rate=load * sum(d.capacity for d in dips), seed=11)
    names = names or [d.name for d in dips]
    model.set_weights({n: 1.0 for n in names}, 0.0)
    loop = Loop(model, VipController("vip", names, FAST, rng=random.Random(2)))
    loop.tick(vip_config(names))
    return loop


def _settle(loop: Loop, ticks: int) -> dict[str, float]:
    for _ in range(ticks):
        loop.tick()
    plan = loop.ctl.plan
    assert plan is not None
    return dict(plan.weights)


def test_two_dips_of_very_different_capacity_converge_to_the_oracle_ratio() -> None:
    loop = _loop([FluidDip("small", 1, 100.0), FluidDip("large", 8, 100.0)])
    loop.until_built()
    weights = _settle(loop, 20)
    oracle = loop.model.oracle().weights
    assert weights["large"] / weights["small"] > 0.7 * oracle["large"] / oracle["small"]
    assert loop.model.quality(weights).mean_latency <= 1.1 * loop.model.oracle().quality.mean_latency
    assert max(loop.model.utilisation(weights).values()) < 1.0


def test_a_load_inversion_mid_run_is_followed() -> None:
    loop = _loop([FluidDip("a", 4, 100.0), FluidDip("b", 1, 100.0)], load=0.5)
    loop.until_built()
    before = _settle(loop, 10)
    assert before["a"] > before["b"]
    loop.model.set_capacity_factor("a", 0.25)  # a now has b's capacity and b gets a's
    loop.model.set_capacity_factor("b", 4.0)
    after = _settle(loop, 80)
    assert after["b"] > after["a"]
    assert max(loop.model.utilisation(after).values()) < 1.0


def test_membership_churn_add_fail_remove_re_add() -> None:
    dips = [FluidDip("a", 2, 100.0), FluidDip("b", 2, 100.0), FluidDip("c", 2, 100.0), FluidDip("d", 2, 100.0)]
    loop = _loop(dips, load=0.5, names=["a", "b", "c"])
    loop.until_built()
    _settle(loop, 5)
    loop.tick(vip_config(["a", "b", "c", "d"]))  # add
    loop.until_built()
    assert _settle(loop, 10)["d"] > 0
    loop.model.fail("b")  # fail
    plan = loop.tick()
    assert plan is not None and plan.weights["b"] == 0.0
    loop.tick(vip_config(["a", "c", "d"]))  # remove the failed DIP
    weights = _settle(loop, 10)
    assert "b" not in weights and max(loop.model.utilisation(weights).values()) < 1.0
    loop.model.restore("b")
    loop.tick(vip_config(["a", "b", "c", "d"]))  # re-add
    loop.until_built()
    weights = _settle(loop, 15)
    assert weights["b"] > 0 and abs(sum(weights.values()) - 1.0) < 1e-9
    assert max(loop.model.utilisation(weights).values()) < 1.0


def test_a_three_dip_pool_never_ejects_more_than_the_allowed_share() -> None:
    dips = [FluidDip("a", 2, 100.0), FluidDip("b", 2, 100.0), FluidDip("c", 2, 100.0, error_rate=0.6)]
    loop = _loop(dips, load=0.4)
    for _ in range(60):
        loop.tick()
        allowed = int(FAST.breaker.max_ejected_share * 3)  # 30 % of 3 DIPs: none may be ejected
        assert len(loop.ctl.breaker.ejections) <= allowed
        plan = loop.ctl.plan
        assert plan is None or PlanFlag.NO_LIVE_DIP not in plan.flags
