"""The event engine: time order, ties in scheduling order, no time travel."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from knapsack_lb.sim.engine import Engine


def test_events_run_in_time_order_and_ties_in_scheduling_order() -> None:
    engine = Engine()
    seen: list[tuple[float, str]] = []

    def record(t: float) -> Callable[[Any], None]:
        return lambda x: seen.append((t, x))

    for t, label in ((2.0, "c"), (1.0, "a"), (1.0, "b"), (3.0, "late")):
        engine.at(t, record(t), label)
    engine.run(2.5)
    assert seen == [(1.0, "a"), (1.0, "b"), (2.0, "c")]
    assert engine.now == 2.5 and engine.pending == 1


def test_cannot_schedule_in_the_past() -> None:
    engine = Engine()
    engine.run(5.0)
    with pytest.raises(ValueError, match="already at"):
        engine.at(4.0, lambda _: None)


def test_every_repeats_until_the_limit() -> None:
    engine = Engine()
    ticks: list[float] = []
    engine.every(0.5, ticks.append, until=2.0)
    engine.run(10.0)
    assert ticks == [0.5, 1.0, 1.5, 2.0]
    with pytest.raises(ValueError, match="interval"):
        engine.every(0.0, ticks.append)
