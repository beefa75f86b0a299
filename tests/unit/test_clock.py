"""``unless_stopped`` and ``within``: a stop never waits on work that hangs, and work that ends is never lost."""

from __future__ import annotations

import asyncio
import logging

import pytest

from knapsack_lb.clock import unless_stopped, within


async def test_work_that_ends_before_a_stop_gives_its_result() -> None:
    async def work() -> int:
        await asyncio.sleep(0.01)
        return 7

    assert await unless_stopped(asyncio.Event(), work()) == 7


async def test_a_stop_cancels_work_that_hangs_and_gives_none() -> None:
    stop = asyncio.Event()
    cancelled = asyncio.Event()

    async def hangs() -> int:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return 1

    asyncio.get_running_loop().call_later(0.05, stop.set)
    assert await asyncio.wait_for(unless_stopped(stop, hangs()), timeout=5) is None
    assert cancelled.is_set()


async def test_work_that_ends_within_the_grace_after_a_stop_gives_its_result() -> None:
    stop = asyncio.Event()
    stop.set()

    async def work() -> str:
        await asyncio.sleep(0.05)
        return "done"

    assert await unless_stopped(stop, work(), grace=2.0) == "done"
    assert await unless_stopped(stop, work(), grace=0.0) is None


async def test_an_error_of_the_work_reaches_the_caller() -> None:
    async def fails() -> None:
        raise ConnectionError("store down")

    with pytest.raises(ConnectionError, match="store down"):
        await unless_stopped(asyncio.Event(), fails())


async def test_work_that_will_not_unwind_is_left_after_cancel_wait() -> None:
    stop = asyncio.Event()
    stop.set()
    release = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await release.wait()  # cleanup that itself hangs on the store

    result = await asyncio.wait_for(unless_stopped(stop, stubborn(), cancel_wait=0.05), timeout=5)
    assert result is None
    release.set()
    await asyncio.sleep(0)


async def test_a_stop_step_that_ends_in_time_says_so_and_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("test.stop")
    assert await within(1.0, asyncio.sleep(0.01), log=log, step="handing the leases back") is True
    assert not caplog.records


async def test_a_stop_step_past_its_bound_is_cancelled_and_named_in_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("test.stop")
    hung = asyncio.ensure_future(asyncio.sleep(3600))
    with caplog.at_level(logging.WARNING, logger="test.stop"):
        assert await within(0.05, hung, log=log, step="writing the buffered rounds", rounds=3) is False
    assert hung.cancelled()
    (record,) = caplog.records
    assert "cut short" in record.getMessage()
    assert (record.step, record.seconds, record.rounds) == ("writing the buffered rounds", 0.05, 3)  # type: ignore[attr-defined]
