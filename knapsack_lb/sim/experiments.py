"""Ready-made experiments for notebooks and docs: compare policies, run the dynamics scenario.

Notebooks call these and plot; ``small=True`` (KLB_NOTEBOOK_SMALL) shrinks durations so that the
test suite can execute them.
"""

from __future__ import annotations

from collections.abc import Sequence

from knapsack_lb.sim.metrics import SimResult
from knapsack_lb.sim.simulation import run
from knapsack_lb.sim.spec import Scenario, load_scenario


def compare(
    scenario: str | Scenario,
    *,
    policies: Sequence[str] | None = None,
    duration: float | None = None,
    seed: int = 1,
    skip: Sequence[str] = (),
) -> list[SimResult]:
    """Run the scenario's policies (or ``policies``) on one seed; ``skip`` leaves some out."""
    sc = load_scenario(scenario) if isinstance(scenario, str) else scenario
    if duration is not None:
        sc = sc.with_changes(duration=duration, warmup=min(sc.warmup, duration / 4))
    specs = [sc.policy(p) for p in policies] if policies is not None else list(sc.policies)
    return [run(sc, p, seed) for p in specs if p.display not in skip and p.name not in skip]


def dynamics_scenario(small: bool = False) -> Scenario:
    """``knapsack-dynamics`` (30 DIPs), or for ``small`` the 3-DIP pool with the same kinds of events."""
    if not small:
        return load_scenario("knapsack-dynamics")
    return load_scenario("knapsack-3dip").with_changes(
        name="knapsack-3dip-dynamics",
        duration=320.0,
        warmup=150.0,
        window=5.0,
        events=[
            {"at": 170, "kind": "fail", "dips": ["dip-0.8"]},
            {"at": 210, "kind": "restart", "dips": ["dip-0.8"]},
            {"at": 240, "kind": "capacity", "dips": ["dip-1.0"], "speed": 0.7},
            {"at": 280, "kind": "traffic", "factor": 1.1},
        ],
    )


def dynamics_runs(small: bool = False, seed: int = 1) -> dict[str, SimResult]:
    """KnapsackLB, round robin and least connections through the dynamics scenario."""
    sc = dynamics_scenario(small)
    return {p: run(sc, p, seed) for p in ("knapsack", "round_robin", "least_connections")}


def group_names(result: SimResult) -> list[str]:
    """DIP -> its group (name without the ``-N`` suffix), for plotting group weights."""
    return [name.rsplit("-", 1)[0] if name.rsplit("-", 1)[-1].isdigit() else name for name in result.dip_names]
