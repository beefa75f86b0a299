"""`klb bench robustness`: KnapsackLB with its defaults against an operator's choices on random pools."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from knapsack_lb.cli.output import stdout_console

if TYPE_CHECKING:
    from knapsack_lb.lab.bench.robustness import PoolReport

QUICK_POOLS, QUICK_DURATION = 6, 420.0


def bench_robustness_command(
    pools: int = typer.Option(40, min=1, max=1000, help="Pools to generate."),
    seed: int = typer.Option(1, help="Seed of the pool set (pool i of seed s is always the same pool)."),
    quick: bool = typer.Option(False, help=f"{QUICK_POOLS} pools of {QUICK_DURATION:.0f} s: a smoke run."),
    engine: str = typer.Option("sim", help="sim (discrete events, every policy) or fluid (fast, M/M/c, "
                               "static baselines only)."),
    duration: float = typer.Option(None, help="Simulated seconds per run (default: the generator's 600)."),
    workers: int = typer.Option(None, min=1, help="Processes (default: the CPUs)."),
    light_requests: int = typer.Option(0, min=0, max=1000, help="Light requests per DIP per round to a fixed-work "
                                       "URL every DIP has (0: none, the paper's black box)."),
    save_specs: Path = typer.Option(None, "--save-specs", help="Write each pool's scenario YAML here."),
    plot: Path = typer.Option(Path("robustness.png"), help="PNG: ratios per pool (sorted) and their CDFs."),
    as_json: bool = typer.Option(False, "--json", help="Print every pool's numbers as JSON on stdout."),
    paths: int = typer.Option(1, min=1, max=20, help="Random paths (simulation seeds) per pool; every policy runs "
                              "each, and a pool's ratio is the geometric mean over them."),
    layer: int = typer.Option(None, help="Only the pools at this layer (4 or 7); pool i stays pool i."),
    policies: str = typer.Option(None, help="Comma-separated policies to run (default: all of the engine's); "
                                 "knapsack and oracle always run."),
) -> None:
    """Run the gauge: every pool, every policy on the same seed of each random path; a table, a PNG and
    optionally JSON."""
    from knapsack_lb.lab.bench import robustness as gauge

    if engine not in ("sim", "fluid"):
        raise typer.BadParameter(f"engine must be 'sim' or 'fluid' (got {engine!r})", param_hint="--engine")
    chosen: Literal["sim", "fluid"] = "fluid" if engine == "fluid" else "sim"
    if light_requests and chosen == "fluid":
        raise typer.BadParameter(f"the fluid model sends no light requests (got {light_requests}); use --engine sim",
                                 param_hint="--light-requests")
    if layer is not None and layer not in (4, 7):
        raise typer.BadParameter(f"layer must be 4 or 7 (got {layer})", param_hint="--layer")
    try:
        labels = gauge.gauge_policies(chosen, None if policies is None else
                                      [p.strip() for p in policies.split(",") if p.strip()])
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--policies") from exc
    count = QUICK_POOLS if quick else pools
    gen = gauge.PoolGenerator(duration=duration or (QUICK_DURATION if quick else gauge.PoolGenerator().duration),
                              light_requests=light_requests)
    pool_set = [p for p in (gauge.generate_pool(i, seed, gen) for i in range(count)) if layer in (None, p.layer)]
    if not pool_set:
        raise typer.BadParameter(f"none of the {count} pools of seed {seed} is at layer {layer}", param_hint="--layer")
    if save_specs is not None:
        gauge.save_specs(pool_set, save_specs)
    err = Console(stderr=True)
    with Progress(TextColumn("robustness"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err) as progress:
        task = progress.add_task("runs", total=len(pool_set) * len(labels) * paths)
        reports = gauge.run_gauge(pool_set, chosen, workers, on_done=lambda _: progress.advance(task), paths=paths,
                                  policies=labels)
    gauge.plot(reports, plot)
    result = gauge.report_json(reports, chosen, seed)
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2, allow_nan=False) + "\n")
        return
    out = stdout_console()
    out.print(_table(reports))
    out.print(_summary_table(result["summary"]))
    err.print(f"plot: {plot}")


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _table(reports: list[PoolReport]) -> Table:
    table = Table(title="KnapsackLB (defaults) per pool: steady-window mean latency (ms)")
    for col in ("#", "path", "pool", "RR", "LC", "P2C", "WRR vCPU", "WLC vCPU", "oracle", "capacity", "KLB", "KLB/best",
                "KLB/oracle", "solved at (s)", "max util", "max busy"):
        table.add_column(col, justify="left" if col == "pool" else "right")
    for r in reports:
        o = r.outcomes
        k = o["knapsack"]
        table.add_row(str(r.pool.index), str(r.path), r.pool.describe(),
                      *(_fmt(o[x].steady_mean_ms, 1) if x in o else "-" for x in
                        ("round_robin", "least_connections", "power_of_two", "wrr_vcpu", "wlc_vcpu", "oracle",
                         "capacity", "knapsack")),
                      _fmt(r.ratio("best")), _fmt(r.ratio("oracle")), _fmt(k.first_solved_s, 0),
                      _fmt(k.max_utilisation_after), _fmt(k.max_busy))
    return table


def _summary_table(summary: dict[str, Any]) -> Table:
    paths = summary.get("paths", 1)
    table = Table(title=f"over {summary['pools']} pools" + (f", {paths} random paths each" if paths > 1 else ""))
    table.add_column("measure")
    for col in ("median", "p90", "worst"):
        table.add_column(col, justify="right")
    for key in ("steady_vs_best_baseline", "steady_vs_oracle", "whole_run_vs_best_baseline", "whole_run_vs_oracle",
                "steady_vs_capacity_weights", "capacity_weights_vs_vcpu_weights",
                "first_solved_s", "max_utilisation_after_solved", "max_busy_after_solved", "probe_share"):
        if key not in summary:
            continue
        d = summary[key]
        table.add_row(key.replace("_", " "), _fmt(d["median"]), _fmt(d["p90"]), _fmt(d["worst"]))
    for label, pools in summary.get("saturated_pools", {}).items():
        table.add_row(f"a DIP at capacity in a 5 s window: {label} (pools)", str(pools), "", "")
    for key in ("worse_than_least_connections", "worse_than_least_connections_by_5pct", "worse_than_vcpu_weights",
                "worse_than_vcpu_weights_by_5pct", "never_solved"):
        if key in summary:
            table.add_row(key.replace("_", " ") + " (pools)", str(summary[key]), "", "")
    for layer, d in summary.get("by_layer", {}).items():
        if not d["operator_baselines"]:
            continue
        against = "best of " + ", ".join(d["operator_baselines"])
        for key in ("steady_vs_operator", "steady_vs_oracle", "whole_run_vs_operator", "first_solved_s"):
            table.add_row(f"layer {layer}: {key.replace('_', ' ')}", _fmt(d[key]["median"]), _fmt(d[key]["p90"]),
                          _fmt(d[key]["worst"]))
        per_path = ", ".join(map(str, d["better_whole_run_per_path"]))
        table.add_row(f"layer {layer}: better than the {against} over the whole run (of {d['pools']} pools; "
                      f"each path: {per_path})", str(d["better_whole_run"]), "", "")
        table.add_row(f"layer {layer}: worse by 5 % over the whole run (pools)", str(d["worse_whole_run_by_5pct"]),
                      "", "")
        table.add_row(f"layer {layer}: a plan past a DIP's capacity after the first solved one (pools)",
                      str(d["above_capacity_after_solved"]), "", "")
    return table


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add this module's benchmark to ``bench_app``."""
    bench_app.command("robustness")(bench_robustness_command)
