"""The oracle: the exact solver fed each DIP's true latency curve.

Benchmarks and the simulator's claims measure the controller against what it would send if it
knew every DIP's curve. Each DIP's ``latency(rate)`` (seconds at an arrival rate in requests/s) is
sampled at ``points`` weights from 0 to ``max_utilisation`` of its capacity (denser towards the
top, where queueing curves bend) and handed to the exact solver (section 4.4's problem on a grid of
``units``) with that weight as ``w_max``: no plan runs a DIP nearer its limit.

Queueing relations for true curves: :func:`erlang_c` (the probability that an arrival waits in an
M/M/c queue) and :func:`mmc_latency` (its mean sojourn time).

How it fails: a rate at or beyond ``max_utilisation`` of the pool's capacity has no plan within
the caps (the solver raises :class:`~knapsack_lb.errors.InfeasibleError`); a curve that is not
increasing is solved as given (the exact method then falls back as :func:`solve` documents).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from knapsack_lb.curves.piecewise import PiecewiseLinearCurve
from knapsack_lb.solver.api import solve
from knapsack_lb.solver.inputs import DipInput

Latency = Callable[[float], float]  # seconds at an arrival rate (requests/s)


def erlang_c(servers: int, offered: float) -> float:
    """Probability that an arrival waits in M/M/c with ``offered`` = lambda/mu erlangs (< servers)."""
    if offered <= 0:
        return 0.0
    if offered >= servers:
        return 1.0
    # Erlang B by the stable recursion, then C from B.
    b = 1.0
    for k in range(1, servers + 1):
        b = offered * b / (k + offered * b)
    rho = offered / servers
    return b / (1 - rho + rho * b)


def mmc_latency(servers: int, service_rate: float, rate: float) -> float:
    """Mean sojourn time (s) of an M/M/c queue: ``servers`` at ``service_rate`` requests/s each, Poisson
    ``rate``; ``inf`` at or beyond capacity."""
    capacity = servers * service_rate
    if rate >= capacity:
        return math.inf
    return 1 / service_rate + erlang_c(servers, rate / service_rate) / (capacity - rate)


def oracle_split(latency: Mapping[str, Latency], capacity: Mapping[str, float], rate: float, *,
                 max_utilisation: float = 0.97, points: int = 48, units: int = 100_000) -> dict[str, float]:
    """The split of ``rate`` over the DIPs of ``latency`` (each one's true curve; ``capacity`` in
    requests/s) that minimises the mean latency, on the exact solver."""
    inputs = []
    for name, curve in latency.items():
        cap = max_utilisation * capacity[name] / rate
        ws = [cap * (i / (points - 1)) ** 0.7 for i in range(points)]
        inputs.append(DipInput(name, PiecewiseLinearCurve(tuple(ws), tuple(curve(w * rate) for w in ws)), w_max=cap))
    weights = solve(inputs, objective="mean", method="exact", units=units).weights
    return {name: float(weights.get(name, 0.0)) for name in latency}
