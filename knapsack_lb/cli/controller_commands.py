"""`klb controller` (the controller service) and `klb bench controller`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from knapsack_lb.cli.output import stdout_console
from knapsack_lb.errors import KnapsackLBError

EXIT_INVALID = 2
# The names of knapsack_lb.lab.bench.controller.SCENARIOS, kept here so that `klb --help` does not import the
# controller (scikit-learn, scipy: seconds); tests/unit/controller/test_cli_lazy.py checks they agree.
SCENARIO_NAMES = ("paper30", "two-dip", "dynamics", "operator")


def _fail(exc: Exception) -> typer.Exit:
    Console(stderr=True).print(f"[red]error:[/red] {exc}", highlight=False)
    return typer.Exit(EXIT_INVALID)


def controller_command(
    config: Path = typer.Option(None, "--config", "-c", help="YAML configuration file: run the controller it "
                                "describes (the other options but --controller-id are ignored)."),
    redis: str = typer.Option(None, "--redis", help="Latency store, e.g. redis://127.0.0.1:6379/0."),
    redis_cluster: bool = typer.Option(False, "--redis-cluster", help="--redis names a node of a Redis Cluster "
                                       "(the file's redis.cluster)."),
    controller_id: str = typer.Option(None, "--controller-id", help="This process's identity in leases (default: "
                                      "the file's controller_id, else '<hostname>-<pid>-<random>')."),
    namespace: str = typer.Option("klb", help="Key namespace in Redis."),
    interval: float = typer.Option(None, help="Seconds between steps per VIP (default: the settings' 5 s)."),
    max_rounds: int = typer.Option(None, help="Stop after this many passes (default: run until SIGINT/SIGTERM)."),
) -> None:
    """Run the controller service: learn curves, solve, push weights, for every VIP it can lease."""
    if config is not None:
        from knapsack_lb.cli.service_commands import run_services

        raise typer.Exit(run_services(config, probes=False, controller=True, api=False, controller_id=controller_id))
    if redis is None:
        raise _fail(ValueError("give --config FILE or --redis URL"))
    from knapsack_lb.cli.service_commands import check_store_at_start
    from knapsack_lb.config import redis_settings_from_options
    from knapsack_lb.controller.settings import ControllerSettings, LoopSettings
    from knapsack_lb.service.controller import run_controller_service
    from knapsack_lb.store.redis import RedisLatencyStore

    try:
        settings = ControllerSettings(loop=LoopSettings() if interval is None else LoopSettings(interval=interval))
        redis_settings = redis_settings_from_options(redis, namespace, redis_cluster)
    except (KnapsackLBError, ValueError) as exc:
        raise _fail(exc) from None
    if not check_store_at_start(redis_settings):
        raise typer.Exit(EXIT_INVALID)
    store = RedisLatencyStore.from_settings(redis_settings)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        try:
            await run_controller_service(store, settings, controller_id=controller_id, stop=stop,
                                         max_rounds=max_rounds)
        finally:
            await store.close()

    try:
        asyncio.run(main())
    except KnapsackLBError as exc:
        raise _fail(exc) from None


def bench_controller_command(
    scenario: str = typer.Option("paper30", help=f"One of {', '.join(SCENARIO_NAMES)}."),
    seed: int = typer.Option(1, help="Seed of the pool's capacities and of the probe noise."),
    paper: bool = typer.Option(False, "--paper", help="The paper's settings (quadratic curves, no rails)."),
    as_json: bool = typer.Option(False, "--json", help="Print the full result as JSON on stdout."),
) -> None:
    """Run a controller scenario end to end in virtual time on the fluid model."""
    from knapsack_lb.controller.settings import ControllerSettings
    from knapsack_lb.lab.bench.controller import expected_rounds, run_scenario, summarise

    settings = ControllerSettings.paper() if paper else ControllerSettings()
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:.0f} s virtual"),
                      TimeElapsedColumn(), console=Console(stderr=True), transient=True) as progress:
            task = progress.add_task(f"controller {scenario}", total=expected_rounds(scenario) * settings.loop.interval)
            result = run_scenario(scenario, seed=seed, settings=settings,
                                  on_tick=lambda now: progress.update(task, completed=now))
    except KnapsackLBError as exc:
        raise _fail(exc) from None
    result["settings"] = "paper" if paper else "default"
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        stdout_console().print(summarise(result), highlight=False)


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add this module's commands to ``app`` and its benchmarks to ``bench_app``."""
    app.command("controller")(controller_command)
    bench_app.command("controller")(bench_controller_command)
