"""docs/api.md lists every operation of the OpenAPI schema and every metric."""

from __future__ import annotations

import re

from knapsack_lb.api import create_app
from knapsack_lb.api.metrics import MetricsSnapshot, render
from knapsack_lb.store import LatencyStore
from tests.conftest import REPO_ROOT


async def test_api_doc_lists_every_operation_and_metric(store: LatencyStore) -> None:
    text = (REPO_ROOT / "docs" / "api.md").read_text()
    spec = create_app(store, token="t" * 16).openapi()
    operations = [f"`{method.upper()} {path}`" for path, ops in spec["paths"].items() for method in ops]
    assert len(operations) >= 25
    assert [op for op in operations if op not in text] == []
    metric_doc = {m for m in re.findall(r"`(klb_[a-z_]+)`", text)}
    assert {"klb_dip_weight", "klb_probe_latency_seconds", "klb_plan_age_seconds"} <= metric_doc
    rendered = render(MetricsSnapshot(store_up=True, now=0.0)).decode()
    declared = set(re.findall(r"^# TYPE (klb_[a-z_]+) ", rendered, re.MULTILINE))
    assert "klb_store_up" in declared
    assert declared - metric_doc - {"klb_apply_failures"} == set()
