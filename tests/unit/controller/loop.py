"""The controller tests' environment: the one control loop on the fluid model in virtual time."""

from __future__ import annotations

import random
from typing import Any

from knapsack_lb.controller.core import VipController
from knapsack_lb.controller.settings import ControllerSettings, SolverSettings
from knapsack_lb.lab.fluid import FluidDip, FluidLab, FluidModel
from knapsack_lb.lab.fluid import vip_config as lab_vip_config
from knapsack_lb.loop import ControlLoop
from knapsack_lb.model import Measurement, PlanFlag, VipConfig, WeightPlan

FAST = ControllerSettings(solver=SolverSettings(units=20_000))
ALGORITHM1 = FAST.tuned(learning={"method": "algorithm1"})  # the paper's measurement phase (section 4.3)


class Loop:
    """A :class:`ControlLoop` over a :class:`FluidLab`; ``tick`` optionally changes the operator's
    configuration first (it stays until changed again) and asks for re-measurements."""

    def __init__(self, model: FluidModel, ctl: VipController) -> None:
        self.ctl = ctl
        self.plans: list[WeightPlan] = []
        self.lab = FluidLab(model, lab_vip_config(model.vip, model.names, objective=ctl.settings.solver.objective))
        self.control: ControlLoop = self.lab.loop(ctl)

    @property
    def model(self) -> FluidModel:
        return self.lab.model

    @model.setter
    def model(self, model: FluidModel) -> None:
        self.lab.model = model

    @property
    def now(self) -> float:
        return self.lab.now

    @now.setter
    def now(self, value: float) -> None:
        self.lab.now = value

    def tick(self, config: VipConfig | None = None, remeasure: tuple[str, ...] = ()) -> WeightPlan | None:
        if config is not None:
            self.lab.config = config
        self.lab.remeasure |= set(remeasure)
        plan = self.lab.tick(self.control, self.ctl.settings.loop.interval).plan
        if plan is not None:
            self.plans.append(plan)
        return plan

    def until_flagged(self, flag: PlanFlag, limit: int) -> WeightPlan | None:
        """Tick until a plan carries ``flag`` (that plan), at most ``limit`` times (None)."""
        for _ in range(limit):
            plan = self.tick()
            if plan is not None and flag in plan.flags:
                return plan
        return None

    def until_built(self, limit: int = 60) -> None:
        for _ in range(limit):
            self.tick()
            plan = self.ctl.plan
            if not self.ctl.measuring and plan is not None and "measuring" not in plan.flags:
                return
        raise AssertionError("curves not built")


def small_pool() -> list[FluidDip]:
    return [FluidDip("a", 1, 100.0), FluidDip("b", 1, 70.0), FluidDip("c", 2, 100.0), FluidDip("d", 4, 110.0)]


def small_pool_loop(settings: ControllerSettings, load: float = 0.7, seed: int = 5, **model: Any) -> Loop:
    """The small pool at ``load`` of its capacity from the equal split, under ``settings``."""
    dips = small_pool()
    fluid = FluidModel(dips, total_rate=load * sum(d.capacity for d in dips), seed=seed, **model)
    fluid.set_weights({d.name: 1.0 for d in dips}, 0.0)
    return Loop(fluid, VipController("vip", [d.name for d in dips], settings, rng=random.Random(1)))


def vip_config(names: list[str], **overrides: object) -> VipConfig:
    return lab_vip_config("vip", names, **overrides)


def record_steps(ctl: VipController) -> list[dict[str, Measurement]]:
    """Every round set ``ctl.step`` is given from now on, in order (the controller steps as before)."""
    seen: list[dict[str, Measurement]] = []
    real_step = ctl.step

    def step(now: float, observations: dict[str, Measurement], **kw: Any) -> WeightPlan | None:
        seen.append(dict(observations))
        return real_step(now, observations, **kw)

    ctl.step = step  # type: ignore[method-assign, assignment]
    return seen
