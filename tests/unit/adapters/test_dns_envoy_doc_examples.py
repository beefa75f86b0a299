"""The configuration examples in docs/adapters-envoy-dns.md are valid VIP configurations
whose adapter settings the adapters accept (Envoy's bootstrap examples are run through
``envoy --mode validate`` in tests/integration/test_envoy_adapter.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from adapters.dns import PowerDnsAdapter
from adapters.envoy import EnvoyAdapter
from knapsack_lb.config import KlbConfig, parse_config
from knapsack_lb.model import VipConfig
from knapsack_lb.service.adapters import adapter_factory

DOC = Path(__file__).resolve().parents[3] / "docs" / "adapters-envoy-dns.md"


def doc_example(name: str) -> str:
    """The fenced block right after ``<!-- example: name -->`` in the doc."""
    match = re.search(rf"<!-- example: {re.escape(name)} -->\n```\w*\n(.*?)```", DOC.read_text(), re.S)
    assert match is not None, f"example {name!r} missing from {DOC}"
    return match.group(1)


def _example(name: str) -> tuple[KlbConfig, VipConfig]:
    config = parse_config(yaml.safe_load(doc_example(name)), source=name)
    (vip,) = config.vips
    return config, vip


def test_envoy_vip_example_is_accepted() -> None:
    config, vip = _example("envoy-vip")
    adapter = adapter_factory(config.load_balancers)(vip)
    assert isinstance(adapter, EnvoyAdapter)
    assert adapter.settings.endpoint_addresses == {d.name: d.host_port for d in vip.dips}


def test_dns_vip_example_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    config, vip = _example("dns-vip")
    monkeypatch.setenv("KLB_PDNS_API_KEY", "example-key")
    adapter = adapter_factory(config.load_balancers)(vip)
    assert isinstance(adapter, PowerDnsAdapter)
    with adapter:
        assert adapter.settings.record == "www.example.test." and adapter.settings.ttl == 5
        assert adapter.settings.addresses == {d.name: d.host_port[0] for d in vip.dips}


def test_pdns_conf_example_matches_what_the_testbed_writes(tmp_path: Path) -> None:
    from knapsack_lb.lab.testbed.lb_pdns import pdns_config

    documented = dict(line.split("=", 1) for line in doc_example("pdns-conf").splitlines() if line)
    written = dict(
        line.split("=", 1)
        for line in pdns_config(workdir=tmp_path, dns_port=53, api_port=8081, api_key="k").splitlines()
    )
    for key in ("launch", "api", "webserver", "enable-lua-records", "cache-ttl", "query-cache-ttl", "local-address"):
        assert documented[key] == written[key], key
