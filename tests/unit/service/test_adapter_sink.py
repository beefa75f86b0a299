"""The live loop's sink over an adapter: the optional counters and timings pass through, in a thread."""

from __future__ import annotations

import asyncio
import threading

from knapsack_lb.model import ApplyResult, TimedRequests, Traffic, WeightPlan
from knapsack_lb.service.controller import AdapterSink


class CountingAdapter:
    """An adapter that counts and times (a recording stand-in: the real ones are tested against their LBs)."""

    name = "counting"

    def __init__(self) -> None:
        self.threads: list[str] = []

    def apply(self, plan: WeightPlan) -> ApplyResult:
        return ApplyResult(ok=True, adapter=self.name)

    def read(self) -> dict[str, float]:
        return {}

    def traffic(self) -> Traffic:
        self.threads.append(threading.current_thread().name)
        return Traffic("requests", {"a": 10.0})

    def timings(self) -> dict[str, TimedRequests]:
        self.threads.append(threading.current_thread().name)
        return {"a": TimedRequests(3, 0.01, 0.002)}


class PlainAdapter:
    name = "plain"

    def apply(self, plan: WeightPlan) -> ApplyResult:
        return ApplyResult(ok=True, adapter=self.name)

    def read(self) -> dict[str, float]:
        return {"a": 1.0}


def test_counters_and_timings_come_from_the_adapter_off_the_event_loop() -> None:
    adapter = CountingAdapter()
    sink = AdapterSink(adapter)  # type: ignore[arg-type]

    async def run() -> None:
        assert await sink.traffic() == Traffic("requests", {"a": 10.0})
        assert await sink.timings() == {"a": TimedRequests(3, 0.01, 0.002)}
        assert await sink.read() is None  # an empty read: the LB could not be read

    asyncio.run(run())
    assert len(adapter.threads) == 2 and threading.main_thread().name not in adapter.threads


def test_an_adapter_without_them_counts_and_times_nothing() -> None:
    sink = AdapterSink(PlainAdapter())  # type: ignore[arg-type]

    async def run() -> None:
        assert await sink.traffic() is None and await sink.timings() is None
        assert await sink.read() == {"a": 1.0}

    asyncio.run(run())
