"""The 'capacity' measurement remainder (ours, section 4.6): estimates from what was measured."""

from __future__ import annotations

import pytest

from knapsack_lb.controller.core import VipController
from knapsack_lb.controller.measurement import DipMeasurement
from knapsack_lb.controller.settings import ControllerSettings, MeasurementSettings
from knapsack_lb.curves import QuadraticCurve


def test_capacity_estimates_use_w_max_then_the_equal_share_and_halve_after_an_early_drop() -> None:
    settings = ControllerSettings(measurement=MeasurementSettings(remainder="capacity"))
    ctl = VipController("v", ["a", "b", "c", "d"], settings)
    a = ctl.dips["a"]
    a.measuring, a.curve, a.w_max = None, QuadraticCurve(1.0, 0.0, 1.0).to_dict(), 0.6
    assert ctl._capacity_estimate("a", 0.25) == pytest.approx(0.6)
    assert ctl._capacity_estimate("b", 0.25) == pytest.approx(0.25)  # nothing known: the equal share
    c = ctl.dips["c"]
    c.measuring = DipMeasurement("c", 0.0, w_max=0.4)
    assert ctl._capacity_estimate("c", 0.25) == pytest.approx(0.4)  # served 0.4 without a drop
    d = ctl.dips["d"]
    d.measuring = DipMeasurement("d", 0.0, w_max=0.05, w_drop=0.2)
    assert ctl._capacity_estimate("d", 0.25) == pytest.approx(0.1)  # dropped below the equal share


def test_paper_settings_keep_the_solver_remainder() -> None:
    assert ControllerSettings.paper().measurement.remainder == "solver"
    assert ControllerSettings().measurement.remainder == "solver"
