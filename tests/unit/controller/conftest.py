"""Fixtures of the controller tests."""

from __future__ import annotations

import random

import pytest

from knapsack_lb.controller.core import VipController
from knapsack_lb.lab.fluid import FluidModel

from .loop import FAST, Loop, small_pool


@pytest.fixture
def loop() -> Loop:
    dips = small_pool()
    model = FluidModel(dips, total_rate=0.7 * sum(d.capacity for d in dips), seed=5)
    model.set_weights({d.name: 1.0 for d in dips}, 0.0)
    return Loop(model, VipController("vip", [d.name for d in dips], FAST, rng=random.Random(1)))
