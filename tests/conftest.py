"""Fixtures shared by the whole suite: a real Redis on a free loopback port, artifacts."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from knapsack_lb.lab.procs import RedisServer

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
def artifacts_dir() -> Path:
    """Where tests keep files a person may want to look at (screenshots, plots)."""
    path = Path(os.environ.get("KLB_ARTIFACTS", ARTIFACTS))
    path.mkdir(parents=True, exist_ok=True)
    return path
