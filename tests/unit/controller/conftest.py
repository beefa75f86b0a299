"""Fixtures of the controller tests."""

from __future__ import annotations

import pytest

from .loop import ALGORITHM1, FAST, Loop, small_pool_loop


@pytest.fixture
def loop() -> Loop:
    """The small pool at 70 % load under the default learner."""
    return small_pool_loop(FAST)


@pytest.fixture
def algorithm1_loop() -> Loop:
    """The small pool at 70 % load under the paper's Algorithm 1."""
    return small_pool_loop(ALGORITHM1)
