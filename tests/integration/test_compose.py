"""docker-compose.yml and its configuration, validated offline (no Docker engine runs here)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from knapsack_lb.config import load_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("profile", [[], ["--profile", "cluster"]], ids=["default", "cluster"])
def test_compose_file_is_valid(profile: list[str]) -> None:
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.skip("docker-compose is not installed (make test installs it)")
    result = subprocess.run([binary, "-f", str(ROOT / "docker-compose.yml"), *profile, "config", "-q"], cwd=ROOT,
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
    (volume,) = compose["x-klb"]["volumes"]
    assert volume == "${KLB_CONFIG_FILE:-./examples/compose-config.yaml}:/etc/klb/config.yaml:ro"
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


CLUSTER_NODES = [f"redis-node-{n}" for n in range(1, 7)]


def test_the_cluster_profile_has_six_cluster_nodes_and_a_one_shot_create_job() -> None:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    for name in CLUSTER_NODES:
        node = services[name]
        assert node["profiles"] == ["cluster"]
        command = node["command"]
        assert command[command.index("--cluster-enabled") + 1] == "yes"
        assert command[command.index("--port") + 1] == "6379"
    create = services["redis-cluster-create"]
    assert create["profiles"] == ["cluster"] and create["restart"] == "no"
    assert create["depends_on"] == CLUSTER_NODES
    script = create["command"][0]
    assert "--cluster create $$nodes --cluster-replicas 1 --cluster-yes" in script
    assert "for n in 1 2 3 4 5 6" in script and "cluster_state:ok" in script
    assert not any("profiles" in services[name] for name in ("redis", "probes", "controller", "api"))


def test_the_cluster_example_config_names_every_node_and_differs_only_in_redis() -> None:
    single = load_config(ROOT / "examples" / "compose-config.yaml")
    cluster = load_config(ROOT / "examples" / "compose-cluster-config.yaml")
    assert cluster.redis.cluster and cluster.redis.url == "redis://redis-node-1:6379/0"
    named = ["redis-node-1", *(host for host, _port in cluster.redis.startup_node_addresses())]
    assert named == CLUSTER_NODES
    assert cluster.model_dump(exclude={"redis"}) == single.model_dump(exclude={"redis"})
