"""The one configuration file of a knapsack-lb deployment (YAML, validated with pydantic).

One file describes the latency store (Redis), the VIPs with their DIPs, probe URL and
adapter (:class:`knapsack_lb.model.VipConfig`, reused as is), the controller's knobs
(:class:`knapsack_lb.controller.settings.ControllerSettings`), the probe workers, the admin
API and logging. Every field carries its unit and default in its description;
``docs/configuration.md`` is generated from these models by :func:`reference_markdown`
(``klb config-reference``) and a test keeps the two in step.

The file is the *initial* source of VIPs: at start-up, VIPs missing from the store are
created from it; VIPs already in the store keep the state the admin API gave them (pins,
drains, added DIPs ...) unless ``vip_source: config`` says the file wins. So a restart
loses no operator change (KnapsackLB section 5: the store is the single source of truth).

Errors name the field and the value (:class:`ConfigError`), e.g.
``field 'vips.0.dips.1.address': ...``.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import socket
import types
import typing
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from knapsack_lb.controller.settings import ControllerSettings
from knapsack_lb.errors import InvalidInputError
from knapsack_lb.model import VipConfig
from knapsack_lb.names import parse_address, validate_host, validate_name
from knapsack_lb.plugins import ADAPTERS, load_plugin, validate_settings
from knapsack_lb.store import DEFAULT_PLAN_HISTORY, DEFAULT_RETENTION_COUNT, DEFAULT_RETENTION_SECONDS

DEFAULT_TOKEN_ENV = "KLB_API_TOKEN"


class ConfigError(InvalidInputError):
    """A configuration file that cannot be used; ``field`` is the dotted path of the bad field."""


class RedisSettings(BaseModel):
    """Where the latency store lives and how much history it keeps (KnapsackLB section 5)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    url: str = Field(
        "redis://127.0.0.1:6379/0",
        description="Redis URL (redis://host:port/db or rediss:// for TLS). Default redis://127.0.0.1:6379/0.",
    )
    namespace: str = Field(
        "klb", description="Key prefix; keys are '<namespace>:{<vip>}:...'. Two deployments on one Redis need two "
        "namespaces. Default klb."
    )
    measurement_retention_count: int = Field(
        DEFAULT_RETENTION_COUNT, ge=1, le=1_000_000,
        description=f"Probe rounds kept per DIP (count). Default {DEFAULT_RETENTION_COUNT} (10 min at 5 s; "
        "docs/sizing.md: memory per DIP).",
    )
    measurement_retention_age: float = Field(
        DEFAULT_RETENTION_SECONDS, gt=0,
        description=f"Probe rounds older than this are dropped (seconds). Default {DEFAULT_RETENTION_SECONDS:g}.",
    )
    plan_history: int = Field(
        DEFAULT_PLAN_HISTORY, ge=1, le=1_000_000,
        description=f"Plans kept per VIP in the plan history (count). Default {DEFAULT_PLAN_HISTORY}.",
    )
    cluster: bool = Field(
        False, description="The store is a Redis Cluster: url names one of its nodes (redis://host:port, database 0) "
        "and the cluster client follows slots, redirections and failovers (bool). Default false (one Redis).",
    )
    startup_nodes: tuple[str, ...] = Field(
        (), description="More nodes of the Redis Cluster ('host:port' list), tried when the url's node does not "
        "answer; only with cluster: true. Default: none (the url's node alone).",
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"must start with redis://, rediss:// or unix://, got {value!r}")
        return value

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        return validate_name("redis.namespace", value)

    @model_validator(mode="after")
    def _cluster(self) -> RedisSettings:
        from knapsack_lb.store.redis import cluster_url_problem

        if self.startup_nodes and not self.cluster:
            raise InvalidInputError("startup_nodes", list(self.startup_nodes), "are only used with a Redis Cluster: "
                                    "set redis.cluster: true or remove them")
        for index, node in enumerate(self.startup_nodes):
            try:
                parse_address(f"startup_nodes.{index}", node)
            except InvalidInputError as bad:  # name the whole entry, not only its bad part
                raise InvalidInputError(f"startup_nodes.{index}", node, f"must be 'host:port': {bad.problem}") from None
        problem = cluster_url_problem(self.url) if self.cluster else None
        if problem:
            raise InvalidInputError("url", self.url, f"with redis.cluster: true, {problem}")
        return self

    def startup_node_addresses(self) -> tuple[tuple[str, int], ...]:
        """``startup_nodes`` as (host, port) pairs."""
        return tuple(parse_address("redis.startup_nodes", node) for node in self.startup_nodes)


class ProbeWorkerSettings(BaseModel):
    """The probe worker (the paper's KLM, section 5). Per-VIP probe URL, N and interval are in
    each VIP's ``probe`` block; these are the worker's own settings."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    enabled: bool = Field(True, description="Run a probe worker inside `klb run` (bool). Default true.")
    worker_id: str | None = Field(
        None, description="Identity of this worker in leases and measurements (name). Default: '<hostname>-<pid>'."
    )
    max_buffered_rounds: int = Field(
        1000, ge=1, le=1_000_000, description="Probe rounds held in memory while Redis is unreachable; the oldest "
        "beyond this are dropped (count). Default 1000."
    )
    lease_ttl: float | None = Field(
        None, gt=0, le=3600, description="Seconds a worker's lease on a DIP lasts without renewal; a dead worker's "
        "DIPs are taken over after this (seconds). Default: half the shortest probe interval, so that a dead "
        "worker's DIPs are taken over within two intervals."
    )
    max_concurrency: int = Field(
        256, ge=1, le=100_000, description="DIPs probed at the same time by one worker (count). Default 256."
    )

    @field_validator("worker_id")
    @classmethod
    def _worker(cls, value: str | None) -> str | None:
        return None if value is None else validate_name("probes.worker_id", value)

    def resolved_worker_id(self) -> str:
        """``worker_id``, or '<hostname>-<pid>' made a valid name."""
        return self.worker_id or process_id("probes.worker_id")


def process_id(field: str, *, unique: bool = False) -> str:
    """'<hostname>-<pid>' made a valid name; with ``unique``, a random suffix as well, so that two
    processes never share it even across hosts with the same name and pid (containers)."""
    host = "".join(c if c.isalnum() or c in "._-" else "-" for c in socket.gethostname())[:40] or "host"
    suffix = f"-{secrets.token_hex(3)}" if unique else ""
    return validate_name(field, f"{host.lstrip('._-') or 'host'}-{os.getpid()}{suffix}")


class ApiSettings(BaseModel):
    """The admin API (FastAPI) and its dashboard."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    enabled: bool = Field(True, description="Serve the admin API inside `klb run` (bool). Default true.")
    host: str = Field(
        "127.0.0.1", description="Listen address (IP literal). A non-loopback address needs a token. Default 127.0.0.1."
    )
    port: int = Field(8080, ge=0, le=65535, description="Listen port (TCP; 0 = any free port). Default 8080.")
    token: SecretStr | None = Field(
        None, description="Bearer token for mutating calls (string). Prefer token_file or token_env. Default none."
    )
    token_file: Path | None = Field(
        None, description="File whose first line is the bearer token (path). Default none."
    )
    token_env: str = Field(
        DEFAULT_TOKEN_ENV, description="Environment variable read for the token when token and token_file are "
        f"unset (name). Default {DEFAULT_TOKEN_ENV}."
    )
    history_limit: int = Field(
        200, ge=1, le=10_000, description="Most plans / measurements one read returns (count). Default 200."
    )
    dashboard_refresh: float = Field(
        5.0, ge=0, le=3600, description="Seconds between dashboard refreshes in the browser (0 = never). Default 5."
    )
    max_body_bytes: int = Field(
        1_048_576, ge=1024, le=64 * 1_048_576, description="Largest request body accepted; larger ones get 413 "
        "(bytes). Default 1048576 (1 MiB)."
    )
    max_header_bytes: int = Field(
        16_384, ge=1024, le=1_048_576, description="Largest sum of request header lines accepted; more gets 431 "
        "(bytes). Default 16384."
    )
    max_dips_per_vip: int = Field(
        5000, ge=1, le=1_000_000, description="Most DIPs one VIP may have through the API (count). Default 5000."
    )
    dip_networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = Field(
        (), description="When set, DIP addresses written through the API must be IP literals inside one of these "
        "networks (CIDR list): the token cannot point a load balancer at other hosts. Default: any address."
    )

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(f"must be an IP address literal (e.g. 127.0.0.1 or ::1), got {value!r}") from None
        return value

    @model_validator(mode="after")
    def _one_token_source(self) -> ApiSettings:
        if self.token is not None and self.token_file is not None:
            raise ValueError("set api.token or api.token_file, not both")
        return self

    def resolve_token(self, environ: typing.Mapping[str, str] | None = None) -> str | None:
        """The bearer token from ``token``, ``token_file`` or the ``token_env`` variable (in that order)."""
        if self.token is not None:
            text = self.token.get_secret_value().strip()
        elif self.token_file is not None:
            try:
                text = self.token_file.read_text().splitlines()[0].strip() if self.token_file.exists() else ""
            except (OSError, IndexError):
                text = ""
            if not text:
                raise ConfigError("api.token_file", str(self.token_file), "is missing, unreadable or empty")
        else:
            text = (os.environ if environ is None else environ).get(self.token_env, "").strip()
        if not text:
            return None
        if len(text) < 16 or any(c.isspace() for c in text):
            raise ConfigError("api.token", "<hidden>", "must be at least 16 characters without whitespace")
        return text


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8 and ::1."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def require_safe_listen(host: str, token: str | None) -> None:
    """Refuse to serve the admin API on a non-loopback address without a token."""
    validate_host("api.host", host)
    if token is None and not is_loopback(host):
        raise ConfigError(
            "api.host", host, "listening on a non-loopback address needs a token (api.token, api.token_file or "
            "the api.token_env variable)",
        )


class LoadBalancerConfig(BaseModel):
    """A load balancer the operator lets knapsack-lb program: its adapter and that adapter's settings.

    Everything that names a binary, a file, a socket, a listen address, a URL or an environment
    variable lives here, in the file the operator owns; VIPs (also those written through the
    admin API) select a load balancer by name and may set only the adapter's ``vip_fields``.
    Validation builds nothing: no connection, no listener, no file written, no variable read.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    adapter: str = Field(description="Adapter entry point (group knapsack_lb.adapters): haproxy, nginx, envoy, "
                         "powerdns, recording or a third party's.")
    settings: dict[str, Any] = Field(default_factory=dict, description="The adapter's settings (docs/adapters.md).")

    @field_validator("adapter")
    @classmethod
    def _adapter(cls, value: str) -> str:
        return validate_name("adapter", value)

    @model_validator(mode="after")
    def _settings_valid(self) -> LoadBalancerConfig:
        validate_settings(adapter_settings_model(self.adapter), self.settings, "settings")
        return self


def adapter_settings_model(adapter: str) -> type[BaseModel]:
    """The settings model of the adapter registered as ``adapter`` (entry point group knapsack_lb.adapters)."""
    cls = load_plugin(ADAPTERS, adapter, "adapter")
    model = getattr(cls, "Settings", None)
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise InvalidInputError("adapter", adapter, "this adapter declares no Settings model (pydantic)")
    return model


def adapter_settings_for(
    load_balancers: Mapping[str, LoadBalancerConfig], vip: VipConfig
) -> tuple[str, dict[str, Any]]:
    """The adapter name and the merged, validated settings that push ``vip``'s plans: the DIPs'
    defaults (e.g. their addresses), then the operator's load balancer, then the VIP's own part.

    :class:`InvalidInputError` names ``adapter.lb`` (no such load balancer) or
    ``adapter.settings.<field>`` (a field the VIP may not set, or a bad value)."""
    spec = vip.adapter
    if spec.lb is None:
        raise InvalidInputError("adapter.lb", None, "the VIP selects no load balancer: plans cannot be pushed")
    lb = load_balancers.get(spec.lb)
    if lb is None:
        raise InvalidInputError(
            "adapter.lb", spec.lb, f"no such load balancer in the configuration file; defined: {sorted(load_balancers)}"
        )
    model = adapter_settings_model(lb.adapter)
    allowed: frozenset[str] = getattr(model, "vip_fields", frozenset())
    for key in spec.settings:
        if key not in allowed:
            raise InvalidInputError(
                f"adapter.settings.{key}", "<not shown>", f"is operator-owned: set it in load_balancers.{spec.lb}."
                f"settings of the configuration file; a VIP may set only {sorted(allowed)}",
            )
    defaults_for = getattr(model, "defaults_for", None)
    defaults: dict[str, Any] = defaults_for(vip.dips) if callable(defaults_for) else {}
    merged = {**defaults, **lb.settings, **spec.settings}
    validate_settings(model, merged, "adapter.settings")
    return lb.adapter, merged


class LoggingSettings(BaseModel):
    """Structured logs on standard error."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, allow_inf_nan=False, validate_by_name=True, validate_by_alias=True
    )

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="Lowest level written (DEBUG, INFO, WARNING, ERROR). Default INFO."
    )
    json_lines: bool = Field(
        False, alias="json", description="One JSON object per line instead of text (bool). Default false."
    )


class KlbConfig(BaseModel):
    """The whole configuration file."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    redis: RedisSettings = Field(default_factory=RedisSettings, description="The latency store.")
    load_balancers: dict[str, LoadBalancerConfig] = Field(
        default_factory=dict, description="The load balancers knapsack-lb may program, by name (operator-owned: the "
        "admin API can only select one for a VIP)."
    )
    vips: tuple[VipConfig, ...] = Field(
        default=(), description="VIPs with their DIPs, probe spec and adapter (see the VIP fields below)."
    )
    vip_source: Literal["store-first", "config"] = Field(
        "store-first", description="At start-up: store-first creates VIPs missing from the store and keeps the "
        "stored ones (admin API changes survive restarts); config overwrites stored VIPs with the file. Default "
        "store-first."
    )
    controller: ControllerSettings = Field(default_factory=ControllerSettings, description="Controller knobs.")
    controller_id: str | None = Field(
        None, description="Identity of this controller process in leases (name); two live processes never share "
        "one (the second waits until the first's identity lease expires). Default: '<hostname>-<pid>-<random>'."
    )
    probes: ProbeWorkerSettings = Field(default_factory=ProbeWorkerSettings, description="The probe worker.")
    api: ApiSettings = Field(default_factory=ApiSettings, description="The admin API.")
    logging: LoggingSettings = Field(default_factory=LoggingSettings, description="Logging.")

    @field_validator("controller_id")
    @classmethod
    def _controller_id(cls, value: str | None) -> str | None:
        return None if value is None else validate_name("controller_id", value)

    def resolved_controller_id(self) -> str:
        """``controller_id``, or a unique '<hostname>-<pid>-<random>'."""
        return self.controller_id or process_id("controller_id", unique=True)

    @field_validator("load_balancers")
    @classmethod
    def _lb_names(cls, value: dict[str, LoadBalancerConfig]) -> dict[str, LoadBalancerConfig]:
        for name in value:
            validate_name("load_balancers", name)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> KlbConfig:
        names = [v.name for v in self.vips]
        if len(set(names)) != len(names):
            duplicates = sorted(name for name, count in Counter(names).items() if count > 1)
            raise ValueError(f"vips: duplicate VIP names {duplicates}")
        for index, vip in enumerate(self.vips):
            if vip.adapter.lb is None:
                continue
            try:
                adapter_settings_for(self.load_balancers, vip)
            except InvalidInputError as exc:
                raise InvalidInputError(f"vips.{index}.{exc.field}", exc.value, exc.problem) from None
        return self


def error_field(error: Any) -> tuple[str, object]:
    """The dotted path and the value a pydantic error is about. A validator that raised
    :class:`InvalidInputError` adds the field it named below the error's location
    (``load_balancers.web`` + ``settings.binary``)."""
    path = ".".join(str(part) for part in error["loc"])
    inner = (error.get("ctx") or {}).get("error")
    if isinstance(inner, InvalidInputError) and inner.field:
        if not path.endswith(inner.field.split(".")[-1]):
            path = f"{path}.{inner.field}" if path else inner.field
        return path, inner.value
    return path or "<root>", error.get("input")


def error_message(error: Any) -> str:
    """A pydantic error's message without the 'Value error, ' prefix and without repeating the value."""
    inner = (error.get("ctx") or {}).get("error")
    if isinstance(inner, InvalidInputError):
        return inner.problem
    return str(error["msg"]).removeprefix("Value error, ")


def parse_config(raw: object, source: str = "<config>") -> KlbConfig:
    """Validate already-parsed YAML; :class:`ConfigError` names the first bad field and value."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError("<root>", type(raw).__name__, f"{source}: must be a mapping of sections")
    try:
        return KlbConfig.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        others = len(exc.errors()) - 1
        more = f" (and {others} more problem{'s' if others > 1 else ''})" if others else ""
        field, value = error_field(first)
        raise ConfigError(field, value, f"{source}: {error_message(first)}{more}") from exc
    except InvalidInputError as exc:  # raised by shared validators inside nested models
        raise ConfigError(exc.field, exc.value, f"{source}: {exc.problem}") from exc


def redis_settings_from_options(url: str, namespace: str, cluster: bool = False) -> RedisSettings:
    """The ``redis`` block that ``--redis``, ``--namespace`` and ``--redis-cluster`` describe;
    :class:`ConfigError` names the block's field (``redis.url`` ...), as for a file."""
    return parse_config({"redis": {"url": url, "namespace": namespace, "cluster": cluster}},
                        source="command line").redis


def load_config(path: str | Path) -> KlbConfig:
    """Read and validate a YAML configuration file."""
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise ConfigError("--config", str(file), f"cannot read the file: {exc.strerror}") from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError("--config", str(file), f"is not valid YAML: {exc}") from exc
    return parse_config(raw, source=str(file))


# --- reference documentation, generated from the models ---------------------------------


def _unwrap(annotation: Any) -> list[Any]:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return [t for arg in typing.get_args(annotation) for t in _unwrap(arg)]
    if origin in (tuple, list):
        return [t for arg in typing.get_args(annotation) if arg is not Ellipsis for t in _unwrap(arg)]
    return [annotation]


def _type_name(annotation: Any) -> str:
    text = str(annotation).replace("typing.", "").replace("pathlib.", "").replace("pydantic.types.", "")
    for module in ("knapsack_lb.model.", "knapsack_lb.controller.settings.", "knapsack_lb.config."):
        text = text.replace(module, "")
    if isinstance(annotation, type):
        text = annotation.__name__
    return text.replace("<class '", "").replace("'>", "")


def _default_text(info: Any) -> str:
    if info.is_required():
        return "required"
    if info.default_factory is not None:
        value = info.default_factory()
        return "(see fields)" if isinstance(value, BaseModel) else repr(value)
    value = info.default
    if isinstance(value, BaseModel):
        return "(see fields)"
    return "none" if value is None else repr(value)


def iter_fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, str, str, str]]:
    """(dotted path, type, default, description) of every field, nested models included;
    list items are written ``path[]``."""
    for name, info in model.model_fields.items():
        key = info.alias or name
        path = f"{prefix}{key}"
        yield path, _type_name(info.annotation), _default_text(info), info.description or ""
        for inner in _unwrap(info.annotation):
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                is_list = typing.get_origin(info.annotation) in (tuple, list)
                yield from iter_fields(inner, f"{path}[]." if is_list else f"{path}.")


def reference_markdown() -> str:
    """docs/configuration.md: every field of :class:`KlbConfig` with type, default and meaning."""
    lines = [
        "# Configuration reference",
        "",
        "<!-- generated by `klb config-reference` from knapsack_lb/config.py; do not edit by hand -->",
        "",
        "One YAML file (`klb run --config FILE`, `klb check --config FILE`); `examples/config.yaml` is a working",
        "example. Times are in seconds, weights are fractions of a VIP's traffic in [0, 1]. Unknown keys are",
        "errors; every error names the field (dotted path) and the value.",
        "",
        "At start-up, VIPs in the file that are missing from the store are created; VIPs already stored keep",
        "the changes the admin API made (pins, drains, added DIPs, pause, dry run) unless `vip_source: config`.",
        "The API token is never written into the file in production: use `api.token_file` or the environment",
        "variable named by `api.token_env`.",
        "",
    ]
    sections: dict[str, list[tuple[str, str, str, str]]] = {}
    for path, type_name, default, description in iter_fields(KlbConfig):
        top = path.split(".")[0].removesuffix("[]")
        sections.setdefault(top, []).append((path, type_name, default, description))
    for top, rows in sections.items():
        lines += [f"## `{top}`", "", "| field | type | default | meaning |", "|---|---|---|---|"]
        for path, type_name, default, description in rows:
            cell = description.replace("|", "\\|")
            lines.append(f"| `{path}` | `{type_name.replace('|', '&#124;')}` | `{default}` | {cell} |")
        lines.append("")
    return "\n".join(lines)
