"""Writes notebooks/02_policies.ipynb and notebooks/03_dynamics.ipynb (run: python notebooks/build_sim_notebooks.py).

The cells only call knapsack_lb.sim and plot; KLB_NOTEBOOK_SMALL shrinks the runs.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

SETUP = """import os
SMALL = bool(os.environ.get("KLB_NOTEBOOK_SMALL"))
%matplotlib inline
import matplotlib.pyplot as plt
from knapsack_lb.sim.experiments import compare, dynamics_runs, dynamics_scenario, group_names
from knapsack_lb.sim.plots import latency_cdf_figure, timeline_figure, utilization_figure
from knapsack_lb.cli.sim_commands import print_results"""


def policies_notebook() -> nbformat.NotebookNode:
    return new_notebook(
        cells=[
            new_markdown_cell(
                "# Policies side by side\n\n"
                "Latency CDFs of every policy on the shipped scenarios (docs/simulator.md). With "
                "`KLB_NOTEBOOK_SMALL` set the runs are short and KnapsackLB (which needs minutes of simulated "
                "time to build its curves) is left out."
            ),
            new_code_cell(SETUP),
            new_markdown_cell("## The L7 report's setting: 10 closed-loop clients, 3 servers"),
            new_code_cell(
                "l7 = compare('l7-basics', duration=30 if SMALL else 120)\n"
                "print_results(l7)\n"
                "latency_cdf_figure(l7, 'l7-basics'); plt.show()"
            ),
            new_markdown_cell(
                "## KnapsackLB 6.2: three DIPs (capacities 1, 0.8, 0.6) at layer 4\n\n"
                "Connections are placed once by 4 MUXes and carry 10 requests each; least connections balances "
                "connection counts, not load (docs/design.md)."
            ),
            new_code_cell(
                "three = compare('knapsack-3dip', duration=40 if SMALL else 400, skip=('knapsack',) if SMALL else ())\n"
                "print_results(three)\n"
                "latency_cdf_figure(three, 'knapsack-3dip'); plt.show()\n"
                "utilization_figure(three); plt.show()"
            ),
            new_markdown_cell("## The other documents' scenarios (BLOC, DL3, ELS)"),
            new_code_cell(
                "for name in ('bloc-40x10', 'dl3-netdelay', 'els-failing'):\n"
                "    results = compare(name, duration=20 if SMALL else None)\n"
                "    print_results(results)\n"
                "    latency_cdf_figure(results, name); plt.show()"
            ),
        ],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    )


def dynamics_notebook() -> nbformat.NotebookNode:
    return new_notebook(
        cells=[
            new_markdown_cell(
                "# KnapsackLB through dynamics (section 6.3)\n\n"
                "The project's controller (`knapsack_lb.controller.core.VipController`) runs unchanged on simulated "
                "time; its probe rounds go through the simulated DIP queues and its plans are pushed to the "
                "MUXes' weighted round robin (new connections only). Full size: `knapsack-dynamics` (30 DIPs: "
                "failure of DIP-25,26, capacity drop of DIP-25..28, +10% traffic). Small: the 3-DIP pool with "
                "the same kinds of events."
            ),
            new_code_cell(SETUP),
            new_code_cell(
                "runs = dynamics_runs(small=SMALL)\n"
                "print_results(list(runs.values()))\n"
                "[(e.at, e.kind, e.dips, e.speed, e.factor) for e in dynamics_scenario(SMALL).events]"
            ),
            new_markdown_cell("## Weights (share per DIP group) and mean latency over time"),
            new_code_cell("klb = runs['knapsack']\ntimeline_figure(klb, group_of=group_names(klb)); plt.show()"),
            new_markdown_cell("## The controller's plans and why it changed them"),
            new_code_cell(
                "for plan in klb.series['plans'][-15:]:\n"
                "    print(f\"{plan['time']:7.1f}  {plan['flags']}  {plan['reasons'][:1]}\")"
            ),
            new_markdown_cell("## Latency CDF against round robin and least connections over the whole run"),
            new_code_cell("latency_cdf_figure(list(runs.values()), 'dynamics'); plt.show()"),
        ],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    )


def main() -> None:
    nbformat.write(policies_notebook(), HERE / "02_policies.ipynb")
    nbformat.write(dynamics_notebook(), HERE / "03_dynamics.ipynb")


if __name__ == "__main__":
    main()
