"""The claims registry: each document's headline numbers beside what the simulator gives.

A claims module (one per document in ``knapsack_lb.sim.claims``: ``knapsack``, ``l7``, ``bloc``,
``dl3``, ``els``) defines ``EXPERIMENTS: list[Experiment]``. An experiment runs
one scenario (at reduced size) with a few policies and returns one ``ClaimRow`` per claim:
document, claim, metric, the document's value, the simulated value, whether the direction and rough
size hold, and the command that reproduces it at full size. ``run_claims`` imports every module
listed in ``CLAIM_MODULES`` (a module that does not exist yet is reported as one row that does not
hold) and runs all experiments; ``klb sim reproduce --json`` prints the rows.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from knapsack_lb.sim.metrics import SimResult
from knapsack_lb.sim.simulation import run
from knapsack_lb.sim.spec import PolicySpec, Scenario

CLAIM_MODULES: tuple[str, ...] = (
    "knapsack_lb.sim.claims.knapsack",
    "knapsack_lb.sim.claims.l7",
    "knapsack_lb.sim.claims.bloc",
    "knapsack_lb.sim.claims.dl3",
    "knapsack_lb.sim.claims.els",
)


@dataclass(frozen=True)
class ClaimRow:
    document: str
    claim: str
    metric: str
    document_value: str
    simulated_value: str
    holds: bool
    command: str = ""
    note: str = ""
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Experiment:
    document: str  # short key: knapsack, l7, bloc, dl3, els
    name: str
    run: Callable[[int], list[ClaimRow]]  # seed -> rows
    tags: tuple[str, ...] = field(default=())


def reduction(percent_lower: float) -> str:
    return f"{percent_lower:.0f}% lower"


def percent_lower(better: float, worse: float) -> float:
    """How much lower ``better`` is than ``worse``, in percent of ``worse``."""
    return 100.0 * (worse - better) / worse if worse > 0 else 0.0


def run_many(scenario: Scenario, policies: Sequence[PolicySpec | str], seed: int) -> dict[str, SimResult]:
    """Run several policies on one scenario and seed; keyed by display name."""
    out: dict[str, SimResult] = {}
    for p in policies:
        spec = p if isinstance(p, PolicySpec) else scenario.policy(p)
        out[spec.display] = run(scenario, spec, seed)
    return out


def experiments(only: str | None = None) -> list[Experiment | ClaimRow]:
    """Every registered experiment (or a row saying a claims module is missing)."""
    found: list[Experiment | ClaimRow] = []
    for module_name in CLAIM_MODULES:
        short = module_name.rsplit(".", 1)[-1]
        if only is not None and only != short:
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            found.append(
                ClaimRow(
                    short, "claims module not written yet", "-", "-", "-", False, note=f"{module_name} does not exist"
                )
            )
            continue
        found.extend(getattr(module, "EXPERIMENTS", []))
    return found


def run_claims(
    only: str | None = None, seed: int = 1, progress: Callable[[int, int, str], None] | None = None
) -> list[ClaimRow]:
    items = experiments(only)
    rows: list[ClaimRow] = []
    for i, item in enumerate(items):
        if isinstance(item, ClaimRow):
            rows.append(item)
            continue
        if progress is not None:
            progress(i, len(items), f"{item.document}: {item.name}")
        start = time.perf_counter()
        produced = item.run(seed)
        seconds = time.perf_counter() - start
        rows.extend(ClaimRow(**{**r.to_dict(), "seconds": round(seconds / max(1, len(produced)), 2)}) for r in produced)
    if progress is not None:
        progress(len(items), len(items), "done")
    return rows
