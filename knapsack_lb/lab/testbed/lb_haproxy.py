"""A real HAProxy (Debian ``haproxy``, 2.6) in front of given backends, for tests and benchmarks.

Implements :class:`knapsack_lb.lab.testbed.lb_harness.LbTestbed`. HAProxy runs in the foreground
in master-worker mode (``-W -db``) under :class:`~knapsack_lb.lab.procs.ManagedProcess`, with an
HTTP frontend on a free loopback port, one backend ``klb`` with a server per backend name
(config weight 100), an admin ``stats socket`` (UNIX by default, TCP with ``admin="tcp"``) and
``server-state-file`` + ``load-server-state-from-file`` so that runtime weights survive
:meth:`HAProxyTestbed.reload` (SIGUSR2 to the master) once the adapter has dumped the state.
"""

from __future__ import annotations

import signal
import socket
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from knapsack_lb.lab.procs import ManagedProcess, free_listening_port, require_binary, wait_for_port
from knapsack_lb.lab.testbed.lb_harness import HttpSender
from knapsack_lb.names import format_address, parse_address, validate_name

BACKEND = "klb"
UNIX_PATH_MAX = 100  # sun_path is 108 bytes; stay below


class HAProxyTestbed:
    """HAProxy on loopback in front of ``backends`` (name -> ``host:port``)."""

    lb_name = "haproxy"
    adapter_name = "haproxy"
    log_socket = socket.SOCK_DGRAM  # ``log_to``: HAProxy logs over syslog (UDP)
    retries = 0  # HAProxy must not fail a single request while weights change

    def __init__(
        self,
        backends: Mapping[str, str],
        workdir: Path,
        *,
        balance: str = "roundrobin",
        admin: Literal["unix", "tcp"] = "unix",
        keep_alive: bool = True,
        mode: Literal["http", "tcp"] = "http",
        log_to: str | None = None,
    ) -> None:
        self.backends = {validate_name("backend", n): a for n, a in backends.items()}
        for name, address in self.backends.items():
            parse_address(f"backends.{name}", address)
        if balance not in ("roundrobin", "leastconn", "static-rr", "random", "random(1)", "first"):
            raise ValueError(f"unsupported balance {balance!r}")
        self.balance = balance
        if mode not in ("http", "tcp"):
            raise ValueError(f"unsupported mode {mode!r} (http or tcp)")
        self.mode = mode  # tcp: layer 4, a client connection is placed once (KnapsackLB's setting)
        self.admin = admin
        self.keep_alive = keep_alive
        # host:port (UDP) HAProxy sends its logs to (HTTP logs in mode http), the adapter's log_listen
        self.log_to = None if log_to is None else format_address(*parse_address("log_to", log_to))
        self.workdir = workdir.resolve()  # HAProxy reads a relative socket path as host:port
        self.port = 0
        self.admin_port = 0
        self.socket_path = ""
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None
        self._proc: ManagedProcess | None = None

    # --- LbTestbed ---------------------------------------------------------------------------

    @property
    def config_path(self) -> Path:
        return self.workdir / "haproxy.cfg"

    @property
    def state_file(self) -> Path:
        return self.workdir / "server-state"

    @property
    def adapter_settings(self) -> dict[str, Any]:
        endpoint = self.socket_path if self.admin == "unix" else f"127.0.0.1:{self.admin_port}"
        settings = {"socket": endpoint, "backend": BACKEND, "state_file": str(self.state_file)}
        return settings if self.log_to is None else {**settings, "log_listen": self.log_to}

    def traffic_target(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def open_sender(self) -> HttpSender:
        return HttpSender(self.traffic_target(), keep_alive=self.keep_alive, retries=self.retries)

    def __enter__(self) -> HAProxyTestbed:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_listening_port()
        if self.admin == "unix":
            self.socket_path = str(self.workdir / "admin.sock")
            if len(self.socket_path) > UNIX_PATH_MAX:
                self._tmpdir = tempfile.TemporaryDirectory(prefix="klb-hx-")
                self.socket_path = str(Path(self._tmpdir.name) / "admin.sock")
        else:
            self.admin_port = free_listening_port(taken=[self.port])
        self.config_path.write_text(self.render_config())
        # A state file an earlier run left here holds that run's servers (ports, runtime weights); HAProxy
        # would load it and send traffic to backends that are gone (a second `make demo` answered nothing).
        self.state_file.unlink(missing_ok=True)
        binary = require_binary("haproxy")
        self._proc = ManagedProcess(
            [binary, "-W", "-db", "-f", str(self.config_path)], log_path=self.workdir / "haproxy.log"
        ).start()
        try:
            wait_for_port("127.0.0.1", self.port, timeout=10.0)
            self._wait_admin(timeout=10.0)
        except Exception:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._proc is not None:
            self._proc.stop()
            self._proc = None
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None

    # --- extras ------------------------------------------------------------------------------

    def render_config(self) -> str:
        if self.admin == "unix":
            stats = f"stats socket {self.socket_path} mode 600 level admin"
        else:
            stats = f"stats socket ipv4@127.0.0.1:{self.admin_port} level admin"
        servers = "\n".join(
            f"    server {name} {address} weight 100" for name, address in sorted(self.backends.items())
        )
        logging = ""
        if self.log_to is not None:
            logging = f"    log {self.log_to} local0\n" + ("    option httplog\n" if self.mode == "http" else "")
        return f"""global
    {stats}
    server-state-file {self.state_file}
    maxconn 4000

defaults
    mode {self.mode}
{logging}    timeout connect 2s
    timeout client 30s
    timeout server 30s
    retries 2
    option redispatch
    load-server-state-from-file global

frontend fe
    bind 127.0.0.1:{self.port}
    default_backend {BACKEND}

backend {BACKEND}
    balance {self.balance}
{servers}
"""

    def reconfigure(self, *, balance: str | None = None, mode: Literal["http", "tcp"] | None = None) -> None:
        """Switch the balance algorithm and/or the proxy mode: rewrite the config and reload.

        Runtime weights survive through the server-state file once an adapter has written it;
        connections already open stay on the old worker until they close."""
        if balance is not None:
            if balance not in ("roundrobin", "leastconn", "static-rr", "random", "random(1)", "first"):
                raise ValueError(f"unsupported balance {balance!r}")
            self.balance = balance
        if mode is not None:
            if mode not in ("http", "tcp"):
                raise ValueError(f"unsupported mode {mode!r} (http or tcp)")
            self.mode = mode
        self.config_path.write_text(self.render_config())
        self.reload()

    def worker_pid(self) -> int:
        """PID of the current worker (``show info``), to see a reload complete."""
        for line in self.admin_command("show info").splitlines():
            if line.startswith("Pid:"):
                return int(line.split(":", 1)[1])
        raise RuntimeError("show info has no Pid line")

    def admin_command(self, command: str) -> str:
        """One non-interactive admin command (for the testbed itself, not the adapter)."""
        if self.admin == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(2.0)
            sock.connect(self.socket_path)
        else:
            sock = socket.create_connection(("127.0.0.1", self.admin_port), timeout=2.0)
        with sock:
            sock.sendall(command.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")

    def reload(self, timeout: float = 10.0) -> None:
        """Graceful reload (SIGUSR2 to the master): a new worker reads the config and the
        server-state file; returns when the new worker answers on the admin socket.

        A master that is still finishing its own start-up ignores the signal, so it is sent
        again every second until a new worker answers."""
        assert self._proc is not None
        before = self.worker_pid()
        deadline = time.monotonic() + timeout
        next_signal = 0.0
        while time.monotonic() < deadline:
            if time.monotonic() >= next_signal:
                self._proc.signal(signal.SIGUSR2)
                next_signal = time.monotonic() + 1.0
            try:
                if self.worker_pid() != before:
                    return
            except (OSError, RuntimeError, ValueError):
                pass
            time.sleep(0.05)
        raise TimeoutError(f"HAProxy did not reload within {timeout} s")

    def _wait_admin(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.worker_pid()
                return
            except (OSError, RuntimeError, ValueError):
                if time.monotonic() > deadline:
                    raise TimeoutError("HAProxy admin socket did not answer") from None
                time.sleep(0.05)
