"""``klb-probe [OPTIONS]`` (``python -m knapsack_lb.cli.probe_main``): the ``klb probe`` command
without loading the rest of ``klb``.

Same options and behaviour as ``klb probe`` (both come from
:mod:`knapsack_lb.cli.probe_commands`); starts in about a second instead of loading the
controller, solver and simulator modules the full ``klb`` app registers.
"""

from __future__ import annotations

import typer

from knapsack_lb.cli import probe_commands

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
probe_commands.register(app, typer.Typer())

if __name__ == "__main__":
    app()
