"""The admin API on a real Redis Cluster: every read route and the write routes work as on one Redis
(VIP keys in one slot, the VIP index in another), and an unreachable cluster is a 503."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from fastapi import FastAPI

from knapsack_lb.clock import SystemClock
from knapsack_lb.lab.procs import free_cluster_port
from knapsack_lb.store import LatencyStore
from knapsack_lb.store.redis import RedisLatencyStore
from tests.api.conftest import AUTH
from tests.api.seed import VIP, seed_store
from tests.conftest import RedisTarget, make_redis_target

AppFactory = Callable[..., FastAPI]
READS = ["/healthz", "/readyz", "/metrics", "/api/v1/vips", f"/api/v1/vips/{VIP}", f"/api/v1/vips/{VIP}/dips",
         f"/api/v1/vips/{VIP}/plan", f"/api/v1/vips/{VIP}/plans", f"/api/v1/vips/{VIP}/curves",
         f"/api/v1/vips/{VIP}/measurements", f"/api/v1/vips/{VIP}/controller", "/api/v1/status",
         f"/api/v1/vips/{VIP}/dashboard", "/dashboard"]


@pytest.fixture
async def cluster_store(request: pytest.FixtureRequest) -> AsyncIterator[LatencyStore]:
    target: RedisTarget = make_redis_target(request, "cluster")
    store = target.store(namespace=f"a{uuid.uuid4().hex[:10]}")
    try:
        await seed_store(store, SystemClock().wall())
        yield store
    finally:
        await store.close()


async def test_every_read_and_the_write_routes_work_on_a_cluster(cluster_store: LatencyStore,
                                                                  app_factory: AppFactory) -> None:
    app = app_factory(cluster_store)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        for path in READS:
            response = await c.get(path)
            assert response.status_code == 200, (path, response.text)
        assert (await c.post(f"/api/v1/vips/{VIP}/pause", headers=AUTH)).status_code == 200
        assert (await c.put(f"/api/v1/vips/{VIP}/dips/dip1/pin", json={"weight": 0.3}, headers=AUTH)).status_code == 200
        assert (await c.post(f"/api/v1/vips/{VIP}/dips/dip2/remeasure", headers=AUTH)).status_code == 202
        created = await c.post("/api/v1/vips", headers=AUTH, json={
            "name": "api", "dips": [{"name": "a1", "address": "127.0.0.1:18091"}], "adapter": {"lb": "rec"}})
        assert created.status_code == 201, created.text
        assert [v["name"] for v in (await c.get("/api/v1/vips")).json()] == ["api", VIP]
        assert (await c.delete("/api/v1/vips/api", headers=AUTH)).status_code == 204
        assert [v["name"] for v in (await c.get("/api/v1/vips")).json()] == [VIP]
        config = (await c.get(f"/api/v1/vips/{VIP}")).json()
        assert config["paused"] is True and config["pins"] == {"dip1": 0.3}
    assert await cluster_store.take_remeasure_requests(VIP) == {"dip2"}


async def test_an_unreachable_cluster_is_a_503(app_factory: AppFactory) -> None:
    store = RedisLatencyStore.from_url(f"redis://127.0.0.1:{free_cluster_port()}/0", cluster=True)
    try:
        app = app_factory(store)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
            assert (await c.get("/api/v1/vips")).status_code == 503
            assert (await c.get("/readyz")).status_code == 503
    finally:
        await store.close()
