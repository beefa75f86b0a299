"""The emulator's service model: FCFS pools and processor sharing on a real asyncio loop."""

from __future__ import annotations

import asyncio
import random
import statistics

import pytest

from knapsack_lb.testbed.queueing import ServiceModel, ServiceTimes


async def _finish_times(model: ServiceModel, works: list[float]) -> list[float]:
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def one(work: float) -> float:
        await model.serve(work)
        return loop.time() - start

    return list(await asyncio.gather(*(one(w) for w in works)))


async def test_fcfs_single_worker_serves_one_after_another() -> None:
    model = ServiceModel("fcfs", workers=1)
    done = await _finish_times(model, [0.05, 0.05, 0.05])
    assert done[0] == pytest.approx(0.05, abs=0.02)
    assert done[1] == pytest.approx(0.10, abs=0.02)
    assert done[2] == pytest.approx(0.15, abs=0.02)
    assert model.busy_seconds == pytest.approx(0.15, abs=0.02)
    assert model.completed == 3


async def test_fcfs_two_workers_serve_in_parallel() -> None:
    model = ServiceModel("fcfs", workers=2)
    done = await _finish_times(model, [0.05, 0.05, 0.05])
    assert done[0] == pytest.approx(0.05, abs=0.02)
    assert done[1] == pytest.approx(0.05, abs=0.02)
    assert done[2] == pytest.approx(0.10, abs=0.02)


async def test_processor_sharing_splits_capacity() -> None:
    model = ServiceModel("ps", workers=1)
    done = await _finish_times(model, [0.05, 0.10])
    # Both share the server: the short job sees 2 x 0.05, the long one finishes at 0.15.
    assert done[0] == pytest.approx(0.10, abs=0.02)
    assert done[1] == pytest.approx(0.15, abs=0.02)


async def test_capacity_change_applies_to_jobs_in_service() -> None:
    model = ServiceModel("fcfs", workers=1)
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(model.serve(0.10))
    await asyncio.sleep(0)  # the job enters service
    entered = loop.time()
    await asyncio.sleep(0.05)  # about half done
    model.set_capacity(0.5)  # the rest now takes twice as long
    changed = loop.time()
    await task
    remaining = 0.10 - (changed - entered)
    assert loop.time() - changed == pytest.approx(2 * remaining, abs=0.02)


def test_bad_parameters_are_refused_with_the_value() -> None:
    with pytest.raises(ValueError, match="mode"):
        ServiceModel("lifo", workers=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="workers"):
        ServiceModel("ps", workers=0)
    with pytest.raises(ValueError, match="capacity"):
        ServiceModel("ps").set_capacity(0)
    with pytest.raises(ValueError, match="distribution"):
        ServiceTimes(0.01, "uniform")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mean"):
        ServiceTimes(-1.0)


@pytest.mark.parametrize("distribution", ["fixed", "exponential", "lognormal"])
def test_service_time_distributions_have_the_requested_mean(distribution: str) -> None:
    times = ServiceTimes(0.01, distribution, sigma=0.5)  # type: ignore[arg-type]
    rng = random.Random(7)
    draws = [times.draw(rng) for _ in range(20_000)]
    assert statistics.fmean(draws) == pytest.approx(0.01, rel=0.03)
    if distribution == "fixed":
        assert set(draws) == {0.01}
    else:
        assert statistics.pstdev(draws) > 0.002
    again = [times.draw(random.Random(7)) for _ in range(1)]
    assert again[0] == draws[0]  # seeded: same draws
