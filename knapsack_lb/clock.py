"""Time, injected: the only module that reads the wall clock.

``SystemClock`` is for real runs, ``FakeClock`` for tests (time moves only when told),
and the simulator drives a ``SimClock`` from its event loop. Everything else takes a
``Clock`` (or a plain ``now`` argument) so that runs are reproducible.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar, runtime_checkable

T = TypeVar("T")


@runtime_checkable
class Clock(Protocol):
    """Seconds as a float on a monotonic time line, and a way to wait on it."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """Real time: ``time.monotonic()`` for intervals; ``wall()`` for timestamps people read."""

    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class FakeClock:
    """Virtual time for tests: ``sleep`` returns at once after moving time forward."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"cannot move a clock backwards (advance by {seconds!r})")
        self._now += seconds

    async def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))
        await asyncio.sleep(0)


class SimClock:
    """A clock read from a discrete-event engine (``now_fn`` is e.g. ``lambda: env.now``).

    Processes in the simulator wait with the engine's own timeouts; ``sleep`` is not
    meaningful there and raises so that a misuse is loud.
    """

    def __init__(self, now_fn: Callable[[], float]) -> None:
        self._now_fn = now_fn

    def now(self) -> float:
        return float(self._now_fn())

    def wall(self) -> float:
        return self.now()

    async def sleep(self, seconds: float) -> None:
        raise RuntimeError("SimClock cannot sleep: schedule a simulator timeout instead")


async def wait_unless_stopped(stop: asyncio.Event, seconds: float) -> None:
    """Wait ``seconds`` of real time, or less when ``stop`` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)


async def unless_stopped(stop: asyncio.Event, work: Awaitable[T], grace: float = 0.0,
                         cancel_wait: float = 1.0) -> T | None:
    """``work``'s result, or None when ``stop`` is set and ``work`` has not finished ``grace``
    seconds later: it is then cancelled and given at most ``cancel_wait`` seconds to unwind, so a
    stop never waits on a call that hangs (a store client retrying a downed cluster for seconds).
    Errors of ``work`` propagate; cancelling the caller cancels ``work`` too."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done() and grace > 0:
            await asyncio.wait({task}, timeout=grace)
    finally:
        stopped.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=cancel_wait)
    if not task.done() or task.cancelled():
        # still unwinding past ``cancel_wait``: its outcome is not waited for, and not reported as lost
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return None
    return task.result()


async def within(seconds: float, work: Awaitable[None], *, log: logging.Logger, step: str, **extra: Any) -> bool:
    """One step of a stop: ``work`` given ``seconds``. Past them it is cancelled, ``log`` gets the
    warning every stop step cut short gives (naming ``step``, with ``extra``), and False says so."""
    try:
        await asyncio.wait_for(work, timeout=seconds)
    except TimeoutError:
        log.warning("stopping: the store did not answer in time; cut short",
                    extra={**extra, "step": step, "seconds": seconds})
        return False
    return True
