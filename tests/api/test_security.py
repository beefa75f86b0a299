"""The admin API's token cannot run commands, write files, signal processes, read the controller's
environment or open listeners: one test per attack, each refused with a 4xx naming the field,
with nothing stored and nothing executed (checked on the file system, the process table, the
network and the store, not only by the status code). docs/security.md is the threat model.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from adapters.nginx import NginxAdapter, NginxError, require_nginx_master
from knapsack_lb.cli.main import app as cli
from knapsack_lb.clock import FakeClock
from knapsack_lb.config import ConfigError, LoadBalancerConfig, parse_config
from knapsack_lb.controller.settings import ControllerSettings, LoopSettings
from knapsack_lb.lab.procs import RedisServer, free_listening_port
from knapsack_lb.model import WeightPlan
from knapsack_lb.service.adapters import adapter_factory
from knapsack_lb.service.controller import ControllerService
from knapsack_lb.store import LatencyStore
from tests.api.conftest import AUTH
from tests.api.seed import VIP

DIPS = [{"name": "a", "address": "127.0.0.1:18081"}, {"name": "b", "address": "127.0.0.1:18082"}]


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


async def _refused(client: httpx.AsyncClient, body: dict[str, Any], field: list[str]) -> dict[str, Any]:
    """POST the VIP and PUT it over the seeded one: both 422 naming ``field``; nothing stored."""
    before = (await client.get(f"/api/v1/vips/{VIP}")).json()
    attempts = (("POST", "/api/v1/vips", body), ("PUT", f"/api/v1/vips/{VIP}", {**body, "name": VIP}))
    for method, path, payload in attempts:
        r = await client.request(method, path, json=payload, headers=AUTH)
        assert r.status_code == 422, r.text
        detail = r.json()["detail"][0]
        assert detail["loc"][: len(field)] == field, detail
    assert (await client.get(f"/api/v1/vips/{body['name']}")).status_code == 404
    assert (await client.get(f"/api/v1/vips/{VIP}")).json() == before
    return detail


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    return tmp_path / "pwned"


# --- critical: adapter settings are the operator's -----------------------------------------------------------


async def test_nginx_binary_and_config_from_the_api_run_nothing(client: httpx.AsyncClient, marker: Path) -> None:
    settings = {"binary": "/bin/sh", "config": f"/usr/bin/touch {marker}", "include_file": "/tmp/klb-up.conf",
                "upstream": "web", "servers": {"a": "127.0.0.1:18081"}}
    old_shape = {"name": "evil", "dips": DIPS, "adapter": {"name": "nginx", "settings": settings}}
    detail = await _refused(client, old_shape, ["body", "adapter"])
    assert "operator" in detail["msg"] and "load_balancers" in detail["msg"]
    via_lb = {"name": "evil", "dips": DIPS, "adapter": {"lb": "rec", "settings": {"binary": "/bin/sh"}}}
    detail = await _refused(client, via_lb, ["body", "adapter", "settings", "binary"])
    assert "operator-owned" in detail["msg"]
    await asyncio.sleep(1.0)
    assert not marker.exists()


def test_klb_check_runs_no_binary_that_is_not_nginx(tmp_path: Path, marker: Path) -> None:
    script = tmp_path / "x.sh"
    script.write_text(f"#!/bin/sh\ntouch {marker}\n")
    script.chmod(0o755)
    for binary, config in (("/bin/sh", f"/usr/bin/touch {marker}"), ("/bin/sh", str(script)), (str(script), "/x")):
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump({
            "load_balancers": {"web": {"adapter": "nginx", "settings": {
                "binary": binary, "config": config, "include_file": str(tmp_path / "up.conf"), "upstream": "web"}}},
            "vips": [{"name": "web", "dips": DIPS, "adapter": {"lb": "web"}}],
        }))
        result = CliRunner().invoke(cli, ["check", "--config", str(path)])
        assert result.exit_code == 2, result.output
        assert "load_balancers.web.settings." in result.output
    assert not marker.exists()


async def test_file_paths_from_the_api_are_refused(client: httpx.AsyncClient, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    for adapter_settings, field in (
        ({"include_file": str(victim)}, "include_file"),  # nginx: overwrite any file
        ({"state_file": str(victim)}, "state_file"),  # haproxy: overwrite any file
        ({"pid_file": str(victim)}, "pid_file"),  # nginx: SIGHUP any process
    ):
        body = {"name": "evil", "dips": DIPS, "adapter": {"lb": "rec", "settings": adapter_settings}}
        await _refused(client, body, ["body", "adapter", "settings", field])
    assert victim.read_text() == "precious\n"


def test_the_nginx_adapter_never_replaces_a_file_it_did_not_write(tmp_path: Path) -> None:
    victim = tmp_path / "victim.conf"
    victim.write_text("worker_processes 1;\n")
    adapter = NginxAdapter.from_config({"include_file": str(victim), "config": str(tmp_path / "nginx.conf"),
                                        "upstream": "web", "servers": {"a": "127.0.0.1:18081"}})
    result = adapter.apply(WeightPlan(vip="web", weights={"a": 1.0}))
    assert not result.ok and "not written by knapsack-lb" in result.reason
    assert victim.read_text() == "worker_processes 1;\n"


def test_the_nginx_adapter_signals_only_an_nginx_master() -> None:
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(NginxError, match="not an Nginx master"):
            require_nginx_master(victim.pid)
        assert victim.poll() is None  # not signalled: SIGHUP would have ended it
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait()


@pytest.fixture
def catcher() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server that records every request it receives (where a stolen key would go)."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(f"{self.path} {dict(self.headers)}")
            self.send_response(200)
            self.end_headers()

        do_PATCH = do_PUT = do_POST = do_GET

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()


async def test_dns_settings_from_the_api_cannot_send_the_environment_anywhere(
    client: httpx.AsyncClient, catcher: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, seen = catcher
    monkeypatch.setenv("KLB_SECRET_FOR_TEST", "s3cr3t-value")
    answers = []
    for variable in ("PATH", "KLB_SECRET_FOR_TEST", "NO_SUCH_VARIABLE_AT_ALL"):
        settings = {"api_url": url, "api_key_env": variable, "zone": "example.test.", "record": "web",
                    "dns_server": "127.0.0.1:53"}
        old_shape = {"name": "evil", "dips": DIPS, "adapter": {"name": "dns", "settings": settings}}
        await _refused(client, old_shape, ["body", "adapter"])
        via_lb = {"name": "evil", "dips": DIPS, "adapter": {"lb": "rec", "settings": {"api_key_env": variable}}}
        detail = await _refused(client, via_lb, ["body", "adapter", "settings", "api_key_env"])
        answers.append(detail["msg"])
    assert len(set(answers)) == 1  # whether a variable exists is not revealed
    await asyncio.sleep(0.5)
    assert seen == []


async def test_envoy_xds_from_the_api_opens_no_listener(client: httpx.AsyncClient) -> None:
    port = free_listening_port()
    settings = {"mode": "xds", "cluster": "web", "xds_listen": f"127.0.0.1:{port}"}
    await _refused(client, {"name": "evil", "dips": DIPS, "adapter": {"name": "envoy", "settings": settings}},
                   ["body", "adapter"])
    await _refused(client, {"name": "evil", "dips": DIPS, "adapter": {"lb": "rec", "settings": settings}},
                   ["body", "adapter", "settings"])
    assert not _listening(port)


async def test_an_operators_xds_server_stops_when_its_vip_is_deleted(redis_server: RedisServer) -> None:
    """The controller, not the API, serves xDS, for the operator's load balancer only, and only
    while a VIP it owns uses it."""
    from tests.api.conftest import make_store

    port = free_listening_port()
    lbs = {"envoy": LoadBalancerConfig(adapter="envoy", settings={"mode": "xds", "cluster": "web",
                                                                  "xds_listen": f"127.0.0.1:{port}"})}
    config = parse_config({"load_balancers": {k: v.model_dump() for k, v in lbs.items()},
                           "vips": [{"name": "xdsvip", "dips": DIPS, "adapter": {"lb": "envoy"}}]})
    store: LatencyStore = make_store(redis_server.url, f"x{port}")
    try:
        await store.put_vip(config.vips[0])
        service = ControllerService(store, ControllerSettings(loop=LoopSettings(lease_ttl=5.0)), FakeClock(1000.0),
                                    "ctl-x",
                                    adapter_factory=adapter_factory(config.load_balancers))
        await service.tick()  # the first plan is pushed: the xDS server listens
        assert _listening(port)
        await store.delete_vip("xdsvip")
        await service.tick()
        deadline = time.monotonic() + 5
        while _listening(port) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not _listening(port)
    finally:
        service.adapters.close()
        await store.close()


# --- medium: sizes and echoes ----------------------------------------------------------------------------------


async def test_a_huge_body_is_413_and_nothing_is_stored(client: httpx.AsyncClient) -> None:
    dips = [{"name": f"d{i}", "address": f"127.0.0.1:{10000 + i % 50000}"} for i in range(60_000)]
    r = await client.post("/api/v1/vips", json={"name": "huge", "dips": dips}, headers=AUTH)
    assert r.status_code == 413, r.text[:200]
    assert "max_body_bytes" in r.json()["detail"]
    assert (await client.get("/api/v1/vips/huge")).status_code == 404


async def test_dips_per_vip_are_capped(seeded: LatencyStore, app_factory: Any) -> None:
    app = app_factory(seeded, max_dips_per_vip=5)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        dips = [{"name": f"d{i}", "address": f"127.0.0.1:{10000 + i}"} for i in range(6)]
        r = await c.post("/api/v1/vips", json={"name": "many", "dips": dips}, headers=AUTH)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "dips"], r.text
        assert (await c.get("/api/v1/vips/many")).status_code == 404


async def test_duplicate_dips_in_a_large_body_are_found_quickly(client: httpx.AsyncClient) -> None:
    dips = [{"name": f"d{i}", "address": "127.0.0.1:1"} for i in range(4000)]
    dips.append({"name": "d1", "address": "127.0.0.1:2"})
    started = time.perf_counter()
    r = await client.post("/api/v1/vips", json={"name": "dup", "dips": dips}, headers=AUTH)
    assert r.status_code == 422 and "duplicate" in r.text
    assert time.perf_counter() - started < 10  # linear: a quadratic check took minutes at this size


async def test_a_422_does_not_echo_megabytes(client: httpx.AsyncClient) -> None:
    body = {"name": "echo", "probe": {"headers": {"X-Big": "x" * 500_000}}}
    r = await client.post("/api/v1/vips", json=body, headers=AUTH)
    assert r.status_code == 422 and len(r.content) < 4096, len(r.content)
    assert r.json()["detail"][0]["loc"][:3] == ["body", "probe", "headers"]


async def test_dip_addresses_can_be_restricted_to_the_operators_networks(
    seeded: LatencyStore, app_factory: Any
) -> None:
    app = app_factory(seeded, dip_networks=["10.0.0.0/8"])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        r = await c.post(f"/api/v1/vips/{VIP}/dips", json={"name": "out", "address": "192.0.2.1:80"}, headers=AUTH)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "address"], r.text
        r = await c.post(f"/api/v1/vips/{VIP}/dips", json={"name": "in", "address": "10.1.2.3:80"}, headers=AUTH)
        assert r.status_code == 201, r.text


# --- low: numbers and text that cannot be sent or stored --------------------------------------------------------


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e309"])
@pytest.mark.parametrize(("path", "template"), [
    ("/api/v1/vips/web/dips/dip1/pin", '{"weight": %s}'),
    ("/api/v1/vips", '{"name": "n", "probe": {"interval": %s}}'),
    ("/api/v1/vips", '{"name": "n", "dips": [{"name": "a", "address": "127.0.0.1:1", "max_weight": %s}]}'),
])
async def test_non_finite_numbers_are_422(client: httpx.AsyncClient, path: str, template: str, literal: str) -> None:
    method = "PUT" if path.endswith("/pin") else "POST"
    r = await client.request(method, path, content=template % literal,
                             headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert (await client.get("/api/v1/vips/n")).status_code == 404


@pytest.mark.parametrize(("section", "key"), [
    ("redis", "measurement_retention_age"), ("controller.solver", "time_limit"), ("api", "dashboard_refresh"),
])
@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_yaml_infinities_are_refused_naming_the_field(section: str, key: str, value: float) -> None:
    raw: dict[str, object] = {key: value}
    for part in reversed(section.split(".")):
        raw = {part: raw}
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert info.value.field == f"{section}.{key}"


def test_a_nan_nginx_reload_timeout_is_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"load_balancers": {"n": {"adapter": "nginx", "settings": {
            "include_file": "/etc/nginx/klb/up.conf", "config": "/etc/nginx/nginx.conf", "upstream": "web",
            "reload_timeout": float("nan")}}}})
    assert info.value.field == "load_balancers.n.settings.reload_timeout"


@pytest.mark.parametrize(("probe", "field"), [
    ({"path": "/caf\u00e9"}, "path"), ({"path": "/a\x00b"}, "path"), ({"path": "/a\x0bb"}, "path"),
    ({"path": "/a\x7fb"}, "path"), ({"headers": {"X-Name": "caf\u00e9"}}, "headers"),
    ({"headers": {"X-Name": "a\x00b"}}, "headers"), ({"headers": {"X\u00e9": "v"}}, "headers"),
    ({"headers": {"Content-Length": "5"}}, "headers"),
])
async def test_probe_text_the_client_cannot_send_is_refused(
    client: httpx.AsyncClient, probe: dict[str, Any], field: str
) -> None:
    r = await client.post("/api/v1/vips", json={"name": "p", "probe": probe}, headers=AUTH)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][:3] == ["body", "probe", field], r.text


def test_klb_check_names_a_non_ascii_header_instead_of_crashing(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"vips": [{"name": "web", "dips": DIPS,
                                              "probe": {"headers": {"X-Name": "caf\u00e9"}}}]}, allow_unicode=True))
    result = CliRunner().invoke(cli, ["check", "--config", str(path)])
    assert result.exit_code == 2 and "vips.0.probe.headers" in result.output, result.output


def test_a_user_host_header_replaces_the_default() -> None:
    from probes.http_client import request_head

    head = request_head("GET", "/", "127.0.0.1", 8080, {"Host": "app.example"}).decode()
    assert head.count("Host:") == 1 and "Host: app.example" in head
    assert "Host: 127.0.0.1:8080" in request_head("GET", "/", "127.0.0.1", 8080, {}).decode()


async def test_the_controller_view_names_the_lease_owner(redis_server: RedisServer) -> None:
    from knapsack_lb.api import create_app
    from tests.api.conftest import make_store
    from tests.api.seed import seed_store

    store = make_store(redis_server.url, f"o{os.getpid()}")
    try:
        await seed_store(store, time.time())
        settings = ControllerSettings(loop=LoopSettings(lease_ttl=30.0))
        service = ControllerService(store, settings, FakeClock(time.time()), "ctl-owner")
        await service.tick()
        app = create_app(store)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
            view = (await c.get(f"/api/v1/vips/{VIP}/controller")).json()
        assert view["lease_owner"] == "ctl-owner", json.dumps(view)[:300]
    finally:
        await store.close()
