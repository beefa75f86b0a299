"""Free loopback ports and managed child processes (Redis, load balancers, emulators).

Tests, benchmarks and the demo start real servers on free loopback ports; this module is
the one place that knows how to pick a port, start a process, wait until it listens, and
stop it (SIGTERM, then SIGKILL) without leaving orphans behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path


def free_port(host: str = "127.0.0.1", kind: int = socket.SOCK_STREAM) -> int:
    """A port that is free on ``host`` right now (TCP by default; ``SOCK_DGRAM`` for UDP)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, kind) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_for_port(host: str, port: int, timeout: float = 10.0) -> None:
    """Block until a TCP connect to ``host:port`` succeeds; ``TimeoutError`` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listened on {host}:{port} within {timeout} s") from None
            time.sleep(0.02)


def require_binary(name: str, *extra_dirs: str) -> str:
    """Absolute path of an executable, looking in PATH and ``/usr/sbin``-style dirs."""
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", *extra_dirs])
    found = shutil.which(name, path=search)
    if found is None:
        raise FileNotFoundError(f"{name} is not installed (make test / make demo install it)")
    return found


@dataclass
class ManagedProcess:
    """A child process that is stopped for sure: SIGTERM, wait, then SIGKILL."""

    argv: Sequence[str]
    log_path: Path | None = None
    env: dict[str, str] | None = None
    cwd: Path | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> ManagedProcess:
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.process = subprocess.Popen(
                list(self.argv), stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd,
                start_new_session=True,
            )
        finally:
            if self.log_path:
                log.close()  # type: ignore[union-attr]
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.process is not None
            self.process.send_signal(sig)

    def stop(self, timeout: float = 5.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=timeout)

    def __enter__(self) -> ManagedProcess:
        return self.start() if self.process is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class RedisServer:
    """A throw-away ``redis-server`` on a free loopback port; nothing persisted to disk unless
    ``persistent`` (append-only file, fsync on every write: a restart after SIGKILL keeps every
    acknowledged write, as a production Redis configured for it does)."""

    workdir: Path
    host: str = "127.0.0.1"
    port: int = 0
    persistent: bool = False
    _proc: ManagedProcess | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def start(self) -> RedisServer:
        self.port = self.port or free_port(self.host)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._proc = ManagedProcess(
            [require_binary("redis-server"), "--port", str(self.port), "--bind", self.host, "--save", "",
             *(["--appendonly", "yes", "--appendfsync", "always"] if self.persistent else ["--appendonly", "no"]),
             "--dir", str(self.workdir)],
            log_path=self.workdir / "redis.log",
        ).start()
        wait_for_port(self.host, self.port)
        return self

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()

    def kill(self) -> None:
        """Stop abruptly (SIGKILL), as an outage would."""
        if self._proc is not None:
            self._proc.signal(signal.SIGKILL)
            assert self._proc.process is not None
            self._proc.process.wait(timeout=5)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def redis_server(workdir: Path) -> Iterator[RedisServer]:
    """Context manager form of :class:`RedisServer`."""
    server = RedisServer(workdir).start()
    try:
        yield server
    finally:
        server.stop()
