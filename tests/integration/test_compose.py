"""docker-compose.yml and its configuration, validated offline (no Docker engine runs here)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from knapsack_lb.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def test_compose_file_is_valid() -> None:
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.skip("docker-compose is not installed (make test installs it)")
    result = subprocess.run([binary, "-f", str(ROOT / "docker-compose.yml"), "config", "-q"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_compose_services_run_klb_with_the_example_config() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"redis", "probes", "controller", "api", "haproxy"} <= set(services)
    commands = {name: services[name]["command"] for name in ("probes", "controller", "api")}
    assert commands["api"][:3] == ["api", "--config", "/etc/klb/config.yaml"]
    assert commands["probes"] == ["probe", "--config", "/etc/klb/config.yaml"]
    assert commands["controller"] == ["controller", "--config", "/etc/klb/config.yaml"]
    mounted = {v.split(":")[0] for v in compose["x-klb"]["volumes"]}
    assert "./examples/compose-config.yaml" in mounted
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "FROM python:3.11-slim" in dockerfile and 'ENTRYPOINT ["klb"]' in dockerfile


def test_example_config_matches_the_compose_haproxy() -> None:
    config = load_config(ROOT / "examples" / "compose-config.yaml")
    vip = config.vips[0]
    haproxy_cfg = (ROOT / "docker" / "haproxy.cfg").read_text()
    lb = config.load_balancers[vip.adapter.lb or ""]
    assert lb.adapter == "haproxy"
    assert "ipv4@0.0.0.0:9999 level admin" in haproxy_cfg and lb.settings["socket"] == "haproxy:9999"
    assert f"backend {lb.settings['backend']}" in haproxy_cfg
    for dip in vip.dips:
        assert f"server {dip.name} {dip.address}" in haproxy_cfg
    assert "mode tcp" in haproxy_cfg
