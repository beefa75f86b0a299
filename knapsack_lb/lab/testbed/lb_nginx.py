"""A real Nginx (Debian ``nginx``, 1.22 OSS) in front of given backends, for tests and benchmarks.

Implements :class:`knapsack_lb.lab.testbed.lb_harness.LbTestbed`. Nginx runs unprivileged with its
prefix, pid file, error log and temp paths in the work directory (``-p prefix -c conf -e log``),
in the foreground (``daemon off``, master + one worker) under
:class:`~knapsack_lb.lab.procs.ManagedProcess`. The upstream block lives in its own include file,
first written with equal weights by :func:`adapters.nginx.render_upstream`, the same renderer
the adapter uses. With ``log_to`` (``host:port``) Nginx sends its access log there over syslog in
the adapter's line format (:data:`adapters.nginx_log.LOG_FORMAT`), and the adapter settings
receive it (``log_listen``). Keep-alive clients are used and retry idempotent requests (Nginx closes
keep-alive connections of old workers on every reload).
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from adapters.nginx import render_upstream
from adapters.nginx_log import LOG_FORMAT, LOG_FORMAT_NAME
from knapsack_lb.lab.procs import ManagedProcess, free_listening_port, require_binary, wait_for_port
from knapsack_lb.lab.testbed.lb_harness import HttpSender
from knapsack_lb.names import format_address, parse_address, validate_name

UPSTREAM = "klb"


class NginxTestbed:
    """Nginx on loopback in front of ``backends`` (name -> ``host:port``)."""

    lb_name = "nginx"
    adapter_name = "nginx"
    log_socket = socket.SOCK_DGRAM  # ``log_to``: Nginx logs over syslog (UDP)
    retries = 2  # a reload closes keep-alive connections of old workers: retry idempotent GETs

    def __init__(
        self,
        backends: Mapping[str, str],
        workdir: Path,
        *,
        method: str = "round_robin",
        keep_alive: bool = True,
        upstream_keepalive: int = 16,
        log_to: str | None = None,
    ) -> None:
        self.backends = {validate_name("backend", n): a for n, a in backends.items()}
        for name, address in self.backends.items():
            parse_address(f"backends.{name}", address)
        self.method = method
        self.keep_alive = keep_alive
        self.upstream_keepalive = upstream_keepalive
        self.log_to = None if log_to is None else format_address(*parse_address("log_to", log_to))
        self.workdir = workdir
        self.port = 0
        self._proc: ManagedProcess | None = None

    @property
    def config_path(self) -> Path:
        return self.workdir / "nginx.conf"

    @property
    def include_path(self) -> Path:
        return self.workdir / "upstream-klb.conf"

    @property
    def pid_path(self) -> Path:
        return self.workdir / "nginx.pid"

    @property
    def error_log(self) -> Path:
        return self.workdir / "error.log"

    @property
    def adapter_settings(self) -> dict[str, Any]:
        settings = {
            "include_file": str(self.include_path),
            "config": str(self.config_path),
            "prefix": str(self.workdir),
            "error_log": str(self.error_log),
            "pid_file": str(self.pid_path),
            "upstream": UPSTREAM,
            "servers": dict(self.backends),
            "method": self.method,
            "keepalive": self.upstream_keepalive,
        }
        return settings if self.log_to is None else {**settings, "log_listen": self.log_to}

    def traffic_target(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def open_sender(self) -> HttpSender:
        return HttpSender(self.traffic_target(), keep_alive=self.keep_alive, retries=self.retries)

    def render_config(self) -> str:
        tmp = self.workdir / "tmp"
        logging = "access_log off;" if self.log_to is None else (
            f"log_format {LOG_FORMAT_NAME} '{LOG_FORMAT}';\n"
            f"    access_log syslog:server={self.log_to},nohostname {LOG_FORMAT_NAME};"
        )
        return f"""daemon off;
master_process on;
worker_processes 1;
pid {self.pid_path};
error_log {self.error_log} notice;
events {{ worker_connections 1024; }}
http {{
    {logging}
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    include {self.include_path};
    server {{
        listen 127.0.0.1:{self.port};
        location / {{
            proxy_pass http://{UPSTREAM};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_next_upstream error timeout http_502 http_503;
        }}
    }}
}}
"""

    def __enter__(self) -> NginxTestbed:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "tmp").mkdir(exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        self.port = free_listening_port()
        equal = dict.fromkeys(self.backends, 1)
        self.include_path.write_text(
            render_upstream(UPSTREAM, self.backends, equal, method=self.method, keepalive=self.upstream_keepalive)
        )
        self.config_path.write_text(self.render_config())
        argv = [
            require_binary("nginx"),
            "-p",
            str(self.workdir),
            "-e",
            str(self.error_log),
            "-c",
            str(self.config_path),
        ]
        self._proc = ManagedProcess(argv, log_path=self.workdir / "nginx.out").start()
        try:
            wait_for_port("127.0.0.1", self.port, timeout=10.0)
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
