"""API fixtures: the real Redis latency store (one namespace per test), seeded data, an
httpx client talking to the app in-process (ASGI), and a real uvicorn on a free port."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from knapsack_lb.api import create_app
from knapsack_lb.clock import SystemClock
from knapsack_lb.config import ApiSettings, LoadBalancerConfig
from knapsack_lb.lab.procs import RedisServer, free_listening_port, wait_for_port
from knapsack_lb.store import LatencyStore
from tests.api.seed import seed_store

TOKEN = "test-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# The operator's load balancers the API tests run with (a recording adapter: nothing is contacted)
LOAD_BALANCERS = {"rec": LoadBalancerConfig(adapter="recording")}


def make_store(url: str, namespace: str) -> LatencyStore:
    from knapsack_lb.store.redis import RedisLatencyStore

    store: LatencyStore = RedisLatencyStore.from_url(url, namespace=namespace)
    return store


@pytest.fixture
def namespace() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def store(redis_server: RedisServer, namespace: str) -> AsyncIterator[LatencyStore]:
    s = make_store(redis_server.url, namespace)
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
async def seeded(store: LatencyStore) -> LatencyStore:
    await seed_store(store, SystemClock().wall())
    return store


@pytest.fixture
def app_factory() -> Callable[..., FastAPI]:
    def build(store: LatencyStore, token: str | None = TOKEN, **settings: object) -> FastAPI:
        return create_app(store, ApiSettings.model_validate(settings), token=token, load_balancers=LOAD_BALANCERS)

    return build


@pytest.fixture
async def client(seeded: LatencyStore, app_factory: Callable[..., FastAPI]) -> AsyncIterator[httpx.AsyncClient]:
    app = app_factory(seeded)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        yield c


@dataclass
class LiveServer:
    """A uvicorn serving the app on a free loopback port, in a thread with its own loop and store."""

    url: str
    port: int


@contextlib.contextmanager
def live_server(redis_url: str, namespace: str, token: str | None = TOKEN, seed: bool = True,
                **settings: object) -> Iterator[LiveServer]:
    port = free_listening_port()
    ready = threading.Event()
    holder: dict[str, uvicorn.Server] = {}
    errors: list[BaseException] = []

    async def main() -> None:
        store = make_store(redis_url, namespace)
        try:
            if seed:
                await seed_store(store, SystemClock().wall())
            app = create_app(store, ApiSettings.model_validate(settings), token=token,
                             load_balancers=LOAD_BALANCERS)
            server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                                   lifespan="off"))
            holder["server"] = server
            ready.set()
            await server.serve()
        finally:
            await store.close()

    def thread_main() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # reported by the fixture
            errors.append(exc)
            ready.set()

    thread = threading.Thread(target=thread_main, name="uvicorn-test", daemon=True)
    thread.start()
    ready.wait(30)
    if errors:
        raise errors[0]
    wait_for_port("127.0.0.1", port, timeout=30)
    try:
        yield LiveServer(url=f"http://127.0.0.1:{port}", port=port)
    finally:
        if "server" in holder:
            holder["server"].should_exit = True
        thread.join(15)
