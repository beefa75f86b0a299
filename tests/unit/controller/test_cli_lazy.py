"""`klb` starts without importing the controller's heavy dependencies (scikit-learn, scipy)."""

from __future__ import annotations

import subprocess
import sys

from knapsack_lb.cli.controller_commands import SCENARIO_NAMES
from knapsack_lb.lab.bench.controller import SCENARIOS


def test_scenario_names_match_the_bench() -> None:
    assert tuple(SCENARIO_NAMES) == tuple(SCENARIOS)


def test_importing_the_cli_does_not_import_sklearn() -> None:
    code = "import sys, knapsack_lb.cli.controller_commands as c; print('sklearn' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"
