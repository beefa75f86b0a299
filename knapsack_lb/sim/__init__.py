"""The discrete-event simulator: scenarios (spec), engine, DIPs, network, LB instances, runs, claims.

Entry points: ``load_scenario(name_or_path)``, ``Simulation(scenario, policy, seed).run()`` ->
``SimResult``. See docs/simulator.md.
"""

from knapsack_lb.sim.metrics import SimResult
from knapsack_lb.sim.simulation import Simulation, run
from knapsack_lb.sim.spec import PolicySpec, Scenario, load_scenario, parse_scenario, shipped_scenarios

__all__ = [
    "PolicySpec",
    "Scenario",
    "SimResult",
    "Simulation",
    "load_scenario",
    "parse_scenario",
    "run",
    "shipped_scenarios",
]
