"""Nginx (open source) adapter: render the upstream block, ``nginx -t``, then reload.

KnapsackLB shows that it works with Nginx through the weights of its ``upstream`` servers
(KnapsackLB paper, section 6.5, Table 6: 20/30/50 observed as set). Open-source Nginx has no
runtime API for weights (the ``api`` module is NGINX Plus only), so one ``apply`` is:

1. every DIP of the plan must have an address in ``servers``; integer weights by
   largest-remainder rounding to ``resolution`` (Nginx weights are integers >= 1), a DIP
   at weight 0 (or a configured DIP missing from the plan) becomes ``down``; a pool with
   every server ``down`` is never written (Nginx would answer 502);
2. the block is written to its own include file atomically (temp file + ``os.replace``),
   after keeping the previous file's bytes;
3. ``nginx -t`` checks the whole configuration; if it fails the previous include file is put
   back and nothing is reloaded (a HUP with a broken config fails silently in the log, which
   is why the test always comes first);
4. the master is reloaded (SIGHUP to the pid in ``pid_file``, or ``nginx -s reload``) and,
   when the master's pid is known, the adapter waits until new worker processes exist and
   the old ones have exited (at most 2 s: an old worker still accepts connections until it
   has handled the master's QUIT).

The new weights apply to requests handled by the new workers (11-15 ms here); old workers
finish their requests and close idle keep-alive connections, so keep-alive clients see a
few closed connections per reload and must retry idempotent requests.

``read()`` parses the include file, which after every apply (success or rollback) is the file
the running master loaded; Nginx OSS cannot report the weights it really uses, so a file
edited by hand without a reload would be reported wrongly (documented limit).

With ``log_listen`` set, ``timings()`` gives the client requests Nginx timed per DIP from its
access log, sent over syslog in the adapter's line format (:mod:`adapters.nginx_log`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, ConfigDict, Field

from adapters.access_log import AccessLogTimer, DipOf, LbTimings, dips_by_address
from adapters.base import AdapterSettings, ApplyResult, CheckResult, parse_settings, quantise
from adapters.nginx_log import parse_nginx_log_line
from knapsack_lb.errors import InvalidInputError, KnapsackLBError
from knapsack_lb.model import DipConfig, WeightPlan
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

METHODS = {"round_robin": "", "least_conn": "least_conn;", "random": "random;", "random_two": "random two;"}
SERVER_LINE = re.compile(
    r"^\s*server\s+(?P<address>\S+?)(?:\s+weight=(?P<weight>\d+))?(?P<down>\s+down)?\s*;(?:\s*#\s*(?P<dip>\S+))?\s*$"
)


class NginxError(KnapsackLBError):
    """Nginx refused the configuration or could not be reloaded; the message says why."""


def render_upstream(
    upstream: str,
    servers: Mapping[str, str],
    weights: Mapping[str, int],
    *,
    method: str = "round_robin",
    keepalive: int = 0,
    comment: str = "",
) -> str:
    """The ``upstream`` block: one ``server`` line per DIP (``down`` for weight 0), the DIP's
    name as a trailing comment so ``read()`` maps lines back. Every name and address is
    validated here again, so nothing unchecked reaches the file."""
    validate_name("upstream", upstream)
    if method not in METHODS:
        raise InvalidInputError("method", method, f"must be one of {sorted(METHODS)}")
    if not any(weights.get(dip, 0) > 0 for dip in servers):
        raise NginxError(f"refusing to write upstream {upstream!r} with every server down (Nginx would answer 502)")
    lines = [f"# written by knapsack-lb; do not edit by hand{': ' + comment if comment else ''}"]
    lines.append(f"upstream {upstream} {{")
    if METHODS[method]:
        lines.append(f"    {METHODS[method]}")
    for dip in sorted(servers):
        validate_name("dip", dip)
        host, port = parse_address(f"servers.{dip}", servers[dip])
        weight = int(weights.get(dip, 0))
        state = f"weight={weight}" if weight > 0 else "weight=1 down"
        lines.append(f"    server {format_address(host, port)} {state};  # {dip}")
    if keepalive:
        lines.append(f"    keepalive {int(keepalive)};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def parse_upstream(text: str, servers: Mapping[str, str]) -> dict[str, int]:
    """Integer weights by DIP from an include file written by :func:`render_upstream`
    (``down`` = 0); lines without a DIP comment are mapped by address."""
    by_address = {address: dip for dip, address in servers.items()}
    weights: dict[str, int] = {}
    for line in text.splitlines():
        match = SERVER_LINE.match(line)
        if not match:
            continue
        dip = match.group("dip") or by_address.get(match.group("address"), match.group("address"))
        weights[dip] = 0 if match.group("down") else int(match.group("weight") or 1)
    return weights


OLD_WORKER_GRACE = 2.0


def require_nginx_master(pid: int) -> None:
    """Refuse to signal ``pid`` unless it is an Nginx master process (``nginx: master process``
    in /proc/<pid>/cmdline): a stale or wrong pid file must never make the adapter signal
    another process."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError as exc:
        raise NginxError(f"pid {pid} from the pid file is not a running process: {exc}") from exc
    if not cmdline.startswith(b"nginx: master process"):
        shown = cmdline.replace(b"\0", b" ").strip()[:60].decode(errors="replace")
        raise NginxError(f"pid {pid} from the pid file is not an Nginx master ({shown!r}); not signalled")


def worker_pids(master: int) -> set[int]:
    """PIDs whose parent is ``master`` (from /proc; empty where /proc is missing)."""
    with contextlib.suppress(OSError, ValueError):
        children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
        return {int(pid) for pid in children}
    found: set[int] = set()
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            # the command name is in parentheses and may hold spaces: split after the last ')'
            fields = stat.rsplit(")", 1)[-1].split()
            if len(fields) > 1 and fields[1] == str(master):
                found.add(int(entry))
    return found


NGINX_BINARY = re.compile(r"^nginx(-[a-z]+)?$")
MANAGED_MARKER = b"# written by knapsack-lb"


def find_nginx() -> str:
    """The ``nginx`` executable on PATH or in the sbin directories."""
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/local/sbin"])
    found = shutil.which("nginx", path=search)
    if found is None:
        raise NginxError("nginx is not installed (no 'nginx' on PATH or in /usr/sbin)")
    return found


def _nginx_binary(field: str, value: object) -> str:
    path = validate_absolute_path(field, value)
    if not NGINX_BINARY.fullmatch(os.path.basename(path)):
        raise InvalidInputError(field, value, "must be an Nginx executable (named nginx or nginx-<flavour>)")
    return path


class NginxSettings(AdapterSettings):
    """Settings of an Nginx load balancer (the operator's, but for ``servers``)."""

    model_config = ConfigDict(strict=True)
    vip_fields: ClassVar[frozenset[str]] = frozenset({"servers"})

    include_file: AbsolutePath = Field(
        description="The file holding only this upstream block, included inside http {} (or stream {}); "
        "the adapter never replaces a file it did not write."
    )
    config: AbsolutePath = Field(description="The main configuration file (nginx -t -c).")
    upstream: Name = Field(description="The upstream's name.")
    servers: dict[Name, Address] = Field(
        default_factory=dict, description="DIP name -> host:port (default: each DIP's own address)."
    )
    prefix: AbsolutePath | None = Field(None, description="nginx -p (default: the compiled-in prefix).")
    error_log: AbsolutePath | None = Field(None, description="nginx -e for the test and reload commands.")
    pid_file: AbsolutePath | None = Field(
        None, description="The master's pid file; reload by SIGHUP to it (default: nginx -s reload). Only a "
        "process that is an Nginx master is ever signalled."
    )
    method: Literal["round_robin", "least_conn", "random", "random_two"] = Field(
        "round_robin", description="Balancing method of the upstream (random_two ignores weights at low concurrency)."
    )
    keepalive: int = Field(0, ge=0, le=10_000, description="Idle upstream connections per worker (0: none).")
    resolution: int = Field(1000, ge=1, le=1_000_000, description="The integer weights sum to about this.")
    reload_timeout: float = Field(10.0, gt=0, le=300, description="Seconds for nginx -t, the reload and new workers.")
    binary: Annotated[str, BeforeValidator(pydantic_rule(_nginx_binary))] | None = Field(
        None, description="The nginx executable (default: nginx on PATH); must be named nginx."
    )
    log_listen: Address | None = Field(
        None, description="host:port (UDP) where klb receives Nginx's access log (the 'knapsack_lb' log_format "
        "of docs/adapters.md and 'access_log syslog:server=<host:port>,nohostname knapsack_lb'): the client "
        "requests Nginx timed per server are pooled into the probe rounds at layer 7. Bind it where only Nginx "
        "can send (loopback or a private interface).")

    @classmethod
    def defaults_for(cls, dips: Sequence[DipConfig]) -> dict[str, Any]:
        return {"servers": {d.name: d.address for d in dips}}


@dataclass
class NginxAdapter(LbTimings[AccessLogTimer]):
    """Pushes a ``WeightPlan`` into one Nginx ``upstream`` (see the module docstring and
    :class:`NginxSettings`)."""

    include_file: Path
    config: Path
    upstream: str
    servers: dict[str, str]
    prefix: Path | None = None
    error_log: Path | None = None
    pid_file: Path | None = None
    method: str = "round_robin"
    keepalive: int = 0
    resolution: int = 1000
    reload_timeout: float = 10.0
    binary: str = ""
    log_listen: tuple[str, int] | None = None
    last_error: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    name = "nginx"
    Settings: ClassVar[type[NginxSettings]] = NginxSettings

    @classmethod
    def from_config(cls, raw: Mapping[str, Any]) -> NginxAdapter:
        s = parse_settings(NginxSettings, raw)
        if not s.servers:
            raise InvalidInputError("adapter.settings.servers", {}, "required: DIP name -> 'host:port'")

        def path(value: str | None) -> Path | None:
            return None if value is None else Path(value)

        return cls(
            include_file=Path(s.include_file), config=Path(s.config), upstream=s.upstream, servers=dict(s.servers),
            prefix=path(s.prefix), error_log=path(s.error_log), pid_file=path(s.pid_file), method=s.method,
            keepalive=s.keepalive, resolution=s.resolution, reload_timeout=s.reload_timeout, binary=s.binary or "",
            log_listen=parse_address("log_listen", s.log_listen) if s.log_listen else None,
        )

    # --- protocol -----------------------------------------------------------------------------

    def apply(self, plan: WeightPlan) -> ApplyResult:
        started = time.perf_counter()
        try:
            missing = sorted(set(plan.weights) - set(self.servers))
            if missing:
                raise NginxError(f"plan has DIP(s) {missing} with no address in settings.servers")
            q = quantise(plan.weights, self.resolution, low=1)
            weights = {dip: q.weights.get(dip, 0) for dip in self.servers}
            text = render_upstream(
                self.upstream,
                self.servers,
                weights,
                method=self.method,
                keepalive=self.keepalive,
                comment=f"vip {plan.vip} plan version {int(plan.version)}",
            )
        except (InvalidInputError, NginxError) as exc:
            return self._failed(started, f"plan refused before anything was written: {exc}")
        with self._lock:
            try:
                self._install(text)
            except NginxError as exc:
                return self._failed(started, str(exc))
        self.last_error = ""
        return ApplyResult(
            ok=True,
            adapter=self.name,
            lb_weights=weights,
            quantisation_error=q.error,
            seconds=time.perf_counter() - started,
        )

    def read(self) -> dict[str, float]:
        """Weights of the include file as fractions (``{}`` if it cannot be read; reason in
        ``last_error``). See the module docstring for why this is the file, not live state."""
        try:
            weights = parse_upstream(self.include_file.read_text(), self.servers)
        except OSError as exc:
            self.last_error = f"cannot read {self.include_file}: {exc}"
            return {}
        total = sum(weights.values())
        return {dip: (w / total if total else 0.0) for dip, w in weights.items()}

    def _timings_receiver(self) -> tuple[AccessLogTimer, DipOf] | None:
        """Nginx's access log on ``log_listen`` (:meth:`LbTimings.timings`). Nginx names a server by
        the address it connected to: a DIP whose address is a hostname is matched by the addresses
        it resolves to when the receiver starts."""
        if self.log_listen is None:
            return None
        receiver = AccessLogTimer(*self.log_listen, self.upstream, parse_nginx_log_line, lb="Nginx")
        return receiver, dips_by_address(self.servers).get

    def check(self) -> CheckResult:
        try:
            self._test_config()
            master = self._master_pid()
        except NginxError as exc:
            return CheckResult(ok=False, adapter=self.name, detail=str(exc))
        detail = f"nginx -t ok; master pid {master}" if master else "nginx -t ok; master pid unknown"
        return CheckResult(ok=True, adapter=self.name, detail=f"{detail}; method {self.method}",
                           balancing="least_connections" if self.method == "least_conn" else "weighted")

    # --- steps ----------------------------------------------------------------------------------

    def _install(self, text: str) -> None:
        previous: bytes | None
        try:
            previous = self.include_file.read_bytes()
        except FileNotFoundError:
            previous = None
        except OSError as exc:
            raise NginxError(f"cannot read the current include file {self.include_file}: {exc}") from exc
        if previous and not previous.startswith(MANAGED_MARKER):
            raise NginxError(
                f"{self.include_file} was not written by knapsack-lb (its first line is not "
                f"{MANAGED_MARKER.decode()!r}); it is not replaced: point include_file at a file of its own"
            )
        self._write_atomic(text.encode())
        try:
            self._test_config()
        except NginxError as exc:
            self._restore(previous)
            raise NginxError(f"{exc}; the previous include file was restored and Nginx was not reloaded") from exc
        try:
            self._reload()
        except NginxError as exc:
            self._restore(previous)
            raise NginxError(f"{exc}; the previous include file was restored") from exc

    def _write_atomic(self, data: bytes) -> None:
        try:
            fd, tmp = tempfile.mkstemp(prefix=".klb-upstream-", dir=self.include_file.parent)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.include_file)
        except OSError as exc:
            with contextlib.suppress(OSError, UnboundLocalError):
                os.unlink(tmp)
            raise NginxError(f"cannot write {self.include_file}: {exc}") from exc

    def _restore(self, previous: bytes | None) -> None:
        if previous is None:
            with contextlib.suppress(FileNotFoundError):
                self.include_file.unlink()
        else:
            self._write_atomic(previous)

    def _base_argv(self) -> list[str]:
        argv = [self.binary or find_nginx()]
        if self.prefix is not None:
            argv += ["-p", str(self.prefix)]
        if self.error_log is not None:
            argv += ["-e", str(self.error_log)]
        return [*argv, "-c", str(self.config)]

    def _run(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(list(argv), capture_output=True, text=True, timeout=self.reload_timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise NginxError(f"cannot run {argv[0]}: {exc}") from exc

    def _test_config(self) -> None:
        try:
            done = self._run([*self._base_argv(), "-t", "-q"])
        except FileNotFoundError as exc:
            raise NginxError(str(exc)) from exc
        if done.returncode != 0:
            tail = " | ".join(line for line in done.stderr.strip().splitlines()[-3:])
            raise NginxError(f"nginx -t failed: {tail}")

    def _master_pid(self) -> int | None:
        if self.pid_file is None:
            return None
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError) as exc:
            raise NginxError(f"cannot read the Nginx pid file {self.pid_file}: {exc}") from exc
        require_nginx_master(pid)
        return pid

    def _reload(self) -> None:
        master = self._master_pid()
        if master is None:
            done = self._run([*self._base_argv(), "-s", "reload"])
            if done.returncode != 0:
                raise NginxError(f"nginx -s reload failed: {done.stderr.strip()[-300:]}")
            return
        before = worker_pids(master)
        try:
            os.kill(master, signal.SIGHUP)
        except OSError as exc:
            raise NginxError(f"cannot signal the Nginx master (pid {master}): {exc}") from exc
        if not Path("/proc").is_dir():
            return
        deadline = time.monotonic() + self.reload_timeout
        while time.monotonic() < deadline:
            if worker_pids(master) - before:
                self._wait_for_old_workers(master, before)
                return
            time.sleep(0.002)
        raise NginxError(
            f"Nginx master {master} started no new worker within {self.reload_timeout} s after SIGHUP "
            "(see its error log); the include file holds the new weights"
        )

    def _wait_for_old_workers(self, master: int, old: set[int]) -> None:
        """Until the previous workers have exited (at most ``OLD_WORKER_GRACE`` seconds).

        Until an old worker has handled the master's QUIT it still accepts new connections
        with the old weights; once it exits, all traffic follows the new plan. A worker busy
        with a long request may outlive the grace period: the plan is loaded all the same.
        """
        deadline = time.monotonic() + OLD_WORKER_GRACE
        while worker_pids(master) & old and time.monotonic() < deadline:
            time.sleep(0.002)

    def _failed(self, started: float, reason: str) -> ApplyResult:
        self.last_error = reason
        return ApplyResult(ok=False, adapter=self.name, seconds=time.perf_counter() - started, reason=reason)
