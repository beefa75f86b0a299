"""The demo's live testbed on loopback: Redis, emulated DIPs, HAProxy, and the generated config.

* Redis: :class:`knapsack_lb.lab.procs.RedisServer` (throw-away, nothing on disk).
* DIPs: one emulator **process** per DIP (``python -m knapsack_lb.lab.testbed.emulator``) in
  processor-sharing mode (a CPU-bound server: every request in service gets an equal share of
  the CPU), work of ``service_time`` at capacity 1 (fixed by default: the same computation per
  request, like the paper's cache-intensive task), capacity factor per DIP.
  Each process stops by itself after ``max_seconds`` if the demo were killed.
* HAProxy: :class:`knapsack_lb.lab.testbed.lb_haproxy.HAProxyTestbed` in ``mode tcp`` (layer 4, as in
  the paper) with an admin socket; :meth:`DemoTestbed.switch` rewrites its config and reloads.
  With ``lb="nginx"`` or ``lb="envoy"`` the clients reach the DIPs through that LB instead
  (:class:`~knapsack_lb.lab.testbed.lb_nginx.NginxTestbed`, round robin, or
  :class:`~knapsack_lb.lab.testbed.lb_envoy.EnvoyTestbed`, EDS from a file; both layer 7), for the
  benchmarks that compare LBs; the demo's phases need HAProxy.
* :meth:`DemoTestbed.klb_config`: the configuration the service runner gets (one VIP whose DIPs
  are the emulators, the LB's adapter: ``haproxy`` on the demo's admin socket by default).
"""

from __future__ import annotations

import json
import signal
import sys
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from knapsack_lb.config import KlbConfig, parse_config
from knapsack_lb.lab.demo.settings import DemoSettings, probe_spec
from knapsack_lb.lab.procs import ManagedProcess, RedisServer, free_listening_port
from knapsack_lb.lab.testbed.lb_envoy import EnvoyTestbed
from knapsack_lb.lab.testbed.lb_haproxy import BACKEND, HAProxyTestbed
from knapsack_lb.lab.testbed.lb_nginx import NginxTestbed

VIP = "demo"
DemoLb = Literal["haproxy", "nginx", "envoy"]


class DemoTestbed:
    """Everything the demo runs besides the service itself; a context manager that stops it all."""

    def __init__(self, settings: DemoSettings, workdir: Path, max_seconds: float = 3600.0,
                 log_to: str | None = None, lb: DemoLb = "haproxy") -> None:
        self.settings = settings
        self.log_to = log_to  # host:port the LB sends the requests it timed to, the adapter's log_listen
        self.lb_kind = lb
        self.workdir = workdir
        self.max_seconds = max_seconds
        self.redis = RedisServer(workdir / "redis")
        self.backends: dict[str, str] = {}
        self.capacity: dict[str, float] = dict(zip(settings.names, settings.capacities, strict=True))
        self._emulators: dict[str, ManagedProcess] = {}
        self.front: HAProxyTestbed | NginxTestbed | EnvoyTestbed | None = None  # the LB the clients reach

    def __enter__(self) -> DemoTestbed:
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self.redis.start()
            self._start_emulators()
            if self.lb_kind == "nginx":
                self.front = NginxTestbed(self.backends, self.workdir / "nginx", log_to=self.log_to)
            elif self.lb_kind == "envoy":
                self.front = EnvoyTestbed(self.backends, self.workdir / "envoy", log_to=self.log_to)
            else:
                self.front = HAProxyTestbed(self.backends, self.workdir / "haproxy", balance="roundrobin",
                                            mode="tcp", log_to=self.log_to)
            self.front.__enter__()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.front is not None:
            self.front.__exit__(None, None, None)
            self.front = None
        for proc in self._emulators.values():
            proc.stop()
        self._emulators.clear()
        self.redis.stop()

    def _start_emulators(self) -> None:
        taken: list[int] = []
        for name in self.capacity:
            taken.append(free_listening_port(taken=taken))
            self.backends[name] = f"127.0.0.1:{taken[-1]}"
            self._emulators[name] = self._emulator(name)
        for name in self.backends:
            self._wait_for(name)

    def _emulator(self, name: str) -> ManagedProcess:
        s = self.settings
        logs = self.workdir / "emulators"
        logs.mkdir(parents=True, exist_ok=True)
        port = self.backends[name].rpartition(":")[2]
        argv = [sys.executable, "-m", "knapsack_lb.lab.testbed.emulator", "--name", name, "--port", port,
                "--mode", "ps", "--workers", "1", "--service-time", str(s.service_time),
                "--distribution", s.distribution, "--capacity", str(self.capacity[name]),
                "--seed", str(s.seed * 100 + list(self.capacity).index(name)), "--duration", str(self.max_seconds)]
        return ManagedProcess(argv, log_path=logs / f"{name}.log").start()

    def _wait_for(self, name: str) -> None:
        host, _, listen = self.backends[name].rpartition(":")
        self._emulators[name].wait_listening(host, int(listen), timeout=20.0)

    def kill_backend(self, name: str) -> None:
        """The DIP's server dies (SIGKILL): its connections break, its port refuses."""
        proc = self._emulators[name]
        proc.signal(signal.SIGKILL)
        proc.stop()

    def restart_backend(self, name: str) -> None:
        """The DIP's server comes back on the same address (fresh counters)."""
        self._emulators[name] = self._emulator(name)
        self._wait_for(name)

    # --- the LB --------------------------------------------------------------------------
    @property
    def vip_port(self) -> int:
        """The port the clients send to (the LB's listener on 127.0.0.1)."""
        assert self.front is not None, "testbed not started"
        return self.front.listen_port if isinstance(self.front, EnvoyTestbed) else self.front.port

    @property
    def lb(self) -> HAProxyTestbed:
        assert isinstance(self.front, HAProxyTestbed), "testbed not started, or not in front of HAProxy"
        return self.front

    def switch(self, balance: str, mode: Literal["http", "tcp"]) -> None:
        """Rewrite HAProxy's config for a phase and reload it (runtime weights kept via the state file)."""
        if self.lb.balance != balance or self.lb.mode != mode:
            self.lb.reconfigure(balance=balance, mode=mode)

    def set_weights(self, weights: dict[str, int]) -> None:
        """Set runtime weights directly on the admin socket (0-256), e.g. equal weights for a baseline."""
        commands = ";".join(f"set server {BACKEND}/{name} weight {w}" for name, w in weights.items())
        self.lb.admin_command(commands)

    # --- emulators -----------------------------------------------------------------------
    def _http(self, name: str, path: str, method: str = "GET") -> dict[str, Any]:
        request = urllib.request.Request(f"http://{self.backends[name]}{path}", method=method)
        with urllib.request.urlopen(request, timeout=5.0) as response:
            data: dict[str, Any] = json.loads(response.read())
        return data

    def reset_stats(self) -> None:
        for name in self.backends:
            self._http(name, "/admin/reset", "POST")

    def stats(self) -> dict[str, dict[str, Any]]:
        return {name: self._http(name, "/stats") for name in self.backends}

    def stats_of(self, name: str) -> dict[str, Any]:
        """One emulator's counters (busy seconds, requests); raises OSError when it is down."""
        return self._http(name, "/stats")

    # --- the service's configuration -------------------------------------------------------
    def klb_config(self, api_port: int = 0) -> KlbConfig:
        s = self.settings
        assert self.front is not None, "testbed not started"
        raw: dict[str, Any] = {
            "redis": {"url": self.redis.url, "namespace": "demo"},
            "vip_source": "config",
            "load_balancers": {self.lb_kind: {"adapter": self.front.adapter_name,
                                              "settings": self.front.adapter_settings}},
            "vips": [{
                "name": VIP,
                "objective": "mean",
                "paused": True,  # the baseline phases run first; the runner unpauses it to learn
                "probe": probe_spec(s, timeout=2.0),
                "adapter": {"lb": self.lb_kind},
                "dips": [{"name": n, "address": a} for n, a in self.backends.items()],
            }],
            # physical inputs only (the cadence, a round's age, the drain time): every learning knob at its default
            "controller": {
                "loop": {"interval": s.controller_interval, "measurement_max_age": max(15.0, 4 * s.probe_interval)},
                "drain": {"time": s.drain_time},
            },
            "probes": {"worker_id": "demo-probes"},
            "api": {"host": "127.0.0.1", "port": api_port},
            "logging": {"level": "WARNING"},
        }
        return parse_config(raw, source="demo")
