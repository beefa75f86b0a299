"""`klb bench lb-timings`: the learner live at layer 7 with and without the LB's own timings.

See :mod:`knapsack_lb.lab.bench.lb_timings`; measured numbers: docs/results/lb-timings.md.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from knapsack_lb.cli.output import stdout_console


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter(f"seeds must be integers separated by commas (got {text!r})",
                                 param_hint="--seeds") from None
    if not seeds:
        raise typer.BadParameter(f"no seed in {text!r}", param_hint="--seeds")
    return seeds


def bench_lb_timings_command(
    seeds: str = typer.Option("1,2,3", help="Seeds; each runs once with the LB's timings and once without."),
    lb: str = typer.Option("haproxy", "--lb", help="The LB in front of the DIPs: haproxy, nginx or envoy."),
    seconds: float = typer.Option(120.0, min=20.0, max=1800.0, help="Seconds of load per run."),
    count_after: float = typer.Option(60.0, min=0.0, help="Latency counted from this second of a run."),
    workdir: Path = typer.Option(None, "--workdir", help="Keep configs and logs here (default: a temporary one)."),
    as_json: bool = typer.Option(False, "--json", help="Print the runs and the summary as JSON on stdout."),
) -> None:
    """Layer 7 (HAProxy mode http roundrobin, Nginx round robin or Envoy ROUND_ROBIN), klb learning from
    the start, with and without the adapter's log_listen: clients' latency, failed requests, probes
    sent, plans."""
    from knapsack_lb.lab.bench import lb_timings
    from knapsack_lb.service.logs import configure_logging

    chosen = _seeds(seeds)
    if lb not in ("haproxy", "nginx", "envoy"):
        raise typer.BadParameter(f"must be haproxy, nginx or envoy (got {lb!r})", param_hint="--lb")
    if count_after >= seconds:
        raise typer.BadParameter(f"count_after {count_after:g} must be below seconds {seconds:g}",
                                 param_hint="--count-after")
    configure_logging("WARNING")
    err = Console(stderr=True)
    with tempfile.TemporaryDirectory(prefix="klb-lbt-") as scratch, \
            Progress(TextColumn("lb-timings"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                     console=err) as progress:
        task = progress.add_task("runs", total=2 * len(chosen))
        runs = lb_timings.run_pairs(chosen, seconds, count_after, workdir or Path(scratch),
                                    on_done=lambda _: progress.advance(task), lb=lb)  # type: ignore[arg-type]
    result = lb_timings.report(runs)
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2, allow_nan=False) + "\n")
        return
    table = Table(title=f"layer 7, {lb} round robin: latency from {count_after:g} s of {seconds:g} s")
    for col in ("seed", "the LB's timings", "mean ms", "p99 ms", "requests", "failed", "probe requests", "plan"):
        table.add_column(col)
    for r in runs:
        table.add_row(str(r.seed), "yes" if r.logs else "no", _ms(r.mean_ms), _ms(r.p99_ms), str(r.requests),
                      str(r.failed), str(r.probe_requests),
                      f"{r.plan_method}: " + " ".join(f"{v:.3f}" for v in r.plan.values()))
    stdout_console().print(table)
    sys.stdout.write(json.dumps(result["summary"], allow_nan=False) + "\n")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add this module's benchmark to ``bench_app``."""
    bench_app.command("lb-timings")(bench_lb_timings_command)
