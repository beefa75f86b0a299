"""`klb demo` (the project's main job): KnapsackLB against HAProxy on a live loopback testbed.

See knapsack_lb/lab/demo/ and docs/demo.md. ``make demo`` runs ``klb demo $(ARGS)``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add this module's commands to ``app`` and its benchmarks to ``bench_app``."""

    @app.command("demo")
    def demo(
        quick: Annotated[bool, typer.Option("--quick", help="Short phases (20 s), shorter learning.")] = False,
        out: Annotated[Path, typer.Option("--out", help="Directory for report.json, demo.png and logs.")] = Path(
            "demo-out"),
        phase_seconds: Annotated[float | None, typer.Option(
            "--phase-seconds", help="Counted seconds per phase (default 60, quick 20).")] = None,
        seed: Annotated[int, typer.Option("--seed", help="Seed of arrivals, lifetimes and service times.")] = 1,
        light_requests: Annotated[int, typer.Option(
            "--light-requests", help="Light requests per DIP per round to the emulated DIPs' GET /light "
            "(probe.light_path; 0: none, the DIPs are black boxes).")] = 0,
        ops: Annotated[bool, typer.Option(
            "--ops", help="Instead: the day-2 tour (add, drain, fail, remove a DIP, dry run, stop and restart klb) "
            "under load, with each step's failed requests and latency; exit 1 when a step's check fails.")] = False,
    ) -> None:
        """Run the live demo: HAProxy roundrobin, leastconn, KnapsackLB weights (layer 4), then HTTP leastconn
        with the learned weights; print a comparison and write OUT/report.json and OUT/demo.png."""
        from knapsack_lb.cli.output import stdout_console
        from knapsack_lb.errors import InvalidInputError
        from knapsack_lb.lab.demo.runner import DemoAborted, run
        from knapsack_lb.lab.demo.settings import DemoSettings
        from knapsack_lb.service.logs import configure_logging

        console = stdout_console()
        configure_logging("WARNING")
        if ops:
            from knapsack_lb.lab.demo.ops import OpsSettings, run_ops

            ops_settings = (OpsSettings.quick_preset(seed=seed, light_requests=light_requests) if quick
                            else OpsSettings(seed=seed, light_requests=light_requests))
            if phase_seconds is not None:
                ops_settings = replace(ops_settings, step_seconds=phase_seconds)
            try:
                report = run_ops(ops_settings, out, console)
            except FileNotFoundError as exc:
                console.print(f"[red]missing dependency[/red]: {exc}")
                raise typer.Exit(2) from None
            raise typer.Exit(0 if report["passed"] else 1)
        try:
            settings = (DemoSettings.quick_preset(seed=seed, light_requests=light_requests) if quick
                        else DemoSettings(seed=seed, light_requests=light_requests))
            if phase_seconds is not None:
                settings = replace(settings, phase_seconds=phase_seconds)
        except InvalidInputError as exc:
            console.print(f"[red]invalid option[/red]: {exc}")
            raise typer.Exit(2) from None
        try:
            run(settings, out, console)
        except (DemoAborted, KeyboardInterrupt) as exc:
            console.print(f"[red]demo aborted[/red]: {exc}")
            raise typer.Exit(1) from None
        except FileNotFoundError as exc:  # a missing binary (haproxy, redis-server)
            console.print(f"[red]missing dependency[/red]: {exc}")
            raise typer.Exit(2) from None
