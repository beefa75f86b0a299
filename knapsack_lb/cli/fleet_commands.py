"""`klb bench fleet`: real controller processes sharing a seeded fleet of VIPs on one store."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from knapsack_lb.cli.output import stdout_console
from knapsack_lb.errors import KnapsackLBError

EXIT_INVALID = 2


def bench_fleet_command(
    full: bool = typer.Option(False, "--full", help="The full fleet: 3,410 VIPs, 60,000 DIPs (default: 100 VIPs, "
                              "1,000 DIPs, for CI)."),
    vips: int = typer.Option(None, help="VIPs of the fleet (overrides --full's or the default's)."),
    dips: int = typer.Option(None, help="DIPs of the fleet, over all VIPs (overrides --full's or the default's)."),
    controllers: int = typer.Option(2, help="`klb controller` processes at the start."),
    writers: int = typer.Option(1, help="Processes writing the fluid model's probe rounds."),
    cluster: bool = typer.Option(False, "--cluster", help="Start a local Redis Cluster (3 masters, 3 replicas) on free "
                                 "loopback ports (default: one local redis-server)."),
    failover: bool = typer.Option(False, "--failover", help="With --cluster: SIGKILL a master mid-run (its replica "
                                  "takes over); report rounds lost and VIPs without a step for over two intervals."),
    redis: str = typer.Option(None, "--redis", help="Use this existing store (redis://host:port/db) instead of "
                              "starting one; the run's keys are deleted at the end."),
    redis_cluster: bool = typer.Option(False, "--redis-cluster", help="--redis names a node of a Redis Cluster."),
    seconds: float = typer.Option(60.0, help="Seconds the controllers run."),
    interval: float = typer.Option(5.0, help="Probe and controller interval (seconds)."),
    lease_ttl: float = typer.Option(None, help="Controllers' loop.lease_ttl (default: the controller's default)."),
    join: bool = typer.Option(True, "--join/--no-join", help="Start one more controller a quarter into the run."),
    kill: bool = typer.Option(True, "--kill/--no-kill", help="SIGKILL the first controller 55% into the run."),
    probe_requests: int = typer.Option(100, help="Requests per DIP per fluid probe round."),
    seed: int = typer.Option(0, help="Seed of the fleet and of the fluid model's noise."),
    out: Path = typer.Option(Path("fleet-out"), help="Directory for fleet.json, fleet.png and the processes' logs."),
    as_json: bool = typer.Option(False, "--json", help="Print the full result as JSON on stdout."),
) -> None:
    """Real `klb controller` processes sharing a seeded fleet through leases; fluid rounds written as probes write.

    Reports time until every VIP has a plan, round-to-step lag, VIP steps per CPU-second per
    controller process, store operations and memory per DIP, and rebalancing when a controller
    joins, is SIGKILLed or (with --failover) a cluster master dies.
    """
    from knapsack_lb.lab.bench.fleet import FULL_FLEET, SMALL_FLEET, FleetBenchOptions, run_fleet_bench

    size = FULL_FLEET if full else SMALL_FLEET
    try:
        options = FleetBenchOptions(
            vips=vips or size[0], dips=dips or size[1], controllers=controllers, writers=writers, cluster=cluster,
            failover=failover, redis=redis, redis_cluster=redis_cluster, seconds=seconds, interval=interval,
            lease_ttl=lease_ttl, join=join, kill=kill, probe_requests=probe_requests, seed=seed,
        )
        out.mkdir(parents=True, exist_ok=True)
        count = TextColumn("{task.completed:.0f}/{task.total:.0f}")
        with Progress(TextColumn("{task.description}"), BarColumn(), count, TimeElapsedColumn(),
                      console=Console(stderr=True), transient=True) as bar:
            tasks: dict[str, TaskID] = {}
            labels = {"build": "building the fleet (DIPs)", "configure": "writing VIP configurations",
                      "run": "controllers running (s)"}

            def progress(phase: str, done: float, total: float) -> None:
                if phase not in tasks:
                    tasks[phase] = bar.add_task(labels.get(phase, phase), total=total)
                bar.update(tasks[phase], completed=done)

            result = run_fleet_bench(options, out, progress)
    except KnapsackLBError as exc:
        Console(stderr=True).print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(EXIT_INVALID) from None
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
        return
    stdout_console().print(summary(result), highlight=False)


def summary(result: dict[str, object]) -> str:
    """A few lines for the terminal; the JSON has everything."""
    r: dict[str, object] = result
    lag = r["lag"]
    memory = r["memory"]
    assert isinstance(lag, dict) and isinstance(memory, dict)
    lines = [
        f"fleet: {r['fleet']}",
        f"time until every VIP has a plan: {r['time_to_all_planned_seconds']} s",
        f"lag p50 {lag['p50_seconds']} s, p99 {lag['p99_seconds']} s over {lag['steps']} steps",
        f"VIP steps per CPU-second (all controllers): {r['steps_per_cpu_second']}",
        f"store ops/s: {r['store_ops']}",
        f"memory per DIP: {memory['bytes_per_dip_measured']} B measured; at retention: {memory['at_retention']}",
        f"rebalance: {r['rebalance']}",
        f"failover: {r['failover']}",
        f"files: {r['files']}",
    ]
    return "\n".join(lines)


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add this module's benchmark to ``bench_app``."""
    bench_app.command("fleet")(bench_fleet_command)
