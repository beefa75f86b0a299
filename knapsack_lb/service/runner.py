"""The service runner: probes, controller and admin API in one asyncio loop (``klb run``).

KnapsackLB (section 5) has three building blocks: the probe workers (KLM)
write latencies into the store, the controller reads them and pushes weights, and (here)
the admin API shows and overrides it all. ``klb run`` runs the three in one process for
small setups; ``klb probe``, ``klb controller`` and ``klb api`` run one each to scale out.

Lifecycle: open the store, seed the VIPs of the configuration file (``vip_source``), start
each component as a task, and wait. SIGTERM or SIGINT sets the stop event: uvicorn stops
accepting requests, the probe worker and the controller are asked to stop (they finish or
abandon their round and flush what they buffered), and then the store is closed - after
every component is done, so nothing a component already handed to the store is lost. A
component that crashes stops the others; the process then exits non-zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Coroutine, Generator, Sequence
from dataclasses import dataclass
from typing import Any

import uvicorn

from knapsack_lb.config import KlbConfig, RedisSettings, require_safe_listen
from knapsack_lb.store import LatencyStore

log = logging.getLogger(__name__)

StopEvent = asyncio.Event
ComponentMain = Callable[[LatencyStore, StopEvent], Coroutine[Any, Any, None]]


@dataclass(frozen=True)
class Component:
    """A long-running part of the service: ``main(store, stop)`` returns once ``stop`` is set."""

    name: str
    main: ComponentMain


def open_store(settings: RedisSettings) -> LatencyStore:
    """The Redis latency store described by ``settings`` (connects lazily, on first use)."""
    from knapsack_lb.store.redis import RedisLatencyStore

    store: LatencyStore = RedisLatencyStore.from_url(
        settings.url,
        namespace=settings.namespace,
        retention_count=settings.measurement_retention_count,
        retention_seconds=settings.measurement_retention_age,
        plan_history_limit=settings.plan_history,
    )
    return store


async def seed_vips(store: LatencyStore, config: KlbConfig) -> list[str]:
    """Write the file's VIPs into the store as ``vip_source`` says; returns the names written."""
    written = []
    for vip in config.vips:
        existing = await store.get_vip(vip.name)
        if existing is None or config.vip_source == "config":
            await store.put_vip(vip)
            written.append(vip.name)
        elif existing != vip:
            log.info("vip kept as stored (admin API changes win over the file)", extra={"vip": vip.name})
    return written


class QuietServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to the runner (one handler for the process)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def api_component(config: KlbConfig, token: str | None, port_holder: list[int] | None = None) -> Component:
    """The admin API served by uvicorn on ``config.api.host:port``."""
    require_safe_listen(config.api.host, token)

    async def main(store: LatencyStore, stop: StopEvent) -> None:
        from knapsack_lb.api import create_app

        app = create_app(store, config.api, token=token, load_balancers=config.load_balancers)
        server = QuietServer(
            uvicorn.Config(
                app, host=config.api.host, port=config.api.port, log_config=None, lifespan="off",
                access_log=False, server_header=False,
            )
        )
        serving = asyncio.create_task(server.serve(), name="uvicorn")
        while not server.started and not serving.done():
            await asyncio.sleep(0.02)
        if server.started:
            port = server.servers[0].sockets[0].getsockname()[1]
            if port_holder is not None:
                port_holder.append(port)
            log.info("admin API listening", extra={"host": config.api.host, "port": port})
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
        server.should_exit = True
        stopping.cancel()
        await serving

    return Component("api", main)


def probe_component(config: KlbConfig) -> Component:
    """The probe worker (``probes/``) with the file's worker settings."""
    from knapsack_lb.service.probes import run_probe_worker

    async def main(store: LatencyStore, stop: StopEvent) -> None:
        await run_probe_worker(store, config, stop)

    return Component("probes", main)


def controller_component(config: KlbConfig) -> Component:
    """The controller service (``knapsack_lb.service.controller``) with the file's settings."""
    from knapsack_lb.service.controller import run_controller

    async def main(store: LatencyStore, stop: StopEvent) -> None:
        await run_controller(store, config, stop)

    return Component("controller", main)


class ServiceRunner:
    """Runs components on one store until stopped; see the module docstring for the lifecycle."""

    def __init__(
        self,
        config: KlbConfig,
        components: Sequence[Component],
        store_factory: Callable[[], LatencyStore] | None = None,
        stop_grace: float = 10.0,
    ) -> None:
        self.config = config
        self.components = list(components)
        self.store_factory = store_factory or (lambda: open_store(config.redis))
        self.stop_grace = stop_grace
        self.stop = asyncio.Event()

    def request_stop(self, reason: str = "requested") -> None:
        if not self.stop.is_set():
            log.info("stopping", extra={"reason": reason})
            self.stop.set()

    async def run(self) -> int:
        """Run until a signal or a crash; 0 after a clean stop, 1 if a component failed."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.request_stop, signal.Signals(sig).name)
        store = self.store_factory()
        failed = False
        try:
            seeded = await seed_vips(store, self.config)
            log.info("service starting", extra={"components": [c.name for c in self.components], "seeded": seeded})
            tasks: dict[asyncio.Task[Any], str] = {
                asyncio.create_task(c.main(store, self.stop), name=c.name): c.name for c in self.components
            }
            stopper = asyncio.create_task(self.stop.wait(), name="stop")
            pending: set[asyncio.Task[Any]] = set(tasks)
            done, _ = await asyncio.wait(pending | {stopper}, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is stopper:
                    continue
                failed |= self._report(task, tasks[task], early=True)
            self.request_stop("component ended" if not self.stop.is_set() else "signal")
            pending = {t for t in tasks if not t.done()}
            if pending:
                done, still = await asyncio.wait(pending, timeout=self.stop_grace)
                for task in done:
                    failed |= self._report(task, tasks[task], early=False)
                for task in still:
                    log.warning("component did not stop in time; cancelled", extra={"component": tasks[task]})
                    task.cancel()
                if still:
                    await asyncio.gather(*still, return_exceptions=True)
            stopper.cancel()
        finally:
            await store.close()
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(sig)
        log.info("service stopped", extra={"clean": not failed})
        return 1 if failed else 0

    def _report(self, task: asyncio.Task[Any], name: str, early: bool) -> bool:
        """Log how a component ended; True when it failed."""
        if task.cancelled():
            return False
        exc = task.exception()
        if exc is not None:
            log.error("component failed", extra={"component": name}, exc_info=exc)
            return True
        if early and not self.stop.is_set():
            log.warning("component ended before a stop was requested", extra={"component": name})
        return False
