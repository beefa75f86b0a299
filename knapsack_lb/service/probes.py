"""The probe worker as a component of ``klb run`` (:mod:`knapsack_lb.service.runner`): the
composition of the probe worker (``probes/``) with the configuration file."""

from __future__ import annotations

import asyncio

from knapsack_lb.config import KlbConfig, ProbeWorkerSettings
from knapsack_lb.store import LatencyStore
from probes.worker import ProbeWorker, ProbeWorkerOptions


def options_from_settings(settings: ProbeWorkerSettings, *, vips: tuple[str, ...] = ()) -> ProbeWorkerOptions:
    """:class:`ProbeWorkerOptions` from :class:`knapsack_lb.config.ProbeWorkerSettings`."""
    return ProbeWorkerOptions(
        worker_id=settings.resolved_worker_id(),
        vips=vips,
        max_buffered_rounds=settings.max_buffered_rounds,
        lease_ttl=settings.lease_ttl,
        max_concurrency=settings.max_concurrency,
    )


async def run_probe_worker(store: LatencyStore, config: KlbConfig, stop: asyncio.Event) -> None:
    """Run one probe worker with ``config.probes`` (a :class:`knapsack_lb.config.KlbConfig`) until ``stop``."""
    await ProbeWorker(store, options_from_settings(config.probes)).run(stop)
