"""Every configuration example in docs/adapters.md is valid: it parses as a configuration file
whose VIP selects the operator's load balancer, and the adapter builds from the merged settings
(so the documented examples cannot rot)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from knapsack_lb.config import parse_config
from knapsack_lb.service.adapters import adapter_factory, close_adapter

DOC = Path(__file__).resolve().parents[3] / "docs" / "adapters.md"
BLOCK = re.compile(r"```yaml\n# example: (?P<lb>\S+)\n(?P<body>.*?)```", re.S)


def _examples() -> dict[str, str]:
    return {m.group("lb"): m.group("body") for m in BLOCK.finditer(DOC.read_text())}


def test_the_doc_has_an_example_for_each_lb() -> None:
    assert set(_examples()) == {"haproxy", "nginx", "envoy", "dns"}


@pytest.mark.parametrize("lb", ["haproxy", "nginx", "envoy", "dns"])
def test_example_is_a_valid_configuration_and_adapter(lb: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PDNS_API_KEY", "doc-example-key")
    config = parse_config(yaml.safe_load(_examples()[lb]), source="docs/adapters.md")
    (vip,) = config.vips
    assert config.load_balancers[vip.adapter.lb or ""].adapter in (lb, "powerdns")
    adapter = adapter_factory(config.load_balancers)(vip)
    try:
        assert adapter.name in (lb, "powerdns")
    finally:
        close_adapter(adapter)
