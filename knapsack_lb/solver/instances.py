"""Seeded solver instances shaped like the paper's pools (benchmarks, tests, notebooks).

``table3_pool`` follows KnapsackLB's Table 3: 1-, 2-, 4- and 8-vCPU DIPs in the mix
16:8:4:2, scaled to ``n`` DIPs (largest remainder), capacity proportional to vCPUs, the 8-vCPU
F-series 15-20% faster per core (section 6), each DIP's capacity varied by up to
``variation`` (noisy neighbours, section 2.1), and the VIP's traffic at a load drawn from
``load`` (70-80% of the pool's capacity, sections 6 and 6.6).

A DIP of capacity ``mu`` (requests/s) that gets weight ``w`` of the traffic ``lam`` sees the
M/M/1 processor-sharing latency ``base + 1 / (mu - w * lam)``, i.e. a ``QueueingCurve`` with
``a = base``, ``b = 1 / lam``, ``c = mu / lam`` (weight at saturation). ``w_max`` is the
weight at ``safe`` utilisation (the largest weight without drops, section 4.3). With
``kind="quadratic"`` each curve is instead the degree-2 least-squares fit of section 4.2
(coefficients kept non-negative, so the fit is monotone and convex) through points of that
queueing curve on ``[0, w_max]``.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import nnls

from knapsack_lb.curves import LatencyCurve, QuadraticCurve, QueueingCurve
from knapsack_lb.errors import InvalidInputError
from knapsack_lb.solver.inputs import DipInput

TABLE3_VCPUS = (1, 2, 4, 8)
TABLE3_MIX = (16, 8, 4, 2)
CORE_RATE = 100.0
"""Requests/s one DS-series vCPU serves (sets the time scale: 10 ms service time)."""

F_SERIES_SPEEDUP = (1.15, 1.20)
BASE_LATENCY = 0.0005
"""Seconds of network and parsing overhead at zero load."""


def table3_counts(n: int) -> list[int]:
    """How many DIPs of each Table 3 type (1, 2, 4, 8 vCPUs) make up ``n`` in the 16:8:4:2 mix."""
    if n < 1:
        raise InvalidInputError("dips", n, "must be >= 1")
    share = np.array(TABLE3_MIX, dtype=np.float64) * n / sum(TABLE3_MIX)
    counts = np.floor(share).astype(int)
    for i in np.argsort(-(share - counts), kind="stable")[: n - int(counts.sum())]:
        counts[i] += 1
    return [int(c) for c in counts]


def _quadratic_fit(curve: QueueingCurve, w_max: float) -> QuadraticCurve:
    ws = np.linspace(0.0, w_max, 8)
    ys = curve.latencies(ws)
    design = np.column_stack([np.ones_like(ws), ws, ws * ws])
    coef, _ = nnls(design, ys)
    return QuadraticCurve(float(coef[0]), float(coef[1]), float(coef[2]))


def pool_from_capacities(
    capacities: np.ndarray,
    load: float,
    *,
    kind: str = "queueing",
    safe: float = 0.95,
    prefix: str = "dip",
) -> list[DipInput]:
    """DIPs of the given capacities (requests/s) sharing traffic ``load * sum(capacities)``."""
    if kind not in ("queueing", "quadratic"):
        raise InvalidInputError("kind", kind, "must be 'queueing' or 'quadratic'")
    if not 0 < load < 1:
        raise InvalidInputError("load", load, "must be in (0, 1)")
    lam = load * float(np.sum(capacities))
    width = len(str(len(capacities)))
    dips = []
    for i, mu in enumerate(capacities):
        queue = QueueingCurve(BASE_LATENCY, 1.0 / lam, float(mu) / lam)
        w_max = min(safe * float(mu) / lam, 1.0)
        curve: LatencyCurve = queue if kind == "queueing" else _quadratic_fit(queue, w_max)
        dips.append(DipInput(name=f"{prefix}-{i:0{width}d}", curve=curve, w_max=w_max))
    return dips


def table3_pool(
    n: int,
    rng: np.random.Generator,
    *,
    load: tuple[float, float] = (0.70, 0.80),
    variation: float = 0.15,
    kind: str = "queueing",
) -> list[DipInput]:
    """A seeded heterogeneous pool of ``n`` DIPs like Table 3 at 70-80% load."""
    mus = table3_capacities(n, rng, variation=variation)
    return pool_from_capacities(mus, float(rng.uniform(*load)), kind=kind)


def table3_capacities(n: int, rng: np.random.Generator, *, variation: float = 0.15) -> np.ndarray:
    """Capacities (requests/s) of ``n`` DIPs in Table 3's 16:8:4:2 mix, varied and shuffled (seeded)."""
    counts = table3_counts(n)
    capacities = []
    for vcpus, count in zip(TABLE3_VCPUS, counts, strict=True):
        speed = rng.uniform(*F_SERIES_SPEEDUP, size=count) if vcpus == 8 else np.ones(count)
        noise = rng.uniform(1 - variation, 1 + variation, size=count)
        capacities.append(CORE_RATE * vcpus * speed * noise)
    mus = np.concatenate(capacities)
    order = rng.permutation(n)
    return mus[order]


def identical_pool(n: int, *, load: float = 0.80, vcpus: int = 8, kind: str = "queueing") -> list[DipInput]:
    """Section 6.6's simulation: ``n`` equal DIPs (F-series curve) with the traffic at 80% of capacity."""
    capacities = np.full(n, CORE_RATE * vcpus * float(np.mean(F_SERIES_SPEEDUP)))
    return pool_from_capacities(capacities, load, kind=kind)
