"""HAProxy adapter: weights through the runtime API of an admin ``stats socket``.

KnapsackLB programs weights through the interface the LB already has (KnapsackLB paper,
section 3.2 "Using weights to control traffic"; HAProxy is the paper's main LB). HAProxy 2.6
takes ``set server <backend>/<server> weight <0-256>`` on a UNIX or TCP socket declared
``stats socket ... level admin``; a new weight applies to the next request.

One ``apply`` is one connection in interactive (``prompt``) mode, so every command's answer
is read on its own:

1. ``show stat <backend> 2 -1``: the backend exists and its ``algo`` is not ``static-rr``
   (static-rr only accepts weights 0% and 100%; HAProxy answers every other weight with
   "Backend is using a static LB algorithm");
2. ``show servers state <backend>``: the weights in use now (column 8, ``srv_uweight``),
   kept to restore on failure, and every planned server exists;
3. one ``set server`` per DIP (integers from largest-remainder rounding, 0-256; weight 0 =
   no new traffic; the largest weight is scaled to 256 for the finest split);
4. ``show servers state <backend>`` again: every runtime weight equals what was sent;
5. with ``state_file`` set, ``show servers state`` (all backends) is written atomically to
   that file, so that a reload with ``server-state-file`` + ``load-server-state-from-file``
   keeps the runtime weights (HAProxy itself never writes the file).

If any step fails, the weights read in step 2 are sent back and ``apply`` returns
``ok=False`` with the reason; an unreachable socket is a failed result, never an exception.

How HAProxy's algorithms use these weights (see docs/adapters.md): ``roundrobin`` follows
them exactly (smooth weighted round robin, dynamic); ``leastconn`` picks the lowest
connections/weight, so weights only matter once requests overlap (at low concurrency every
server has 0 connections and it degrades to round robin over the weighted tree);
``random`` draws ``random(<n>)`` servers (2 by default) by weight and takes the least loaded,
which pulls the split toward equal under load (use ``random(1)`` for a pure weighted draw);
``static-rr`` is refused.

The backend is the VIP's pool: an active server that no DIP of the plan maps to (a DIP removed
from the VIP, or a server the mapping misses) is set to weight 0 in the same apply and verified,
and the result warns about it; ``backup`` servers are left alone (they take traffic only when
every active server is down). ``klb check`` refuses a mapping that does not match the backend.

``traffic()`` reads what each server served (``show stat``); with ``log_listen`` set,
``timings()`` gives the client requests HAProxy timed per DIP from its HTTP logs
(:mod:`adapters.haproxy_log`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import BeforeValidator, ConfigDict, Field

from adapters.access_log import AccessLogTimer, DipOf, LbTimings
from adapters.base import AdapterSettings, ApplyResult, CheckResult, parse_settings
from adapters.haproxy_log import haproxy_requests
from knapsack_lb.errors import InvalidInputError, KnapsackLBError
from knapsack_lb.model import Traffic, WeightPlan
from knapsack_lb.names import (
    AbsolutePath,
    Address,
    Name,
    format_address,
    parse_address,
    pydantic_rule,
    validate_absolute_path,
    validate_name,
)
from knapsack_lb.quantise import HAPROXY_MAX_WEIGHT, haproxy_weights

MAX_WEIGHT = HAPROXY_MAX_WEIGHT
PROMPT = b"\n> "
UWEIGHT_COLUMN = 7  # 0-based index of srv_uweight in `show servers state` (column 8)


class HAProxyError(KnapsackLBError):
    """The runtime API refused a command or could not be reached; the message says which."""


class AdminConnectionLost(HAProxyError):
    """The admin connection broke (reset, closed, timed out): a new one may still work."""


@dataclass(frozen=True)
class ServerState:
    """One row of ``show servers state``: the runtime (user) and configured weights."""

    backend: str
    server: str
    runtime_weight: int
    config_weight: int


def parse_servers_state(text: str) -> list[ServerState]:
    """Rows of ``show servers state`` (format version 1: ``be_id be_name srv_id srv_name
    srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight ...``)."""
    rows: list[ServerState] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or line == "1":
            continue
        parts = line.split()
        if len(parts) < 9 or not parts[0].isdigit():
            raise HAProxyError(f"unexpected line in 'show servers state': {line!r}")
        rows.append(ServerState(parts[1], parts[3], int(parts[UWEIGHT_COLUMN]), int(parts[8])))
    return rows


def _stat_rows(text: str, backend: str) -> list[dict[str, str]]:
    """``backend``'s rows of ``show stat`` CSV as column -> cell."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or not lines[0].startswith("# "):
        return []
    header = lines[0][2:].split(",")
    rows = (dict(zip(header, line.split(","), strict=False)) for line in lines[1:])
    return [row for row in rows if row.get("pxname") == backend]


def parse_backend_algo(text: str, backend: str) -> str | None:
    """The ``algo`` field of ``backend``'s BACKEND row in ``show stat`` CSV, or None."""
    for row in _stat_rows(text, backend):
        if row.get("svname") == "BACKEND":
            return row.get("algo")
    return None


def parse_backup_servers(text: str, backend: str) -> frozenset[str]:
    """``backend``'s ``backup`` servers (column ``bck`` = 1) in ``show stat`` CSV: they take traffic
    only when every active server is down, so their weights are not part of the split."""
    return frozenset(row["svname"] for row in _stat_rows(text, backend)
                     if row.get("svname") not in ("BACKEND", "FRONTEND") and row.get("bck") == "1")


ERROR_COUNTERS = ("econ", "eresp", "wretr", "wredis", "hrsp_5xx")  # `show stat` columns of failed or moved requests


def parse_server_errors(text: str, backend: str) -> dict[str, dict[str, int]]:
    """``backend``'s servers' error counters from ``show stat`` CSV: connection errors (``econ``),
    response errors (``eresp``), retries (``wretr``), redispatches to another server (``wredis``) and
    5xx answers (``hrsp_5xx``, ``mode http`` only). A request HAProxy retried elsewhere reaches the
    client as a success: these counters are the only trace of it."""
    return {row["svname"]: {c: int(row[c]) for c in ERROR_COUNTERS if row.get(c, "").isdigit()}
            for row in _stat_rows(text, backend) if row.get("svname") not in ("BACKEND", "FRONTEND")}


def parse_server_traffic(text: str, backend: str) -> tuple[str, dict[str, float]]:
    """What ``backend``'s active servers served so far, from ``show stat`` CSV: HTTP requests
    (``req_tot``) in ``mode http``; at layer 4, where HAProxy sees no requests, bytes sent back to
    clients (``bout``), which grow with the responses served. Returns (kind, server -> counter)."""
    rows = [row for row in _stat_rows(text, backend)
            if row.get("svname") not in ("BACKEND", "FRONTEND") and row.get("bck") != "1"]
    if rows and all(row.get("req_tot", "").isdigit() for row in rows):
        return "requests", {row["svname"]: float(row["req_tot"]) for row in rows}
    return "bytes", {row["svname"]: float(row["bout"]) for row in rows if row.get("bout", "").isdigit()}


class RuntimeApi:
    """One interactive connection to the HAProxy admin socket (``prompt`` mode)."""

    def __init__(self, sock: socket.socket, timeout: float) -> None:
        self._sock = sock
        self._sock.settimeout(timeout)
        self._buffer = b""
        self.sent: list[str] = []

    @classmethod
    @contextlib.contextmanager
    def connect(cls, endpoint: str | tuple[str, int], timeout: float) -> Iterator[RuntimeApi]:
        try:
            if isinstance(endpoint, str):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(timeout)
                sock.connect(endpoint)
            else:
                sock = socket.create_connection(endpoint, timeout=timeout)
        except OSError as exc:
            raise HAProxyError(f"cannot reach the HAProxy admin socket {endpoint}: {exc}") from exc
        api = cls(sock, timeout)
        try:
            api.command("prompt")
            yield api
        finally:
            with contextlib.suppress(OSError):
                sock.sendall(b"quit\n")
            sock.close()

    def command(self, line: str) -> str:
        """Send one command (no ``;``, no newline: names were validated) and return its answer."""
        if any(c in line for c in ";\n\r"):
            raise HAProxyError(f"refusing to send a command containing ';' or a newline: {line!r}")
        self.sent.append(line)
        try:
            self._sock.sendall(line.encode() + b"\n")
            while PROMPT not in self._buffer:
                chunk = self._sock.recv(65536)
                if not chunk:
                    raise AdminConnectionLost(f"HAProxy closed the admin connection after {line!r}")
                self._buffer += chunk
        except OSError as exc:
            raise AdminConnectionLost(f"admin socket error after {line!r}: {exc}") from exc
        answer, _, self._buffer = self._buffer.partition(PROMPT)
        return answer.decode(errors="replace").strip("\n")


def _socket_endpoint(field: str, value: object) -> str:
    if isinstance(value, str) and value.startswith("/"):
        return validate_absolute_path(field, value)
    return format_address(*parse_address(field, value))


class HAProxySettings(AdapterSettings):
    """Settings of an HAProxy load balancer (the operator's, but for ``servers``)."""

    model_config = ConfigDict(strict=True)
    vip_fields: ClassVar[frozenset[str]] = frozenset({"servers"})

    socket: Annotated[str, BeforeValidator(pydantic_rule(_socket_endpoint))] = Field(
        description="Admin socket: an absolute UNIX socket path or host:port (stats socket ... level admin)."
    )
    backend: Name = Field(description="The backend whose servers get the weights.")
    servers: dict[Name, Name] = Field(
        default_factory=dict, description="DIP name -> server name (default: the server has the DIP's name)."
    )
    state_file: AbsolutePath | None = Field(
        None, description="Where to dump 'show servers state' after each apply (the server-state-file), best effort."
    )
    timeout: float = Field(2.0, gt=0, le=60, description="Seconds per socket operation.")
    log_listen: Address | None = Field(
        None, description="host:port (UDP) where klb receives HAProxy's HTTP logs ('log <host:port> local0' and "
        "'option httplog' in HAProxy's configuration): the client requests HAProxy timed per server are pooled into "
        "the probe rounds at layer 7. Bind it where only HAProxy can send (loopback or a private interface).")


@dataclass
class HAProxyAdapter(LbTimings[AccessLogTimer]):
    """Pushes a ``WeightPlan`` into one HAProxy backend (see the module docstring and
    :class:`HAProxySettings`)."""

    socket_endpoint: str | tuple[str, int]
    backend: str
    servers: dict[str, str] = field(default_factory=dict)
    state_file: Path | None = None
    timeout: float = 2.0
    log_listen: tuple[str, int] | None = None
    last_error: str = ""

    name = "haproxy"
    Settings: ClassVar[type[HAProxySettings]] = HAProxySettings

    @classmethod
    def from_config(cls, raw: Mapping[str, Any]) -> HAProxyAdapter:
        settings = parse_settings(HAProxySettings, raw)
        endpoint: str | tuple[str, int] = (
            settings.socket if settings.socket.startswith("/") else parse_address("socket", settings.socket)
        )
        state_file = Path(settings.state_file) if settings.state_file else None
        log_listen = parse_address("log_listen", settings.log_listen) if settings.log_listen else None
        return cls(endpoint, settings.backend, dict(settings.servers), state_file, settings.timeout, log_listen)

    # --- names ------------------------------------------------------------------------

    def server_of(self, dip: str) -> str:
        validate_name("dip", dip)
        return self.servers.get(dip, dip)

    def dip_of(self, server: str) -> str:
        for dip, name in self.servers.items():
            if name == server:
                return dip
        return server

    # --- protocol -----------------------------------------------------------------------

    def apply(self, plan: WeightPlan) -> ApplyResult:
        started = time.perf_counter()
        try:
            quantised = haproxy_weights(plan.weights)
            targets_by_dip, error = quantised.weights, quantised.error
            targets = {self.server_of(dip): w for dip, w in targets_by_dip.items()}
        except InvalidInputError as exc:
            return self._failed(started, f"plan refused before anything was sent: {exc}")
        try:
            with RuntimeApi.connect(self.socket_endpoint, self.timeout) as api:
                self._refuse_static(api)
                previous = self._weights(api)
                missing = sorted(set(targets) - set(previous))
                if missing:
                    raise HAProxyError(
                        f"backend {self.backend!r} has no server(s) {missing}; it has {sorted(previous)}"
                    )
                strays = {s: w for s, w in previous.items() if s not in targets}
                targets.update({s: 0 for s in strays})
                changed: list[str] = []
                try:
                    for server, weight in sorted(targets.items()):
                        changed.append(server)
                        self._set_weight(api, server, weight)
                    now = self._weights(api)
                    wrong = {s: (now.get(s), w) for s, w in targets.items() if now.get(s) != w}
                    if wrong:
                        raise HAProxyError(f"verification failed (server: (runtime, sent)): {wrong}")
                except HAProxyError as exc:
                    restore_note = self._restore(api, {s: previous[s] for s in changed})
                    raise HAProxyError(f"{exc}; {restore_note}") from exc
                warnings = self._save_state_best_effort(api)
        except HAProxyError as exc:
            return self._failed(started, str(exc))
        zeroed = {s: w for s, w in strays.items() if w}
        if zeroed:
            warnings = (f"server(s) of backend {self.backend!r} that no DIP of the plan maps to were set to "
                        f"weight 0 (from {zeroed}): a removed DIP, or a server to map in adapter.servers",
                        *warnings)
        self.last_error = ""
        return ApplyResult(
            ok=True,
            adapter=self.name,
            lb_weights=targets_by_dip,
            quantisation_error=error,
            seconds=time.perf_counter() - started,
            warnings=warnings,
        )

    def read(self) -> dict[str, float]:
        """Runtime weights as fractions (DIP names). ``{}`` if HAProxy cannot be read (the
        reason is in ``last_error``): never raises, so a controller's verify step just sees
        a mismatch and re-applies."""
        try:
            with RuntimeApi.connect(self.socket_endpoint, self.timeout) as api:
                weights = self._weights(api)
        except HAProxyError as exc:
            self.last_error = str(exc)
            return {}
        total = sum(weights.values())
        return {self.dip_of(s): (w / total if total else 0.0) for s, w in weights.items()}

    def traffic(self) -> Traffic | None:
        """What each DIP's server served so far (:func:`parse_server_traffic`), ``None`` when HAProxy
        cannot be read: the controller takes each DIP's share of the traffic between two reads."""
        try:
            with RuntimeApi.connect(self.socket_endpoint, self.timeout) as api:
                kind, counters = parse_server_traffic(api.command(f"show stat {self.backend} 4 -1"), self.backend)
        except HAProxyError as exc:
            self.last_error = str(exc)
            return None
        return Traffic(kind, {self.dip_of(server): count for server, count in counters.items()})

    def _timings_receiver(self) -> tuple[AccessLogTimer, DipOf] | None:
        """HAProxy's HTTP log lines on ``log_listen`` (:meth:`LbTimings.timings`), servers by name."""
        if self.log_listen is None:
            return None
        return AccessLogTimer(*self.log_listen, self.backend, haproxy_requests, lb="HAProxy"), self.dip_of

    def read_integers(self) -> dict[str, int]:
        """Runtime integer weights by DIP name (raises :class:`HAProxyError`)."""
        with RuntimeApi.connect(self.socket_endpoint, self.timeout) as api:
            return {self.dip_of(s): w for s, w in self._weights(api).items()}

    def check(self) -> CheckResult:
        try:
            with RuntimeApi.connect(self.socket_endpoint, self.timeout) as api:
                algo = self._refuse_static(api)
                weights = self._weights(api)
        except HAProxyError as exc:
            return CheckResult(ok=False, adapter=self.name, detail=str(exc))
        return CheckResult(
            ok=True, adapter=self.name, detail=f"backend {self.backend!r} balance {algo}, runtime weights {weights}",
            balancing="least_connections" if algo == "leastconn" else "weighted",
        )

    def save_state(self) -> None:
        """Write ``show servers state`` to ``state_file`` now (e.g. right before a reload)."""
        if self.state_file is None:
            raise HAProxyError("no state_file configured")
        with RuntimeApi.connect(self.socket_endpoint, self.timeout) as api:
            self._dump_state(api)

    # --- steps ----------------------------------------------------------------------------

    def _refuse_static(self, api: RuntimeApi) -> str:
        algo = parse_backend_algo(api.command(f"show stat {self.backend} 2 -1"), self.backend)
        if algo is None:
            raise HAProxyError(f"HAProxy has no backend {self.backend!r} (show stat found no BACKEND row)")
        if algo == "static-rr":
            raise HAProxyError(
                f"backend {self.backend!r} uses 'balance static-rr', which fixes weights at startup and only "
                "accepts 0% or 100% at runtime; use 'balance roundrobin' (or leastconn) for KnapsackLB weights"
            )
        return algo

    def _weights(self, api: RuntimeApi) -> dict[str, int]:
        """Runtime weights of the backend's active servers (``backup`` servers are not in the split)."""
        answer = api.command(f"show servers state {self.backend}")
        if not answer.startswith("1"):
            raise HAProxyError(f"'show servers state {self.backend}' failed: {answer.strip()!r}")
        backups = parse_backup_servers(api.command(f"show stat {self.backend} 4 -1"), self.backend)
        return {row.server: row.runtime_weight for row in parse_servers_state(answer)
                if row.backend == self.backend and row.server not in backups}

    def _set_weight(self, api: RuntimeApi, server: str, weight: int) -> None:
        answer = api.command(f"set server {self.backend}/{validate_name('server', server)} weight {int(weight)}")
        if answer.strip():
            raise HAProxyError(f"HAProxy refused weight {weight} for {self.backend}/{server}: {answer.strip()}")

    def _restore(self, api: RuntimeApi, previous: Mapping[str, int]) -> str:
        """Send the previous weights back; a broken admin connection is replaced by a new one
        (once), so a dropped connection mid-apply does not leave a partial plan."""
        problems: list[str] = []
        reconnected = False
        pending = sorted(previous.items())
        while pending:
            server, weight = pending[0]
            try:
                self._set_weight(api, server, weight)
            except AdminConnectionLost as exc:
                if reconnected:
                    problems.append(str(exc))
                    break
                reconnected = True
                try:
                    return self._restore_on_new_connection(dict(pending), problems)
                except HAProxyError as again:
                    problems.append(f"{exc}; a new admin connection failed too: {again}")
                    break
            except HAProxyError as exc:
                problems.append(str(exc))
            pending.pop(0)
        if problems:
            return f"restoring the previous weights also failed: {problems}"
        return f"previous weights restored: {dict(previous)}"

    def _restore_on_new_connection(self, pending: Mapping[str, int], problems: list[str]) -> str:
        with RuntimeApi.connect(self.socket_endpoint, self.timeout) as fresh:
            for server, weight in sorted(pending.items()):
                try:
                    self._set_weight(fresh, server, weight)
                except AdminConnectionLost:
                    raise
                except HAProxyError as exc:
                    problems.append(str(exc))
        if problems:
            return f"restoring the previous weights (on a new admin connection) also failed: {problems}"
        return f"previous weights restored on a new admin connection: {dict(pending)}"

    def _save_state_best_effort(self, api: RuntimeApi) -> tuple[str, ...]:
        """Dump the server state after a successful apply. The runtime weights are what matters;
        a state file that cannot be written (read-only or full disk) is a warning, not a failure."""
        if self.state_file is None:
            return ()
        try:
            self._dump_state(api)
        except AdminConnectionLost as exc:
            return (f"server state file not written (admin connection lost): {exc}",)
        except HAProxyError as exc:
            return (str(exc),)
        return ()

    def _dump_state(self, api: RuntimeApi) -> None:
        assert self.state_file is not None
        answer = api.command("show servers state")
        if not answer.startswith("1"):
            raise HAProxyError(f"'show servers state' failed: {answer.strip()!r}")
        self._refuse_foreign_state_file()
        tmp: str | None = None
        try:
            fd, tmp = tempfile.mkstemp(prefix=".klb-state-", dir=self.state_file.parent)
            with os.fdopen(fd, "w") as handle:
                handle.write(answer.rstrip("\n") + "\n")
            os.replace(tmp, self.state_file)
            tmp = None
        except OSError as exc:
            raise HAProxyError(f"cannot write the server state file {self.state_file}: {exc}") from exc
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

    def _refuse_foreign_state_file(self) -> None:
        """Never replace a file that is not an HAProxy server state file (its first line is the
        format version, ``1``): a wrong path in the configuration must not destroy another file."""
        assert self.state_file is not None
        try:
            with self.state_file.open("rb") as handle:
                first = handle.readline(64).strip()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise HAProxyError(f"cannot read the server state file {self.state_file}: {exc}") from exc
        if first not in (b"1", b""):
            raise HAProxyError(
                f"{self.state_file} is not an HAProxy server state file (first line {first[:20]!r}); not replaced"
            )

    def _failed(self, started: float, reason: str) -> ApplyResult:
        self.last_error = reason
        return ApplyResult(ok=False, adapter=self.name, seconds=time.perf_counter() - started, reason=reason)
