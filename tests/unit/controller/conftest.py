"""Fixtures of the controller tests."""

from __future__ import annotations

import random

import pytest

from knapsack_lb.controller.core import VipController
from knapsack_lb.controller.settings import ControllerSettings
from knapsack_lb.lab.fluid import FluidModel

from .loop import ALGORITHM1, FAST, Loop, small_pool


def _small_pool_loop(settings: ControllerSettings) -> Loop:
    dips = small_pool()
    model = FluidModel(dips, total_rate=0.7 * sum(d.capacity for d in dips), seed=5)
    model.set_weights({d.name: 1.0 for d in dips}, 0.0)
    return Loop(model, VipController("vip", [d.name for d in dips], settings, rng=random.Random(1)))


@pytest.fixture
def loop() -> Loop:
    """The small pool at 70 % load under the default learner."""
    return _small_pool_loop(FAST)


@pytest.fixture
def algorithm1_loop() -> Loop:
    """The small pool at 70 % load under the paper's Algorithm 1."""
    return _small_pool_loop(ALGORITHM1)
