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
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adapters.base import ApplyResult, CheckResult, quantise
from knapsack_lb.errors import InvalidInputError, KnapsackLBError
from knapsack_lb.lab.procs import require_binary
from knapsack_lb.model import WeightPlan
from knapsack_lb.names import format_address, parse_address, validate_name

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


def _absolute(field: str, value: object, required: bool = True) -> Path | None:
    if value is None and not required:
        return None
    if not isinstance(value, str) or not os.path.isabs(value) or any(c in value for c in "\x00\n\r;"):
        raise InvalidInputError(field, value, "must be an absolute path without ';' or newlines")
    return Path(value)


@dataclass
class NginxAdapter:
    """Pushes a ``WeightPlan`` into one Nginx ``upstream`` (see the module docstring).

    Settings (``adapter.settings`` of the VIP):

    * ``include_file`` (required): the file holding only this upstream block, included by the
      main configuration inside ``http {}`` (or ``stream {}``);
    * ``config`` (required): the main configuration file (``nginx -t -c``);
    * ``upstream`` (required): the upstream's name;
    * ``servers`` (required): DIP name -> ``host:port``;
    * ``prefix``: ``nginx -p`` (default: Nginx's compiled-in prefix);
    * ``error_log``: ``nginx -e`` for the test and reload commands (default: compiled-in);
    * ``pid_file``: the master's pid file; reload by SIGHUP to it (default: ``nginx -s reload``);
    * ``method``: ``round_robin`` (default), ``least_conn``, ``random``, ``random_two`` (the last
      ignores weights at low concurrency);
    * ``keepalive``: idle upstream connections per worker (default 0: none);
    * ``resolution``: the integer weights sum to about this (default 1000);
    * ``reload_timeout``: seconds to wait for ``nginx -t``/reload and new workers (default 10).
    """

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
    last_error: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    name = "nginx"

    @classmethod
    def from_config(cls, raw: Mapping[str, Any]) -> NginxAdapter:
        known = {
            "include_file",
            "config",
            "upstream",
            "servers",
            "prefix",
            "error_log",
            "pid_file",
            "method",
            "keepalive",
            "resolution",
            "reload_timeout",
            "binary",
        }
        unknown = sorted(set(raw) - known)
        if unknown:
            raise InvalidInputError("adapter.settings", unknown, f"unknown keys; known: {sorted(known)}")
        include_file = _absolute("adapter.settings.include_file", raw.get("include_file"))
        config = _absolute("adapter.settings.config", raw.get("config"))
        assert include_file is not None and config is not None
        upstream = validate_name("adapter.settings.upstream", raw.get("upstream"))
        servers_raw = raw.get("servers")
        if not isinstance(servers_raw, Mapping) or not servers_raw:
            raise InvalidInputError("adapter.settings.servers", servers_raw, "required: DIP name -> 'host:port'")
        servers: dict[str, str] = {}
        for dip, address in servers_raw.items():
            validate_name("adapter.settings.servers (DIP)", dip)
            host, port = parse_address(f"adapter.settings.servers.{dip}", address)
            servers[dip] = format_address(host, port)
        method = raw.get("method", "round_robin")
        if method not in METHODS:
            raise InvalidInputError("adapter.settings.method", method, f"must be one of {sorted(METHODS)}")
        keepalive = raw.get("keepalive", 0)
        if isinstance(keepalive, bool) or not isinstance(keepalive, int) or not 0 <= keepalive <= 10_000:
            raise InvalidInputError("adapter.settings.keepalive", keepalive, "must be an integer in 0-10000")
        resolution = raw.get("resolution", 1000)
        if isinstance(resolution, bool) or not isinstance(resolution, int) or not 1 <= resolution <= 1_000_000:
            raise InvalidInputError("adapter.settings.resolution", resolution, "must be an integer in 1-1000000")
        reload_timeout = raw.get("reload_timeout", 10.0)
        if isinstance(reload_timeout, bool) or not isinstance(reload_timeout, (int, float)) or reload_timeout <= 0:
            raise InvalidInputError("adapter.settings.reload_timeout", reload_timeout, "must be seconds > 0")
        binary = raw.get("binary", "")
        if binary:
            _absolute("adapter.settings.binary", binary)
        return cls(
            include_file=include_file,
            config=config,
            upstream=upstream,
            servers=servers,
            prefix=_absolute("adapter.settings.prefix", raw.get("prefix"), required=False),
            error_log=_absolute("adapter.settings.error_log", raw.get("error_log"), required=False),
            pid_file=_absolute("adapter.settings.pid_file", raw.get("pid_file"), required=False),
            method=method,
            keepalive=keepalive,
            resolution=resolution,
            reload_timeout=float(reload_timeout),
            binary=str(binary),
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

    def check(self) -> CheckResult:
        try:
            self._test_config()
            master = self._master_pid()
        except NginxError as exc:
            return CheckResult(ok=False, adapter=self.name, detail=str(exc))
        detail = f"nginx -t ok; master pid {master}" if master else "nginx -t ok; master pid unknown"
        return CheckResult(ok=True, adapter=self.name, detail=detail)

    # --- steps ----------------------------------------------------------------------------------

    def _install(self, text: str) -> None:
        previous: bytes | None
        try:
            previous = self.include_file.read_bytes()
        except FileNotFoundError:
            previous = None
        except OSError as exc:
            raise NginxError(f"cannot read the current include file {self.include_file}: {exc}") from exc
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
        argv = [self.binary or require_binary("nginx")]
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
            return int(self.pid_file.read_text().strip())
        except (OSError, ValueError) as exc:
            raise NginxError(f"cannot read the Nginx pid file {self.pid_file}: {exc}") from exc

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
