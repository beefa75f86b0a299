"""Driving a VipController against the fluid model in virtual time (shared by the tests here)."""

from __future__ import annotations

from dataclasses import dataclass, field

from knapsack_lb.controller.core import VipController
from knapsack_lb.controller.settings import ControllerSettings
from knapsack_lb.lab.fluid import FluidDip, FluidModel
from knapsack_lb.model import DipConfig, VipConfig, WeightPlan

FAST = ControllerSettings(solver_units=20_000)


@dataclass
class Loop:
    """One controller, one fluid model, one probe round per interval (like the service, in virtual time)."""

    model: FluidModel
    ctl: VipController
    now: float = 0.0
    plans: list[WeightPlan] = field(default_factory=list)

    def tick(self, config: VipConfig | None = None, remeasure: tuple[str, ...] = ()) -> WeightPlan | None:
        self.now += self.ctl.settings.interval
        plan = self.ctl.step(self.now, self.model.measure(self.now), config=config, remeasure=remeasure)
        if plan is not None:
            self.plans.append(plan)
            self.model.set_weights(plan.weights, self.now)
        return plan

    def until_built(self, limit: int = 60) -> None:
        for _ in range(limit):
            self.tick()
            plan = self.ctl.plan
            if not self.ctl.measuring and plan is not None and "measuring" not in plan.flags:
                return
        raise AssertionError("curves not built")


def small_pool() -> list[FluidDip]:
    return [FluidDip("a", 1, 100.0), FluidDip("b", 1, 70.0), FluidDip("c", 2, 100.0), FluidDip("d", 4, 110.0)]


def vip_config(names: list[str], **overrides: object) -> VipConfig:
    dips = tuple(DipConfig(name=n, address=f"127.0.0.1:{8000 + i}") for i, n in enumerate(names))
    return VipConfig(name="vip", dips=dips, **overrides)


