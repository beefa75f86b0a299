"""Free loopback ports and managed child processes (Redis, load balancers, emulators).

Tests, benchmarks and the demo start real servers on free loopback ports; this module is
the one place that knows how to pick a port, start a process, wait until it listens, and
stop it (SIGTERM, then SIGKILL) without leaving orphans behind.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path


def free_port(host: str = "127.0.0.1", kind: int = socket.SOCK_STREAM) -> int:
    """A port that is free on ``host`` right now (TCP by default; ``SOCK_DGRAM`` for UDP)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, kind) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_is_free(host: str, port: int) -> bool:
    """True when a TCP listener could bind ``host:port`` right now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


CLUSTER_BUS_OFFSET = 10000  # a Redis Cluster node also listens on its port + this (the cluster bus)
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_EPHEMERAL_FLOOR = 32768  # the kernel's default lower bound of the ephemeral range


def ephemeral_port_floor(ranges: Path = EPHEMERAL_RANGE) -> int:
    """The lowest port the kernel hands to outgoing connections (Linux's default when unreadable)."""
    try:
        return int(ranges.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return LINUX_EPHEMERAL_FLOOR


def free_listening_port(host: str = "127.0.0.1", taken: Collection[int] = (), offsets: Sequence[int] = (0,)) -> int:
    """A port for a server the caller is about to start: free on ``host`` with ``port + offset`` free
    for every one of ``offsets``, none of them in ``taken`` (ports already handed out, whose servers
    may not have bound yet), and below the ephemeral range, where no outgoing connection can take
    it before the server binds it. A port the kernel picks (``free_port``) has neither guarantee: two
    emulators of one testbed were once given the same port, and HAProxy sent one DIP's traffic to
    another's server for a whole demo. ``OSError`` if none is found."""
    rng = random.Random()
    top = max(ephemeral_port_floor() - max(offsets), 12000)  # a kernel with a low floor: a small range, free-checked
    used = set(taken)
    for _ in range(1000):
        port = rng.randrange(10000, top)
        if any(port + a - b in used for a in offsets for b in offsets):
            continue
        if all(port_is_free(host, port + offset) for offset in offsets):
            return port
    raise OSError(f"no free port (with {', '.join(f'+{o}' for o in offsets)}) found on {host}")


def free_cluster_port(host: str = "127.0.0.1", taken: Sequence[int] = ()) -> int:
    """A port for a Redis Cluster node: free, with its cluster bus port (port + 10000) free as well
    (:func:`free_listening_port`). ``OSError`` if none is found."""
    return free_listening_port(host, taken, (0, CLUSTER_BUS_OFFSET))


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


_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp


def listening_sockets(port: int, tables: Sequence[Path] = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))) -> set[int]:
    """The inodes of the TCP sockets listening on ``port`` in this network namespace (Linux)."""
    inodes = set()
    for table in tables:
        with contextlib.suppress(OSError):
            for line in table.read_text().splitlines()[1:]:
                fields = line.split()
                if len(fields) > 9 and fields[3] == _LISTEN and int(fields[1].rpartition(":")[2], 16) == port:
                    inodes.add(int(fields[9]))
    return inodes


def _socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets process ``pid`` holds open."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(int(target[8:-1]))
    return inodes


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

    def wait_listening(self, host: str, port: int, timeout: float = 10.0) -> None:
        """Block until this process holds a listening socket on ``port`` (:func:`listening_sockets`) and
        a connect to ``host:port`` succeeds. A connect alone is not enough: when another process has
        the port, it answers while this one is still starting, and this one then fails to bind.
        ``RuntimeError`` naming the port if the process exits first, ``TimeoutError`` if it does not
        listen in time."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.alive():
                code = self.process.returncode if self.process is not None else None
                raise RuntimeError(f"{' '.join(self.argv[:4])} exited (code {code}) before listening on "
                                   f"{host}:{port}; see {self.log_path or 'its output'}")
            if listening_sockets(port) & _socket_inodes(self.pid):
                with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{' '.join(self.argv[:4])} did not listen on {host}:{port} within {timeout} s")
            time.sleep(0.02)

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
        self.port = self.port or free_listening_port(self.host)
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


@dataclass
class RedisClusterServers:
    """A throw-away Redis Cluster on free loopback ports: ``masters`` masters with ``replicas``
    replicas each (``redis-cli --cluster create``), nothing persisted, node timeout
    ``node_timeout_ms`` (a dead master's replica is promoted about two timeouts later).

    :meth:`start` returns once every node reports ``cluster_state:ok`` and every replica has
    finished its first sync; ``TimeoutError`` (with the nodes' logs' tails) otherwise.
    """

    workdir: Path
    host: str = "127.0.0.1"
    masters: int = 3
    replicas: int = 1
    node_timeout_ms: int = 1000
    ports: list[int] = field(default_factory=list, init=False)
    _procs: dict[int, ManagedProcess] = field(default_factory=dict, init=False)

    @property
    def url(self) -> str:
        """The first node, as the store's ``redis.url`` (any node would do)."""
        return f"redis://{self.host}:{self.ports[0]}/0"

    @property
    def startup_nodes(self) -> list[str]:
        """Every node but the first, as ``redis.startup_nodes``."""
        return [f"{self.host}:{port}" for port in self.ports[1:]]

    def start(self, timeout: float = 30.0) -> RedisClusterServers:
        self.workdir.mkdir(parents=True, exist_ok=True)
        server = require_binary("redis-server")
        for _ in range(self.masters * (1 + self.replicas)):
            port = free_cluster_port(self.host, self.ports)
            self.ports.append(port)
            node_dir = self.workdir / str(port)
            node_dir.mkdir(exist_ok=True)
            self._procs[port] = ManagedProcess(
                [server, "--port", str(port), "--bind", self.host, "--cluster-enabled", "yes",
                 "--cluster-config-file", str(node_dir / "nodes.conf"),
                 "--cluster-node-timeout", str(self.node_timeout_ms), "--save", "", "--appendonly", "no",
                 "--dir", str(node_dir)],
                log_path=node_dir / "redis.log",
            ).start()
        try:
            for port in self.ports:
                wait_for_port(self.host, port)
            subprocess.run(
                [require_binary("redis-cli"), "--cluster", "create", *(f"{self.host}:{p}" for p in self.ports),
                 "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                check=True, capture_output=True, timeout=timeout,
            )
            self.wait_until_ok(self.ports, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def cli(self, port: int, *args: str, timeout: float = 5.0) -> str:
        """Run ``redis-cli -p port args...`` against one node; its standard output."""
        result = subprocess.run([require_binary("redis-cli"), "-h", self.host, "-p", str(port), *args],
                                capture_output=True, text=True, timeout=timeout)
        return result.stdout

    def info(self, port: int, section: str) -> dict[str, str]:
        """``INFO section`` (or ``CLUSTER INFO`` for ``section='cluster-info'``) of one node, as a dict."""
        args = ("cluster", "info") if section == "cluster-info" else ("info", section)
        pairs = (line.split(":", 1) for line in self.cli(port, *args).splitlines() if ":" in line)
        return {key.strip(): value.strip() for key, value in pairs}

    def master_ports(self) -> list[int]:
        """Ports of the live nodes that are masters now."""
        return [p for p in self.ports if self.alive(p) and self.info(p, "replication").get("role") == "master"]

    def replica_ports(self, master_port: int) -> list[int]:
        """Ports of the live replicas of the master on ``master_port``."""
        return [p for p in self.ports if p != master_port and self.alive(p)
                and self.info(p, "replication").get("master_port") == str(master_port)]

    def alive(self, port: int) -> bool:
        return self._procs[port].alive()

    def wait_until_ok(self, ports: Sequence[int], timeout: float = 30.0) -> None:
        """Until each node on ``ports`` reports ``cluster_state:ok`` and each replica among them is in sync."""
        deadline = time.monotonic() + timeout
        pending = list(ports)
        while pending:
            port = pending[0]
            replication = self.info(port, "replication")
            synced = replication.get("role") != "slave" or replication.get("master_link_status") == "up"
            if self.info(port, "cluster-info").get("cluster_state") == "ok" and synced:
                pending.pop(0)
                continue
            if time.monotonic() > deadline:
                raise TimeoutError(f"Redis Cluster node {self.host}:{port} not ok within {timeout} s: "
                                   f"{self.cli(port, 'cluster', 'info')[:200]!r}")
            time.sleep(0.05)

    def wait_for_state(self, port: int, state: str, timeout: float = 30.0) -> None:
        """Until the node on ``port`` reports ``cluster_state:<state>``; ``TimeoutError`` otherwise."""
        deadline = time.monotonic() + timeout
        while self.info(port, "cluster-info").get("cluster_state") != state:
            if time.monotonic() > deadline:
                raise TimeoutError(f"Redis Cluster node {self.host}:{port} did not reach cluster_state:{state}")
            time.sleep(0.05)

    def kill(self, port: int) -> None:
        """SIGKILL one node, as a crash would."""
        proc = self._procs[port]
        proc.signal(signal.SIGKILL)
        assert proc.process is not None
        proc.process.wait(timeout=5)

    def stop(self) -> None:
        for proc in self._procs.values():
            proc.stop()

    def __enter__(self) -> RedisClusterServers:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
