"""Adapters for VIPs, built from the operator's load balancers (the composition of config and plugins).

A VIP selects one of the configuration file's ``load_balancers`` by name; the adapter is built
from that load balancer's settings merged with the VIP's own part (only the adapter's
``vip_fields``) by :func:`knapsack_lb.config.adapter_settings_for`. Nothing a VIP carries can
name a binary, a file, a socket, a URL or an environment variable.

:class:`AdapterPool` keeps one adapter per VIP while its settings stay the same and closes the
ones no VIP uses any more (an Envoy xDS server stops with its last adapter).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from adapters.base import Adapter, load_adapter_class
from knapsack_lb.config import LoadBalancerConfig, adapter_settings_for
from knapsack_lb.model import VipConfig

log = logging.getLogger(__name__)

AdapterFactory = Callable[[VipConfig], Adapter]


def adapter_factory(load_balancers: Mapping[str, LoadBalancerConfig]) -> AdapterFactory:
    """A factory building each VIP's adapter from ``load_balancers`` (raises :class:`InvalidInputError`
    naming the field when the VIP's selection or settings are not acceptable)."""

    def build(vip: VipConfig) -> Adapter:
        name, settings = adapter_settings_for(load_balancers, vip)
        return load_adapter_class(name).from_config(settings)

    return build


def close_adapter(adapter: Adapter) -> None:
    """Release what an adapter holds (connections, an xDS server), if it holds anything."""
    close = getattr(adapter, "close", None)
    if callable(close):
        with contextlib.suppress(Exception):
            close()


@dataclass
class AdapterPool:
    """One adapter per VIP, rebuilt when the VIP's adapter settings change, closed when unused."""

    factory: AdapterFactory
    adapters: dict[str, tuple[str, Adapter]] = field(default_factory=dict)

    def get(self, vip: VipConfig) -> Adapter:
        key = json.dumps([vip.adapter.model_dump(), [d.model_dump() for d in vip.dips]], sort_keys=True)
        known = self.adapters.get(vip.name)
        if known is not None and known[0] == key:
            return known[1]
        adapter = self.factory(vip)
        if known is not None:
            close_adapter(known[1])
        self.adapters[vip.name] = (key, adapter)
        return adapter

    def retain(self, vips: set[str]) -> None:
        """Close the adapters of VIPs not in ``vips`` (deleted, or leased by another controller)."""
        for name in [n for n in self.adapters if n not in vips]:
            close_adapter(self.adapters.pop(name)[1])

    def close(self) -> None:
        self.retain(set())
