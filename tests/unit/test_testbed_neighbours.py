"""Noisy neighbours: validated, really running, bounded in time, and gone when the context exits."""

from __future__ import annotations

import time

import pytest

from knapsack_lb.lab.testbed.neighbours import NoisyNeighbours


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"count": -1, "seconds": 1.0}, "count must be an integer in 0-64, got -1"),
    ({"count": 65, "seconds": 1.0}, "got 65"),
    ({"count": 1, "seconds": 0.0}, "seconds must be in"),
    ({"count": 1, "seconds": 1.0, "burst": (0.01, 0.001)}, "burst must be"),
])
def test_bad_settings_are_refused_by_name_and_value(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        NoisyNeighbours(**kwargs)  # type: ignore[arg-type]


def test_neighbours_run_until_the_context_exits() -> None:
    with NoisyNeighbours(2, seconds=60.0) as neighbours:
        assert neighbours.alive() == 2
        procs = list(neighbours._procs)
    assert all(not p.is_alive() for p in procs) and neighbours.alive() == 0


def test_neighbours_stop_by_themselves_after_their_time() -> None:
    neighbours = NoisyNeighbours(1, seconds=0.5).start()
    try:
        deadline = time.monotonic() + 20
        while neighbours.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert neighbours.alive() == 0
    finally:
        neighbours.stop()


def test_zero_neighbours_is_a_quiet_machine() -> None:
    with NoisyNeighbours(0, seconds=1.0) as neighbours:
        assert neighbours.alive() == 0
