"""The PowerDNS adapter against a real PowerDNS Authoritative 4.7 (Debian pdns-server +
pdns-backend-sqlite3) on free loopback ports: LUA pickwrandom records changed through the
REST API, DNS queries (dnspython) counted per answered address."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dns.message
import dns.query
import dns.rcode
import dns.rdatatype
import pytest

from adapters.base import make_adapter
from adapters.dns import PowerDnsAdapter
from knapsack_lb.lab.testbed import lb_harness
from knapsack_lb.lab.testbed.lb_pdns import PdnsTestbed
from knapsack_lb.model import WeightPlan

NAMES = ("b1", "b2", "b3")
TARGET = {"b1": 0.1, "b2": 0.3, "b3": 0.6}
# The testbed never connects to backends: a DNS answer names the backend by its address.
BACKENDS = dict.fromkeys(NAMES, "127.0.0.1:9")

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def pdns(tmp_path: Path) -> Iterator[PdnsTestbed]:
    with PdnsTestbed(BACKENDS, tmp_path / "pdns") as testbed:
        yield testbed


@pytest.fixture
def adapter(pdns: PdnsTestbed) -> Iterator[PowerDnsAdapter]:
    built = make_adapter("powerdns", pdns.adapter_settings)
    assert isinstance(built, PowerDnsAdapter)
    with built:
        yield built


def query(pdns: PdnsTestbed, name: str, rdtype: Any = dns.rdatatype.A) -> dns.message.Message:
    return dns.query.udp(dns.message.make_query(name, rdtype), pdns.server.host, port=pdns.server.dns_port, timeout=2)


def test_split_follows_10_30_60_within_3_points(pdns: PdnsTestbed, adapter: PowerDnsAdapter) -> None:
    assert pdns.addresses == {"b1": "127.0.0.10", "b2": "127.0.0.11", "b3": "127.0.0.12"}
    result = adapter.apply(WeightPlan(vip="web", weights=TARGET))
    assert result.ok, result.reason
    assert result.lb_weights == {"b1": 100, "b2": 300, "b3": 600}
    assert adapter.read_lb_weights() == {"b1": 100, "b2": 300, "b3": 600}
    assert adapter.read() == pytest.approx(TARGET)
    answer = query(pdns, pdns.record)
    assert answer.answer[0].ttl == 5  # the default TTL reaches resolvers
    counts = lb_harness.measure_split(pdns, 3000)
    assert "<failed>" not in counts
    assert sum(counts.values()) == 3000
    assert lb_harness.split_error(counts, TARGET) <= 0.03, counts


def test_fifty_weight_changes_under_queries_never_servfail(pdns: PdnsTestbed, adapter: PowerDnsAdapter) -> None:
    plans = lb_harness.churn_plans("web", list(NAMES), 50, random.Random(3))
    report = lb_harness.churn(pdns, adapter, plans, traffic_seconds=10.0)
    assert report.apply_failures == ()
    assert report.requests > 300
    assert report.failed == 0, report.failure_samples  # no SERVFAIL, no timeout, no stray address
    # After a one-hot plan, every query sent after apply() returned gets the target's address
    # (caches are off). Queries in flight while the next plan was applied are ambiguous.
    changes = [a.started for a in report.applied]
    unambiguous = [r for r in report.served if not any(r.started < t <= r.finished for t in changes)]
    one_hot = [(i, a) for i, a in enumerate(report.applied) if lb_harness.one_hot_target(a.plan)]
    assert len(one_hot) == 10
    for i, item in one_hot:
        end = report.applied[i + 1].started if i + 1 < len(report.applied) else float("inf")
        late = [r for r in unambiguous if item.finished < r.started < end and r.backend is not None]
        wrong = [r for r in late if r.backend != lb_harness.one_hot_target(item.plan)]
        assert not wrong, (i, item.plan.weights, wrong[:3])
    follows, not_followed = lb_harness.follow_times(report.applied, unambiguous)
    # on a loaded machine some one-hot windows are too short for 3 confirming answers
    assert len(follows) + not_followed == 10 and len(follows) >= 5
    assert max(follows) < 1.0
    assert adapter.read() == pytest.approx(plans[-1].weights, abs=0.002)


def test_weight_zero_leaves_the_address_out(pdns: PdnsTestbed, adapter: PowerDnsAdapter) -> None:
    assert adapter.apply(WeightPlan(vip="web", weights={"b1": 0.0, "b2": 0.5, "b3": 0.5})).ok
    assert adapter.read_lb_weights() == {"b2": 500, "b3": 500}
    counts = lb_harness.measure_split(pdns, 300)
    assert set(counts) == {"b2", "b3"}


def test_a_record_that_servfails_is_rolled_back(
    pdns: PdnsTestbed, adapter: PowerDnsAdapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API takes broken Lua (HTTP 204) and the name then SERVFAILs: the adapter's DNS
    check sees it and puts the previous rrset back."""
    assert adapter.apply(WeightPlan(vip="web", weights={"b1": 0.2, "b2": 0.3, "b3": 0.5})).ok
    before = adapter.read_rrset()
    broken = "A \"pickwrandom({{1,'127.0.0.10'}\""
    monkeypatch.setattr(adapter, "render", lambda plan: (broken, {"b1": 1}, 0.0))
    result = adapter.apply(WeightPlan(vip="web", weights={"b1": 1.0}))
    assert not result.ok
    assert "SERVFAIL" in result.reason and "previous rrset restored" in result.reason
    assert adapter.read_rrset() == before
    assert query(pdns, pdns.record).rcode() == dns.rcode.NOERROR


def test_ttl_is_configurable(pdns: PdnsTestbed) -> None:
    with PowerDnsAdapter.from_config({**pdns.adapter_settings, "ttl": 30}) as adapter:
        assert adapter.apply(WeightPlan(vip="web", weights=TARGET)).ok
        assert query(pdns, pdns.record).answer[0].ttl == 30
        current = adapter.read_rrset()
        assert current is not None and current[1] == 30


def test_unknown_zone_and_dead_server_are_failed_results(pdns: PdnsTestbed) -> None:
    settings = {**pdns.adapter_settings, "zone": "nowhere.test.", "record": "vip"}
    with PowerDnsAdapter.from_config(settings) as lost:
        result = lost.apply(WeightPlan(vip="web", weights=TARGET))
        assert not result.ok and "nowhere.test." in result.reason
        assert not lost.check().ok
    with PowerDnsAdapter.from_config(pdns.adapter_settings) as adapter:
        assert adapter.check().ok
        pdns.server.stop()
        result = adapter.apply(WeightPlan(vip="web", weights=TARGET))
        assert not result.ok and "unreachable" in result.reason
        assert adapter.read() == {}


def test_ipv6_addresses_become_a_lua_aaaa_record(pdns: PdnsTestbed) -> None:
    settings = {**pdns.adapter_settings, "record": "v6", "addresses": {"b1": "2001:db8::1", "b2": "2001:DB8::2"}}
    with PowerDnsAdapter.from_config(settings) as adapter:
        result = adapter.apply(WeightPlan(vip="web", weights={"b1": 0.25, "b2": 0.75}))
        assert result.ok, result.reason
        assert adapter.read_lb_weights() == {"b1": 250, "b2": 750}
        seen = set()
        for _ in range(40):
            answer = query(pdns, "v6.klb.test.", dns.rdatatype.AAAA)
            assert answer.rcode() == dns.rcode.NOERROR
            seen |= {str(r) for rrset in answer.answer for r in rrset}
        assert seen == {"2001:db8::1", "2001:db8::2"}
        # the A record of the testbed's VIP is untouched
        assert query(pdns, pdns.record).rcode() == dns.rcode.NOERROR
