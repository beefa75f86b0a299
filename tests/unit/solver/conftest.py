"""Shared builders for the solver tests: small DIP pools with known answers."""

from __future__ import annotations

from knapsack_lb.curves import QueueingCurve
from knapsack_lb.solver import DipInput


def capacity_dip(name: str, capacity: float, traffic: float, service: float = 0.01, base: float = 0.001) -> DipInput:
    """A DIP whose ``capacity`` parallel servers each take ``service`` seconds per request (M/M/1-like).

    Unloaded it answers in ``base + service`` whatever its capacity (section 3.4's "roughly equal
    latency when not loaded"); the curve blows up as ``weight * traffic`` nears ``capacity``.
    """
    return DipInput(
        name,
        QueueingCurve(base, service * capacity / traffic, capacity / traffic),
        w_max=min(0.95 * capacity / traffic, 1.0),
    )
