"""Read endpoints against the real Redis store with seeded data."""

from __future__ import annotations

import math
from collections.abc import Callable

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from knapsack_lb.lab.procs import RedisServer
from knapsack_lb.store import LatencyStore
from tests.api.conftest import make_store
from tests.api.seed import DIPS, PLAN_WEIGHTS, VIP, curve_of, vip_config

AppFactory = Callable[..., FastAPI]


async def test_health_and_readiness(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    ready = await client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "store": True}


async def test_readyz_is_503_when_redis_is_gone(fresh_redis: RedisServer, app_factory: AppFactory) -> None:
    server = fresh_redis
    store = make_store(server.url, "down")
    app = app_factory(store)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        assert (await c.get("/readyz")).status_code == 200
        server.kill()
        down = await c.get("/readyz")
        assert down.status_code == 503
        assert down.json() == {"status": "unavailable", "store": False}
        listing = await c.get("/api/v1/vips")
        assert listing.status_code == 503
        assert "unreachable" in listing.json()["detail"]
        metrics = await c.get("/metrics")
        assert "klb_store_up 0.0" in metrics.text
    await store.close()


async def test_vip_list_and_config(client: httpx.AsyncClient) -> None:
    vips = (await client.get("/api/v1/vips")).json()
    assert vips == [
        {"name": VIP, "dips": list(DIPS), "paused": False, "dry_run": False, "pins": {}, "drained": [],
         "adapter": None, "plan_version": len(PLAN_WEIGHTS)}
    ]
    config = (await client.get(f"/api/v1/vips/{VIP}")).json()
    assert config["name"] == VIP
    assert [d["name"] for d in config["dips"]] == list(DIPS)
    dips = (await client.get(f"/api/v1/vips/{VIP}/dips")).json()
    assert [d["address"] for d in dips] == ["127.0.0.1:18081", "127.0.0.1:18082", "127.0.0.1:18083"]


async def test_unknown_vip_and_dip_are_404_naming_them(client: httpx.AsyncClient) -> None:
    for path in ("", "/dips", "/plan", "/plans", "/curves", "/measurements", "/controller", "/dashboard"):
        response = await client.get(f"/api/v1/vips/nope{path}")
        assert response.status_code == 404, path
        assert "'nope'" in response.json()["detail"]
    response = await client.get(f"/api/v1/vips/{VIP}/measurements", params={"dip": "dip9"})
    assert response.status_code == 404
    assert "'dip9'" in response.json()["detail"]


async def test_invalid_names_and_queries_are_422_naming_the_field(client: httpx.AsyncClient) -> None:
    response = await client.get("/api/v1/vips/bad;name")
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["path", "vip"]
    response = await client.get(f"/api/v1/vips/{VIP}/plans", params={"limit": 0})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["query", "limit"]
    response = await client.get(f"/api/v1/vips/{VIP}/measurements", params={"since": "soon"})
    assert response.json()["detail"][0]["loc"] == ["query", "since"]


async def test_current_plan_with_reasons_and_history(client: httpx.AsyncClient) -> None:
    plan = (await client.get(f"/api/v1/vips/{VIP}/plan")).json()
    assert plan["version"] == len(PLAN_WEIGHTS)
    assert plan["weights"] == PLAN_WEIGHTS[-1]
    assert plan["reasons"] == [f"step {len(PLAN_WEIGHTS)}"]
    assert plan["method"] == "exact-greedy"
    assert plan["predicted_latency"]["dip1"] == pytest.approx(curve_of("dip1").latency(PLAN_WEIGHTS[-1]["dip1"]))
    history = (await client.get(f"/api/v1/vips/{VIP}/plans")).json()
    assert sorted(p["version"] for p in history) == [1, 2, 3]
    assert len((await client.get(f"/api/v1/vips/{VIP}/plans", params={"limit": 1})).json()) == 1


async def test_no_plan_yet_is_404(store: LatencyStore, app_factory: AppFactory) -> None:
    await store.put_vip(vip_config())
    app = app_factory(store)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        response = await c.get(f"/api/v1/vips/{VIP}/plan")
        assert response.status_code == 404
        assert "no plan" in response.json()["detail"]
        assert (await c.get("/api/v1/vips")).json()[0]["plan_version"] is None


async def test_curves_with_points_and_samples(client: httpx.AsyncClient) -> None:
    curves = (await client.get(f"/api/v1/vips/{VIP}/curves")).json()
    assert [c["dip"] for c in curves] == list(DIPS)
    for c in curves:
        truth = curve_of(c["dip"])
        assert c["model"] == "queueing"
        assert c["curve"] == truth.to_dict()
        assert len(c["points"]) == 5
        assert c["w_max"] == pytest.approx(0.9 * truth.c)
        w, latency = c["samples"][3]
        assert latency == pytest.approx(truth.latency(w))
        beyond = [s for s in c["samples"] if s[0] >= truth.c]
        assert all(s[1] is None for s in beyond)  # infinite latency past capacity is null, not a 500


async def test_measurements_filtered_and_limited(client: httpx.AsyncClient) -> None:
    rows = (await client.get(f"/api/v1/vips/{VIP}/measurements")).json()
    assert len(rows) == 6 * len(DIPS)
    assert {r["dip"] for r in rows} == set(DIPS)
    only = (await client.get(f"/api/v1/vips/{VIP}/measurements", params={"dip": "dip3", "limit": 2})).json()
    assert [r["dip"] for r in only] == ["dip3", "dip3"]
    assert only[-1]["errors"] == 1 and only[-1]["failure_latency_mean"] == 0.001
    assert only[0]["time"] <= only[1]["time"]
    since = only[0]["time"]
    later = (await client.get(f"/api/v1/vips/{VIP}/measurements", params={"dip": "dip3", "since": since})).json()
    assert [r["time"] for r in later] == [r["time"] for r in only]  # from `since` on


async def test_controller_state_and_status(client: httpx.AsyncClient, seeded: LatencyStore) -> None:
    state = (await client.get(f"/api/v1/vips/{VIP}/controller")).json()
    assert state["state"]["phase"] == "steady"
    assert state["remeasure_pending"] is False
    status = (await client.get("/api/v1/status")).json()
    assert "ctl-1" in status["controllers"] and status["controllers"]["ctl-1"]["rounds"] == 12
    assert "probe-1" in status["probes"]
    assert status["vips"] == [VIP]


async def test_dashboard_data(client: httpx.AsyncClient) -> None:
    data = (await client.get(f"/api/v1/vips/{VIP}/dashboard")).json()
    assert data["plan"]["version"] == len(PLAN_WEIGHTS)
    by_name = {d["name"]: d for d in data["dips"]}
    assert by_name["dip1"]["weight"] == PLAN_WEIGHTS[-1]["dip1"]
    assert [p["value"] for p in by_name["dip2"]["weight_series"]] == [w["dip2"] for w in PLAN_WEIGHTS]
    assert len(by_name["dip3"]["latency_series"]) == 6
    assert by_name["dip3"]["curve"]["model"] == "queueing"


async def test_metrics_built_from_the_store(client: httpx.AsyncClient) -> None:
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    assert value("klb_store_up") == 1.0
    for dip in DIPS:
        assert value("klb_dip_weight", vip=VIP, dip=dip) == PLAN_WEIGHTS[-1][dip]
        expected = curve_of(dip).latency(PLAN_WEIGHTS[-1][dip])
        assert value("klb_probe_latency_seconds", vip=VIP, dip=dip) == pytest.approx(expected)
        assert value("klb_probe_requests", vip=VIP, dip=dip) == 100
    assert value("klb_probe_errors", vip=VIP, dip="dip3") == 1
    assert value("klb_plan_version", vip=VIP) == len(PLAN_WEIGHTS)
    assert value("klb_plan_solve_seconds", vip=VIP) == pytest.approx(0.004)
    assert 0 <= value("klb_plan_age_seconds", vip=VIP) < 60
    assert value("klb_apply_failures_total", vip=VIP) == 2
    assert value("klb_vip_paused", vip=VIP) == 0
    assert value("klb_lb_weight", vip=VIP, dip="dip1") == 0.5  # the LB's split beside the plan's
    assert value("klb_apply_error", vip=VIP) == 1
    assert value("klb_plan_flag", vip=VIP, flag="slow-start") == 1
    assert value("klb_dip_learning", vip=VIP, dip="dip3") == 1
    assert value("klb_dip_learning", vip=VIP, dip="dip1") == 0
    assert value("klb_dip_overloaded", vip=VIP, dip="dip1") == 1
    assert value("klb_dip_overloaded", vip=VIP, dip="dip2") == 0
    assert value("klb_component_up", component="controller", id="ctl-1") == 1
    assert value("klb_component_up", component="probe", id="probe-1") == 1
    assert value("klb_controller_vips", controller="ctl-1") == 1
    assert value("klb_controller_step_failures_total", controller="ctl-1") == 1
    assert value("klb_probe_rounds_buffered", worker="probe-1") == 4
    assert not any(math.isnan(v) for v in samples.values())
