"""Fixtures shared by the whole suite: a real Redis and a real Redis Cluster on free loopback ports,
kernel receive timestamps switched on, artifacts."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import settings

from knapsack_lb.lab.procs import RedisClusterServers, RedisServer
from knapsack_lb.socket_timestamps import enable_timestamps, receive_with_timestamp

if TYPE_CHECKING:
    from knapsack_lb.store.redis import RedisLatencyStore

# The suite is reproducible: property tests draw the same examples on every run (CI once failed on
# a fresh draw). Search new ground with `pytest --hypothesis-profile=explore` and pin what it finds
# as a plain test.
settings.register_profile("reproducible", derandomize=True, database=None)
settings.register_profile("explore", max_examples=2000)
settings.load_profile("reproducible")

REPO_ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO_ROOT / "test-artifacts"


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One real ``redis-server`` for the session (tests use their own key namespaces/DBs)."""
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def fresh_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A real ``redis-server`` of the test's own, for tests that kill or restart it."""
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    """One real Redis Cluster for the session: 3 masters with a replica each (tests use their own
    key namespaces). Started the first time a test asks for it."""
    cluster = RedisClusterServers(tmp_path_factory.mktemp("redis-cluster")).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def fresh_redis_cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RedisClusterServers]:
    """A real Redis Cluster of the test's own (3 masters, 1 replica each), for tests that kill nodes;
    parametrized indirectly, the parameter is the node timeout in ms (default 1000)."""
    node_timeout_ms = getattr(request, "param", 1000)
    cluster = RedisClusterServers(tmp_path / "redis-cluster", node_timeout_ms=node_timeout_ms).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@dataclass(frozen=True)
class RedisTarget:
    """Where a store test runs: one Redis (``cluster`` false) or a Redis Cluster."""

    url: str
    cluster: bool
    startup_nodes: tuple[tuple[str, int], ...] = ()

    def store(self, **options: Any) -> RedisLatencyStore:
        """A store on this target (connects lazily); ``options`` go to :meth:`RedisLatencyStore.from_url`."""
        from knapsack_lb.store.redis import RedisLatencyStore

        return RedisLatencyStore.from_url(self.url, cluster=self.cluster, startup_nodes=self.startup_nodes,
                                          **options)


def make_redis_target(request: pytest.FixtureRequest, kind: str) -> RedisTarget:
    """The session's Redis (``kind`` "redis") or the session's Redis Cluster ("cluster") as a target."""
    if kind == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        return RedisTarget(server.url, cluster=False)
    if kind != "cluster":
        raise ValueError(f"kind must be 'redis' or 'cluster', got {kind!r}")
    cluster: RedisClusterServers = request.getfixturevalue("redis_cluster")
    nodes = tuple((cluster.host, port) for port in cluster.ports[1:])
    return RedisTarget(cluster.url, cluster=True, startup_nodes=nodes)


@pytest.fixture(params=["redis", "cluster"])
def redis_target(request: pytest.FixtureRequest) -> RedisTarget:
    """The session's Redis, then the session's Redis Cluster: a test that takes this runs on both."""
    return make_redis_target(request, request.param)


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """Where tests keep files a person may want to look at (screenshots, plots)."""
    path = Path(os.environ.get("KLB_ARTIFACTS", ARTIFACTS))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def kernel_stamping() -> Iterator[None]:
    """Linux stamps received data only after a work queue has switched stamping on for the whole
    machine, some time after the first socket asked (and off again after the last closed). Tests
    that time a socket's first data by its stamp hold a stamped loopback connection open and wait
    until its data comes stamped; a kernel that never stamps fails the test."""
    if not sys.platform.startswith("linux"):
        yield
        return
    with socket.create_server(("127.0.0.1", 0)) as listener, \
            socket.create_connection(listener.getsockname()[:2], timeout=5) as sender:
        receiver, _ = listener.accept()
        with receiver:
            receiver.settimeout(5)
            assert enable_timestamps(receiver)
            deadline = time.monotonic() + 5
            sender.sendall(b"x")
            while not receive_with_timestamp(receiver, 64)[1]:
                if time.monotonic() > deadline:
                    pytest.fail("the kernel did not stamp received data within 5 s")
                time.sleep(0.01)
                sender.sendall(b"x")
            yield
