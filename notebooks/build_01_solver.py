"""Builds notebooks/01_solver.ipynb (cells call the package and plot; no logic in cells)."""
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

cells = [
    new_markdown_cell(
        "# 01 - The weight solver\n\n"
        "KnapsackLB frames load balancing as a knapsack problem (section 3.3, Fig. 7): pick one weight per "
        "DIP from a set of levels so the weights sum to 1 and the latency predicted by each DIP's "
        "weight-latency curve is minimal. The paper solves it as an ILP with CBC (section 5) and speeds it "
        "up with a two-step ILP (section 4.4); section 6.6 reports its running time.\n\n"
        "This notebook times the same ILP with PuLP's bundled CBC on this machine next to the paper's "
        "numbers and the exact solver of `knapsack_lb.solver` (greedy marginal allocation on a grid of "
        "10^6 units, optimal for convex costs), then shows what the `mean` and `sum` objectives do to one pool. "
        "Sizes shrink when `KLB_NOTEBOOK_SMALL` is set (the test suite). The machine is shared, so times are "
        "pessimistic."
    ),
    new_code_cell(
        "import os\n"
        "import matplotlib.pyplot as plt\n"
        "import numpy as np\n"
        "from knapsack_lb.lab.bench.solver import PAPER_ILP_SECONDS, objective_table, scaling\n"
        "from knapsack_lb.solver.instances import table3_pool\n\n"
        "SMALL = bool(os.environ.get('KLB_NOTEBOOK_SMALL'))\n"
        "SIZES = [10, 30, 100] if SMALL else [10, 50, 100, 500, 1000, 10000]\n"
        "LARGEST = {'ilp': 30 if SMALL else 1000, 'ilp-multistep': 30 if SMALL else 1000}"
    ),
    new_markdown_cell(
        "## Solver time against the number of DIPs\n\n"
        "A Table 3 pool (1/2/4/8-vCPU DIPs in the 16:8:4:2 mix, 70-80% load, M/M/1-shaped curves), "
        "10 levels per DIP for the ILP. The paper's line is its Table 6 (equal DIPs at 80% load)."
    ),
    new_code_cell(
        "series = scaling(SIZES, ['exact', 'ilp', 'ilp-multistep'], largest=LARGEST, time_limit=120)\n"
        "fig, ax = plt.subplots(figsize=(7, 4))\n"
        "ax.plot(list(PAPER_ILP_SECONDS), list(PAPER_ILP_SECONDS.values()), 'k--o', label='paper: ILP (Table 6)')\n"
        "for method, points in series.items():\n"
        "    ax.plot(*zip(*points), marker='o', label=f'here: {method}')\n"
        "ax.set_xscale('log'); ax.set_yscale('log')\n"
        "ax.set_xlabel('DIPs'); ax.set_ylabel('seconds'); ax.legend(); ax.grid(True, which='both', alpha=0.3)\n"
        "series"
    ),
    new_markdown_cell(
        "## `mean` against `sum`\n\n"
        "The paper's objective (`sum`) adds up the latency of every DIP once, whatever traffic it carries. "
        "It is the average latency *of a DIP*, not of a request: it happily starves small DIPs (their "
        "latency counts as much as a big DIP's, and is lowest at weight 0), and it pushes big DIPs "
        "to the latency at which their curve is as steep as the small ones'. The `mean` objective, "
        "`sum_d w_d * l_d(w_d)`, weighs each DIP's latency by the share of requests it serves: it is "
        "the latency the average request sees, and is the default here. Below, one 30-DIP Table 3 pool "
        "solved for each, and each plan scored under both."
    ),
    new_code_cell(
        "pool = table3_pool(30, np.random.default_rng(1))\n"
        "rows = objective_table(pool)\n"
        "order = np.argsort([d.w_max for d in pool])\n"
        "fig, ax = plt.subplots(figsize=(9, 3.5))\n"
        "x = np.arange(len(pool))\n"
        "for shift, row in zip((-0.2, 0.2), rows):\n"
        "    ax.bar(x + shift, [row['weights'][pool[i].name] for i in order], width=0.4, "
        "label=f\"solved for {row['solved_for']}\")\n"
        "ax.plot(x, [pool[i].w_max for i in order], 'k_', markersize=12, label='w_max')\n"
        "ax.set_xlabel('DIP (sorted by capacity)'); ax.set_ylabel('weight'); ax.legend()\n"
        "[{k: v for k, v in row.items() if k != 'weights'} for row in rows]"
    ),
]
notebook = new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}})
nbformat.write(notebook, Path(__file__).resolve().parent / "01_solver.ipynb")
