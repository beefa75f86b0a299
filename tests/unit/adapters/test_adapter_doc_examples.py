"""Every VIP configuration example in docs/adapters.md is valid: it parses as a ``VipConfig``
and its adapter builds from those settings (so the documented examples cannot rot)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from adapters.base import make_adapter
from knapsack_lb.model import VipConfig

DOC = Path(__file__).resolve().parents[3] / "docs" / "adapters.md"
BLOCK = re.compile(r"```yaml\n# example: (?P<lb>\S+)\n(?P<body>.*?)```", re.S)


def _examples() -> dict[str, str]:
    return {m.group("lb"): m.group("body") for m in BLOCK.finditer(DOC.read_text())}


def test_the_doc_has_an_example_for_each_lb() -> None:
    assert set(_examples()) == {"haproxy", "nginx", "envoy", "dns"}


@pytest.mark.parametrize("lb", ["haproxy", "nginx", "envoy", "dns"])
def test_example_is_a_valid_vip_and_adapter(lb: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PDNS_API_KEY", "doc-example-key")
    vip = VipConfig.model_validate(yaml.safe_load(_examples()[lb]))
    assert vip.adapter.name == lb
    adapter = make_adapter(vip.adapter.name, vip.adapter.settings)
    assert adapter.name in (lb, "powerdns")
