"""`klb` commands of the adapters: list installed adapters, benchmark them against real LBs.

``klb bench adapters --json`` starts, for each LB, emulated backends and the real load balancer
on free loopback ports (knapsack_lb.lab.testbed.lb_harness), pushes 10/30/60, sends ``--requests``
requests and reports the observed split error, then applies ``--plans`` plans under continuous
traffic and reports apply latency (median, p99), the time until traffic follows a new plan and
the failed requests. Everything stops by itself; an LB that cannot start is reported, not fatal.
"""

from __future__ import annotations

import json
import os
import tempfile
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from adapters.base import ENTRY_POINT_GROUP
from knapsack_lb.cli.output import stdout_console
from knapsack_lb.lab.testbed.lb_harness import TESTBEDS, bench_lb

DEFAULT_LBS = "haproxy,nginx,envoy,dns"


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add this module's commands to ``app`` and its benchmarks to ``bench_app``."""
    adapters_app = typer.Typer(help="Weight adapters (plugins in entry-point group knapsack_lb.adapters).")
    app.add_typer(adapters_app, name="adapters")

    @adapters_app.command("list")
    def list_adapters() -> None:
        """Installed adapters: name and the class it loads."""
        table = Table("name", "class")
        for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            table.add_row(ep.name, ep.value)
        stdout_console().print(table)

    @bench_app.command("adapters")
    def bench_adapters(
        json_output: bool = typer.Option(False, "--json", help="Print the result as JSON (always JSON on stdout)."),
        lbs: str = typer.Option(DEFAULT_LBS, "--lbs", help=f"Comma-separated LBs of {sorted(TESTBEDS)}."),
        requests: int = typer.Option(3000, "--requests", min=100, max=100_000, help="Requests for the split."),
        plans: int = typer.Option(50, "--plans", min=5, max=500, help="Plan changes under traffic."),
        churn_seconds: float = typer.Option(
            15.0, "--churn-seconds", min=1.0, max=300.0, help="Seconds over which the plans are spread."
        ),
        seed: int = typer.Option(7, "--seed", help="Seed of the churn plans."),
        workdir: Path | None = typer.Option(None, "--workdir", help="Keep LB configs and logs here."),
    ) -> None:
        """Observed split error, apply latency, follow time and failed requests per real LB."""
        chosen = [name.strip() for name in lbs.split(",") if name.strip()]
        unknown = sorted(set(chosen) - set(TESTBEDS))
        if unknown:
            raise typer.BadParameter(f"unknown LB(s) {unknown}; known: {sorted(TESTBEDS)}", param_hint="--lbs")
        stderr = Console(stderr=True)
        results: dict[str, Any] = {}
        with tempfile.TemporaryDirectory(prefix="klb-bench-adapters-") as tmp:
            base = workdir or Path(tmp)
            with Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TimeElapsedColumn(),
                console=stderr,
            ) as progress:
                task = progress.add_task("adapters", total=len(chosen))
                for lb in chosen:
                    progress.update(task, description=f"{lb}: split + {plans} plans under traffic")
                    results[lb] = bench_lb(
                        lb, base / lb, requests=requests, plans=plans, churn_seconds=churn_seconds, seed=seed
                    )
                    progress.advance(task)
        load = os.getloadavg()
        output = {
            "benchmark": "adapters",
            "requests": requests,
            "plans": plans,
            "churn_seconds": churn_seconds,
            "target_split": {"b1": 0.1, "b2": 0.3, "b3": 0.6},
            "machine": {"cpus": os.cpu_count(), "loadavg_1m": load[0]},
            "note": "split_error = largest |observed - target| share; seconds are wall time on a shared machine",
            "lbs": results,
        }
        if not json_output:
            _print_table(stderr, results)
        typer.echo(json.dumps(output, indent=2, sort_keys=True, default=str))


def _print_table(console: Console, results: dict[str, Any]) -> None:
    def ms(value: object) -> str:
        return f"{1000 * value:.1f}" if isinstance(value, (int, float)) else "-"

    table = Table(
        "LB", "split error", "apply ms (p50)", "apply ms (p99)", "follow ms (p50)", "failed / requests", "error"
    )
    for lb, row in results.items():
        split = row.get("split_error")
        table.add_row(
            lb,
            f"{100 * split:.2f} pp" if isinstance(split, float) else "-",
            ms(row.get("apply_seconds_median")),
            ms(row.get("apply_seconds_p99")),
            ms(row.get("follow_seconds_median")),
            f"{row.get('failed_requests', '-')} / {row.get('requests', '-')}",
            str(row.get("error", "")),
        )
    console.print(table)
