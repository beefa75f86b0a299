"""`klb solve` and `klb bench solver`: weights from curves, and the solver benchmark."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from knapsack_lb.cli.output import stdout_console
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
    console = stdout_console()
    table = Table()  # the summary goes on its own line: a title would wrap at the table's width
    table.add_column("DIP")
    table.add_column("weight", justify="right")
    table.add_column("predicted latency (ms)", justify="right")
    for name, weight in solution.weights.items():
        table.add_row(name, f"{weight:.6f}", f"{solution.predicted_latency[name] * 1000:.3f}")
    console.print(f"{solution.objective_kind} objective {solution.objective:.6g} by {solution.method} "
                  f"in {solution.seconds * 1000:.1f} ms", highlight=False)
    console.print(table)
    console.print(solution.note, highlight=False)


def bench_solver_command(
    dips: int = typer.Option(None, "--dips", help="Number of DIPs in the generated pool (required without --fleet)."),
    levels: int = typer.Option(10, help="K, the ILP's levels per DIP."),
    methods: str = typer.Option("exact,ilp,ilp-multistep", help="Comma-separated methods to run."),
    objective: str = typer.Option("mean", help=f"One of {', '.join(OBJECTIVES)}."),
    seed: int = typer.Option(0, help="Seed of the pool generator."),
    repeat: int = typer.Option(3, help="Runs per method; seconds is the median."),
    pool: str = typer.Option("table3", help="table3 (paper Table 3 mix at 70-80% load) or identical (section 6.6)."),
    kind: str = typer.Option(None, help="Curve kind: queueing (M/M/1) or quadratic (section 4.2 fit); default "
                                        "queueing, with --fleet quadratic."),
    units: int = typer.Option(1_000_000, help="Integer units of the exact grid."),
    time_limit: float = typer.Option(None, help="Seconds per CBC run."),
    as_json: bool = typer.Option(True, "--json/--table", help="Print JSON (default) or a table."),
    fleet: bool = typer.Option(False, "--fleet", help="Solve a whole seeded fleet (paper section 6.7, Table 8: "
                                                       "3,330 VIPs, 60,000 DIPs) on one core; prints JSON."),
    fleet_shape: str = typer.Option("table8", help="--fleet: table8 (the paper's VIP sizes) or lognormal "
                                                   "(heavy-tailed sizes, --fleet-vips and --fleet-dips)."),
    fleet_scale: float = typer.Option(1.0, help="--fleet table8: this fraction of each size's VIPs (0.1: a quick "
                                                "run of 333 VIPs, 6,000 DIPs)."),
    fleet_vips: int = typer.Option(3410, help="--fleet lognormal: number of VIPs."),
    fleet_dips: int = typer.Option(60_000, help="--fleet lognormal: number of DIPs, summed over the VIPs."),
    per_vip: bool = typer.Option(True, "--per-vip/--batched-only",
                                 help="--fleet: also solve VIP by VIP (per-VIP median and p99, same-plan check)."),
    pin_cpu: int = typer.Option(None, help="--fleet: pin the process to this CPU while solving (default: not pinned; "
                                           "the solver is single-threaded either way)."),
) -> None:
    """Solve one seeded pool with each method; print method, dips, levels, seconds, objective, gap.

    With --fleet: build a seeded fleet like the paper's Table 8, solve every VIP with the exact
    method on one core (one solve_many call, and VIP by VIP), and print wall and CPU time, VIPs/s,
    the per-VIP median and p99, and the paper's 851 s (one 8-core VM) beside them.
    """
    if fleet:
        _bench_fleet(seed, fleet_shape, fleet_scale, fleet_vips, fleet_dips, kind or "quadratic", objective, units,
                     per_vip, pin_cpu)
        return
    if dips is None:
        Console(stderr=True).print("[red]error:[/red] --dips is required (or use --fleet)", highlight=False)
        raise typer.Exit(EXIT_INVALID)
    kind = kind or "queueing"
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
    stdout_console().print(table)


def _bench_fleet(seed: int, shape: str, scale: float, vips: int, dips: int, kind: str, objective: str, units: int,
                 per_vip: bool, pin_cpu: int | None) -> None:
    from knapsack_lb.lab.bench.solver import run_fleet_bench  # scipy: imported only when the bench runs

    try:
        with Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=Console(stderr=True), transient=True,
        ) as bar:
            tasks: dict[str, TaskID] = {}
            labels = {"build": "building the fleet (DIPs)", "solve": "solving VIP by VIP"}

            def progress(phase: str, done: int, total: int) -> None:
                if phase not in tasks:
                    tasks[phase] = bar.add_task(labels[phase], total=total)
                bar.update(tasks[phase], completed=done)

            result = run_fleet_bench(seed=seed, shape=shape, scale=scale, vips=vips, dips=dips, kind=kind,
                                     objective=objective, units=units, per_vip=per_vip, pin_cpu=pin_cpu,
                                     progress=progress)
    except KnapsackLBError as exc:
        raise _fail(exc) from None
    sys.stdout.write(json.dumps(result, indent=2) + "\n")


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add this module's commands to ``app`` and its benchmarks to ``bench_app``."""
    app.command("solve")(solve_command)
    bench_app.command("solver")(bench_solver_command)
