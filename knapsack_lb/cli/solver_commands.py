"""`klb solve` and `klb bench solver`: weights from curves, and the solver benchmark."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from knapsack_lb.errors import InfeasibleError, KnapsackLBError
from knapsack_lb.solver.api import solve
from knapsack_lb.solver.curves_file import load_curves, solution_to_dict
from knapsack_lb.solver.inputs import METHODS, OBJECTIVES

EXIT_INVALID = 2
EXIT_INFEASIBLE = 3


def _fail(exc: KnapsackLBError) -> typer.Exit:
    Console(stderr=True).print(f"[red]error:[/red] {exc}", highlight=False)
    return typer.Exit(EXIT_INFEASIBLE if isinstance(exc, InfeasibleError) else EXIT_INVALID)


def solve_command(
    curves: Path = typer.Argument(..., help="Curves file (JSON; see README 'Solver' and examples/curves.json)."),
    objective: str = typer.Option(None, help=f"One of {', '.join(OBJECTIVES)}; default: the file's, else mean."),
    method: str = typer.Option("auto", help=f"One of {', '.join(METHODS)}."),
    levels: int = typer.Option(10, help="K, the ILP's levels per DIP (ilp, ilp-multistep)."),
    units: int = typer.Option(1_000_000, help="Integer units the free weight is cut into."),
    imbalance: float = typer.Option(None, help="Largest allowed max(w) - min(w) (ILP methods only)."),
    time_limit: float = typer.Option(None, help="Seconds per CBC run."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Compute weights that minimise latency for the DIPs in CURVES."""
    try:
        spec = load_curves(curves)
        solution = solve(
            spec.dips, objective=objective or spec.objective, method=method, total=spec.total, levels=levels,
            units=units, imbalance=imbalance, time_limit=time_limit,
        )
    except KnapsackLBError as exc:
        raise _fail(exc) from None
    if as_json:
        sys.stdout.write(json.dumps(solution_to_dict(solution), indent=2) + "\n")
        return
    console = Console()
    table = Table(title=f"{solution.objective_kind} objective {solution.objective:.6g} by {solution.method} "
                        f"in {solution.seconds * 1000:.1f} ms")
    table.add_column("DIP")
    table.add_column("weight", justify="right")
    table.add_column("predicted latency (ms)", justify="right")
    for name, weight in solution.weights.items():
        table.add_row(name, f"{weight:.6f}", f"{solution.predicted_latency[name] * 1000:.3f}")
    console.print(table)
    console.print(solution.note, highlight=False)


def bench_solver_command(
    dips: int = typer.Option(..., "--dips", help="Number of DIPs in the generated pool."),
    levels: int = typer.Option(10, help="K, the ILP's levels per DIP."),
    methods: str = typer.Option("exact,ilp,ilp-multistep", help="Comma-separated methods to run."),
    objective: str = typer.Option("mean", help=f"One of {', '.join(OBJECTIVES)}."),
    seed: int = typer.Option(0, help="Seed of the pool generator."),
    repeat: int = typer.Option(3, help="Runs per method; seconds is the median."),
    pool: str = typer.Option("table3", help="table3 (paper Table 3 mix at 70-80% load) or identical (section 6.6)."),
    kind: str = typer.Option("queueing", help="Curve kind: queueing (M/M/1) or quadratic (section 4.2 fit)."),
    units: int = typer.Option(1_000_000, help="Integer units of the exact grid."),
    time_limit: float = typer.Option(None, help="Seconds per CBC run."),
    as_json: bool = typer.Option(True, "--json/--table", help="Print JSON (default) or a table."),
) -> None:
    """Solve one seeded pool with each method; print method, dips, levels, seconds, objective, gap."""
    from knapsack_lb.lab.bench.solver import run_solver_bench  # scipy: imported only when the bench runs

    chosen = [m.strip() for m in methods.split(",") if m.strip()]
    try:
        with Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=Console(stderr=True), transient=True,
        ) as bar:
            task = bar.add_task(f"solver bench, {dips} DIPs", total=len(chosen) * repeat)
            rows = run_solver_bench(
                dips, levels=levels, methods=chosen, objective=objective, seed=seed, repeat=repeat, pool=pool,
                kind=kind, units=units, time_limit=time_limit,
                progress=lambda method: bar.update(task, advance=1, description=f"{method}, {dips} DIPs"),
            )
    except KnapsackLBError as exc:
        raise _fail(exc) from None
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    table = Table(title=f"solver bench: {dips} DIPs, {levels} levels, {objective}")
    for column in ("method", "ran", "seconds", "objective", "gap"):
        table.add_column(column)
    for row in rows:
        table.add_row(
            row["method"], str(row["ran"]), "-" if row["seconds"] is None else f"{row['seconds']:.4f}",
            "-" if row["objective"] is None else f"{row['objective']:.6g}",
            "-" if row["gap"] is None else f"{row['gap']:.2e}",
        )
    Console().print(table)


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add this module's commands to ``app`` and its benchmarks to ``bench_app``."""
    app.command("solve")(solve_command)
    bench_app.command("solver")(bench_solver_command)
