"""`klb probe` (run a probe worker, the paper's KLM), `klb bench probes` and `klb bench light-probes`.

``klb probe --redis URL --worker-id ID [--vip NAME ...]`` reads the VIP configurations
from the latency store and probes the DIPs it leases until interrupted (or ``--duration``
seconds). Options are named so that a ``--config FILE`` can be added later with the same
meaning (the file's ``redis.url``/``redis.namespace``/``probes.*`` fields).
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Annotated

import typer

from knapsack_lb.errors import InvalidInputError


def _run_worker(redis: str, namespace: str, worker_id: str | None, vips: list[str], max_buffered_rounds: int,
                lease_ttl: float | None, max_concurrency: int, duration: float | None, cluster: bool = False) -> int:
    from knapsack_lb.cli.service_commands import check_store_at_start
    from knapsack_lb.config import ProbeWorkerSettings, redis_settings_from_options
    from knapsack_lb.store.redis import RedisLatencyStore
    from probes.worker import ProbeWorker, ProbeWorkerOptions

    worker = ProbeWorkerSettings(worker_id=worker_id).resolved_worker_id()
    options = ProbeWorkerOptions(worker_id=worker, vips=tuple(vips), max_buffered_rounds=max_buffered_rounds,
                                 lease_ttl=lease_ttl, max_concurrency=max_concurrency)
    settings = redis_settings_from_options(redis, namespace, cluster)
    if not check_store_at_start(settings):
        return 2
    store = RedisLatencyStore.from_settings(settings)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await ProbeWorker(store, options).run(stop, duration=duration)
        finally:
            await store.close()

    asyncio.run(main())
    return 0


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add this module's commands to ``app`` and its benchmarks to ``bench_app``."""

    @app.command("probe")
    def probe(
        config: Annotated[Path | None, typer.Option(
            "--config", "-c", help="YAML configuration file: run its probe worker (other options ignored).")
        ] = None,
        redis: Annotated[str, typer.Option(help="Redis URL of the latency store.")] = "redis://127.0.0.1:6379/0",
        redis_cluster: Annotated[bool, typer.Option(
            "--redis-cluster", help="--redis names a node of a Redis Cluster (the file's redis.cluster).")] = False,
        namespace: Annotated[str, typer.Option(help="Key namespace in Redis.")] = "klb",
        worker_id: Annotated[str | None, typer.Option(help="Worker identity (default <hostname>-<pid>).")] = None,
        vip: Annotated[list[str] | None, typer.Option(help="Probe only this VIP (repeatable; default all).")] = None,
        max_buffered_rounds: Annotated[int, typer.Option(help="Rounds held while Redis is down.")] = 1000,
        lease_ttl: Annotated[float | None, typer.Option(help="DIP lease TTL, s (default 0.5 x interval).")] = None,
        max_concurrency: Annotated[int, typer.Option(help="DIPs probed at once.")] = 256,
        duration: Annotated[float | None, typer.Option(help="Stop after this many seconds.")] = None,
        log_format: Annotated[str, typer.Option(help="text or json.")] = "text",
        log_level: Annotated[str, typer.Option(help="Logging level.")] = "INFO",
    ) -> None:
        """Run a probe worker (KLM): measure the DIPs of the VIPs in the store and write rounds to it."""
        if config is not None:
            from knapsack_lb.cli.service_commands import run_services

            raise typer.Exit(run_services(config, probes=True, controller=False, api=False))
        from knapsack_lb.service.logs import configure_logging

        configure_logging(log_level, json_lines=log_format == "json")
        try:
            code = _run_worker(redis, namespace, worker_id, vip or [], max_buffered_rounds, lease_ttl,
                               max_concurrency, duration, cluster=redis_cluster)
        except (InvalidInputError, ValueError) as bad:
            typer.echo(f"klb probe: {bad}", err=True)
            raise typer.Exit(2) from None
        raise typer.Exit(code)

    @bench_app.command("probes")
    def bench_probes(
        dips: Annotated[int, typer.Option(help="Emulated DIPs.")] = 20,
        seconds: Annotated[float, typer.Option(help="Seconds per phase (throughput; 2 ms; 20 ms).")] = 10.0,
        requests_per_round: Annotated[int, typer.Option(help="Probe requests per DIP per round.")] = 100,
        realtime: Annotated[bool, typer.Option(
            help="Run the accuracy phases' emulators under SCHED_FIFO (when allowed) so they keep their latency."
        )] = True,
        noisy_neighbours: Annotated[int, typer.Option(
            help="Background processes alternating 0.2-3 ms of CPU and 0.1-3 ms of sleep during every phase "
                 "(a busy machine on purpose; 4 keep two cores at a load of about 2)."
        )] = 0,
        json_output: Annotated[bool, typer.Option("--json", help="One-line JSON (default: indented JSON).")] = False,
        sizing: Annotated[bool, typer.Option(
            "--sizing", help="Instead: find how many DIPs one worker serves at --requests-per-round per --interval "
                             "(the paper's 100 per 5 s), doubling from --start-dips up to --max-dips, then bisecting."
        )] = False,
        start_dips: Annotated[int, typer.Option(help="--sizing: DIPs of the first step.")] = 25,
        max_dips: Annotated[int, typer.Option(help="--sizing: never more DIPs than this.")] = 800,
        interval: Annotated[float, typer.Option(help="--sizing: probe interval, s (the paper's 5).")] = 5.0,
        rounds: Annotated[int, typer.Option(help="--sizing: rounds per step.")] = 3,
        max_seconds: Annotated[float, typer.Option(help="--sizing: start no step after this many seconds.")] = 600.0,
        worker_concurrency: Annotated[int, typer.Option(
            help="--sizing: the worker's max_concurrency (DIPs probed at once; the worker's default 256)."
        )] = 256,
    ) -> None:
        """Probe requests per CPU-second and probe latency error against emulated DIPs (prints JSON).

        With --sizing: the largest number of DIPs one probe worker process serves while keeping
        the round cadence (every round on time, every request answered), against emulated DIPs
        on loopback, with the worker's CPU share and a per-core projection.
        """
        from rich.console import Console
        from rich.progress import Progress

        from knapsack_lb.lab.bench.probes import run_probe_benchmark, run_probe_sizing

        if sizing:
            with Progress(console=Console(stderr=True), transient=True) as progress:
                task = progress.add_task("probe sizing", total=None)

                def on_step(n: int, elapsed: float) -> None:
                    progress.update(task, description=f"probe sizing: {n} DIPs ({elapsed:.0f} s so far)")

                try:
                    result = run_probe_sizing(start_dips=start_dips, max_dips=max_dips, interval=interval,
                                              requests_per_round=requests_per_round, rounds=rounds,
                                              max_seconds=max_seconds, max_concurrency=worker_concurrency,
                                              on_step=on_step)
                except ValueError as bad:
                    progress.stop()
                    typer.echo(f"klb bench probes: {bad}", err=True)
                    raise typer.Exit(2) from None
            typer.echo(json.dumps(result, indent=None if json_output else 2))
            return

        phases = 3
        with Progress(console=Console(stderr=True), transient=True) as progress:
            task = progress.add_task("probe benchmark", total=phases)

            def on_phase(description: str) -> None:
                done = progress.tasks[0].description != "probe benchmark"
                progress.update(task, description=description, advance=1 if done else 0)

            try:
                result = run_probe_benchmark(dips=dips, seconds=seconds, requests_per_round=requests_per_round,
                                             realtime=realtime, noisy_neighbours=noisy_neighbours,
                                             on_phase=on_phase)
            except ValueError as bad:
                progress.stop()
                typer.echo(f"klb bench probes: {bad}", err=True)
                raise typer.Exit(2) from None
        typer.echo(json.dumps(result, indent=None if json_output else 2))

    @bench_app.command("light-probes")
    def bench_light_probes(
        probes: Annotated[int, typer.Option(help="Light probes per case (simulated).")] = 4000,
        seed: Annotated[int, typer.Option(help="Seed of the arrivals and service times.")] = 1,
        live: Annotated[bool, typer.Option("--live", help="Probe real emulated DIPs over loopback instead.")] = False,
        seconds: Annotated[float, typer.Option(help="Seconds of loaded probing per live case.")] = 30.0,
        light_work: Annotated[float, typer.Option(help="Seconds of fixed work per live light probe.")] = 0.001,
        plot_path: Annotated[Path | None, typer.Option("--plot", help="PNG of the reads per case.")] = None,
        json_output: Annotated[bool, typer.Option("--json", help="One-line JSON (default: indented JSON).")] = False,
    ) -> None:
        """What light probes of fixed work tell of a DIP's capacity, against rounds of the application's
        requests: one simulated DIP per case (1, 4, 16 workers; 50, 70, 85 %; FCFS and processor
        sharing; exponential, lognormal, fixed service), or with --live one emulated DIP per case
        under an open-loop client (8 cases, about 45 s each). Prints JSON."""
        from rich.console import Console
        from rich.progress import Progress

        from knapsack_lb.lab.bench import light_probes, light_probes_live

        with Progress(console=Console(stderr=True), transient=True) as progress:
            try:
                if live:
                    live_cases = light_probes_live.default_live_cases(light_work)
                    task = progress.add_task("live light probes", total=len(live_cases))
                    result = light_probes_live.run_live_light_probes(live_cases, seconds=seconds, seed=seed,
                                                                     on_case=lambda _case: progress.advance(task))
                else:
                    cases = light_probes.default_cases()
                    task = progress.add_task("light probes", total=len(cases))
                    result = light_probes.run_light_probes(cases, probes=probes, seed=seed,
                                                           on_case=lambda _case: progress.advance(task))
            except InvalidInputError as bad:
                progress.stop()
                typer.echo(f"klb bench light-probes: {bad}", err=True)
                raise typer.Exit(2) from None
        if plot_path is not None:
            (light_probes_live if live else light_probes).plot(result, plot_path)
        typer.echo(json.dumps(result, indent=None if json_output else 2))
