"""The emulator's service model: FCFS pools and processor sharing on a real asyncio loop."""

from __future__ import annotations

import asyncio
import random
import statistics

import pytest

from knapsack_lb.lab.testbed.queueing import PUNCTUAL_SPIN_LIMIT, ServiceModel, ServiceTimes


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


async def test_busy_wait_timers_never_let_a_job_leave_before_its_work_is_done() -> None:
    """Punctual departures (module docstring, "Timer precision"): the loop is asked to wake the
    model early and it busy-waits the rest; a departure must still never come early."""
    model = ServiceModel("fcfs", workers=1, spin_limit=PUNCTUAL_SPIN_LIMIT)
    loop = asyncio.get_running_loop()
    early = []
    for _ in range(30):
        start = loop.time()
        await model.serve(0.002)
        early.append(0.002 - (loop.time() - start))
    assert max(early) <= 1e-9
    assert model.spins + model.late_wakeups == 30  # every departure either spun or came late
    assert 0.0 <= model.lead <= 0.0005
    assert model.spin_seconds <= 30 * 0.0005


async def test_without_busy_wait_there_is_no_spinning() -> None:
    plain = ServiceModel("fcfs", workers=1)  # the default: plain timers
    await plain.serve(0.002)
    assert (plain.spins, plain.late_wakeups, plain.lead) == (0, 0, 0.0)
    with pytest.raises(ValueError, match="spin limit"):
        ServiceModel("fcfs", spin_limit=-1.0)


async def test_a_job_that_arrived_earlier_is_served_from_its_arrival() -> None:
    """``submit(age=...)``: the emulator enters a request at its arrival at the socket."""
    model = ServiceModel("fcfs", workers=1)
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    start = loop.time()
    model.submit(0.05, lambda: done.set_result(loop.time()), age=0.03)
    assert await done - start == pytest.approx(0.02, abs=0.015)


async def test_a_backdated_job_never_enters_before_the_last_event() -> None:
    """The model's past is not rewritten: a job cannot claim service it could not have had."""
    model = ServiceModel("fcfs", workers=1)
    loop = asyncio.get_running_loop()
    await model.serve(0.03)  # a departure: the model's last event is now
    done = loop.create_future()
    start = loop.time()
    model.submit(0.05, lambda: done.set_result(loop.time()), age=1.0)
    assert await done - start == pytest.approx(0.05, abs=0.02)


async def test_processor_sharing_counts_a_backdated_job_for_the_others_too() -> None:
    model = ServiceModel("ps", workers=1)
    loop = asyncio.get_running_loop()
    first = loop.create_future()
    second = loop.create_future()
    start = loop.time()
    model.submit(0.06, lambda: first.set_result(loop.time()), age=0.02)
    model.submit(0.06, lambda: second.set_result(loop.time()), age=0.02)
    # The first was alone from 0.02 s ago (0.02 of its work done by now); the second enters now,
    # at the first one's entry event, not before it. Sharing, the first's last 0.04 take 0.08 s;
    # the second then has 0.02 left, alone: it leaves at 0.10.
    assert await first - start == pytest.approx(0.08, abs=0.01)
    assert await second - start == pytest.approx(0.10, abs=0.01)
