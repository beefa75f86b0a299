"""Write endpoints: auth, every override, 4xx naming the field, persistence across an app restart."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from knapsack_lb.lab.procs import RedisServer
from knapsack_lb.store import LatencyStore
from tests.api.conftest import AUTH, TOKEN, make_store
from tests.api.seed import VIP

AppFactory = Callable[..., FastAPI]

WRITES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("POST", "/api/v1/vips", {"name": "new"}),
    ("PUT", f"/api/v1/vips/{VIP}", {"name": VIP}),
    ("DELETE", f"/api/v1/vips/{VIP}", None),
    ("POST", f"/api/v1/vips/{VIP}/dips", {"name": "dip4", "address": "127.0.0.1:18084"}),
    ("DELETE", f"/api/v1/vips/{VIP}/dips/dip1", None),
    ("POST", f"/api/v1/vips/{VIP}/pause", None),
    ("POST", f"/api/v1/vips/{VIP}/resume", None),
    ("PUT", f"/api/v1/vips/{VIP}/dry-run", {"enabled": True}),
    ("PUT", f"/api/v1/vips/{VIP}/dips/dip1/pin", {"weight": 0.2}),
    ("DELETE", f"/api/v1/vips/{VIP}/dips/dip1/pin", None),
    ("PUT", f"/api/v1/vips/{VIP}/dips/dip1/drain", None),
    ("DELETE", f"/api/v1/vips/{VIP}/dips/dip1/drain", None),
    ("POST", f"/api/v1/vips/{VIP}/dips/dip1/remeasure", None),
    ("POST", f"/api/v1/vips/{VIP}/remeasure", None),
]


@pytest.mark.parametrize(("method", "path", "body"), WRITES, ids=[f"{m} {p}" for m, p, _ in WRITES])
async def test_every_write_needs_the_token(
    client: httpx.AsyncClient, seeded: LatencyStore, method: str, path: str, body: dict[str, Any] | None
) -> None:
    before = await seeded.get_vip(VIP)
    missing = await client.request(method, path, json=body)
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == "Bearer"
    wrong = await client.request(method, path, json=body, headers={"Authorization": "Bearer " + "x" * len(TOKEN)})
    assert wrong.status_code == 403
    basic = await client.request(method, path, json=body, headers={"Authorization": f"Basic {TOKEN}"})
    assert basic.status_code == 401
    assert await seeded.get_vip(VIP) == before
    assert await seeded.take_remeasure_requests(VIP) == set()
    ok = await client.request(method, path, json=body, headers=AUTH)
    assert ok.status_code in (200, 201, 202, 204), ok.text


async def test_without_a_configured_token_the_api_is_read_only(seeded: LatencyStore, app_factory: AppFactory) -> None:
    app = app_factory(seeded, token=None)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        assert (await c.get(f"/api/v1/vips/{VIP}")).status_code == 200
        refused = await c.post(f"/api/v1/vips/{VIP}/pause", headers=AUTH)
        assert refused.status_code == 403
        assert "api.token" in refused.json()["detail"]
    assert (await seeded.get_vip(VIP)).paused is False  # type: ignore[union-attr]


async def test_pause_resume_and_dry_run_are_stored(client: httpx.AsyncClient, seeded: LatencyStore) -> None:
    assert (await client.post(f"/api/v1/vips/{VIP}/pause", headers=AUTH)).json()["paused"] is True
    assert (await seeded.get_vip(VIP)).paused is True  # type: ignore[union-attr]
    assert (await client.post(f"/api/v1/vips/{VIP}/resume", headers=AUTH)).json()["paused"] is False
    assert (await client.put(f"/api/v1/vips/{VIP}/dry-run", json={"enabled": True}, headers=AUTH)).status_code == 200
    assert (await seeded.get_vip(VIP)).dry_run is True  # type: ignore[union-attr]
    listing = (await client.get("/api/v1/vips")).json()[0]
    assert listing["dry_run"] is True and listing["paused"] is False


async def test_pin_unpin_drain_undrain(client: httpx.AsyncClient, seeded: LatencyStore) -> None:
    r = await client.put(f"/api/v1/vips/{VIP}/dips/dip2/pin", json={"weight": 0.25}, headers=AUTH)
    assert r.status_code == 200 and r.json()["pins"] == {"dip2": 0.25}
    r = await client.put(f"/api/v1/vips/{VIP}/dips/dip3/drain", headers=AUTH)
    assert r.json()["drained"] == ["dip3"]
    again = await client.put(f"/api/v1/vips/{VIP}/dips/dip3/drain", headers=AUTH)
    assert again.json()["drained"] == ["dip3"]  # idempotent
    stored = await seeded.get_vip(VIP)
    assert stored is not None and stored.pins == {"dip2": 0.25} and stored.drained == ("dip3",)
    assert (await client.delete(f"/api/v1/vips/{VIP}/dips/dip2/pin", headers=AUTH)).json()["pins"] == {}
    assert (await client.delete(f"/api/v1/vips/{VIP}/dips/dip3/drain", headers=AUTH)).json()["drained"] == []
    missing = await client.put(f"/api/v1/vips/{VIP}/dips/dip9/pin", json={"weight": 0.1}, headers=AUTH)
    assert missing.status_code == 404 and "'dip9'" in missing.json()["detail"]


async def test_pins_summing_above_one_are_422_naming_the_field(client: httpx.AsyncClient) -> None:
    assert (await client.put(f"/api/v1/vips/{VIP}/dips/dip1/pin", json={"weight": 0.7}, headers=AUTH)).is_success
    r = await client.put(f"/api/v1/vips/{VIP}/dips/dip2/pin", json={"weight": 0.5}, headers=AUTH)
    assert r.status_code == 422
    error = r.json()["detail"][0]
    assert error["loc"][:2] == ["body", "weight"]
    assert "pins" in error["msg"] and "> 1" in error["msg"]


@pytest.mark.parametrize(
    ("path", "body", "loc"),
    [
        (f"/api/v1/vips/{VIP}/dips/dip1/pin", {"weight": 1.5}, ["body", "weight"]),
        (f"/api/v1/vips/{VIP}/dips/dip1/pin", {"weight": "heavy"}, ["body", "weight"]),
        (f"/api/v1/vips/{VIP}/dips/dip1/pin", {}, ["body", "weight"]),
        (f"/api/v1/vips/{VIP}/dry-run", {"enabled": "perhaps"}, ["body", "enabled"]),
        (f"/api/v1/vips/{VIP}/dry-run", {"enabled": True, "extra": 1}, ["body", "extra"]),
    ],
)
async def test_bad_override_bodies_are_422_naming_the_field(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], loc: list[str]
) -> None:
    r = await client.put(path, json=body, headers=AUTH)
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == loc


async def test_add_and_remove_a_dip(client: httpx.AsyncClient, seeded: LatencyStore) -> None:
    new = {"name": "dip4", "address": "127.0.0.1:18084", "max_weight": 0.5}
    r = await client.post(f"/api/v1/vips/{VIP}/dips", json=new, headers=AUTH)
    assert r.status_code == 201
    assert [d["name"] for d in r.json()["dips"]] == ["dip1", "dip2", "dip3", "dip4"]
    duplicate = await client.post(f"/api/v1/vips/{VIP}/dips", json=new, headers=AUTH)
    assert duplicate.status_code == 409 and "'dip4'" in duplicate.json()["detail"]
    bad = await client.post(f"/api/v1/vips/{VIP}/dips", json={"name": "dip5", "address": "nowhere"}, headers=AUTH)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "address"]
    bad_name = await client.post(f"/api/v1/vips/{VIP}/dips", json={"name": "a b", "address": "127.0.0.1:1"},
                                 headers=AUTH)
    assert bad_name.status_code == 422 and bad_name.json()["detail"][0]["loc"] == ["body", "name"]
    await client.put(f"/api/v1/vips/{VIP}/dips/dip4/pin", json={"weight": 0.1}, headers=AUTH)
    await client.put(f"/api/v1/vips/{VIP}/dips/dip4/drain", headers=AUTH)
    removed = await client.delete(f"/api/v1/vips/{VIP}/dips/dip4", headers=AUTH)
    assert removed.status_code == 200
    stored = await seeded.get_vip(VIP)
    assert stored is not None
    assert [d.name for d in stored.dips] == ["dip1", "dip2", "dip3"]
    assert stored.pins == {} and stored.drained == ()  # overrides of a removed DIP go with it
    assert (await client.delete(f"/api/v1/vips/{VIP}/dips/dip4", headers=AUTH)).status_code == 404


async def test_create_replace_delete_a_vip(client: httpx.AsyncClient, seeded: LatencyStore) -> None:
    body = {"name": "api", "dips": [{"name": "a1", "address": "127.0.0.1:19001"}], "probe": {"path": "/health"}}
    created = await client.post("/api/v1/vips", json=body, headers=AUTH)
    assert created.status_code == 201 and created.json()["probe"]["path"] == "/health"
    assert (await client.post("/api/v1/vips", json=body, headers=AUTH)).status_code == 409
    assert sorted(await seeded.list_vips()) == ["api", VIP]
    replaced = await client.put("/api/v1/vips/api", json={**body, "objective": "sum"}, headers=AUTH)
    assert replaced.status_code == 200 and (await seeded.get_vip("api")).objective == "sum"  # type: ignore[union-attr]
    mismatch = await client.put("/api/v1/vips/api", json={**body, "name": "other"}, headers=AUTH)
    assert mismatch.status_code == 422 and mismatch.json()["detail"][0]["loc"] == ["body", "name"]
    assert (await client.delete("/api/v1/vips/api", headers=AUTH)).status_code == 204
    assert await seeded.get_vip("api") is None
    assert (await client.delete("/api/v1/vips/api", headers=AUTH)).status_code == 404


@pytest.mark.parametrize(
    ("body", "loc_prefix"),
    [
        ({"name": "v", "dips": [{"name": "a", "address": "127.0.0.1:1"}], "pins": {"zz": 0.5}}, ["body"]),
        ({"name": "v", "probe": {"path": "no-slash"}}, ["body", "probe", "path"]),
        ({"name": "v", "probe": {"interval": -1}}, ["body", "probe", "interval"]),
        ({"name": "v", "objective": "fastest"}, ["body", "objective"]),
        ({"name": "v", "adapter": {"name": "no-such-lb"}}, ["body", "adapter", "name"]),
        ({"name": "v", "adapter": {"lb": "no-such-lb"}}, ["body", "adapter", "lb"]),
        ({"name": "v", "adapter": {"lb": "rec", "settings": {"resolution": 0}}},
         ["body", "adapter", "settings", "resolution"]),
    ],
)
async def test_invalid_vip_configs_are_422_naming_the_field(
    client: httpx.AsyncClient, body: dict[str, Any], loc_prefix: list[str]
) -> None:
    r = await client.post("/api/v1/vips", json=body, headers=AUTH)
    assert r.status_code == 422, r.text
    loc = r.json()["detail"][0]["loc"]
    assert loc[: len(loc_prefix)] == loc_prefix
    if body.get("pins"):
        assert "pins" in r.json()["detail"][0]["msg"]


async def test_remeasure_requests_reach_the_controller_queue(client: httpx.AsyncClient, seeded: LatencyStore) -> None:
    one = await client.post(f"/api/v1/vips/{VIP}/dips/dip2/remeasure", headers=AUTH)
    assert one.status_code == 202 and one.json() == {"vip": VIP, "dips": ["dip2"]}
    state = (await client.get(f"/api/v1/vips/{VIP}/controller")).json()
    assert state["remeasure_pending"] is True
    assert await seeded.take_remeasure_requests(VIP) == {"dip2"}
    every = await client.post(f"/api/v1/vips/{VIP}/remeasure", headers=AUTH)
    assert every.json()["dips"] == ["dip1", "dip2", "dip3"]
    assert await seeded.take_remeasure_requests(VIP) == {"dip1", "dip2", "dip3"}


async def test_changes_survive_an_app_and_store_restart(redis_server: RedisServer, namespace: str,
                                                        seeded: LatencyStore, app_factory: AppFactory) -> None:
    first = app_factory(seeded)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=first), base_url="http://api") as c:
        await c.post(f"/api/v1/vips/{VIP}/pause", headers=AUTH)
        await c.put(f"/api/v1/vips/{VIP}/dips/dip1/pin", json={"weight": 0.3}, headers=AUTH)
        await c.put(f"/api/v1/vips/{VIP}/dips/dip3/drain", headers=AUTH)
        await c.post(f"/api/v1/vips/{VIP}/dips", json={"name": "dip4", "address": "127.0.0.1:18084"}, headers=AUTH)
        await c.post(f"/api/v1/vips/{VIP}/dips/dip4/remeasure", headers=AUTH)
    other = make_store(redis_server.url, namespace)  # a new connection, as after a restart
    try:
        second = app_factory(other)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=second), base_url="http://api") as c:
            config = (await c.get(f"/api/v1/vips/{VIP}")).json()
            assert config["paused"] is True
            assert config["pins"] == {"dip1": 0.3}
            assert config["drained"] == ["dip3"]
            assert [d["name"] for d in config["dips"]] == ["dip1", "dip2", "dip3", "dip4"]
            assert (await c.get(f"/api/v1/vips/{VIP}/controller")).json()["remeasure_pending"] is True
            assert (await c.get(f"/api/v1/vips/{VIP}/plan")).json()["version"] == 3
    finally:
        await other.close()
