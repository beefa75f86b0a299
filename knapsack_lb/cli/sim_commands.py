"""`klb sim ...` (run, compare, reproduce, policies, scenarios) and `klb bench sim`."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from knapsack_lb.cli.output import stdout_console

sim_app = typer.Typer(
    help="Discrete-event simulator: run scenarios, compare policies, reproduce the documents.", no_args_is_help=True
)
_err = Console(stderr=True)
_out = stdout_console()


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        console=_err,
        transient=False,
    )


def _updater(bar: Progress, task: TaskID) -> Callable[[float], None]:
    return lambda fraction: bar.update(task, completed=fraction)


def _fmt_ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value * 1000:.2f}"


def _clean(value: Any) -> Any:
    """JSON-safe: NaN -> None."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


@sim_app.command("run")
def run_command(
    spec: str = typer.Argument(..., help="Scenario YAML path or shipped scenario name."),
    policy: str = typer.Option(..., "--policy", "-p", help="Policy label from the scenario or a registry name."),
    seed: int | None = typer.Option(None, "--seed", "-s", help="Seed (default: the scenario's)."),
    duration: float | None = typer.Option(None, help="Override the scenario's duration (seconds)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Run one policy on one scenario."""
    from knapsack_lb.sim.simulation import run
    from knapsack_lb.sim.spec import load_scenario

    scenario = load_scenario(spec)
    if duration is not None:
        scenario = scenario.with_changes(duration=duration, warmup=min(scenario.warmup, duration / 4))
    with _progress() as bar:
        task = bar.add_task(f"{scenario.name} / {policy}", total=1.0)
        result = run(scenario, policy, seed, progress=lambda f: bar.update(task, completed=f))
    if as_json:
        print(json.dumps(_clean(result.summary()), indent=2))
        return
    print_results([result])


def print_results(results: list[Any]) -> None:
    table = Table(title=results[0].scenario if results else "")
    for col in (
        "policy",
        "mean ms",
        "p50",
        "p90",
        "p99",
        "p99.9",
        "p99.99",
        "10-90",
        "thr/s",
        "err %",
        "drop %",
        "util spread",
    ):
        table.add_column(col, justify="right" if col != "policy" else "left")
    for r in results:
        table.add_row(
            r.policy,
            _fmt_ms(r.mean),
            _fmt_ms(r.p50),
            _fmt_ms(r.p90),
            _fmt_ms(r.p99),
            _fmt_ms(r.p999),
            _fmt_ms(r.p9999),
            _fmt_ms(r.spread_10_90),
            f"{r.throughput:.1f}",
            f"{100 * r.error_rate:.2f}",
            f"{100 * r.drop_rate:.2f}",
            f"{r.utilization_spread:.3f}",
        )
    _out.print(table)


@sim_app.command("compare")
def compare_command(
    spec: str = typer.Argument(..., help="Scenario YAML path or shipped scenario name."),
    policies: str | None = typer.Option(None, help="Comma-separated policies (default: the scenario's list)."),
    seed: int | None = typer.Option(None, "--seed", "-s", help="Seed (default: the scenario's)."),
    duration: float | None = typer.Option(None, help="Override the scenario's duration (seconds)."),
    plot: Path | None = typer.Option(None, help="PNG of latency CDFs (default: sim-<scenario>.png)."),
    as_json: bool = typer.Option(False, "--json", help="Print results as JSON."),
) -> None:
    """Run every applicable policy of a scenario on the same seed; a table and latency-CDF plots."""
    from knapsack_lb.sim.plots import save_latency_cdfs
    from knapsack_lb.sim.simulation import run
    from knapsack_lb.sim.spec import PolicySpec, load_scenario

    scenario = load_scenario(spec)
    if duration is not None:
        scenario = scenario.with_changes(duration=duration, warmup=min(scenario.warmup, duration / 4))
    specs: list[PolicySpec] = (
        [scenario.policy(p.strip()) for p in policies.split(",") if p.strip()] if policies else list(scenario.policies)
    )
    if not specs:
        raise typer.BadParameter("the scenario lists no policies; pass --policies", param_hint="--policies")
    results = []
    with _progress() as bar:
        overall = bar.add_task(f"{scenario.name}", total=len(specs))
        for p in specs:
            task = bar.add_task(f"  {p.display}", total=1.0)
            results.append(run(scenario, p, seed, progress=_updater(bar, task)))
            bar.advance(overall)
    out = plot or Path(f"sim-{scenario.name}.png")
    save_latency_cdfs(results, out, title=f"{scenario.name}: latency CDF per policy")
    if as_json:
        print(
            json.dumps(
                _clean({"scenario": scenario.name, "plot": str(out), "results": [r.summary() for r in results]}),
                indent=2,
            )
        )
        return
    print_results(results)
    _err.print(f"plot: {out}")


@sim_app.command("policies")
def policies_command() -> None:
    """List the policy registry."""
    from knapsack_lb.sim.policies.registry import REGISTRY

    table = Table(title="policies")
    table.add_column("name")
    table.add_column("description")
    for entry in REGISTRY.values():
        table.add_row(entry.name, entry.description)
    _out.print(table)


@sim_app.command("scenarios")
def scenarios_command() -> None:
    """List the shipped scenarios."""
    from knapsack_lb.sim.spec import load_scenario, shipped_scenarios

    table = Table(title="shipped scenarios")
    table.add_column("name")
    table.add_column("description")
    for name in shipped_scenarios():
        table.add_row(name, load_scenario(name).description)
    _out.print(table)


@sim_app.command("reproduce")
def reproduce_command(
    only: str | None = typer.Option(None, help="Only claims of this document (e.g. knapsack, l7, bloc)."),
    seed: int = typer.Option(1, "--seed", "-s", help="Seed of every run."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object per claim row (a list)."),
) -> None:
    """Run every document's headline experiment at reduced size; one row per claim."""
    from knapsack_lb.sim.reproduce import run_claims

    with _progress() as bar:
        task = bar.add_task("claims", total=None)

        def tick(done: int, total: int, label: str) -> None:
            bar.update(task, total=total, completed=done, description=f"claims: {label}")

        rows = run_claims(only=only, seed=seed, progress=tick)
    if as_json:
        print(json.dumps(_clean([r.to_dict() for r in rows]), indent=2))
        return
    table = Table(title="claims")
    for col in ("document", "claim", "metric", "document value", "simulated", "holds"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r.document,
            r.claim,
            r.metric,
            r.document_value,
            r.simulated_value,
            "[green]yes[/]" if r.holds else "[red]no[/]",
        )
    _out.print(table)


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add this module's commands to ``app`` and its benchmarks to ``bench_app``."""
    app.add_typer(sim_app, name="sim")

    @bench_app.command("sim")
    def bench_sim_command(
        scenario: str = typer.Option("knapsack-paper30", help="Scenario (30 DIPs by default)."),
        policy: str = typer.Option("least_connections", help="Policy."),
        duration: float = typer.Option(20.0, help="Simulated seconds."),
        repeat: int = typer.Option(3, help="Runs; the fastest counts (shared machine)."),
        as_json: bool = typer.Option(True, "--json/--no-json", help="Print JSON (default)."),
    ) -> None:
        """Simulated requests per wall-second (and per CPU-second) on one core."""
        from knapsack_lb.lab.bench.sim import bench_sim

        result = bench_sim(scenario=scenario, policy=policy, duration=duration, repeat=repeat)
        print(json.dumps(result, indent=2) if as_json else result)
