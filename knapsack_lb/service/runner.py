"""The service runner: probes, controller and admin API in one asyncio loop (``klb run``).

KnapsackLB (section 5) has three building blocks: the probe workers (KLM)
write latencies into the store, the controller reads them and pushes weights, and (here)
the admin API shows and overrides it all. ``klb run`` runs the three in one process for
small setups; ``klb probe``, ``klb controller`` and ``klb api`` run one each to scale out.

Lifecycle: open the store, start each component as a supervised task, seed the VIPs of the
configuration file (``vip_source``) as soon as the store answers, and wait. SIGTERM or SIGINT
sets the stop event: uvicorn stops accepting requests, the probe worker and the controller are
asked to stop (they finish or abandon their round and flush what they buffered), and then the
store is closed - after every component is done, so nothing a component already handed to the
store is lost.

Faults: nothing here needs the store to start. Seeding is retried with backoff until the store
answers. A component that fails (or ends before a stop was asked for) is logged and restarted
with exponential backoff (``RESTART_INITIAL`` doubling to ``RESTART_MAX``, reset after it ran
for ``RESTART_RESET``), while the others go on: a crash of one part never takes the probes'
buffered rounds or the API down with it. The exit code is 0 after a clean stop and 1 when a
component had to be cancelled because it did not stop within ``stop_grace``.
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

from knapsack_lb.clock import wait_unless_stopped
from knapsack_lb.config import KlbConfig, RedisSettings, require_safe_listen
from knapsack_lb.errors import KnapsackLBError, short_repr
from knapsack_lb.store import LatencyStore

log = logging.getLogger(__name__)

RESTART_INITIAL = 1.0  # seconds before a failed component is restarted the first time
RESTART_MAX = 30.0
RESTART_RESET = 60.0  # a component that ran this long before failing restarts after RESTART_INITIAL again

StopEvent = asyncio.Event
ComponentMain = Callable[[LatencyStore, StopEvent], Coroutine[Any, Any, None]]


@dataclass(frozen=True)
class Component:
    """A long-running part of the service: ``main(store, stop)`` returns once ``stop`` is set."""

    name: str
    main: ComponentMain


def open_store(settings: RedisSettings) -> LatencyStore:
    """The Redis latency store described by ``settings``, one Redis or a Redis Cluster (connects
    lazily, on first use)."""
    from knapsack_lb.store.redis import RedisLatencyStore

    store: LatencyStore = RedisLatencyStore.from_settings(settings)
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
        self.restarts: dict[str, int] = {}

    def request_stop(self, reason: str = "requested") -> None:
        if not self.stop.is_set():
            log.info("stopping", extra={"reason": reason})
            self.stop.set()

    async def run(self) -> int:
        """Run until SIGTERM/SIGINT; 0 after a clean stop, 1 if a component had to be cancelled."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.request_stop, signal.Signals(sig).name)
        store = self.store_factory()
        stuck = False
        try:
            log.info("service starting", extra={"components": [c.name for c in self.components]})
            tasks = {asyncio.create_task(self._supervise(c, store), name=c.name): c.name for c in self.components}
            seeding = asyncio.create_task(self._seed(store), name="seed")
            await self.stop.wait()
            seeding.cancel()
            _, still = await asyncio.wait(set(tasks), timeout=self.stop_grace)
            for task in still:
                log.warning("component did not stop in time; cancelled", extra={"component": tasks[task]})
                task.cancel()
            await asyncio.gather(seeding, *still, return_exceptions=True)
            stuck = bool(still)
        finally:
            await store.close()
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(sig)
        log.info("service stopped", extra={"clean": not stuck, "restarts": dict(self.restarts)})
        return 1 if stuck else 0

    async def _seed(self, store: LatencyStore) -> None:
        """Seed the file's VIPs once the store answers, retrying with backoff."""
        delay = RESTART_INITIAL
        while not self.stop.is_set():
            try:
                seeded = await seed_vips(store, self.config)
            except (KnapsackLBError, OSError, ConnectionError) as exc:
                log.warning("cannot seed the VIPs yet; retrying", extra={"error": short_repr(str(exc)), "in": delay})
                await wait_unless_stopped(self.stop, delay)
                delay = min(2 * delay, RESTART_MAX)
                continue
            log.info("VIPs seeded from the configuration file", extra={"seeded": seeded})
            return

    async def _supervise(self, component: Component, store: LatencyStore) -> None:
        """Run ``component`` until a stop is asked for, restarting it with backoff when it fails."""
        delay = RESTART_INITIAL
        loop = asyncio.get_running_loop()
        while not self.stop.is_set():
            started = loop.time()
            try:
                await component.main(store, self.stop)
            except Exception as exc:  # any failure of one component: restart it, keep the others
                log.error("component failed; restarting it", extra={"component": component.name, "in": delay},
                          exc_info=exc)
            else:
                if self.stop.is_set():
                    return
                log.warning("component ended before a stop was asked for; restarting it",
                            extra={"component": component.name, "in": delay})
            self.restarts[component.name] = self.restarts.get(component.name, 0) + 1
            if loop.time() - started >= RESTART_RESET:
                delay = RESTART_INITIAL
            await wait_unless_stopped(self.stop, delay)
            delay = min(2 * delay, RESTART_MAX)

