"""`klb run`, `klb api`, `klb check` and `klb config-reference`.

``run`` starts probes, controller and admin API in one process; ``api`` only the API;
``check`` validates a configuration and the reachability of Redis, every DIP's probe URL
and each VIP's load balancer (``adapter.check()``) without changing anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import httpx
import typer
from rich.console import Console
from rich.table import Table

from knapsack_lb.cli.output import stdout_console
from knapsack_lb.config import (
    ConfigError,
    KlbConfig,
    RedisSettings,
    load_config,
    reference_markdown,
    require_safe_listen,
)
from knapsack_lb.errors import InvalidInputError
from knapsack_lb.names import validate_name
from knapsack_lb.service.logs import configure_logging

if TYPE_CHECKING:
    from knapsack_lb.model import Balancing

STORE_CHECK_TIMEOUT = 5.0  # seconds `klb check` and a starting process wait for the store to answer
ConfigOption = Annotated[Path, typer.Option("--config", "-c", help="YAML configuration file.")]


def _load(path: Path) -> KlbConfig:
    try:
        return load_config(path)
    except ConfigError as exc:
        Console(stderr=True).print(f"[red]configuration error[/red]: {exc}")
        raise typer.Exit(2) from None


def _token(config: KlbConfig) -> str | None:
    try:
        token = config.api.resolve_token()
        if config.api.enabled:
            require_safe_listen(config.api.host, token)
        return token
    except InvalidInputError as exc:
        Console(stderr=True).print(f"[red]configuration error[/red]: {exc}")
        raise typer.Exit(2) from None


@dataclass(frozen=True)
class CheckItem:
    """One line of ``klb check``."""

    what: str
    target: str
    ok: bool
    detail: str


async def _check_redis(config: KlbConfig) -> CheckItem:
    """The store answers and is what ``redis.cluster`` says (one Redis, or a healthy Redis Cluster)."""
    from knapsack_lb.store.redis import RedisLatencyStore, redacted_url

    target = redacted_url(config.redis.url) + (" (cluster)" if config.redis.cluster else "")
    try:
        store = RedisLatencyStore.from_settings(config.redis)
    except Exception as exc:  # an unusable URL is reported, not raised
        return CheckItem("redis", target, False, f"cannot create a client: {exc}")
    try:
        described = await asyncio.wait_for(store.verify(), timeout=STORE_CHECK_TIMEOUT)
        vips = await store.list_vips()
        return CheckItem("redis", target, True, f"{described}; {len(vips)} VIP(s) stored")
    except TimeoutError:
        return CheckItem("redis", target, False, f"redis.url {redacted_url(config.redis.url)}: no answer within "
                         f"{STORE_CHECK_TIMEOUT:g} s")
    except Exception as exc:
        return CheckItem("redis", target, False, f"{type(exc).__name__}: {exc}")
    finally:
        with contextlib.suppress(Exception):  # closing a never-connected client may fail
            await store.close()


def check_store_at_start(settings: RedisSettings) -> bool:
    """Before a process starts its components: False (and the reason on standard error, naming the
    setting and the URL) when the store is misconfigured, e.g. a plain Redis with ``redis.cluster:
    true``: no retry can fix that. A store that is down or a cluster that is failing is reported
    too, but True: the components start anyway and retry, as they do through any outage."""
    from knapsack_lb.errors import StoreUnavailableError
    from knapsack_lb.store.redis import RedisLatencyStore, redacted_url

    async def verify() -> str:
        store = RedisLatencyStore.from_settings(settings)
        try:
            return await asyncio.wait_for(store.verify(), timeout=STORE_CHECK_TIMEOUT)
        finally:
            with contextlib.suppress(Exception):
                await store.close()

    console = Console(stderr=True)
    try:
        asyncio.run(verify())
    except InvalidInputError as exc:
        console.print(f"[red]configuration error[/red]: {exc}", highlight=False)
        return False
    except (StoreUnavailableError, TimeoutError) as exc:
        reason = str(exc) or f"redis.url {redacted_url(settings.url)}: no answer within {STORE_CHECK_TIMEOUT:g} s"
        console.print(f"[yellow]latency store not ready[/yellow]: {reason}; starting anyway and retrying",
                      highlight=False)
    return True


async def _check_dips(config: KlbConfig) -> list[CheckItem]:
    items: list[CheckItem] = []
    async with httpx.AsyncClient(follow_redirects=False) as client:

        async def one(vip_name: str, dip_name: str, url: str, method: str, headers: dict[str, str],
                      expected: int, timeout: float) -> CheckItem:
            what = f"dip {vip_name}/{dip_name}"
            try:
                response = await client.request(method, url, headers=headers, timeout=max(timeout, 0.5))
            except httpx.HTTPError as exc:
                return CheckItem(what, url, False, f"{type(exc).__name__}: {exc or 'no answer'}")
            ok = response.status_code == expected
            detail = f"HTTP {response.status_code}" + ("" if ok else f", expected {expected}")
            return CheckItem(what, url, ok, detail)

        jobs = []
        for vip in config.vips:
            for dip in vip.dips:
                host, port = dip.host_port
                netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
                url = f"http://{netloc}{vip.probe.path}"
                jobs.append(one(vip.name, dip.name, url, vip.probe.method, dict(vip.probe.headers),
                                vip.probe.expected_status, vip.probe.timeout))
        items.extend(await asyncio.gather(*jobs))
    return items


def mapping_mismatch(dips: list[str], carried: Mapping[str, float]) -> str:
    """Why the LB's servers (``carried``: the adapter's ``read()``, keyed by the DIP each server maps
    to, or by the server's own name when none does) do not match the VIP's DIPs; ``""`` when they
    do, or when the LB carries nothing yet (a file the adapter writes on its first apply)."""
    if not carried:
        return ""
    unmapped = sorted(set(carried) - set(dips))
    missing = sorted(set(dips) - set(carried))
    problems = []
    if missing:
        problems.append(f"DIP(s) {missing} map to no server of the load balancer (adapter.servers)")
    if unmapped:
        problems.append(f"server(s) {unmapped} of the load balancer map to no DIP of the VIP: map them in "
                        "adapter.servers or take them out of the pool (the controller sets them to 0)")
    return "; ".join(problems)


def balancing_mismatch(vip: Balancing, lb: Balancing | None, detail: str) -> str:
    """Why the VIP's ``balancing`` does not match what its LB does with a weight (``lb``, None when
    the adapter cannot tell), or ``""``: the controller's plans mean something else to such an LB."""
    if lb is None or lb == vip:
        return ""
    return (f"the load balancer uses its weights as {lb.replace('_', ' ')} ({detail}) but the VIP's balancing "
            f"is {vip!r}: set balancing: {lb} on the VIP (or change the LB's algorithm)")


async def _check_adapters(config: KlbConfig) -> list[CheckItem]:
    """Each VIP's load balancer, through its adapter's read-only ``check`` (the operator's binaries
    in read-only modes only, e.g. ``nginx -t``; nothing is written, signalled or started)."""
    from knapsack_lb.service.adapters import adapter_factory, close_adapter

    build = adapter_factory(config.load_balancers)
    items = []
    for vip in config.vips:
        what = f"lb {vip.name}"
        target = vip.adapter.lb or "-"
        if vip.adapter.lb is None:
            items.append(CheckItem(what, target, False, "the VIP selects no load balancer (adapter.lb): its plans "
                                   "would be pushed nowhere"))
            continue
        try:
            adapter = build(vip)
        except InvalidInputError as exc:
            items.append(CheckItem(what, target, False, str(exc)))
            continue
        try:
            result = await asyncio.wait_for(asyncio.to_thread(adapter.check), timeout=15.0)
            detail = result.detail or ("ok" if result.ok else "check failed")
            ok = bool(result.ok)
            if ok:
                carried = await asyncio.wait_for(asyncio.to_thread(adapter.read), timeout=15.0)
                problem = mapping_mismatch([d.name for d in vip.dips], carried) or balancing_mismatch(
                    vip.balancing, result.balancing, detail)
                ok, detail = (False, problem) if problem else (True, detail)
            items.append(CheckItem(what, target, ok, detail))
        except Exception as exc:
            items.append(CheckItem(what, target, False, f"{type(exc).__name__}: {exc}"))
        finally:
            close_adapter(adapter)
    return items


async def run_checks(config: KlbConfig) -> list[CheckItem]:
    """Every check of ``klb check``; nothing is changed anywhere."""
    items = [CheckItem("config", f"{len(config.vips)} VIP(s)", True, "valid")]
    try:
        token = config.api.resolve_token()
        require_safe_listen(config.api.host, token)
        items.append(CheckItem("api", f"{config.api.host}:{config.api.port}", True,
                               "token configured" if token else "no token: read-only API on loopback"))
    except InvalidInputError as exc:
        items.append(CheckItem("api", f"{config.api.host}:{config.api.port}", False, str(exc)))
    redis_item, dips, lbs = await asyncio.gather(_check_redis(config), _check_dips(config), _check_adapters(config))
    return [*items, redis_item, *dips, *lbs]


def run_services(config: Path, *, probes: bool, controller: bool, api: bool, controller_id: str | None = None) -> int:
    """Run the chosen components of ``config`` in one process until SIGTERM/SIGINT; the exit code.

    ``klb run`` runs all three; ``klb probe --config`` and ``klb controller --config`` run one.
    ``controller_id`` replaces the file's.
    """
    from knapsack_lb.service.runner import ServiceRunner, api_component, controller_component, probe_component

    cfg = _load(config)
    if controller_id is not None:
        try:
            cfg = cfg.model_copy(update={"controller_id": validate_name("controller_id", controller_id)})
        except InvalidInputError as exc:
            Console(stderr=True).print(f"[red]error:[/red] {exc}", highlight=False)
            return 2
    if not check_store_at_start(cfg.redis):
        return 2
    configure_logging(cfg.logging.level, cfg.logging.json_lines)
    components = []
    if cfg.probes.enabled and probes:
        components.append(probe_component(cfg))
    if controller:
        components.append(controller_component(cfg))
    if cfg.api.enabled and api:
        components.append(api_component(cfg, _token(cfg)))
    if not components:
        Console(stderr=True).print("[red]nothing to run[/red]: every component is disabled")
        return 2
    return asyncio.run(ServiceRunner(cfg, components).run())


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add this module's commands to ``app`` and its benchmarks to ``bench_app``."""

    @app.command("run")
    def run_command(
        config: ConfigOption,
        no_probes: Annotated[bool, typer.Option("--no-probes", help="Do not run a probe worker.")] = False,
        no_controller: Annotated[bool, typer.Option("--no-controller", help="Do not run the controller.")] = False,
        no_api: Annotated[bool, typer.Option("--no-api", help="Do not serve the admin API.")] = False,
    ) -> None:
        """Run probes, controller and admin API in one process until SIGTERM/SIGINT."""
        raise typer.Exit(run_services(config, probes=not no_probes, controller=not no_controller, api=not no_api))

    @app.command("api")
    def api_command(config: ConfigOption) -> None:
        """Serve only the admin API (and dashboard) until SIGTERM/SIGINT."""
        from knapsack_lb.service.runner import ServiceRunner, api_component

        cfg = _load(config)
        configure_logging(cfg.logging.level, cfg.logging.json_lines)
        raise typer.Exit(asyncio.run(ServiceRunner(cfg, [api_component(cfg, _token(cfg))]).run()))

    @app.command("check")
    def check_command(
        config: ConfigOption,
        as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    ) -> None:
        """Validate a configuration and the reachability of Redis, every DIP and each LB; change nothing.

        Exit code 0 when everything is fine, 1 when something is unreachable, 2 when the file is invalid.
        """
        cfg = _load(config)
        items = asyncio.run(run_checks(cfg))
        failed = [i for i in items if not i.ok]
        if as_json:
            print(json.dumps({"ok": not failed, "checks": [asdict(i) for i in items]}, indent=2))
        else:
            table = Table(title=f"klb check {config}")
            for column in ("check", "target", "result", "detail"):
                table.add_column(column)
            for item in items:
                table.add_row(item.what, item.target, "[green]ok[/green]" if item.ok else "[red]FAIL[/red]",
                              item.detail)
            console = stdout_console()
            console.print(table)
            console.print(f"{len(failed)} problem(s)" if failed else "all checks passed")
        raise typer.Exit(1 if failed else 0)

    @app.command("config-reference")
    def config_reference(
        output: Annotated[Path | None, typer.Option("--output", "-o", help="Write here instead of stdout.")] = None,
    ) -> None:
        """Print the configuration reference (docs/configuration.md) generated from the models."""
        text = reference_markdown()
        if output is None:
            sys.stdout.write(text)
        else:
            output.write_text(text)
