"""Entry point of ``klb``: the root app and the ``bench`` group.

Each concept's commands live in their own module with a ``register(app, bench_app)``
function, so that the solver, probes, controller, adapters, simulator and services each
own their commands.
"""

from __future__ import annotations

import typer

from knapsack_lb.cli import (
    adapter_commands,
    controller_commands,
    demo_commands,
    fleet_commands,
    lb_timings_commands,
    probe_commands,
    robustness_commands,
    service_commands,
    sim_commands,
    solver_commands,
)

app = typer.Typer(
    name="klb",
    help="knapsack-lb: learn per-backend weight-latency curves and push latency-minimising weights.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
bench_app = typer.Typer(help="Benchmarks; each prints JSON.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")

for _module in (
    solver_commands,
    probe_commands,
    controller_commands,
    adapter_commands,
    sim_commands,
    service_commands,
    demo_commands,
    robustness_commands,
    fleet_commands,
    lb_timings_commands,
):
    _module.register(app, bench_app)


if __name__ == "__main__":
    app()
