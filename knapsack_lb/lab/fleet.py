"""A seeded fleet of VIPs shaped like the KnapsackLB paper's Table 8 (section 6.7).

Section 6.7 of the paper ("Overheads at Large Number of DIPs") sizes the controller for a
fleet of many mice VIPs and a few elephants: Table 8 lists 2,000 VIPs of 5 DIPs, 1,000 of
10, 200 of 50, 100 of 100, 20 of 500 and 10 of 1,000, i.e. **3,330 VIPs and 60,000 DIPs**;
computing every VIP's weights took 851 s on one 8-core VM. (The paper's other count, 3,410,
is of probe (KLM) cores: one per VIP below 225 DIPs plus ``ceil(n / 225)`` per larger VIP.)

``make_fleet`` builds such a fleet for benchmarks: every VIP is a Table-3-like pool
(:func:`knapsack_lb.solver.instances.table3_capacities`: 1/2/4/8-vCPU DIPs in the mix
16:8:4:2, capacities varied +-15%) at 70-80% load, each DIP with its true M/M/1 curve
(``QueueingCurve``) and the solver input a controller would have learned (``DipInput``;
by default the degree-2 fit of section 4.2, ``kind="quadratic"``). Two shapes:

* ``table8``: the table itself, optionally scaled (``scale=0.1``: 333 VIPs, 6,000 DIPs);
* ``lognormal``: ``vips`` VIP sizes drawn from a lognormal (heavy tail: the largest VIPs
  reach 1,000+ DIPs) and rounded by largest remainder so that they sum to exactly ``dips``.

Everything comes from one ``numpy.random.Generator`` made from ``seed``: same seed, same
fleet. The quadratic fits are the same non-negative least-squares fits as
:func:`knapsack_lb.solver.instances.pool_from_capacities` makes one DIP at a time, done for
a whole VIP in one matrix product (a DIP whose unconstrained fit has a negative coefficient
is refitted alone with ``nnls``). Building the 60,000 DIPs takes a few seconds, mostly
constructing ``DipInput`` objects; it is not part of any solver timing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from knapsack_lb.curves import LatencyCurve, QuadraticCurve, QueueingCurve
from knapsack_lb.errors import InvalidInputError
from knapsack_lb.solver.inputs import DipInput
from knapsack_lb.solver.instances import BASE_LATENCY, table3_capacities

TABLE8_VIP_SIZES = {5: 2000, 10: 1000, 50: 200, 100: 100, 500: 20, 1000: 10}
"""KnapsackLB paper, section 6.7, Table 8: DIPs per VIP -> number of VIPs (3,330 VIPs, 60,000 DIPs)."""

PAPER_FLEET_SOLVE_SECONDS = 851.0
"""KnapsackLB paper, section 6.7: time to run the ILP for every VIP of Table 8 on one 8-core VM."""

PAPER_CONTROLLER_VMS = 193
"""KnapsackLB paper, section 6.7: 8-core VMs needed to re-solve every VIP every 5 seconds."""

LOGNORMAL_SIGMA = 2.0
"""Spread of the ``lognormal`` shape's VIP sizes (log scale): with 3,410 VIPs averaging 17.6
DIPs, the largest reach about 1,000-3,500 DIPs (seeds 0-2) while the median VIP has 4-5."""

SHAPES = ("table8", "lognormal")
KINDS = ("quadratic", "queueing")
SAFE_UTILISATION = 0.95
"""``w_max`` is the weight at this utilisation (the largest weight without drops, section 4.3)."""

FIT_POINTS = 8
"""Points on ``[0, w_max]`` through which the quadratic of section 4.2 is fitted."""


@dataclass(frozen=True)
class FleetVip:
    """One VIP of a fleet: its traffic, its DIPs' capacities and true curves, and the solver's inputs.

    ``true_curves[i]`` is DIP ``i``'s M/M/1 latency ``base + 1 / (mu_i - w * traffic)`` as a
    function of its weight ``w``; ``dips[i]`` is what the solver gets for it (the curve of
    ``kind``, and ``w_max`` at 95% utilisation).
    """

    name: str
    traffic: float
    capacities: tuple[float, ...]
    true_curves: tuple[QueueingCurve, ...]
    dips: tuple[DipInput, ...]

    @property
    def load(self) -> float:
        """Traffic as a fraction of the pool's capacity."""
        return self.traffic / sum(self.capacities)


@dataclass(frozen=True)
class Fleet:
    """A seeded set of VIPs (``make_fleet``)."""

    shape: str
    seed: int
    kind: str
    vips: tuple[FleetVip, ...]

    @property
    def dip_count(self) -> int:
        return sum(len(v.dips) for v in self.vips)

    @property
    def largest_vip(self) -> int:
        return max((len(v.dips) for v in self.vips), default=0)

    def problems(self) -> list[Sequence[DipInput]]:
        """Every VIP's solver inputs, in fleet order (what ``solve_many`` takes)."""
        return [v.dips for v in self.vips]


def table8_sizes(scale: float = 1.0) -> list[int]:
    """VIP sizes of Table 8, ``scale`` times as many VIPs of each size (at least one of each), largest first."""
    if not 0 < scale <= 10:
        raise InvalidInputError("scale", scale, "must be in (0, 10]")
    sizes: list[int] = []
    for size, count in sorted(TABLE8_VIP_SIZES.items(), reverse=True):
        sizes += [size] * max(1, round(count * scale))
    return sizes


def lognormal_sizes(vips: int, dips: int, rng: np.random.Generator, *, smallest: int = 2,
                    sigma: float = LOGNORMAL_SIGMA) -> list[int]:
    """``vips`` heavy-tailed VIP sizes, each at least ``smallest``, summing to exactly ``dips`` (seeded).

    Draws lognormal sizes, scales the part above ``smallest`` to the DIPs left and rounds by
    largest remainder. Fails (InvalidInputError) when ``dips < vips * smallest``.
    """
    if vips < 1:
        raise InvalidInputError("vips", vips, "must be >= 1")
    spare = dips - vips * smallest
    if spare < 0:
        raise InvalidInputError("dips", dips, f"must be >= vips * {smallest} = {vips * smallest}")
    draw = rng.lognormal(mean=0.0, sigma=sigma, size=vips)
    share = draw * (spare / float(draw.sum()))
    extra = np.floor(share).astype(np.int64)
    short = spare - int(extra.sum())
    extra[np.argsort(-(share - extra), kind="stable")[:short]] += 1
    return sorted((smallest + extra).tolist(), reverse=True)


def make_fleet(
    seed: int = 0,
    *,
    shape: str = "table8",
    scale: float = 1.0,
    vips: int = 3410,
    dips: int = 60_000,
    kind: str = "quadratic",
    load: tuple[float, float] = (0.70, 0.80),
    progress: Callable[[int], None] | None = None,
) -> Fleet:
    """A seeded fleet (module docstring). ``scale`` applies to ``table8``; ``vips`` and ``dips`` to ``lognormal``.

    ``progress(n)`` is called after every VIP with the number of its DIPs (progress bars).
    """
    if shape not in SHAPES:
        raise InvalidInputError("shape", shape, f"must be one of {list(SHAPES)}")
    if kind not in KINDS:
        raise InvalidInputError("kind", kind, f"must be one of {list(KINDS)}")
    rng = np.random.default_rng(seed)
    sizes = table8_sizes(scale) if shape == "table8" else lognormal_sizes(vips, dips, rng)
    width = len(str(len(sizes)))
    out = []
    for i, n in enumerate(sizes):
        capacities = table3_capacities(n, rng)
        traffic = float(rng.uniform(*load)) * float(capacities.sum())
        curves, inputs = _vip_dips(capacities, traffic, kind)
        out.append(FleetVip(f"vip-{i:0{width}d}", traffic, tuple(capacities.tolist()), curves, inputs))
        if progress is not None:
            progress(n)
    return Fleet(shape, seed, kind, tuple(out))


def _vip_dips(capacities: np.ndarray, traffic: float,
              kind: str) -> tuple[tuple[QueueingCurve, ...], tuple[DipInput, ...]]:
    """The true M/M/1 curves of one VIP's DIPs and their solver inputs (curves of ``kind``)."""
    n = len(capacities)
    saturation = capacities / traffic
    w_max = np.minimum(SAFE_UTILISATION * saturation, 1.0)
    true = tuple(QueueingCurve(BASE_LATENCY, 1.0 / traffic, float(c)) for c in saturation.tolist())
    fitted: Sequence[LatencyCurve] = true if kind == "queueing" else _quadratic_fits(saturation, w_max, traffic)
    width = len(str(n))
    inputs = tuple(DipInput(name=f"dip-{i:0{width}d}", curve=curve, w_max=float(w))
                   for i, (curve, w) in enumerate(zip(fitted, w_max.tolist(), strict=True)))
    return true, inputs


def _quadratic_fits(saturation: np.ndarray, w_max: np.ndarray, traffic: float) -> list[QuadraticCurve]:
    """Degree-2 least-squares fits with non-negative coefficients through each true curve on ``[0, w_max]``.

    Fitted in the scaled variable ``t = w / w_max`` (one design matrix for every DIP), then
    mapped back (``b = beta / w_max``, ``c = gamma / w_max^2``). Where that unconstrained fit has
    a negative coefficient the DIP is refitted with ``nnls``, so the result is always monotone
    and convex on ``[0, w_max]``.
    """
    t = np.linspace(0.0, 1.0, FIT_POINTS)
    ws = w_max[:, None] * t[None, :]
    ys = BASE_LATENCY + (1.0 / traffic) / (saturation[:, None] - ws)
    design = np.column_stack([np.ones_like(t), t, t * t])
    coef_t = ys @ np.linalg.pinv(design).T
    coef = coef_t / np.column_stack([np.ones_like(w_max), w_max, w_max * w_max])
    for i in np.flatnonzero((coef < 0).any(axis=1)).tolist():
        row_design = np.column_stack([np.ones_like(t), ws[i], ws[i] * ws[i]])
        coef[i], _ = nnls(row_design, ys[i])
    return [QuadraticCurve(a, b, c) for a, b, c in coef.tolist()]
